"""Triton's APIs that load models, show their configs, map shared memory or change its logging and
tracing, open to `serve` alone.

Triton's loopback ports take requests from any process that shares the network namespace: the image
run with the host's network, `serve` on a shared machine, the other containers of an inference
pipeline. Its model-repository API loads a model from a config and files sent in the request (a
Python model is code), the model-config API shows what a model is made of, the shared-memory API maps
regions of ``/dev/shm`` into Triton, and the logging and trace APIs change what Triton writes. So
`serve` starts Triton with these behind a header (``--http-restricted-api``,
``--grpc-restricted-protocol``) whose value it draws at each start and never logs; the main process
and the front workers (through the state the owner sends them) send it on each call to them.
Inference, health, metadata and statistics stay open: they change nothing.

What it does not protect: a process in the same PID namespace as Triton, running as the same user (or
root), reads the value from ``/proc/<pid>/cmdline`` (docs/operations.md, "Triton's own ports").
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

HEADER = "smtriton-triton-key"
# Triton's names for its API groups (the same for HTTP and gRPC).
RESTRICTED = ("model-repository", "model-config", "shared-memory", "logging", "trace")
_OPTIONS = ("--http-restricted-api", "--grpc-restricted-protocol")


@dataclass(frozen=True)
class TritonAccess:
    """The header a call to a restricted API of Triton carries; the value never shows in a repr."""

    key: str = field(repr=False)

    @classmethod
    def new(cls) -> TritonAccess:
        """A fresh value (URL-safe characters: none of the ``,:=`` Triton's option syntax uses)."""
        return cls(secrets.token_urlsafe(32))

    @property
    def headers(self) -> dict[str, str]:
        return {HEADER: self.key}

    def flags(self) -> list[str]:
        """Triton's options that put the restricted APIs behind this value, over HTTP and gRPC."""
        return [f"{option}={','.join(RESTRICTED)}:{HEADER}={self.key}" for option in _OPTIONS]

    def hidden(self, text: str) -> str:
        """``text`` with the value replaced, for a log line."""
        return text.replace(self.key, "<hidden>")


def restricted_by(additional_args: Sequence[str]) -> list[str]:
    """The restricted APIs that flags in ``SAGEMAKER_TRITON_ADDITIONAL_ARGS`` put behind a key of their
    own (``--http-restricted-api=APIS:KEY=VALUE``, or the option and its value as two words): Triton
    refuses an API in two groups, and `serve` would not hold that key."""
    found: list[str] = []
    args = list(additional_args)
    for index, arg in enumerate(args):
        option, equals, value = arg.partition("=")
        if option not in _OPTIONS:
            continue
        if not equals:
            value = args[index + 1] if index + 1 < len(args) else ""
        apis = value.split(":", 1)[0]
        found += [api.strip() for api in apis.split(",") if api.strip() in RESTRICTED and api.strip() not in found]
    return found
