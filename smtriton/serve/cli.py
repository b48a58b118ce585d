"""The `serve` command: SageMaker runs it as the container's entry; locally it takes flags."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Optional

import typer
import uvicorn

from smtriton.serve.app import create_app
from smtriton.serve.engine import Engine
from smtriton.serve.fastpath import FastPath
from smtriton.serve.logs import configure_logging
from smtriton.serve.metrics import Metrics
from smtriton.serve.multimodel import ModelRegistry
from smtriton.serve.repository import RepositoryError, refuse_unrunnable_plans, resolve_default_model
from smtriton.serve.settings import Settings, SettingsError, warn_without_effect
from smtriton.serve.triton.installation import TritonNotFound, find_triton

log = logging.getLogger("serve")


class _Server(uvicorn.Server):
    """uvicorn, except that a SIGTERM/SIGINT drain ends with status 0 (uvicorn re-raises the signal)
    and tells the engine at once, so /ping fails while in-flight requests finish."""

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self._engine = engine

    def handle_exit(self, sig: int, frame: object) -> None:
        self._engine.begin_drain()
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


cli = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
        force=True,
    )


@cli.command()
def serve(
    mode: Annotated[
        Optional[str],  # noqa: UP045 - typer needs Optional at runtime on 3.10
        typer.Argument(help="'serve' (SageMaker passes it as the container argument); ignored.", show_default=False),
    ] = None,
    model_repository: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Triton model repository to serve [default: /opt/ml/model]"),
    ] = None,
    model_root: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Multi-model endpoints: where load urls must lie [default: /opt/ml/models]"),
    ] = None,
    multi_model: Annotated[
        Optional[bool],  # noqa: UP045
        typer.Option("--multi-model", help="Serve a multi-model endpoint [default: $SAGEMAKER_MULTI_MODEL]"),
    ] = None,
    port: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="Port to serve on [default: $SAGEMAKER_BIND_TO_PORT or 8080]"),
    ] = None,
    host: Annotated[Optional[str], typer.Option(help="Address to bind [default: 0.0.0.0]")] = None,  # noqa: UP045
    default_model: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Model /invocations serves [default: $SAGEMAKER_TRITON_DEFAULT_MODEL_NAME]"),
    ] = None,
    log_level: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="debug, info, warning or error [default: $SMTRITON_LOG_LEVEL or info]"),
    ] = None,
) -> None:
    """Serve a Triton model repository behind SageMaker's hosting contract (/ping, /invocations)."""
    if mode not in (None, "serve"):
        raise typer.BadParameter(f"unknown argument {mode!r}; the only one accepted is 'serve'")
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
    except (SettingsError, RepositoryError, TritonNotFound) as exc:
        print(str(exc), file=sys.stderr)
        raise typer.Exit(1) from None
    metrics = Metrics(enabled=settings.metrics_port is not None)
    engine = Engine(settings, installation, default, metrics)
    if settings.metrics_port is not None:
        metrics.triton_url = lambda: engine.triton_metrics_url
        metrics.serve(settings.metrics_host, settings.metrics_port)
    registry = None
    if settings.multi_model:
        log.info("multi-model endpoint: models from %s, on %s:%d", settings.model_root, settings.host, settings.port)
        registry = ModelRegistry(
            model_root=settings.model_root,
            managed=engine.repository,
            client=engine.live_client,
            memory_reserve_bytes=settings.memory_reserve_bytes,
            memory_factor=settings.model_memory_factor,
            memory_budget_bytes=settings.model_memory_budget_bytes,
            max_concurrent_loads=settings.max_concurrent_loads,
            load_timeout_s=settings.startup_timeout_s,
            gpu_memory_reserve_bytes=settings.gpu_memory_reserve_bytes,
        )
        engine.on_triton_ready = registry.restore
    else:
        log.info("serving model %s from %s on %s:%d", default, settings.model_repository, settings.host, settings.port)
    config = uvicorn.Config(
        FastPath(create_app(engine, registry), engine),
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level,
        access_log=settings.access_log,
        server_header=False,
        timeout_graceful_shutdown=int(settings.shutdown_timeout_s),
        lifespan="on",
    )
    _Server(config, engine).run()


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
