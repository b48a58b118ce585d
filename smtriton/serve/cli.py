"""The `serve` command: SageMaker runs it as the container's entry; locally it takes flags.

Its flags are parsed with argparse, so the image carries no CLI framework: every flag has an
environment equivalent (in the container none is given), and their help comes from the settings schema.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from smtriton.serve.errors import StartupError
from smtriton.serve.logs import configure_logging
from smtriton.serve.repository import refuse_unrunnable_plans, resolve_default_model
from smtriton.serve.settings import Settings, environment_help, flag_help, warn_without_effect
from smtriton.serve.triton.installation import TritonInstallation, find_triton

if TYPE_CHECKING:
    from smtriton.serve.dataplane import DataPlane

log = logging.getLogger("serve")


class _Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr, saying what to change, and exit status 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see serve --help)", file=sys.stderr)
        raise SystemExit(2)


def _version() -> str:
    try:
        return f"serve (smtriton) {version('smtriton')}"
    except PackageNotFoundError:
        return "serve (smtriton) unknown (not installed)"


def parser() -> argparse.ArgumentParser:
    """serve's flags: each one a setting of the schema (its help says the default and the variable)."""
    parser = _Parser(
        prog="serve",
        description="Serve a Triton model repository behind SageMaker's hosting contract (/ping, /invocations).",
        epilog=environment_help(),
    )
    parser.add_argument(
        "mode",
        nargs="?",
        choices=["serve"],
        metavar="serve",
        help="'serve' (SageMaker passes it as the container argument); ignored",
    )
    parser.add_argument("--model-repository", type=Path, metavar="DIR", help=flag_help("model_repository"))
    parser.add_argument("--model-root", type=Path, metavar="DIR", help=flag_help("model_root"))
    parser.add_argument("--multi-model", action="store_true", default=None, help=flag_help("multi_model"))
    parser.add_argument("--port", type=int, metavar="PORT", help=flag_help("port"))
    parser.add_argument("--host", metavar="ADDRESS", help=flag_help("host"))
    parser.add_argument("--default-model", metavar="NAME", help=flag_help("default_model"))
    parser.add_argument("--log-level", metavar="LEVEL", help=flag_help("log_level"))
    parser.add_argument("--version", action="version", version=_version(), help="print the version and exit")
    return parser


def flags(args: argparse.Namespace) -> dict[str, object]:
    """The settings the command line gives (None: not given)."""
    return {name: value for name, value in vars(args).items() if name != "mode"}


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the flags, check the configuration (exit 1 with the reason), then serve until SIGTERM."""
    args = parser().parse_args(argv)
    try:
        settings = Settings.from_env(os.environ, **flags(args))
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


if __name__ == "__main__":
    main()
