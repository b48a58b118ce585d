"""Build a Triton model repository from a recipe: export, check parity, write config, stamp.

Each model is built in a temporary directory beside its final place and renamed into it only when
complete, so an interrupted or failed build never leaves a half model for Triton to load. Models
whose stamp matches are skipped without importing torch. One build at a time per output directory
(a lock file), so parallel test sessions do not race.

Models are built after the models they are built from: an ensemble after its steps' models (its config
then checked against theirs, and the whole pipeline run on sample inputs against its eager reference),
a TensorRT plan after its ONNX entry. A TensorRT entry is built only where TensorRT can be imported;
elsewhere it is skipped with the command that builds it inside the serving image.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from smtriton.convert.parity import ParityReport
from smtriton.convert.recipe import (
    DEFAULT_RECIPE,
    ModelSpec,
    Recipe,
    RecipeError,
    dependencies,
)
from smtriton.convert.recipe_code import source_file
from smtriton.convert.recipe_parse import load_recipe
from smtriton.convert.runners import exporter_for
from smtriton.convert.stamp import entry_json, is_up_to_date, read_stamp, stamp_inputs, write_stamp
from smtriton.convert.tensorrt_profiles import AxisRange, profile_text, recipe_profile, sha256_file

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, builds must not overlap
    fcntl = None  # type: ignore[assignment]

VERSION_DIR = "1"
LOCK_FILE = ".build.lock"
PYTHON_MODEL_FILE = "model.py"
PLAN_FILE = "model.plan"
IMAGE_SCRIPT = "smtriton/convert/build_tensorrt_in_image.sh"

Progress = Callable[[str, str], None]  # (model name, what is happening now)


@dataclass
class ModelResult:
    name: str
    format: str
    status: str  # "built", "up to date", "skipped" (a TensorRT entry without TensorRT here) or "failed"
    seconds: float
    path: Path
    parity: ParityReport | None = None
    error: str | None = None
    note: str | None = None  # why it was skipped, and where to build it


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
        """Nothing was built or removed (a skipped model cannot be built here)."""
        return all(r.status in ("up to date", "skipped") for r in self.results) and not self.removed


def build_repository(
    recipe: str | Path | Recipe = DEFAULT_RECIPE,
    output: str | Path | None = None,
    *,
    models: Sequence[str] | None = None,
    force: bool = False,
    keep_going: bool = True,
    progress: Progress | None = None,
) -> BuildReport:
    """Build every (or the named) model of ``recipe`` into ``output`` (default: the recipe's directory);
    named models bring the models they are built from."""
    started = time.perf_counter()
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    out = Path(output).resolve() if output is not None else recipe.path.parent
    specs = recipe.build_order(models or None)
    out.mkdir(parents=True, exist_ok=True)
    report = BuildReport(output=out)
    with _locked(out):
        _remove_leftovers(out)
        done: dict[str, ModelResult] = {}
        for spec in specs:
            try:
                skipped = _check_dependencies(spec, done)
                if skipped is not None:  # a model built from one that cannot be built here cannot be either
                    note = f"built from {skipped!r}, which is skipped here"
                    result = ModelResult(spec.name, spec.format, "skipped", 0.0, out / spec.name, note=note)
                else:
                    result = build_model(spec, out, recipe=recipe, force=force, progress=progress)
            except Exception as exc:
                if not keep_going:
                    raise
                result = ModelResult(spec.name, spec.format, "failed", 0.0, out / spec.name, error=str(exc))
            done[spec.name] = result
            report.results.append(result)
        if not models:
            report.removed = _prune(out, recipe)
    report.seconds = time.perf_counter() - started
    return report


def _check_dependencies(spec: ModelSpec, done: dict[str, ModelResult]) -> str | None:
    """Raise when a model ``spec`` is built from failed; the first one skipped here, if any."""
    skipped = None
    for name in dependencies(spec):
        result = done[name]
        if result.status == "failed":
            raise RecipeError(f"model {spec.name!r}: built from {name!r}, which failed")
        if result.status == "skipped" and skipped is None:
            skipped = name
    return skipped


def build_model(
    spec: ModelSpec,
    output: Path,
    *,
    recipe: Recipe | None = None,
    force: bool = False,
    progress: Progress | None = None,
    version: int = 1,
    with_config: bool = True,
) -> ModelResult:
    """Build one model into ``output/<name>`` unless its stamp says it is current.

    ``smtriton convert`` uses this with ``force`` (an explicit conversion always runs) and may leave
    the config to ``smtriton config`` (``with_config=False``). Ensembles and TensorRT entries need the
    ``recipe`` and the models they are built from in ``output``.
    """
    started = time.perf_counter()
    final = output / spec.name
    if spec.format == "tensorrt" and not tensorrt_importable():
        assert recipe is not None
        command = image_command(spec, recipe, output)
        note = f"TensorRT is not importable here; build the plan inside the serving image: {command}"
        return ModelResult(spec.name, spec.format, "skipped", 0.0, final, note=note)
    inputs = stamp_inputs(spec, _built_from(spec, output), _host_versions(spec))
    if not force and is_up_to_date(final, inputs.key()):
        stamp = read_stamp(final) or {}
        parity = ParityReport.from_dict(stamp["parity"]) if stamp.get("parity") else None
        return ModelResult(spec.name, spec.format, "up to date", time.perf_counter() - started, final, parity)

    def say(message: str) -> None:
        if progress is not None:
            progress(spec.name, message)

    with staged_dir(output, spec.name) as staging:
        parity = _build_into(staging, spec, say, str(version), with_config, recipe, output)
        extra = {
            "recipe": str(recipe.path) if recipe else None,
            "entry": entry_json(spec.raw),
            "parity": parity.to_dict() if parity else None,
        }
        write_stamp(staging, inputs, extra)
    return ModelResult(spec.name, spec.format, "built", time.perf_counter() - started, final, parity)


def _built_from(spec: ModelSpec, output: Path) -> dict[str, str]:
    """What the models ``spec`` is built from are now (their stamp keys; a model built otherwise, its
    config's hash), so a change to any of them rebuilds it."""
    found = {}
    for name in dependencies(spec):
        stamp = read_stamp(output / name) or {}
        config = output / name / "config.pbtxt"
        found[f"built:{name}"] = str(stamp.get("key") or (sha256_file(config) if config.is_file() else "absent"))
    return found


def _host_versions(spec: ModelSpec) -> dict[str, str]:
    """A plan belongs to the TensorRT version and GPU that built it: both are part of its stamp."""
    if spec.format != "tensorrt":
        return {}
    from smtriton.convert import tensorrt_build

    return {"tensorrt": str(tensorrt_build.load_tensorrt().__version__), "gpu": tensorrt_build.gpu_info().name}


def tensorrt_importable() -> bool:
    from smtriton.convert import tensorrt_build

    try:
        tensorrt_build.load_tensorrt()
    except tensorrt_build.TensorRTError:
        return False
    return True


def image_command(spec: ModelSpec, recipe: Recipe, output: Path) -> str:
    """The image script's command line that builds a TensorRT entry as `convert tensorrt`."""
    assert spec.onnx is not None and spec.tensorrt is not None

    def shown(path: Path) -> str:
        try:
            return os.path.relpath(path)
        except ValueError:  # pragma: no cover - another drive (Windows)
            return str(path)

    options = spec.tensorrt
    # No --recipe: the image sees the repository only; the ONNX model's directory records its entry.
    argv = [IMAGE_SCRIPT, "IMAGE", shown(output), shown(output / spec.onnx), "--model", spec.onnx,
            "--name", spec.name, "--max-batch-size", str(spec.max_batch_size),
            "--profile", profile_text(_profile(spec, recipe)), "--precision", options.precision]  # fmt: skip
    if options.workspace:
        argv += ["--workspace", options.workspace]
    if options.optimization_level is not None:
        argv += ["--optimization-level", str(options.optimization_level)]
    if options.version_compatible:
        argv.append("--version-compatible")
    if options.hardware_compatibility != "none":
        argv += ["--hardware-compatibility", options.hardware_compatibility]
    return shlex.join(argv)


def _profile(spec: ModelSpec, recipe: Recipe) -> dict[str, AxisRange]:
    """The optimization profile of a TensorRT entry: its bounds, the batch axis 1..max_batch_size."""
    assert spec.onnx is not None and spec.tensorrt is not None
    batching = spec.dynamic_batching or recipe.model(spec.onnx).dynamic_batching
    preferred = batching.preferred_batch_size if batching else ()
    return recipe_profile(spec.tensorrt.profile, spec.max_batch_size, preferred)


def _build_into(
    model_dir: Path,
    spec: ModelSpec,
    say: Callable[[str], None],
    version: str = VERSION_DIR,
    with_config: bool = True,
    recipe: Recipe | None = None,
    output: Path | None = None,
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
    if spec.format in ("ensemble", "tensorrt"):
        assert recipe is not None and output is not None, "ensembles and plans are built from a recipe"
        build = _build_ensemble if spec.format == "ensemble" else _build_tensorrt
        return build(model_dir, version_dir, spec, say, recipe, output)

    # Heavy imports only here: an up-to-date repository never loads torch.
    from smtriton.convert.parity import ParityError, compare, parity_cases
    from smtriton.convert.sample_inputs import sample_inputs
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
    exporter.export(module, spec, outputs, sample_inputs(spec, example_sizes, seed=spec.seed), artifact)
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


def _build_ensemble(
    model_dir: Path, version_dir: Path, spec: ModelSpec, say: Callable[[str], None], recipe: Recipe, output: Path
) -> ParityReport:
    """The config from the entry and its step models' built configs, checked with the rules validation
    uses; then the pipeline of built artifacts against the eager references, on sample inputs."""
    from smtriton import model_config
    from smtriton.convert.config import ensemble_config
    from smtriton.convert.parity import ParityError, compare, parity_cases
    from smtriton.convert.pipeline import artifact_runner
    from smtriton.convert.reference import build_reference
    from smtriton.repo import ensemble

    say("checking the steps' tensors")
    members = {name: model_config.read(output / name) for name in dependencies(spec)}
    config = ensemble_config(spec, members)
    problems = ensemble.check(config, members)
    if problems:
        raise RecipeError(f"model {spec.name!r}: {'; '.join(problems)}")
    model_config.write(config, model_dir)  # the version directory stays empty: an ensemble has no artifact
    say("running the pipeline against its eager reference")
    report = compare(
        build_reference(spec, recipe).run,
        artifact_runner(spec, recipe, output),
        parity_cases(spec),
        atol=spec.parity.atol,
        rtol=spec.parity.rtol,
    )
    if not report.passed:
        raise ParityError(spec.name, report, "the built pipeline differs from its eager reference")
    return report


def _build_tensorrt(
    model_dir: Path, version_dir: Path, spec: ModelSpec, say: Callable[[str], None], recipe: Recipe, output: Path
) -> ParityReport:
    """As `smtriton convert tensorrt --recipe --model <the ONNX entry> --profile ...` builds it: profile
    from the entry's bounds, plan and sidecar, the plan checked against ONNX Runtime, config from the
    engine."""
    from smtriton import model_config
    from smtriton.convert import tensorrt_build
    from smtriton.convert.config import ConfigOptions
    from smtriton.convert.parity import ParityError
    from smtriton.convert.tensorrt_profiles import parse_size
    from smtriton.repo.artifacts import find_artifact

    assert spec.onnx is not None and spec.tensorrt is not None
    source = recipe.model(spec.onnx)
    options = tensorrt_build.BuildOptions(
        profiles=[_profile(spec, recipe)],
        precision=spec.tensorrt.precision,
        workspace_bytes=parse_size(spec.tensorrt.workspace) if spec.tensorrt.workspace else None,
        optimization_level=spec.tensorrt.optimization_level,
        version_compatible=spec.tensorrt.version_compatible,
        hardware_compatibility=spec.tensorrt.hardware_compatibility,
    )
    onnx_path = find_artifact(output / source.name)
    plan = version_dir / PLAN_FILE
    say(f"building {PLAN_FILE} ({spec.tensorrt.precision})")
    _, report = tensorrt_build.build_checked_plan(
        onnx_path, plan, options, max_batch_size=spec.max_batch_size,
        ranges={t.name: t.range for t in source.inputs if t.range is not None},
        atol=spec.parity.atol, rtol=spec.parity.rtol, trials=spec.parity.trials,
    )  # fmt: skip
    assert report is not None
    if not report.passed:
        raise ParityError(spec.name, report, "the TensorRT plan differs from ONNX Runtime on its ONNX entry")
    config_options = ConfigOptions(
        max_batch_size=spec.max_batch_size,
        dynamic_batching=spec.dynamic_batching,
        instance_groups=spec.instance_groups,
        parameters=spec.parameters,
    )
    model_config.write(tensorrt_build.plan_config(spec.name, plan, config_options), model_dir)
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
