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

from smtriton.aws import batch_options as batch
from smtriton.aws.batch_job import BatchJob
from smtriton.aws.cli import pairs
from smtriton.aws.endpoint_cli import EnvOpt
from smtriton.aws.resources import DeployError
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
    model_data: Path, default_model: str | None, job: BatchJob, scratch: Path, image: str | None,
    engine: str | None, variables: dict[str, str],
) -> ServeProcess:  # fmt: skip
    """serve (or the image) over the model repository, with the model's variables (--env) and those
    SageMaker sets for the job."""
    repository = model_data
    if model_data.is_file():
        from smtriton.local.endpoint import safe_extract

        repository = scratch / "model"
        safe_extract(model_data, repository)
    require_repository(repository, label=str(model_data) if model_data.is_file() else None)
    if default_model and default_model not in model_names(repository):
        raise ToolUsageError(f"--default-model {default_model}: {model_data} has no such model")
    env = {**variables, **job.environment()}
    if default_model:
        env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = default_model
    log_path = scratch / "serve.log"
    if image is not None:
        return ServeContainer(image, log_path, env=env, mounts=[Mount(repository, "/opt/ml/model")], engine=engine)
    child_env = {**os.environ, **env, "SMTRITON_WORK_DIR": str(scratch)}
    return ServeProcess(["--model-repository", str(repository)], log_path, env=child_env)


async def _run(url: str, job: BatchJob, files: list[tuple[Path, Path]], output: Path) -> transform.Summary:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        answered = await transform.execution_parameters(session, url)
    plan = job.settle(answered)
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
    content_type: batch.ContentTypeOpt = batch.CONTENT_TYPE,
    split_type: batch.SplitTypeOpt = batch.SPLIT_TYPE,
    batch_strategy: batch.BatchStrategyOpt = None,
    accept: batch.AcceptOpt = None,
    max_payload_mb: batch.MaxPayloadOpt = None,
    max_concurrent: batch.MaxConcurrentOpt = None,
    instance_type: batch.InstanceTypeOpt = batch.INSTANCE_TYPE,
    kms_key: batch.KmsKeyOpt = None,
    env: EnvOpt = None,
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

    The job `smtriton transform` would create from the same flags, with its defaults and its checks
    (--instance-type and --kms-key are checked only; --env goes to the serve started here, as to the
    job's model): every file under INPUT is one request, or with
    --split-type Line is split into mini-batches (MultiRecord: as many lines as fit MaxPayloadInMB),
    sent MaxConcurrentTransforms at a time to a serve started here (SAGEMAKER_BATCH=true and the job's
    settings, as SageMaker sets them) or to --endpoint-url, and each answer assembled by line into
    OUTPUT/<file>.out. Prints a summary (records, records/s, failures); exits 1 when a record failed,
    naming its file and line (an error line of SMTRITON_FAILED_RECORD=error-line counts as failed).

    \b
    Examples:
      smtriton local-transform requests/ results/ --model-data model_repository --default-model text_encoder \\
          --content-type application/jsonlines --split-type Line
      smtriton local-transform rows.csv results/ --model-data model.tar.gz --content-type text/csv --split-type Line
    """
    if (model_data is None) == (endpoint_url is None):
        raise typer.BadParameter("give exactly one of --model-data (start serve here) or --endpoint-url")
    if model_data is not None and not model_data.exists():
        raise typer.BadParameter(f"{model_data} does not exist", param_hint="--model-data")
    if env and model_data is None:
        raise typer.BadParameter("the variables are for a serve started here (--model-data)", param_hint="--env")
    variables = pairs(env, "--env")
    job = BatchJob(content_type, accept, split_type, batch_strategy, max_payload_mb, max_concurrent, instance_type,
                   kms_key)  # fmt: skip
    try:
        warnings = job.check()
    except DeployError as exc:
        raise ToolUsageError(str(exc)) from None
    for warning in warnings:
        console.print(f"warning: {escape(warning)}", highlight=False, soft_wrap=True)
    files = transform.input_files(input)
    scratch = Path(tempfile.mkdtemp(prefix="smtriton-transform-"))
    child: ServeProcess | None = None
    keep = False
    try:
        url = endpoint_url.rstrip("/") if endpoint_url else ""
        if model_data is not None:
            console.print("starting serve ...", highlight=False)
            child = _start_serve(model_data, default_model, job, scratch, image, engine, variables)
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
    for failure in summary.failures:
        console.print(f"[yellow]failed:[/] {escape(failure)}", highlight=False, soft_wrap=True)
    if summary.unshown:
        console.print(f"... and {summary.unshown} more failures", highlight=False)
    rate = summary.records_per_second
    said = f"{summary.failed_records} failed"
    if summary.error_lines:
        said += f" ({summary.error_lines} answered with an error line)"
    console.print(
        f"{summary.records} records in {summary.requests} requests, {summary.seconds:.1f} s"
        f"{'' if rate is None else f', {rate:.1f} records/s'}; {said}",
        highlight=False,
        soft_wrap=True,
    )
    if summary.failed_records:
        in_requests = summary.failed_records - summary.error_lines
        why = []
        if in_requests:
            why.append(f"in {summary.failed_files} of {summary.files} files (named above; those files have no output)")
        if summary.error_lines:
            why.append(
                f"{summary.error_lines} as error lines (named above; the output keeps them in their place, "
                "as SageMaker's job would)"
            )
        raise ToolError(f"{summary.failed_records} of {summary.records} records failed, {', '.join(why)}")
    console.print(f"[green]✓[/] {summary.files} files transformed into {escape(str(output))}", highlight=False)
