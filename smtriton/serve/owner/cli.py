"""The `serve` command: SageMaker runs it as the container's entry; locally it takes flags.

Its flags are parsed with argparse, so the image carries no CLI framework: every flag has an
environment equivalent (in the container none is given), and their help comes from the settings schema.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from smtriton.serve.errors import StartupError
from smtriton.serve.host import cgroups
from smtriton.serve.http.sockets import reserve_port
from smtriton.serve.logs import configure_logging
from smtriton.serve.owner.pool import WORKER_ENTRY
from smtriton.serve.owner.startup import (
    models_to_load,
    refuse_unrunnable_plans,
    refuse_without_shared_memory,
    resolve_default_model,
)
from smtriton.serve.settings import Settings, environment_help, flag_help, warn_without_effect
from smtriton.serve.triton.installation import TritonInstallation, find_triton

if TYPE_CHECKING:
    from smtriton.serve.owner.endpoint import Endpoint
    from smtriton.serve.owner.pool import WorkerPool
    from smtriton.serve.triton.supervisor import TritonSupervisor

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
    parser.add_argument("--workers", type=int, metavar="N", help=flag_help("workers"))
    parser.add_argument("--default-model", metavar="NAME", help=flag_help("default_model"))
    parser.add_argument("--log-level", metavar="LEVEL", help=flag_help("log_level"))
    parser.add_argument("--version", action="version", version=_version(), help="print the version and exit")
    return parser


def flags(args: argparse.Namespace) -> dict[str, object]:
    """The settings the command line gives (None: not given)."""
    return {name: value for name, value in vars(args).items() if name != "mode"}


def main(argv: Sequence[str] | None = None, *, worker: str = WORKER_ENTRY) -> None:
    """Parse the flags, check the configuration (exit 1 with the reason), then serve until SIGTERM.
    ``worker`` is what each front worker runs, as ``module:function``."""
    args = parser().parse_args(argv)
    try:
        settings = Settings.from_env(os.environ, **flags(args))
        configure_logging(settings.log_level, settings.log_format)
        warn_without_effect(os.environ)
        default = None
        loads: list[str] = []
        if not settings.multi_model:
            default = resolve_default_model(settings.model_repository, settings.default_model)
            loads = models_to_load(
                settings.model_repository, default, settings.load_models, settings.triton.additional_args
            )
            for model in loads:
                refuse_unrunnable_plans(settings.model_repository, model)
        installation = find_triton(settings.tritonserver)
        _check_gpu_driver(installation)
        if loads:
            refuse_without_shared_memory(
                settings.model_repository, loads, settings.triton.shm_default_byte_size, installation.native_backends()
            )
        if settings.work_dir is not None:
            settings.work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="smtriton-", dir=settings.work_dir) as work:
            _run(settings, installation, default, loads, Path(work), worker)
    except StartupError as exc:
        print(str(exc), file=sys.stderr)
        raise SystemExit(1) from None


def _check_gpu_driver(installation: TritonInstallation) -> None:
    """Say which GPUs and driver this host has against the image's CUDA; stop when the driver is of an older
    CUDA major version (and CUDA's forward compatibility cannot make up for it), or run Triton on that
    compatibility."""
    from smtriton.serve.host.cuda import check_driver

    verdict = check_driver()
    if verdict is None:
        return
    log.log(verdict.level, "GPU: %s", verdict.says)
    if verdict.refusal is not None:
        raise StartupError(verdict.refusal)
    if verdict.libraries is not None:
        existing = installation.env.get("LD_LIBRARY_PATH", os.environ.get("LD_LIBRARY_PATH", ""))
        installation.env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(verdict.libraries), existing) if p)


def _run(
    settings: Settings,
    installation: TritonInstallation,
    default: str | None,
    loads: list[str],
    work: Path,
    worker: str,
) -> None:
    """Run the endpoint until SIGTERM on uvicorn's loop of choice (uvloop where installed)."""
    port = reserve_port(settings.host, settings.port)  # at once: a port that is taken stops serve here
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is in the runtime's dependencies
        run = asyncio.run
    else:
        run = uvloop.run
    try:
        run(_serve(settings, installation, default, loads, work, worker))
    finally:
        port.close()


async def _serve(
    settings: Settings,
    installation: TritonInstallation,
    default: str | None,
    loads: list[str],
    work: Path,
    worker: str,
) -> None:
    """Start Triton first, then the front workers, then assemble the endpoint's owner while both boot:
    the workers' imports (FastAPI, uvicorn, aiohttp: about half a second) overlap Triton's own start-up
    instead of preceding it. ``work`` is scratch space."""
    if settings.metrics_port is not None:
        from smtriton.serve.metrics import share_between_processes

        share_between_processes(work / "metrics")  # before prometheus_client is imported, here or in a worker
    from smtriton.serve.owner.pool import WorkerPool
    from smtriton.serve.triton.supervisor import TritonSupervisor

    log.info("limits: %s", cgroups.describe(cgroups.memory_group(), cgroups.cpu_group()))
    if default is None:
        repository = work / "managed"  # MME: the repository serve manages (docs/design.md §3)
        repository.mkdir()
    else:
        repository = settings.model_repository.resolve()
    assembled = asyncio.Event()
    endpoint: Endpoint | None = None

    async def on_live() -> None:
        await assembled.wait()
        assert endpoint is not None
        await endpoint.on_triton_live()

    async def watch() -> None:
        assert endpoint is not None
        await endpoint.watch_model_health()

    def on_exit() -> None:
        if endpoint is not None:
            endpoint.on_triton_exit()

    def on_change() -> None:
        if endpoint is not None:
            endpoint.publish()

    supervisor = TritonSupervisor(
        settings,
        installation,
        repository,
        work,
        on_live=on_live,
        watch=watch if default is not None else None,
        on_exit=on_exit,
        on_change=on_change,
        metrics_wanted=settings.metrics_port is not None,
        load_models=loads,
    )
    workers = WorkerPool(
        settings.workers,
        entry=worker,
        heartbeat_timeout=settings.worker_heartbeat_timeout_s,
        on_exit=_forget_worker_metrics,
    )
    stop = asyncio.Event()
    fatal: list[str] = []

    def on_fatal(why: str) -> None:
        fatal.append(why)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        supervisor.start()
        await supervisor.wait_spawned()
        workers.start()

        from smtriton.serve.metrics import Metrics
        from smtriton.serve.multimodel.registry import ModelRegistry
        from smtriton.serve.owner.endpoint import Endpoint

        metrics = Metrics(enabled=settings.metrics_port is not None)
        registry = None
        where = f"on {settings.host}:{settings.port} ({settings.workers} front worker{'s' * (settings.workers > 1)})"
        if default is None:
            log.info("multi-model endpoint: models from %s, %s", settings.model_root, where)
            registry = ModelRegistry(
                settings, repository, supervisor.running_client, native_backends=installation.native_backends()
            )
        else:
            log.info("serving model %s from %s %s", default, settings.model_repository, where)
        endpoint = Endpoint(settings, supervisor, metrics, workers, default, registry, on_fatal, loads)
        workers.open(endpoint.hello, endpoint.handle)
        assembled.set()
        if settings.metrics_port is not None:
            metrics.serve(settings.metrics_host, settings.metrics_port, lambda: supervisor.metrics_url)
        await stop.wait()
        log.info("stopping: draining every worker, then Triton")
        endpoint.begin_drain()
    finally:
        await _stop(settings, workers, supervisor)  # also when start-up failed half-way
    if fatal:
        raise StartupError(fatal[0])


async def _stop(settings: Settings, workers: WorkerPool, supervisor: TritonSupervisor) -> None:
    """Stop within one budget: the workers drain their share, Triton exits in what is left; Triton is
    stopped whatever happened to the workers."""
    budget = settings.stop_budget()
    deadline = time.monotonic() + settings.shutdown_timeout_s
    try:
        await workers.stop(budget.drain_s)
    finally:
        await supervisor.stop(max(budget.triton_s, deadline - time.monotonic()))


def _forget_worker_metrics(pid: int) -> None:
    """A worker exited: its live gauges stop counting (only where metrics are shared between processes)."""
    from smtriton.serve.metrics import Metrics

    Metrics.forget_process(pid)


if __name__ == "__main__":
    main()
