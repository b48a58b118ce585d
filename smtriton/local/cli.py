"""`smtriton local-endpoint`: run a local SageMaker endpoint (SME or MME) that boto3 can call."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Annotated, Optional

import typer
import uvicorn

from smtriton.aws.session import s3_client
from smtriton.cli_options import DefaultModelOpt, ProfileOpt, RegionOpt
from smtriton.errors import ToolError, ToolUsageError
from smtriton.local.archive import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, GIB, ExtractLimits, safe_extract
from smtriton.local.endpoint import ArchiveSource, create_app
from smtriton.local.serve_process import Mount, ServeContainer, ServeProcess
from smtriton.repo.layout import model_names, require_repository

log = logging.getLogger("smtriton.local_endpoint")

START_TIMEOUT_S = 600.0
SERVE_STOP_TIMEOUT_S = 40.0
ERROR_LINES = 15
# What the image is told of this environment: SageMaker's and smtriton's settings, less what only
# makes sense on this side of the container.
PASSED_PREFIXES = ("SAGEMAKER_", "SMTRITON_")
NOT_PASSED = {"SMTRITON_WORK_DIR", "SMTRITON_CONTAINER_ENGINE", "SMTRITON_TRITONSERVER", "SAGEMAKER_BIND_TO_PORT"}


def _container_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(PASSED_PREFIXES) and k not in NOT_PASSED}


def _last_lines(text: str, count: int = ERROR_LINES) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-count:])


def _launch(
    image: str | None,
    engine: str | None,
    work_dir: Path,
    repository: Path | None,
    default_model: str | None,
) -> tuple[ServeProcess, str | None]:
    """Start serve, from this environment or as the image; the child and where it sees the MME model root."""
    log_path = work_dir / "serve.log"
    if image is None:
        env = {**os.environ, "SMTRITON_WORK_DIR": str(work_dir)}  # serve's own scratch stays inside ours
        if repository is None:
            args = ["--multi-model", "--model-root", str(work_dir / "models")]
        else:
            args = ["--model-repository", str(repository)]
            if default_model:
                args += ["--default-model", default_model]
        return ServeProcess(args, log_path, env=env), None
    container_env = _container_env()
    if repository is None:
        container_env["SAGEMAKER_MULTI_MODEL"] = "true"
        mounts = [Mount(work_dir / "models", "/opt/ml/models")]
    else:
        if default_model:
            container_env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = default_model
        mounts = [Mount(repository, "/opt/ml/model")]
    child = ServeContainer(image, log_path, env=container_env, mounts=mounts, engine=engine)
    return child, "/opt/ml/models" if repository is None else None


def _listen(host: str, port: int) -> socket.socket:
    """The endpoint's listening socket, taken before anything loads: a port in use is one line at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)  # create_server adds the address to strerror
        raise ToolError(f"cannot listen on {host}:{port}: {reason} (pick another --port)") from None


def _check_single_model(repository: Path, given: Path, default_model: str | None) -> None:
    """What serve would refuse only after starting, refused here in one line naming what was given:
    a model directory where the repository belongs, or a default model that is not in it."""
    require_repository(repository, label=str(given) if given.is_file() else None)
    names = model_names(repository)
    if default_model and default_model not in names:
        raise ToolUsageError(
            f"--default-model {default_model}: {given} has no such model (models: {', '.join(names) or 'none'})"
        )


class _Terminated(Exception):
    """SIGTERM: stop serve, clean up and exit 0, as on Ctrl-C."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Also what uvicorn calls when it raises the signal again after its own graceful stop.
    raise _Terminated


def local_endpoint(
    models: Annotated[
        Optional[str],  # noqa: UP045 - typer needs Optional at runtime on 3.10
        typer.Option(help="MME: folder or s3://bucket/prefix holding the TargetModel archives"),
    ] = None,
    model_data: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="SME: a model.tar.gz (the repository root) or an extracted model repository"),
    ] = None,
    endpoint_name: Annotated[str, typer.Option(help="EndpointName clients use")] = "local",
    capacity: Annotated[int, typer.Option(help="MME: models kept loaded at once (LRU unloads beyond)")] = 4,
    host: Annotated[str, typer.Option(help="Address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the SageMaker Runtime API")] = 8090,
    work_dir: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Where to make the scratch folder (extracted models, serve's log) [default: system temp]"),
    ] = None,
    keep_work_dir: Annotated[
        bool, typer.Option("--keep-work-dir", help="Keep the scratch folder when the endpoint stops")
    ] = False,
    default_model: DefaultModelOpt = None,
    image: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Run this serving image (IMAGE serve, as SageMaker does) instead of serve from here"),
    ] = None,
    engine: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="With --image: docker or podman [default: $SMTRITON_CONTAINER_ENGINE, else docker "
            "where its daemon answers, else podman]"
        ),
    ] = None,
    max_archive_gib: Annotated[
        float,
        typer.Option(
            min=1e-6,
            help="Most GiB an archive may inflate to: its files (their headers summed first) and its tar headers",
        ),
    ] = DEFAULT_MAX_BYTES / GIB,
    max_archive_entries: Annotated[
        int,
        typer.Option(min=1, help="Most entries an archive may hold: its members and the folders their paths imply"),
    ] = DEFAULT_MAX_ENTRIES,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Serve the SageMaker Runtime InvokeEndpoint API locally, in front of a real `serve` + Triton.

    \b
    Examples:
      smtriton local-endpoint --model-data model.tar.gz   # smtriton package sme
      smtriton local-endpoint --models archives/          # smtriton package mme
      smtriton invoke local --endpoint-url http://127.0.0.1:8090 --request request.json

    Call it with boto3 exactly as a real endpoint (GET /ping answers 200 once serve is ready). It checks
    neither the region nor the keys, but boto3 needs some:

    \b
      import boto3
      runtime = boto3.client(
          "sagemaker-runtime", endpoint_url="http://127.0.0.1:8090",
          region_name="us-east-1", aws_access_key_id="local", aws_secret_access_key="local")
      answer = runtime.invoke_endpoint(
          EndpointName="local", ContentType="application/json",
          Body=open("request.json", "rb").read())  # --models: TargetModel="model.tar.gz" too
      print(answer["Body"].read().decode())
    """
    if (models is None) == (model_data is None):
        raise typer.BadParameter("give exactly one of --models (multi-model) or --model-data (single model)")
    if model_data is not None and not model_data.exists():
        raise typer.BadParameter(f"{model_data} does not exist", param_hint="--model-data")
    if models is not None and not models.startswith("s3://") and not Path(models).is_dir():
        raise typer.BadParameter(f"{models} is not a folder (nor an s3:// prefix)", param_hint="--models")
    limits = ExtractLimits(int(max_archive_gib * GIB), max_archive_entries)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
    listener = _listen(host, port)
    scratch = Path(tempfile.mkdtemp(prefix="smtriton-endpoint-", dir=work_dir))
    child: ServeProcess | None = None
    failed = False
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        repository: Path | None = None
        source: ArchiveSource | None = None
        if models is not None:
            (scratch / "models").mkdir()
            source = ArchiveSource(models, s3_client(region, profile) if models.startswith("s3://") else None)
        else:
            assert model_data is not None
            repository = model_data
            if model_data.is_file():
                repository = scratch / "model"
                safe_extract(model_data, repository, limits=limits)
            _check_single_model(repository, model_data, default_model)
        child, model_url_root = _launch(image, engine, scratch, repository, default_model)
        try:
            child.wait_healthy(START_TIMEOUT_S, models=[default_model] if default_model else ())
        except (RuntimeError, TimeoutError):
            failed = True
            child.stop(SERVE_STOP_TIMEOUT_S)
            print(f"serve did not start; its last lines:\n{_last_lines(child.log_text())}", file=sys.stderr)
            print(f"serve's whole log: {child.log_path}", file=sys.stderr)
            raise typer.Exit(1) from None
        log.info("endpoint %s ready at /endpoints/%s/invocations (GET /ping: 200)", endpoint_name, endpoint_name)
        app = create_app(endpoint_name, child, scratch, source, capacity, model_url_root, limits)
        config = uvicorn.Config(app, host=host, port=port, log_config=None, server_header=False)
        uvicorn.Server(config).run(sockets=[listener])
    except (_Terminated, KeyboardInterrupt):
        log.info("stopping")
    finally:
        listener.close()
        signal.signal(signal.SIGTERM, previous)
        if child is not None:
            child.stop(SERVE_STOP_TIMEOUT_S)
        if keep_work_dir:
            print(f"scratch folder kept: {scratch}", file=sys.stderr)
        elif failed:
            # A failed start keeps serve's log (its path was printed above) and nothing else.
            for entry in scratch.iterdir():
                if entry.name != "serve.log":
                    shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
