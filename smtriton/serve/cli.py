"""The `serve` command: SageMaker runs it as the container's entry; locally it takes flags."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from smtriton.serve.errors import StartupError
from smtriton.serve.logs import configure_logging
from smtriton.serve.repository import refuse_unrunnable_plans, resolve_default_model
from smtriton.serve.settings import Settings, warn_without_effect
from smtriton.serve.triton.installation import TritonInstallation, find_triton

if TYPE_CHECKING:
    from smtriton.serve.dataplane import DataPlane

log = logging.getLogger("serve")


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
    except StartupError as exc:
        print(str(exc), file=sys.stderr)
        raise typer.Exit(1) from None
    if settings.work_dir is not None:
        settings.work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smtriton-", dir=settings.work_dir) as work:
        _run(settings, installation, default, Path(work))


def _run(settings: Settings, installation: TritonInstallation, default: str | None, work: Path) -> None:
    """Run the server until SIGTERM on uvicorn's loop of choice (uvloop where installed)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is in the runtime's dependencies
        asyncio.run(_serve(settings, installation, default, work))
    else:
        uvloop.run(_serve(settings, installation, default, work))


async def _serve(settings: Settings, installation: TritonInstallation, default: str | None, work: Path) -> None:
    """Start Triton first, then assemble the front while it boots: the front's imports (FastAPI,
    uvicorn, aiohttp, gRPC: about half a second) overlap Triton's own start-up instead of preceding
    it. ``work`` is scratch space."""
    from smtriton.serve.metrics import Metrics
    from smtriton.serve.supervisor import TritonSupervisor

    metrics = Metrics(enabled=settings.metrics_port is not None)
    if default is None:
        repository = work / "managed"  # MME: the repository serve manages (docs/design.md §3)
        repository.mkdir()
    else:
        repository = settings.model_repository.resolve()
    assembled = asyncio.Event()
    plane: DataPlane | None = None

    async def on_live() -> None:
        await assembled.wait()
        assert plane is not None
        await plane.on_triton_live()

    async def watch() -> None:
        assert plane is not None
        await plane.watch_model_health()

    supervisor = TritonSupervisor(
        settings,
        installation,
        repository,
        work,
        on_live=on_live,
        watch=watch if default is not None else None,
        on_exit=metrics.triton_restarts.inc,
        metrics_wanted=metrics.enabled,
        load_models=(default,) if default is not None else (),
    )
    supervisor.start()
    await supervisor.wait_spawned()

    from smtriton.serve.dataplane import DataPlane
    from smtriton.serve.multimodel import ModelRegistry
    from smtriton.serve.server import http_server

    registry = None
    if default is None:
        log.info("multi-model endpoint: models from %s, on %s:%d", settings.model_root, settings.host, settings.port)
        registry = ModelRegistry(settings, repository, supervisor.running_client)
    else:
        log.info("serving model %s from %s on %s:%d", default, settings.model_repository, settings.host, settings.port)
    plane = DataPlane(settings, supervisor, metrics, default, registry)
    assembled.set()
    if settings.metrics_port is not None:
        metrics.triton_url = lambda: supervisor.metrics_url
        metrics.serve(settings.metrics_host, settings.metrics_port)
    try:
        await http_server(plane).serve()
    finally:
        await supervisor.stop()  # also when the server never started (its port taken, say)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
