"""A request's body as the data plane holds it: read whole or in its pieces, inflated, and given back.

Only a binary+json request goes to Triton in the pieces it arrived in; any other body is read whole
(joined, or past :data:`JOIN_ON_LOOP_BYTES` gathered beside the event loop). A compressed body is
inflated within the payload limit (a bomb stops there, 413; batch transform's 413 says where its limit
comes from). Once a large buffer of a request is read no more it is given back to the system beside
the answer (:class:`Buffers`).
"""

from __future__ import annotations

import asyncio
import contextlib

from smtriton.serve.dataplane.reading import codec
from smtriton.serve.dataplane.request import Request
from smtriton.serve.errors import PayloadTooLarge
from smtriton.serve.host import memory
from smtriton.serve.setting_types import MIB
from smtriton.serve.settings import DEFAULT_BATCH_PAYLOAD_MB, Settings
from smtriton.serve.triton.client import RequestBody
from smtriton.serve.triton.request_body import BodyPieces, HeldBody, contiguous

# Request buffers this large are given back beside the event loop once read (freed at once, one holds
# the loop ~0.13 s a GiB).
GIVE_BACK_FROM = 64 * MIB
# Compressed bodies up to this size inflate on the event loop (a few milliseconds at most); larger ones
# in a thread.
INFLATE_ON_LOOP_BYTES = 8 * 1024
# A body held in pieces up to this size is joined on the event loop (a few milliseconds at most).
JOIN_ON_LOOP_BYTES = 8 * 1024 * 1024


async def read_body(request: Request, settings: Settings) -> HeldBody:
    """The request's body as the data plane holds it (the module docstring)."""
    try:
        body = await request.read_body()
        if isinstance(body, BodyPieces) and (request.encoding is not None or not _binary(request.content_type)):
            body = await _whole(body)  # only a binary request goes to Triton in its pieces: the rest is read whole
        if request.encoding is None:
            return body
        limit = settings.max_payload_bytes
        if len(body) <= INFLATE_ON_LOOP_BYTES:
            return codec.decompress(contiguous(body), request.encoding, limit)
        # zlib lets other threads run while it inflates: a large body inflates beside the event loop,
        # bounded by the limit (a bomb stops there, 413)
        return await asyncio.to_thread(codec.decompress, contiguous(body), request.encoding, limit)
    except PayloadTooLarge:
        if not settings.batch:
            raise
        raise PayloadTooLarge(settings.max_payload_bytes, _batch_limit(settings)) from None


def _batch_limit(settings: Settings) -> str:
    """Where batch transform's body limit comes from, said in its 413."""
    megabytes = settings.max_payload_in_mb
    if megabytes:
        source = f"SAGEMAKER_MAX_PAYLOAD_IN_MB={megabytes}, the job's"
    elif megabytes is None and settings.max_payload_bytes == DEFAULT_BATCH_PAYLOAD_MB * MIB:
        megabytes, source = DEFAULT_BATCH_PAYLOAD_MB, "SageMaker's default, which /execution-parameters answers"
    else:
        return " (SMTRITON_MAX_PAYLOAD_BYTES)"
    return f": batch transform's MaxPayloadInMB of {megabytes} MB ({source}); send smaller mini-batches"


async def _whole(body: BodyPieces) -> RequestBody:
    """A body read whole: joined, or (past :data:`JOIN_ON_LOOP_BYTES`) gathered beside the event loop,
    held once, while the loop serves (each piece's copy lets go of the GIL or is short)."""
    if len(body) <= JOIN_ON_LOOP_BYTES:
        return body.joined()
    return await asyncio.to_thread(body.gathered)


def _binary(content_type: str | None) -> bool:
    """Whether the request is binary+json (its tensors after a JSON part)."""
    return codec.media_type(content_type) == codec.BINARY_JSON


class Buffers:
    """Large buffers of requests, no longer read, given back to the system beside the answers."""

    def __init__(self) -> None:
        self._giving_back: set[asyncio.Future[None]] = set()

    def give_back(self, buffer: object) -> None:
        """A large buffer of a request, no longer read, given back to the system beside the answer
        (freed at once, a gigabyte holds the event loop for a tenth of a second): a body read whole, or
        the tensors a large JSON request was re-encoded into (a mapping of their own)."""
        if isinstance(buffer, bytearray) and len(buffer) >= GIVE_BACK_FROM:
            task = asyncio.ensure_future(_shrink(buffer))
            self._giving_back.add(task)
            task.add_done_callback(self._giving_back.discard)
        elif isinstance(buffer, BodyPieces):
            for piece in buffer.pieces:
                if memory.is_untouched(piece) and len(piece) >= GIVE_BACK_FROM:
                    memory.give_back_beside_loop(piece)


async def _shrink(buffer: bytearray) -> None:
    """Give ``buffer``'s memory back (its pages released in a thread, then the buffer freed), the event
    loop served meanwhile; a buffer still seen through a view stays whole: it goes when that lets go."""
    if not memory.unused(buffer):
        return
    await asyncio.to_thread(memory.drop_pages, buffer)
    with contextlib.suppress(BufferError):
        buffer.clear()
