"""`smtriton local-transform`: a batch transform job on this machine (:mod:`smtriton.local.transform`)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import aiohttp
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from smtriton.aws.resources import DeployError
from smtriton.aws.transform import MAX_PAYLOAD_MB, check_records
from smtriton.cli_options import DefaultModelOpt
from smtriton.errors import ToolError, ToolUsageError
from smtriton.local import transform
from smtriton.local.serve_process import Mount, ServeContainer, ServeProcess
from smtriton.repo.layout import model_names, require_repository

console = Console(stderr=True)
log = logging.getLogger("smtriton.local_transform")
START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 40.0


def _start_serve(
    model_data: Path, default_model: str | None, job: transform.JobSettings, scratch: Path, image: str | None,
    engine: str | None,
) -> ServeProcess:  # fmt: skip
    """serve (or the image) over the model repository, with the variables SageMaker sets for the job."""
    repository = model_data
    if model_data.is_file():
        from smtriton.local.endpoint import safe_extract

        repository = scratch / "model"
        safe_extract(model_data, repository)
    require_repository(repository, label=str(model_data) if model_data.is_file() else None)
    if default_model and default_model not in model_names(repository):
        raise ToolUsageError(f"--default-model {default_model}: {model_data} has no such model")
    env = job.environment()
    if default_model:
        env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = default_model
    log_path = scratch / "serve.log"
    if image is not None:
        return ServeContainer(image, log_path, env=env, mounts=[Mount(repository, "/opt/ml/model")], engine=engine)
    child_env = {**os.environ, **env, "SMTRITON_WORK_DIR": str(scratch)}
    return ServeProcess(["--model-repository", str(repository)], log_path, env=child_env)


async def _run(url: str, job: transform.JobSettings, files: list[tuple[Path, Path]], output: Path) -> transform.Summary:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        answered = await transform.execution_parameters(session, url)
    plan = transform.settle(job, answered)
    limit = f"{plan.payload_bytes // transform.MIB} MB" if plan.payload_bytes else "no limit"
    console.print(
        f"{plan.strategy}, MaxPayloadInMB {escape(limit)}, MaxConcurrentTransforms {plan.concurrency}"
        f"{'' if answered else ' (no /execution-parameters: SageMaker defaults)'}",
        highlight=False,
    )
    total = sum(transform.count_records(path, job.split_type) for path, _ in files)
    columns = (TextColumn("records"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("records", total=total)
        return await transform.run_job(url, job, files, output, plan, lambda n: bar.advance(task, n))


def local_transform(
    input: Annotated[Path, typer.Argument(metavar="INPUT", help="A file, or a folder: every file under it")],
    output: Annotated[Path, typer.Argument(metavar="OUTPUT", help="Folder of the results: OUTPUT/<file>.out")],
    model_data: Annotated[
        Optional[Path],  # noqa: UP045 - typer needs Optional at runtime on 3.10
        typer.Option(help="A model.tar.gz (the repository root) or a model repository folder to serve"),
    ] = None,
    default_model: DefaultModelOpt = None,
    endpoint_url: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="A serve already running (the container's URL, e.g. http://127.0.0.1:8080) instead"),
    ] = None,
    content_type: Annotated[
        str,
        typer.Option(help="application/jsonlines (a KServe v2 request a line), text/csv (a row a line) or JSON"),
    ] = "application/jsonlines",
    accept: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Accept of every request: application/jsonlines turns CSV rows' answers into JSON lines"),
    ] = None,
    split_type: Annotated[str, typer.Option(help="Line: split every file by line; None: a file is a request")] = "Line",
    batch_strategy: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="SingleRecord or MultiRecord [default: the container's /execution-parameters answer]"),
    ] = None,
    max_payload_mb: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="MaxPayloadInMB, 0-100 (0: no limit) [default: the container's answer, else 6]"),
    ] = None,
    max_concurrent: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(min=1, help="MaxConcurrentTransforms [default: the container's answer, else 1]"),
    ] = None,
    image: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Run this serving image (IMAGE serve, as SageMaker does) instead of serve from here"),
    ] = None,
    engine: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="With --image: docker or podman [default: $SMTRITON_CONTAINER_ENGINE, else found]"),
    ] = None,
) -> None:
    """Run a batch transform job on this machine, as SageMaker would: the same mini-batches and output.

    Every file under INPUT is split by line into mini-batches (MultiRecord: as many lines as fit
    MaxPayloadInMB), sent MaxConcurrentTransforms at a time to a serve started here (SAGEMAKER_BATCH=true
    and the job's settings, as SageMaker sets them) or to --endpoint-url, and each answer assembled by
    line into OUTPUT/<file>.out. Prints a summary (records, records/s, failures); exits 1 when a record
    failed, naming its file and lines.

    \b
    Examples:
      smtriton local-transform requests/ results/ --model-data model_repository --default-model text_encoder
      smtriton local-transform rows.csv results/ --model-data model.tar.gz --content-type text/csv
    """
    if (model_data is None) == (endpoint_url is None):
        raise typer.BadParameter("give exactly one of --model-data (start serve here) or --endpoint-url")
    if model_data is not None and not model_data.exists():
        raise typer.BadParameter(f"{model_data} does not exist", param_hint="--model-data")
    if max_payload_mb is not None and not 0 <= max_payload_mb <= MAX_PAYLOAD_MB:
        raise typer.BadParameter(f"must be 0-{MAX_PAYLOAD_MB}", param_hint="--max-payload-mb")
    try:
        check_records(split_type, batch_strategy, content_type)
    except DeployError as exc:
        raise ToolUsageError(str(exc)) from None
    files = transform.input_files(input)
    job = transform.JobSettings(content_type, accept, split_type, batch_strategy, max_payload_mb, max_concurrent)
    scratch = Path(tempfile.mkdtemp(prefix="smtriton-transform-"))
    child: ServeProcess | None = None
    keep = False
    try:
        url = endpoint_url.rstrip("/") if endpoint_url else ""
        if model_data is not None:
            console.print("starting serve ...", highlight=False)
            child = _start_serve(model_data, default_model, job, scratch, image, engine)
            try:
                child.wait_healthy(START_TIMEOUT_S, models=[default_model] if default_model else ())
            except (RuntimeError, TimeoutError) as exc:
                keep = True
                reason = str(exc).splitlines()[0]
                raise ToolError(f"serve did not start ({reason}); its log: {child.log_path}") from None
            url = child.url
        summary = asyncio.run(_run(url, job, files, output))
    finally:
        if child is not None:
            child.stop(STOP_TIMEOUT_S)
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)
    _report(summary, output)


def _report(summary: transform.Summary, output: Path) -> None:
    for failure in summary.failures[: transform.SHOWN_FAILURES]:
        console.print(f"[yellow]failed:[/] {escape(failure)}", highlight=False, soft_wrap=True)
    if len(summary.failures) > transform.SHOWN_FAILURES:
        console.print(f"... and {len(summary.failures) - transform.SHOWN_FAILURES} more failed requests")
    console.print(
        f"{summary.records} records in {summary.requests} requests, {summary.seconds:.1f} s, "
        f"{summary.records_per_second:.1f} records/s; {summary.failed_records} failed",
        highlight=False,
    )
    if summary.failed_records:
        raise ToolError(
            f"{summary.failed_records} of {summary.records} records failed, in {summary.failed_files} of "
            f"{summary.files} files (named above; those files have no output)"
        )
    console.print(f"[green]✓[/] {summary.files} files transformed into {escape(str(output))}", highlight=False)
