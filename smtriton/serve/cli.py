"""The `serve` command: SageMaker runs it as the container's entry; locally it takes flags."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from typer._click.exceptions import ClickException  # typer carries its own copy of click
from typer.core import TyperCommand

from smtriton.serve.errors import StartupError
from smtriton.serve.logs import configure_logging
from smtriton.serve.repository import refuse_unrunnable_plans, resolve_default_model
from smtriton.serve.settings import Settings, environment_help, flag_help, warn_without_effect
from smtriton.serve.triton.installation import TritonInstallation, find_triton

if TYPE_CHECKING:
    from smtriton.serve.dataplane import DataPlane

log = logging.getLogger("serve")


cli = typer.Typer(
    add_completion=False, pretty_exceptions_enable=False, context_settings={"help_option_names": ["-h", "--help"]}
)


class _ServeCommand(TyperCommand):
    """`serve`'s command: its flags take no value, so their help shows none (typer prints ``<bool>``)."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


def _print_version(value: bool) -> None:
    if value:
        try:
            typer.echo(f"serve (smtriton) {version('smtriton')}")
        except PackageNotFoundError:
            typer.echo("serve (smtriton) unknown (not installed)")
        raise typer.Exit()


@cli.command(cls=_ServeCommand, epilog=environment_help())
def serve(
    mode: Annotated[
        Optional[str],  # noqa: UP045 - typer needs Optional at runtime on 3.10
        typer.Argument(
            metavar="serve",
            help="'serve' (SageMaker passes it as the container argument); ignored.",
            show_default=False,
        ),
    ] = None,
    model_repository: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(metavar="DIR", help=flag_help("model_repository")),
    ] = None,
    model_root: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(metavar="DIR", help=flag_help("model_root")),
    ] = None,
    multi_model: Annotated[
        Optional[bool],  # noqa: UP045
        typer.Option("--multi-model", metavar="", help=flag_help("multi_model")),
    ] = None,
    port: Annotated[Optional[int], typer.Option(help=flag_help("port"))] = None,  # noqa: UP045
    host: Annotated[Optional[str], typer.Option(metavar="ADDRESS", help=flag_help("host"))] = None,  # noqa: UP045
    default_model: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(metavar="NAME", help=flag_help("default_model")),
    ] = None,
    log_level: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(metavar="LEVEL", help=flag_help("log_level")),
    ] = None,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", metavar="", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
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
    """The `serve` command; a usage error is one line on stderr and exit status 2."""
    try:
        result = cli(standalone_mode=False)
    except ClickException as exc:
        print(f"error: {exc.format_message()} (see serve --help)", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    raise SystemExit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    main()
