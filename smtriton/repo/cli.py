"""``smtriton validate`` and ``smtriton package sme|mme``: check a repository, then archive it for SageMaker."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from smtriton.cli_options import ProfileOpt, RegionOpt
from smtriton.errors import ToolError, ToolUsageError
from smtriton.repo.layout import model_directories, require_repository

if TYPE_CHECKING:  # the validator (protobuf, tritonclient) loads only when a command runs
    from smtriton.repo.validate import Problem

console = Console(stderr=True, soft_wrap=True)  # one message, one line (logs, grep)
package_app = typer.Typer(
    help="Deterministic model.tar.gz archives: one for an SME (repository root), one per model for an MME.\n\n"
    "Next: smtriton local-endpoint --model-data model.tar.gz (SME; with --default-model NAME when it holds "
    "several models) or --models DIR (MME) calls it on this machine; uploaded with --s3, smtriton deploy serves "
    "it on SageMaker.",
    no_args_is_help=True,
)


def _runtime(tensorrt_version: str | None, gpu_name: str | None, compute_capability: str | None, detect: bool):
    from smtriton.serve.triton.tensorrt_sidecar import RuntimeInfo

    if detect:  # as serve detects it, so that validate refuses exactly the plans serve would
        from smtriton.serve.triton.tensorrt_check import NoRuntime, detect_runtime

        found = detect_runtime()
        if isinstance(found, NoRuntime):
            raise ToolError(f"--detect-runtime: {found.reason}; run it inside the serving image on the GPU host")
        return found
    given = [tensorrt_version, gpu_name, compute_capability]
    if any(given) and not all(given):
        raise ToolUsageError("--tensorrt-version, --gpu-name and --compute-capability go together")
    return RuntimeInfo(tensorrt_version, gpu_name, compute_capability) if all(given) else None  # type: ignore[arg-type]


def _report(repo: Path, problems: list[Problem], quiet_ok: bool = False, checked: int | None = None) -> int:
    """Print one line per problem (stdout) and a summary (stderr); the number of errors."""
    for problem in problems:
        typer.echo(problem.line(repo))
    n_errors = sum(p.severity == "error" for p in problems)
    n_warnings = len(problems) - n_errors
    if n_errors:
        console.print(f"[bold red]{n_errors} error(s)[/], {n_warnings} warning(s) in {escape(str(repo))}")
    elif not quiet_ok:
        warned = f", {n_warnings} warning(s)" if n_warnings else ""
        models = "" if checked is None else f"{checked} model{'s' if checked != 1 else ''} checked, "
        console.print(f"[green]✓[/] {escape(str(repo))}: {models}no errors{warned}")
    return n_errors


def report_merging(repo: Path, models: list[str] | None = None) -> None:
    """One line per model Triton batches: whether serve merges its requests from different clients."""
    from smtriton.repo.validate import merging

    for name, rule in merging(repo, models):
        verdict = "[green]merged[/]" if rule.allowed else "[yellow]not merged[/]"
        line = f"{escape(name)}: requests of different clients {verdict} ({escape(rule.reason)})"
        console.print(line, highlight=False)


def validate_command(
    repo: Annotated[Path, typer.Argument(metavar="REPO", help="Model repository (one directory per model).")],
    mme: Annotated[bool, typer.Option("--mme", help="Multi-model endpoint rules: model names unique.")] = False,
    stub_python: Annotated[
        str,
        typer.Option(
            help="The Python of the image's Python-backend stub, which a packed environment (EXECUTION_ENV_PATH) "
            "must hold: 3.12 in NVIDIA's 25.04 (the triton image), 3.11 in the cpu image."
        ),
    ] = "3.12",
    tensorrt_version: Annotated[
        str | None, typer.Option(help="Check TensorRT plans against this runtime TensorRT version.")
    ] = None,
    gpu_name: Annotated[str | None, typer.Option(help="... and this GPU (as nvidia-smi names it).")] = None,
    compute_capability: Annotated[str | None, typer.Option(help="... with this compute capability, e.g. 8.6.")] = None,
    detect_runtime: Annotated[
        bool, typer.Option(help="Take TensorRT version and GPU from this host (inside the serving image).")
    ] = False,
) -> None:
    """Check a whole repository before deploying it; one line per problem, with its file.

    Layout (model and numeric version directories), every config parses, the artifact each platform
    loads is present, config inputs/outputs agree with the artifact (names, dtypes, ranks, fixed
    dims), max_batch_size agrees with the batch dimension, ensemble steps reference existing models
    and tensors, TensorRT sidecars match their plans. Exits 1 on any error. Then, for each model Triton
    batches, whether serve merges requests of different clients (its backend runs a batch as one
    tensor, or its config declares smtriton_merge_rows).

    Next: smtriton package sme REPO (one endpoint serving the repository) or package mme REPO (one archive
    per model, for a multi-model endpoint).
    """
    from smtriton.repo.validate import validate_repository

    if repo.is_dir():
        require_repository(repo)
    runtime = _runtime(tensorrt_version, gpu_name, compute_capability, detect_runtime)
    problems = validate_repository(repo, mme=mme, runtime=runtime, stub_python=stub_python)
    checked = len(model_directories(repo)) if repo.is_dir() else None
    if _report(repo, problems, checked=checked):
        raise typer.Exit(1)
    report_merging(repo)
    console.print(
        f"next: smtriton package sme {escape(str(repo))} (or package mme, one archive per model)", highlight=False
    )


def _validate_before(repo: Path, names: list[str], mme: bool) -> None:
    """Validation of what is packaged (problems of other models in the repository do not block)."""
    from smtriton.repo.validate import validate_repository

    problems = []
    for p in validate_repository(repo, mme=mme):
        try:
            first = p.path.relative_to(repo).parts[:1]
        except ValueError:
            first = ()
        if not first or first[0] in names:
            problems.append(p)
    if _report(repo, problems, quiet_ok=True):
        raise ToolError("not packaged; fix the errors above, or pass --no-validate")


def _show(archives, uris: list[str] | None) -> None:
    table = Table(box=box.SIMPLE_HEAD, title="Archives", title_justify="left")
    for column in ("archive", "models", "size", "sha256"):
        table.add_column(column, no_wrap=column != "models")
    for a in archives:
        table.add_row(str(a.path), ", ".join(a.models), f"{a.size / 1e6:.1f} MB", a.sha256[:16] + "…")
    console.print(table)
    for uri in uris or ():
        console.print(f"uploaded {uri}", highlight=False)


ModelsOpt = Annotated[
    list[str] | None, typer.Option("--model", "-m", metavar="NAME", help="Package only this model (repeatable).")
]
RenameOpt = Annotated[
    list[str] | None,
    typer.Option(
        metavar="OLD=NEW", help="Rename a model in the archive (its directory, its config's name, ensemble steps)."
    ),
]
S3Opt = Annotated[
    str | None, typer.Option("--s3", help="Upload to s3://bucket/prefix/ (boto3 credentials, --region, --profile).")
]
ValidateOpt = Annotated[bool, typer.Option(help="Validate the packaged models first (default on).")]
# A folder that is not there (or a file) is refused by the argument itself: one usage line naming it.
RepoArg = Annotated[
    Path, typer.Argument(metavar="REPO", help="Model repository.", exists=True, file_okay=False, dir_okay=True)
]


@package_app.command("sme")
def package_sme_command(
    repo: RepoArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Archive to write.", dir_okay=False)] = Path(
        "model.tar.gz"
    ),
    model: ModelsOpt = None,
    rename: RenameOpt = None,
    s3: S3Opt = None,
    validate: ValidateOpt = True,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """One model.tar.gz whose root is the repository (SageMaker extracts it to /opt/ml/model).

    Deterministic: the same repository gives the same bytes (sorted entries, fixed times and owners,
    no gzip name or time); <archive>.sha256 is written beside it.
    """
    from smtriton.aws.session import s3_client
    from smtriton.repo.package import model_dirs, package_sme, parse_renames, served_model, upload

    require_repository(repo)
    client = s3_client(region, profile) if s3 else None  # credentials checked before anything is built
    names = list(model) if model else model_dirs(repo)
    if validate:
        _validate_before(repo, names, mme=False)
    archive = package_sme(repo, output, models=model, renames=parse_renames(rename or ()))
    uris = upload([archive], s3, client) if s3 else None
    _show([archive], uris)
    default = ""
    if len(archive.models) > 1:  # serve needs to be told which one /invocations runs
        chosen = served_model(repo, names)
        default = f" --default-model {parse_renames(rename or ()).get(chosen, chosen)}"
        console.print(
            f"{len(archive.models)} models in the archive ({', '.join(archive.models)}): --default-model names the "
            "one /invocations runs",
            highlight=False,
        )
    console.print(f"next: smtriton local-endpoint --model-data {escape(str(output))}{default} calls it here; "
                  f"smtriton deploy{default} serves it on SageMaker", highlight=False)  # fmt: skip


@package_app.command("mme")
def package_mme_command(
    repo: RepoArg,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Directory for <model>.tar.gz files.", file_okay=False)
    ] = Path("."),
    model: ModelsOpt = None,
    rename: RenameOpt = None,
    s3: S3Opt = None,
    validate: ValidateOpt = True,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """One <model>.tar.gz per model (the TargetModel of a multi-model endpoint).

    An ensemble's archive also holds the models its steps use. Deterministic, with a .sha256 each.
    """
    from smtriton.aws.session import s3_client
    from smtriton.repo.package import model_dirs, package_mme, parse_renames, upload

    require_repository(repo)
    client = s3_client(region, profile) if s3 else None
    names = list(model) if model else model_dirs(repo)
    if validate:
        _validate_before(repo, names, mme=True)
    archives = package_mme(repo, output, models=model, renames=parse_renames(rename or ()))
    uris = upload(archives, s3, client) if s3 else None
    _show(archives, uris)
    here = f"smtriton local-endpoint --models {escape(str(output))} calls them here (TargetModel: an archive's name)"
    console.print(f"next: {here}; smtriton deploy --multi-model serves them on SageMaker", highlight=False)
