"""One inference request as the data plane takes it, and the answer it gives: no HTTP in either.

The HTTP side reads a request's head into a :class:`Request` (the headers SageMaker defines, and how to
read the body), makes one call, :meth:`DataPlane.invoke <smtriton.serve.dataplane.plane.DataPlane.invoke>`,
and writes the :class:`Reply` it gets back: a whole answer, or a :class:`Streamed` one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from smtriton.serve.triton.request_body import HeldBody

# Headers an answer adds (the custom attributes a model set, a session's), as (lower-case name, value).
Headers = list[tuple[bytes, bytes]]


@dataclass(slots=True)
class Request:
    """An inference request: ``model`` is the multi-model endpoint's model named by the path (None for
    ``/invocations``); ``read_body`` reads the whole body, refusing it (413) once it passes the limit."""

    model: str | None
    read_body: Callable[[], Awaitable[HeldBody]]
    content_type: str | None = None
    encoding: str | None = None
    custom_attributes: str | None = None
    inference_id: str | None = None
    accept: str | None = None
    session: str | None = None
    target_model: str | None = None


class Streamed:
    """A streamed answer: its chunks, and the clean-up that runs once however the stream ends — also
    when nothing ever iterates the chunks (the client left before the first one), so that the Triton
    stream is closed and an unload waiting for the invoke is not kept waiting."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        media_type: str,
        cleanup: Callable[[], Awaitable[None]],
        headers: Headers | None = None,
    ) -> None:
        self.chunks = chunks
        self.media_type = media_type
        self.headers = headers or []
        self._cleanup = cleanup
        self._closed = False

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._cleanup()


@dataclass(slots=True)
class Reply:
    """An answer: status, content type, body and the headers the data plane adds; or, for a stream,
    ``stream`` (status 200, its own media type and headers, no body)."""

    status: int
    content_type: str
    body: bytes | bytearray  # (a body of records is answered in the one buffer its lines were written into)
    headers: Headers = field(default_factory=list)
    stream: Streamed | None = None
