"""The `serve` command: SageMaker runs it as the container's entry; locally it takes flags."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import uvicorn

from smtriton.serve.app import create_app
from smtriton.serve.dataplane import DataPlane
from smtriton.serve.errors import StartupError
from smtriton.serve.logs import configure_logging
from smtriton.serve.metrics import Metrics
from smtriton.serve.multimodel import ModelRegistry
from smtriton.serve.repository import refuse_unrunnable_plans, resolve_default_model
from smtriton.serve.settings import Settings, warn_without_effect
from smtriton.serve.supervisor import TritonSupervisor
from smtriton.serve.triton.installation import TritonInstallation, find_triton

log = logging.getLogger("serve")


class _Server(uvicorn.Server):
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


def _parser() -> argparse.ArgumentParser:
    """serve's flags; argparse, so that the image carries no CLI framework (every flag has an environment
    equivalent, and in the container none is given)."""
    parser = argparse.ArgumentParser(
        prog="serve", description="Serve a Triton model repository behind SageMaker's hosting contract."
    )
    parser.add_argument(
        "mode", nargs="?", choices=["serve"], help="'serve' (SageMaker passes it as the container argument); ignored"
    )
    parser.add_argument(
        "--model-repository", type=Path, help="Triton model repository to serve [default: /opt/ml/model]"
    )
    parser.add_argument(
        "--model-root", type=Path, help="Multi-model endpoints: where load urls must lie [default: /opt/ml/models]"
    )
    parser.add_argument(
        "--multi-model",
        action="store_true",
        default=None,
        help="Serve a multi-model endpoint [default: $SAGEMAKER_MULTI_MODEL]",
    )
    parser.add_argument("--port", type=int, help="Port to serve on [default: $SAGEMAKER_BIND_TO_PORT or 8080]")
    parser.add_argument("--host", help="Address to bind [default: 0.0.0.0]")
    parser.add_argument(
        "--default-model", help="Model /invocations serves [default: $SAGEMAKER_TRITON_DEFAULT_MODEL_NAME]"
    )
    parser.add_argument("--log-level", help="debug, info, warning or error [default: $SMTRITON_LOG_LEVEL or info]")
    return parser


def serve(
    model_repository: Path | None = None,
    model_root: Path | None = None,
    multi_model: bool | None = None,
    port: int | None = None,
    host: str | None = None,
    default_model: str | None = None,
    log_level: str | None = None,
) -> None:
    """Serve a Triton model repository behind SageMaker's hosting contract (/ping, /invocations)."""
    try:
        settings = Settings.from_env(
            os.environ,
            model_repository=model_repository,
            model_root=model_root,
            multi_model=multi_model,
            port=port,
            host=host,
            default_model=default_model,
            log_level=log_level,
        )
        configure_logging(settings.log_level, settings.log_format)
        warn_without_effect(os.environ)
        default = None
        if not settings.multi_model:
            default = resolve_default_model(settings.model_repository, settings.default_model)
            refuse_unrunnable_plans(settings.model_repository, default)
        installation = find_triton(settings.tritonserver)
    except StartupError as exc:
        print(str(exc), file=sys.stderr)
        raise SystemExit(1) from None
    if settings.work_dir is not None:
        settings.work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smtriton-", dir=settings.work_dir) as work:
        _run(settings, installation, default, Path(work))


def _run(settings: Settings, installation: TritonInstallation, default: str | None, work: Path) -> None:
    """Assemble the server from its parts and run it until SIGTERM; ``work`` is scratch space."""
    metrics = Metrics(enabled=settings.metrics_port is not None)
    if default is None:
        repository = work / "managed"  # MME: the repository serve manages (docs/design.md §3)
        repository.mkdir()
    else:
        repository = settings.model_repository.resolve()
    plane: DataPlane
    supervisor = TritonSupervisor(
        settings,
        installation,
        repository,
        work,
        on_live=lambda: plane.on_triton_live(),
        watch=(lambda: plane.watch_model_health()) if default is not None else None,
        on_exit=metrics.triton_restarts.inc,
        metrics_wanted=metrics.enabled,
    )
    registry = None
    if default is None:
        log.info("multi-model endpoint: models from %s, on %s:%d", settings.model_root, settings.host, settings.port)
        registry = ModelRegistry(settings, repository, supervisor.running_client)
    else:
        log.info("serving model %s from %s on %s:%d", default, settings.model_repository, settings.host, settings.port)
    plane = DataPlane(settings, supervisor, metrics, default, registry)
    if settings.metrics_port is not None:
        metrics.triton_url = lambda: supervisor.metrics_url
        metrics.serve(settings.metrics_host, settings.metrics_port)
    config = uvicorn.Config(
        create_app(plane),
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level,
        access_log=settings.access_log,
        server_header=False,
        timeout_graceful_shutdown=int(settings.shutdown_timeout_s),
        lifespan="on",
    )
    _Server(config, plane).run()


def main(argv: Sequence[str] | None = None) -> None:
    args = vars(_parser().parse_args(argv))
    del args["mode"]
    serve(**args)


if __name__ == "__main__":
    main()
