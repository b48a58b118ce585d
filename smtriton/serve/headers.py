"""SageMaker's request and response headers (docs/contract.md §1.3, §7, §8): the HTTP side reads them
into a request, the data plane answers with some of them, and the local endpoint passes them on."""

from __future__ import annotations

CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
TARGET_MODEL = "X-Amzn-SageMaker-Target-Model"
INFERENCE_ID = "X-Amzn-SageMaker-Inference-Id"
SESSION = "X-Amzn-SageMaker-Session-Id"  # the request's session, or NEW_SESSION
NEW_SESSION = "X-Amzn-SageMaker-New-Session-Id"  # a session opened: "<id>; Expires=<time>"
CLOSED_SESSION = "X-Amzn-SageMaker-Closed-Session-Id"

# InvokeEndpoint's CustomAttributes: at most this many characters (AWS refuses longer ones before the
# container sees them; serve refuses them too, so no longer value ever reaches a model).
CUSTOM_ATTRIBUTES_MAX = 1024


def wire(name: str) -> bytes:
    """A header's name as HTTP/1.1 servers hand it over and responses carry it here: lower case bytes."""
    return name.lower().encode("ascii")
