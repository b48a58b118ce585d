"""Build a Triton model repository from a recipe: export, check parity, write config, stamp.

Each model is built in a temporary directory beside its final place and renamed into it only when
complete, so an interrupted or failed build never leaves a half model for Triton to load. Models
whose stamp matches are skipped without importing torch. One build at a time per output directory
(a lock file), so parallel test sessions do not race.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from smtriton.convert.parity import ParityReport
from smtriton.convert.recipe import DEFAULT_RECIPE, ModelSpec, Recipe, load_recipe, source_file
from smtriton.convert.stamp import is_up_to_date, read_stamp, stamp_inputs, write_stamp

if TYPE_CHECKING:
    from smtriton.convert.export import Exporter

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, builds must not overlap
    fcntl = None  # type: ignore[assignment]

VERSION_DIR = "1"
LOCK_FILE = ".build.lock"
PYTHON_MODEL_FILE = "model.py"

Progress = Callable[[str, str], None]  # (model name, what is happening now)


@dataclass
class ModelResult:
    name: str
    format: str
    status: str  # "built", "up to date" or "failed"
    seconds: float
    path: Path
    parity: ParityReport | None = None
    error: str | None = None


@dataclass
class BuildReport:
    output: Path
    results: list[ModelResult] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # models this recipe built earlier but no longer lists
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.status != "failed" for r in self.results)

    @property
    def up_to_date(self) -> bool:
        return all(r.status == "up to date" for r in self.results) and not self.removed


def build_repository(
    recipe: str | Path | Recipe = DEFAULT_RECIPE,
    output: str | Path | None = None,
    *,
    models: Sequence[str] | None = None,
    force: bool = False,
    keep_going: bool = True,
    progress: Progress | None = None,
) -> BuildReport:
    """Build every (or the named) model of ``recipe`` into ``output`` (default: the recipe's directory)."""
    started = time.perf_counter()
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    out = Path(output).resolve() if output is not None else recipe.path.parent
    specs = [recipe.model(name) for name in models] if models else list(recipe.models)
    out.mkdir(parents=True, exist_ok=True)
    report = BuildReport(output=out)
    with _locked(out):
        _remove_leftovers(out)
        for spec in specs:
            try:
                report.results.append(build_model(spec, out, recipe_path=recipe.path, force=force, progress=progress))
            except Exception as exc:
                if not keep_going:
                    raise
                report.results.append(
                    ModelResult(spec.name, spec.format, "failed", 0.0, out / spec.name, error=str(exc))
                )
        if not models:
            report.removed = _prune(out, recipe)
    report.seconds = time.perf_counter() - started
    return report


def build_model(
    spec: ModelSpec,
    output: Path,
    *,
    recipe_path: Path | None = None,
    force: bool = False,
    progress: Progress | None = None,
    version: int = 1,
    with_config: bool = True,
) -> ModelResult:
    """Build one model into ``output/<name>`` unless its stamp says it is current.

    ``smtriton convert`` uses this with ``force`` (an explicit conversion always runs) and may leave
    the config to ``smtriton config`` (``with_config=False``).
    """
    started = time.perf_counter()
    final = output / spec.name
    inputs = stamp_inputs(spec)
    if not force and is_up_to_date(final, inputs.key()):
        stamp = read_stamp(final) or {}
        parity = ParityReport.from_dict(stamp["parity"]) if stamp.get("parity") else None
        return ModelResult(spec.name, spec.format, "up to date", time.perf_counter() - started, final, parity)

    def say(message: str) -> None:
        if progress is not None:
            progress(spec.name, message)

    with staged_dir(output, spec.name) as staging:
        parity = _build_into(staging, spec, say, str(version), with_config)
        extra = {
            "recipe": str(recipe_path) if recipe_path else None,
            "parity": parity.to_dict() if parity else None,
        }
        write_stamp(staging, inputs, extra)
    return ModelResult(spec.name, spec.format, "built", time.perf_counter() - started, final, parity)


def exporter_for(fmt: str) -> Exporter:
    """The exporter for a recipe format; imported only here, so unrelated toolchains are never loaded."""
    if fmt == "onnx":
        from smtriton.convert.export_onnx import OnnxExporter

        return OnnxExporter()
    if fmt == "torchscript":
        from smtriton.convert.export_torchscript import TorchScriptExporter

        return TorchScriptExporter()
    raise ValueError(f"no exporter for format {fmt!r}")


def _build_into(
    model_dir: Path, spec: ModelSpec, say: Callable[[str], None], version: str = VERSION_DIR, with_config: bool = True
) -> ParityReport | None:
    from smtriton import model_config
    from smtriton.convert.config import recipe_config

    version_dir = model_dir / version
    version_dir.mkdir()
    if spec.format == "python":
        say("copying model.py")
        shutil.copyfile(source_file(spec), version_dir / PYTHON_MODEL_FILE)
        outputs = tuple(o.declared for o in spec.outputs if o.declared is not None)
        if with_config:
            model_config.write(recipe_config(spec, outputs), model_dir)
        return None

    # Heavy imports only here: an up-to-date repository never loads torch.
    from smtriton.convert.parity import ParityError, compare, parity_cases
    from smtriton.convert.sample_inputs import random_inputs
    from smtriton.convert.signature import probe_outputs
    from smtriton.convert.torch_model import load_module, run_module

    say("building the torch model")
    module = load_module(spec)
    say("probing outputs")
    outputs = probe_outputs(module, spec)
    exporter = exporter_for(spec.format)
    artifact = version_dir / exporter.filename
    say(f"exporting {exporter.filename}")
    # Trace at sizes > 1 so no dynamic axis is specialised to a broadcastable 1.
    example_sizes = {axis: max(*sizes, 2) for axis, sizes in spec.axes.items()}
    exporter.export(module, spec, outputs, random_inputs(spec.inputs, example_sizes, seed=spec.seed), artifact)
    say("checking parity")
    runner = exporter.load(spec, outputs, artifact)
    report = compare(
        lambda inputs: run_module(module, spec, inputs),
        runner,
        parity_cases(spec),
        atol=spec.parity.atol,
        rtol=spec.parity.rtol,
    )
    if not report.passed:
        raise ParityError(spec.name, report)
    if with_config:
        model_config.write(recipe_config(spec, outputs), model_dir)
    return report


@contextmanager
def staged_dir(output: Path, name: str) -> Iterator[Path]:
    """A fresh directory that replaces ``output/name`` only if the block completes."""
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=output))
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the model from a server running as another user
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replace_dir(staging, output / name)


def replace_dir(new: Path, final: Path) -> None:
    """Put ``new`` at ``final``; the old one is moved aside first, so ``final`` is never half-written."""
    old: Path | None = None
    if final.exists() or final.is_symlink():
        old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
    os.replace(new, final)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()


def _remove_leftovers(output: Path) -> None:
    """Staging and set-aside directories of a build that was killed (only ever ours: hidden, tagged)."""
    for path in output.iterdir():
        if path.name.startswith(".") and (".tmp-" in path.name or ".old-" in path.name) and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def _prune(output: Path, recipe: Recipe) -> list[str]:
    """Remove models this recipe built earlier and no longer lists, so Triton does not serve them."""
    removed = []
    for path in sorted(output.iterdir()):
        if path.name.startswith(".") or path.name in recipe.names or not path.is_dir() or path.is_symlink():
            continue
        stamp = read_stamp(path)
        if stamp is not None and stamp.get("recipe") == str(recipe.path):
            shutil.rmtree(path)
            removed.append(path.name)
    return removed


@contextmanager
def _locked(output: Path) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover
        yield
        return
    with (output / LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
