"""uvicorn as `serve` runs it: the drain on SIGTERM, and the server assembled around one data plane."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import uvicorn

from smtriton.serve.app import HeaderLimit, create_app
from smtriton.serve.dataplane import DataPlane
from smtriton.serve.protocol import checks_headers, data_protocol


class DrainingServer(uvicorn.Server):
    """uvicorn, except that a SIGTERM/SIGINT drain ends with status 0 (uvicorn re-raises the signal)
    and tells the data plane at once, so /ping fails while in-flight requests finish."""

    def __init__(self, config: uvicorn.Config, plane: DataPlane) -> None:
        super().__init__(config)
        self._plane = plane

    def handle_exit(self, sig: int, frame: object) -> None:
        self._plane.begin_drain()
        super().handle_exit(sig, frame)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def http_server(plane: DataPlane) -> DrainingServer:
    """The HTTP server for ``plane``, on the SageMaker port."""
    settings = plane.settings
    routes = create_app(plane)
    protocol = data_protocol(routes)
    # Header sizes are checked once: by the protocol while it parses, or (uvicorn's stock protocol) here.
    app = routes if checks_headers(protocol) else HeaderLimit(routes, settings.max_header_bytes)
    config = uvicorn.Config(
        app,
        http=protocol,
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level,
        access_log=settings.access_log,
        server_header=False,
        timeout_graceful_shutdown=int(settings.shutdown_timeout_s),
        lifespan="on",
    )
    return DrainingServer(config, plane)
