"""The `serve` command: SageMaker runs it as the container's entry; locally it takes flags.

Its flags are parsed with argparse, so the image carries no CLI framework: every flag has an
environment equivalent (in the container none is given), and their help comes from the settings schema.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import NoReturn

from smtriton.serve.errors import StartupError
from smtriton.serve.logs import configure_logging
from smtriton.serve.owner import assembly
from smtriton.serve.owner.pool import WORKER_ENTRY
from smtriton.serve.owner.startup import (
    models_to_load,
    refuse_unrunnable_plans,
    refuse_without_shared_memory,
    resolve_default_model,
)
from smtriton.serve.settings import Settings, environment_help, flag_help, warn_without_effect
from smtriton.serve.triton.access import restricted_by
from smtriton.serve.triton.installation import TritonInstallation, find_triton

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
        if restricted := restricted_by(settings.triton.additional_args):
            raise StartupError(
                f"SAGEMAKER_TRITON_ADDITIONAL_ARGS restricts Triton's {', '.join(restricted)} API with a key of its "
                'own: serve already keeps these for itself (docs/operations.md, "Triton\'s own ports"); leave '
                "them out of --http-restricted-api and --grpc-restricted-protocol"
            )
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
            assembly.run(settings, installation, default, loads, Path(work), worker)
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


if __name__ == "__main__":
    main()
