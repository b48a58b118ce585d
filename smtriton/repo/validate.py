"""Validate a whole Triton model repository before deploying it: one problem per line, with its file.

Checks what would otherwise surface as a failed load on the endpoint: layout (model and numeric
version directories), every config parses as Triton's ModelConfig, the artifact each platform loads is
present, the config's inputs/outputs (names, dtypes, ranks, fixed dims) agree with the artifact's own
signature (:mod:`smtriton.repo.artifacts`), max_batch_size agrees with the artifact's batch dimension,
ensemble steps reference existing models and versions and their tensors agree (the rules are those of
:mod:`smtriton.repo.ensemble`, which the recipe builder applies too), TensorRT plans match their sidecar
(and the target TensorRT/GPU when given), and for a multi-model endpoint the model names are unique.
The dimension rules are those of Triton's backends (the onnxruntime backend's CompareDimsSupported):
a fixed artifact dimension must be stated exactly, a dynamic one accepts any config value.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smtriton import dtypes, model_config, row_merging
from smtriton.model_config import CONFIG_FILE, PLATFORM_BACKENDS, ConfigParseError, ModelConfig
from smtriton.repo import ensemble, layout
from smtriton.repo.artifacts import (
    DEFAULT_FILENAMES,
    Signature,
    SignatureError,
    TensorSig,
    onnx_external_data,
    onnx_signature,
    profile_batch_limits,
    sha256_file,
    torchscript_signature,
)
from smtriton.repo.layout import model_directories
from smtriton.repo.tarstream import Overflow, Unreadable, open_tar
from smtriton.serve.triton.tensorrt_sidecar import RuntimeInfo, SidecarError, check_compatibility, read_sidecar

# serve's rule for model names (docs/contract.md §2.4, loading a model), used for every repository.
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
# A Python model's packed environment, and how Triton lets its config name the model's own directory.
EXECUTION_ENV = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY_VARIABLE = "$$TRITON_MODEL_DIRECTORY"
# The Python of the Python-backend stub in the default image (NVIDIA's 25.04, Ubuntu 24.04).
STUB_PYTHON = "3.12"
# What validate reads of a packed environment's archive: as much as local-endpoint extracts of a whole
# model archive by default, and members enough for any environment (a CUDA PyTorch one holds some 40,000).
ENV_MAX_BYTES = 32 << 30  # as local-endpoint's --max-archive-gib
ENV_MAX_MEMBERS = 1_000_000
KIND_OF_BACKEND = {"onnxruntime": "onnx", "pytorch": "torchscript", "tensorrt": "tensorrt", "python": "python"}
ARTIFACT_NAMES = {"onnx": "ONNX graph", "torchscript": "TorchScript model", "tensorrt": "TensorRT plan"}


@dataclass(frozen=True)
class Problem:
    path: Path  # the file (or directory) the problem is in
    message: str
    severity: str = "error"  # "error" or "warning"

    def line(self, root: Path) -> str:
        try:
            where = self.path.relative_to(root).as_posix()
        except ValueError:
            where = str(self.path)
        if where in ("", "."):  # the repository itself: named as it was given
            where = str(root)
        return f"{where}: {self.severity}: {self.message}"


@dataclass
class _Model:
    directory: Path
    config: ModelConfig | None
    versions: list[str] = field(default_factory=list)

    @property
    def config_path(self) -> Path:
        return self.directory / CONFIG_FILE

    @property
    def name(self) -> str:
        return self.directory.name if self.config is None else model_config.served_name(self.config, self.directory)


def validate_repository(
    repo: Path,
    *,
    mme: bool = False,
    runtime: RuntimeInfo | None = None,
    load_torchscript: bool = True,
    models: Collection[str] | None = None,
    stub_python: str = STUB_PYTHON,
) -> list[Problem]:
    """Every problem found, in a stable order (errors and warnings; only errors fail a deploy).

    ``runtime``: the TensorRT version and GPU the endpoint runs, to check plans against. With
    ``load_torchscript`` a TorchScript file without our embedded signature is loaded with torch to
    count its forward() arguments. ``models``: check only these model directories (the others are
    read only as far as an ensemble among them needs). ``stub_python``: the Python of the image's
    Python-backend stub, which a packed environment (``EXECUTION_ENV_PATH``) must hold.
    """
    repo = Path(repo)
    if not repo.is_dir():
        return [Problem(repo, "not a directory" if repo.exists() else "no such directory")]
    wrong_folder = layout.model_directory_given(repo)
    if wrong_folder is not None:
        return [Problem(repo, wrong_folder)]
    problems: list[Problem] = []
    loaded = [_load(d, problems) for d in model_directories(repo)]
    if not loaded:
        problems.append(Problem(repo, "no model directories"))
    by_dir = {m.directory.name: m for m in loaded}
    checked = [m for m in loaded if models is None or m.directory.name in models]
    if models is not None:  # a problem of an unchecked model's config is not ours to report
        problems = [p for p in problems if p.path.parent.name in models or p.path.name in models]
    for model in checked:
        _check_model(model, problems, mme=mme, runtime=runtime, load_torchscript=load_torchscript)
        if model.config is not None:
            _check_execution_env(model, stub_python, problems)
    for model in checked:
        if model.config is not None and model_config.is_ensemble(model.config):
            _check_ensemble(model, by_dir, problems)
    if mme:
        _check_unique_names(loaded, problems)
    return problems


def merging(repo: Path, models: Collection[str] | None = None) -> list[tuple[str, row_merging.RowMerging]]:
    """For each model Triton batches (``dynamic_batching``, ``max_batch_size`` ≥ 2, neither decoupled
    nor a sequence), whether the front merges its requests from different clients, and why: the rule
    serve follows (:mod:`smtriton.row_merging`)."""
    found = []
    for directory in model_directories(repo):
        if models is not None and directory.name not in models:
            continue
        try:
            config = model_config.read(directory)
        except (ConfigParseError, OSError):
            continue  # validate_repository reports it
        batches = config.max_batch_size >= 2 and config.HasField("dynamic_batching")
        if not batches or config.HasField("sequence_batching") or config.model_transaction_policy.decoupled:
            continue
        rule = row_merging.row_merging(config.backend, config.platform, _merge_rows_parameter(config))
        found.append((model_config.served_name(config, directory), rule))
    return found


def _merge_rows_parameter(config: ModelConfig) -> str | None:
    entry = config.parameters.get(row_merging.MERGE_ROWS_PARAMETER)
    return None if entry is None else entry.string_value


def errors(problems: Iterable[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]


def _load(directory: Path, problems: list[Problem]) -> _Model:
    path = directory / CONFIG_FILE
    versions = sorted((p.name for p in directory.iterdir() if p.is_dir() and p.name.isdigit()), key=int)
    if not path.is_file():
        problems.append(Problem(path, "missing: every model needs a config.pbtxt (smtriton config writes one)"))
        return _Model(directory, None, versions)
    try:
        config = model_config.read(path)
    except ConfigParseError as exc:
        problems.append(Problem(path, f"does not parse as a Triton ModelConfig: {exc.reason}"))
        return _Model(directory, None, versions)
    return _Model(directory, config, versions)


def _kind(config: ModelConfig) -> str | None:
    if model_config.is_ensemble(config):
        return "ensemble"
    return KIND_OF_BACKEND.get(model_config.backend_of(config))


def _check_model(
    model: _Model, problems: list[Problem], *, mme: bool, runtime: RuntimeInfo | None, load_torchscript: bool
) -> None:
    def add(message: str, path: Path | None = None, severity: str = "error") -> None:
        problems.append(Problem(path or model.config_path, message, severity))

    d = model.directory
    if not MODEL_NAME.match(d.name):
        add(f"model directory name {d.name!r}: use 1-255 letters, digits, '.', '_', '-', starting with a letter "
            "or digit", d)  # fmt: skip
    odd = sorted(p.name for p in d.iterdir() if p.is_dir() and not p.name.isdigit() and not p.name.startswith("."))
    for name in odd:
        add(f"version directories must be numeric; Triton ignores {name!r}", d / name)
    if not model.versions:
        add("no numeric version directory (e.g. 1/): Triton would load nothing", d)
    config = model.config
    if config is None:
        return
    if config.name and config.name != d.name and not mme:
        add(
            f"name {config.name!r} differs from its directory {d.name!r}; Triton refuses it (rename with "
            "`smtriton package --rename`, which rewrites both)"
        )
    if config.platform and config.platform not in PLATFORM_BACKENDS:
        add(f"unknown platform {config.platform!r} (known: {', '.join(PLATFORM_BACKENDS)})")
        return
    if not config.platform and not config.backend:
        add("names neither a platform nor a backend")
        return
    expected_backend = PLATFORM_BACKENDS.get(config.platform)
    if config.platform and config.backend and expected_backend and config.backend != expected_backend:
        add(f"platform {config.platform!r} runs on backend {expected_backend!r}, not {config.backend!r}")
    kind = _kind(config)
    if kind is None:
        add(f"backend {config.backend or config.platform!r}: artifacts not checked by this tool", severity="warning")

    mbs = config.max_batch_size
    if mbs < 0:
        add(f"max_batch_size must be >= 0, not {mbs}")
    if config.HasField("dynamic_batching"):
        if mbs == 0:
            add("dynamic_batching has no effect with max_batch_size 0", severity="warning")
        bad = [s for s in config.dynamic_batching.preferred_batch_size if not 0 < s <= max(mbs, 0)]
        if bad and mbs > 0:
            add(f"preferred_batch_size {bad} exceeds max_batch_size {mbs}")
    _check_io_declarations(config, kind, add)
    try:
        row_merging.declared(_merge_rows_parameter(config))
    except row_merging.BadDeclaration as exc:
        add(f"{exc}; the front does not merge this model's requests")
    if config.version_policy.HasField("specific"):
        for v in config.version_policy.specific.versions:
            if str(v) not in model.versions:
                add(f"version_policy names version {v}, which has no directory")

    if kind in (None, "ensemble"):
        return
    filename = (
        config.default_model_filename
        or DEFAULT_FILENAMES[config.platform if config.platform in DEFAULT_FILENAMES else config.backend]
    )
    for version in model.versions:
        artifact = d / version / filename
        if not artifact.exists():
            label = config.platform or f"backend {config.backend}"
            add(f"missing: {label} loads {version}/{filename}", artifact)
            continue
        _check_artifact(kind, artifact, config, add, runtime, load_torchscript)


def _check_io_declarations(config: ModelConfig, kind: str | None, add: Any) -> None:
    for what, tensors in (("input", config.input), ("output", config.output)):
        if not tensors:
            if kind in ("onnx", "tensorrt"):
                add(f"declares no {what}s; Triton may auto-complete them, but nothing is checked", severity="warning")
            else:
                add(f"declares no {what}s")
        seen: set[str] = set()
        for t in tensors:
            if t.name in seen:
                add(f"{what} {t.name!r} is declared twice")
            seen.add(t.name)
            if model_config.data_type_name(t.data_type) == "TYPE_INVALID":
                add(f"{what} {t.name!r} has no data_type")
            if not t.dims and not t.HasField("reshape"):
                add(f"{what} {t.name!r} has no dims")
            if any(x == 0 or x < -1 for x in t.dims):
                add(f"{what} {t.name!r}: dims {list(t.dims)} may only hold positive sizes or -1")


def _check_artifact(
    kind: str,
    artifact: Path,
    config: ModelConfig,
    add: Any,
    runtime: RuntimeInfo | None,
    load_torchscript: bool,
) -> None:
    rel = f"{artifact.parent.name}/{artifact.name}"
    signature: Signature | None = None
    try:
        if kind == "onnx":
            signature = onnx_signature(artifact)
            for location in onnx_external_data(artifact):
                if not (artifact.parent / location).is_file():
                    add(f"missing: external weights {location} that {rel} refers to", artifact.parent / location)
        elif kind == "torchscript":
            signature = torchscript_signature(artifact)
            if signature is None and load_torchscript:
                _check_torchscript_arity(artifact, config, add)
        elif kind == "tensorrt":
            signature = _check_plan(artifact, config, add, runtime)
        elif kind == "python":
            _check_python_model(artifact, add)
    except SignatureError as exc:
        add(f"{rel}: {exc}", artifact)
        return
    if signature is not None:
        _compare_io(config, signature, f"{ARTIFACT_NAMES[kind]} {rel}", add)


def _check_plan(artifact: Path, config: ModelConfig, add: Any, runtime: RuntimeInfo | None) -> Any:
    rel = f"{artifact.parent.name}/{artifact.name}"
    try:
        sidecar = read_sidecar(artifact)
    except SidecarError as exc:
        add(f"sidecar of {rel}: {exc}", artifact)
        return None
    if sidecar is None:
        add(f"{rel} has no sidecar ({artifact.name}.json): its TensorRT version and GPU cannot be checked",
            artifact, "warning")  # fmt: skip
        return None
    if sidecar.plan_sha256 != sha256_file(artifact):
        add(f"sidecar {artifact.name}.json describes another plan (sha256 differs); rebuild or rewrite it", artifact)
    if runtime is not None:
        for message in check_compatibility(sidecar, runtime):
            add(f"{rel}: {message}", artifact)
    if config.max_batch_size > 0:
        for name, limit in sorted(profile_batch_limits(sidecar).items()):
            if limit < config.max_batch_size:
                add(
                    f"max_batch_size {config.max_batch_size} exceeds what the plan's profiles accept for "
                    f"input {name!r} (batch up to {limit})"
                )
    _check_profiles(sidecar, config, add, rel, artifact)
    return Signature.from_dict({"inputs": sidecar.inputs, "outputs": sidecar.outputs}, "TensorRT sidecar")


def _spans(sizes: Iterable[tuple[int, int]]) -> str:
    return " or ".join(f"{low}..{high}" for low, high in sorted(set(sizes)))


def _check_profiles(sidecar: Any, config: ModelConfig, add: Any, rel: str, artifact: Path) -> None:
    """Every dimension of every optimization profile: well formed, the same bounds for inputs that
    share an axis, a fixed config dimension inside them, and the sizes a dynamic (-1) one really takes.

    A plan accepts only the sizes its profiles span, whatever the config says; Triton passes a request
    past them on to TensorRT, which fails it at run time."""
    shapes = {t["name"]: list(t["shape"]) for t in sidecar.inputs}
    spans: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)  # (input, dim) -> per profile
    for number, profile in enumerate(sidecar.profiles):
        by_axis: dict[str, tuple[str, int, int]] = {}
        for name, ranges in profile.items():
            low, opt, high = (list(ranges.get(k, [])) for k in ("min", "opt", "max"))
            shape = shapes.get(name)
            if shape is None or not len(low) == len(opt) == len(high) == len(shape):
                add(f"{rel}: profile {number} gives input {name!r} shapes that do not fit its signature", artifact)
                continue
            for dim, (a, b, c, declared) in enumerate(zip(low, opt, high, shape, strict=True)):
                if not 0 < a <= b <= c or (isinstance(declared, int) and declared >= 0 and not a == c == declared):
                    add(f"{rel}: profile {number}, input {name!r} dimension {dim}: {a}:{b}:{c} is not a valid "
                        f"range for {declared}", artifact)  # fmt: skip
                    continue
                spans[(name, dim)].append((a, c))
                if isinstance(declared, str):
                    other = by_axis.setdefault(declared, (name, a, c))
                    if other[1:] != (a, c):
                        add(f"{rel}: profile {number} spans axis {declared!r} {other[1]}..{other[2]} for input "
                            f"{other[0]!r} but {a}..{c} for input {name!r}; requests beyond the smaller fail",
                            artifact)  # fmt: skip
    batch = 1 if config.max_batch_size > 0 else 0
    bounded: list[str] = []
    for io in config.input:
        for index, size in enumerate(io.dims):
            found = spans.get((io.name, index + batch))
            if not found:
                continue
            if size > 0 and not any(low <= size <= high for low, high in found):
                add(f"input {io.name!r}: config dimension {index} is {size}, the plan's profiles accept "
                    f"{_spans(found)} there")  # fmt: skip
            elif size == -1:
                bounded.append(f"input {io.name!r} dimension {index}: {_spans(found)}")
        if batch and any(low > 1 for low, _ in spans.get((io.name, 0), [])):
            lowest = min(low for low, _ in spans[(io.name, 0)])
            add(f"input {io.name!r}: the plan's profiles accept batches from {lowest}, Triton sends smaller ones")
    if bounded:
        add(f"{rel} accepts only these sizes where the config has -1 (its optimization profiles; a request "
            f"outside fails at run time): {'; '.join(bounded)}", artifact, "warning")  # fmt: skip


def _check_torchscript_arity(artifact: Path, config: ModelConfig, add: Any) -> None:
    """Without a stored signature, at least the number of forward() arguments can be checked."""
    try:
        import torch
    except ImportError:  # pragma: no cover - validation without torch
        return
    try:
        module = torch.jit.load(str(artifact), map_location="cpu")
        arguments = module.forward.schema.arguments[1:]  # without self
    except Exception as exc:
        add(f"{artifact.parent.name}/{artifact.name} is not a loadable TorchScript file: {exc}", artifact)
        return
    if len(arguments) == 1 and "Dict" in str(arguments[0].type):
        return
    if len(arguments) != len(config.input):
        add(
            f"config declares {len(config.input)} inputs, forward() of {artifact.parent.name}/{artifact.name} "
            f"takes {len(arguments)} ({', '.join(a.name for a in arguments)})"
        )


def _check_python_model(artifact: Path, add: Any) -> None:
    try:
        tree = ast.parse(artifact.read_text(encoding="utf-8"), str(artifact))
    except (SyntaxError, UnicodeDecodeError) as exc:
        add(f"does not parse as Python: {exc}", artifact)
        return
    if not any(isinstance(n, ast.ClassDef) and n.name == "TritonPythonModel" for n in tree.body):
        add("defines no class TritonPythonModel, which the Python backend instantiates", artifact)


def _check_execution_env(model: _Model, stub_python: str, problems: list[Problem]) -> None:
    """A Python model's packed environment (``EXECUTION_ENV_PATH``, made with conda-pack): inside the model
    directory, so it travels with the archive; an environment (``bin/activate``); the stub's Python."""
    assert model.config is not None
    parameter = model.config.parameters.get(EXECUTION_ENV)
    if parameter is None or not parameter.string_value:
        return
    value = parameter.string_value
    path = Path(value.replace(MODEL_DIRECTORY_VARIABLE, str(model.directory)))
    if not path.resolve().is_relative_to(model.directory.resolve()):
        problems.append(Problem(model.config_path, (
            f"{EXECUTION_ENV} {value!r} lies outside the model directory: put the environment in it and write "
            f"{MODEL_DIRECTORY_VARIABLE}/<file>.tar.gz, so that it travels with the model archive"
        )))  # fmt: skip
        return
    if not path.exists():
        problems.append(Problem(path, f"missing: {EXECUTION_ENV} names it (pack the environment with conda-pack)"))
        return
    try:
        activate, pythons = _environment_contents(path)
    except Unreadable as exc:
        problems.append(Problem(path, f"the packed environment {exc}"))
        return
    if not activate:
        problems.append(Problem(path, "not a packed environment: it has no bin/activate (pack it with conda-pack)"))
    if pythons and stub_python not in pythons:
        problems.append(Problem(path, (
            f"holds Python {', '.join(sorted(pythons))}; the Python backend's stub in the image runs {stub_python} "
            f"and loads no other (make the environment with python={stub_python}, or pass --stub-python for an "
            "image with another: 3.11 for the cpu image)"
        )))  # fmt: skip


def _archive_names(path: Path) -> Iterator[str]:
    """Every member's name of a tar archive, gzip-compressed or not (what the Python backend reads), read
    as a stream by :mod:`smtriton.repo.tarstream` within ``ENV_MAX_BYTES`` and ``ENV_MAX_MEMBERS``, and
    then to its end (a cut or damaged file is found). Raises Unreadable saying what is wrong."""
    if not path.is_file():
        raise Unreadable("is neither a file nor a directory")
    try:
        with open_tar(path, ENV_MAX_BYTES, plain=True) as tar:
            for count, member in enumerate(tar.members(), 1):
                if count > ENV_MAX_MEMBERS:
                    raise Unreadable(f"has more than {ENV_MAX_MEMBERS} members, the most validate reads of one")
                yield member.name
            tar.finish()
    except Overflow:
        most = f"{ENV_MAX_BYTES / (1 << 30):.4g} GiB" if ENV_MAX_BYTES >= 1 << 30 else f"{ENV_MAX_BYTES >> 20} MiB"
        raise Unreadable(
            f"inflates to more than {most} (its tar headers and padding included), the most validate reads of one"
        ) from None
    except OSError as exc:
        raise Unreadable(f"cannot be read: {exc.strerror or exc}") from None


def _environment_contents(path: Path) -> tuple[bool, set[str]]:
    """(whether it has bin/activate, the Python versions of its lib/pythonX.Y) of a packed environment:
    a directory, or a tar archive read as a stream (an environment is hundreds of MB)."""
    names: Iterable[str]
    if path.is_dir():
        names = [str(p.relative_to(path)) for p in (path / "bin").glob("activate")]
        names += [str(p.relative_to(path)) + "/" for p in (path / "lib").glob("python3.*") if p.is_dir()]
    else:
        names = _archive_names(path)
    pythons = set()
    activate = False
    for name in names:
        parts = [part for part in name.split("/") if part not in ("", ".")]
        activate = activate or parts == ["bin", "activate"]
        if len(parts) >= 2 and parts[0] == "lib" and re.fullmatch(r"python3\.\d+", parts[1]):
            pythons.add(parts[1].removeprefix("python"))
    return activate, pythons


def _compare_io(config: ModelConfig, signature: Signature, what: str, add: Any) -> None:
    mbs = config.max_batch_size
    pairs = (("input", config.input, signature.inputs), ("output", config.output, signature.outputs))
    for kind, declared, actual in pairs:
        by_name = {t.name: t for t in actual}
        names = ", ".join(t.name for t in actual) or "none"
        for io in declared:
            sig = by_name.get(io.name)
            if sig is None:
                add(f"{kind} {io.name!r} is not an {kind} of the {what} ({kind}s: {names})")
                continue
            type_name = model_config.data_type_name(io.data_type)
            if type_name != dtypes.config_type(sig.dtype):
                add(f"{kind} {io.name!r}: config data_type {type_name}, the {what} has {dtypes.config_type(sig.dtype)}")
            dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
            _compare_dims(kind, io.name, dims, sig, mbs, what, add)
        if kind == "input":
            missing = [t.name for t in actual if t.name not in {io.name for io in declared}]
            if missing:
                add(f"the {what} needs input(s) {', '.join(missing)}, which the config does not declare")


def _shape_text(sig: TensorSig) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in sig.shape) + "]"


def _compare_dims(kind: str, name: str, dims: Sequence[int], sig: TensorSig, mbs: int, what: str, add: Any) -> None:
    shape = list(sig.shape)
    if mbs > 0:
        if not shape or not sig.is_dynamic(0):
            add(
                f"{kind} {name!r}: max_batch_size {mbs} but the {what}'s first dimension is "
                f"{'missing' if not shape else f'fixed ({shape[0]})'}, shape {_shape_text(sig)}: Triton cannot batch "
                "it (set max_batch_size: 0 and state the full shape)"
            )
            return
        shape = shape[1:]
    if len(dims) != len(shape):
        hint = " (with max_batch_size > 0 leave the batch dimension out of dims)" if mbs > 0 else ""
        add(
            f"{kind} {name!r}: config dims {list(dims)} have rank {len(dims)}, the {what} has rank {len(shape)} "
            f"(shape {_shape_text(sig)}){hint}"
        )
        return
    for i, (want, have) in enumerate(zip(dims, shape, strict=True)):
        if isinstance(have, int) and have >= 0 and want != have:
            add(f"{kind} {name!r}: config dims {list(dims)} differ from the {what}'s shape {_shape_text(sig)} "
                f"at dimension {i}")  # fmt: skip
            return


def _check_ensemble(model: _Model, by_dir: dict[str, _Model], problems: list[Problem]) -> None:
    """The repository's side (step models and versions exist); the graph and the tensors are the
    shared ensemble model's (:func:`smtriton.repo.ensemble.check`)."""
    config = model.config
    assert config is not None

    def add(message: str) -> None:
        problems.append(Problem(model.config_path, message))

    for number, step in enumerate(config.ensemble_scheduling.step, 1):
        member = by_dir.get(step.model_name)
        where = f"ensemble {ensemble.step_label(number, step)}"
        if step.model_name and member is None:
            add(f"{where}: references model {step.model_name!r}, which is not in the repository")
        elif member is not None and str(step.model_version) not in ("-1", "0", *member.versions):
            add(f"{where}: references version {step.model_version}, which {step.model_name} does not have")
    members = {name: by_dir[name].config for name in ensemble.step_models(config) if name in by_dir}
    for message in ensemble.check(config, members):
        add(message)


def _check_unique_names(models: Sequence[_Model], problems: list[Problem]) -> None:
    """An MME serves every archive under its own name; two that claim one name (ignoring case, as
    archive file names on many file systems do) collide."""
    groups: dict[str, list[_Model]] = defaultdict(list)
    for model in models:
        groups[model.name.lower()].append(model)
    for group in groups.values():
        if len(group) < 2:
            continue
        for model in group:
            others = ", ".join(f"{m.directory.name}/{CONFIG_FILE}" for m in group if m is not model)
            problems.append(Problem(model.config_path, f"duplicate model name {model.name!r} (also in {others})"))
