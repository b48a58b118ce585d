"""An archive's models staged in the managed repository, and Triton's refusals told in the caller's terms
(docs/design.md §3).

Each model directory becomes a directory of the managed repository named by its Triton name, holding a
real ``config.pbtxt`` (parsed, renamed, ensemble steps re-pointed, written back through Triton's
ModelConfig protobuf) and symlinks to everything else. The folders of an archive other than its entry
get names of their own (``<Triton name>~<folder>``), so no two archives meet in Triton's one
namespace. A Python model calls another by the name in its code (BLS), which is the folder's: so the
version folders of each Python model of such an archive are staged as real folders of symlinks with an
``__init__.py`` of ours, which Python runs before the model's own file, and which has a BLS request
that names a folder of the archive go to that folder's model.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from smtriton import model_config
from smtriton.model_config import CONFIG_FILE, ConfigParseError
from smtriton.serve.errors import BadRequest, Conflict
from smtriton.serve.multimodel.records import ModelRecord

BLS_NAMES = '''"""Written by smtriton's serve: a BLS request that names a folder of this model's archive goes to
the model staged for that folder (docs/design.md §3). Runs before the model's own file is imported."""

import sys

_NAMES = {names!r}


def _named(original):
    class InferenceRequest(original):
        def __init__(self, *args, **kwargs):
            if "model_name" in kwargs:
                kwargs["model_name"] = _NAMES.get(kwargs["model_name"], kwargs["model_name"])
            elif args:
                args = (_NAMES.get(args[0], args[0]), *args[1:])
            super().__init__(*args, **kwargs)

    InferenceRequest.__name__ = InferenceRequest.__qualname__ = original.__name__
    return InferenceRequest


try:
    import c_python_backend_utils as _backend
except ImportError:
    _backend = None
if _backend is not None and not getattr(_backend.InferenceRequest, "_smtriton", False):
    _backend.InferenceRequest = _named(_backend.InferenceRequest)
    _backend.InferenceRequest._smtriton = True
_utils = sys.modules.get("triton_python_backend_utils")
if _utils is not None and _backend is not None and hasattr(_utils, "InferenceRequest"):
    _utils.InferenceRequest = _backend.InferenceRequest
del _named, _backend, _utils
'''
_RUN_THEIRS = """
with open({path!r}) as _theirs:
    exec(compile(_theirs.read(), {path!r}, "exec"))
"""


def stage_model(source: Path, triton_name: str, renames: Mapping[str, str], managed: Path) -> Path:
    """Stage one model directory in the managed repository under ``triton_name``; ``renames`` (each folder
    of a multi-folder archive -> its Triton name) re-points ensemble steps and BLS requests."""
    try:
        config = model_config.read(source)
    except ConfigParseError as exc:
        raise BadRequest(f"{source.name}/{CONFIG_FILE} does not parse: {exc.reason}") from None
    model_config.rename(config, triton_name, renames)
    target = managed / triton_name
    if target.exists() or target.is_symlink():
        raise Conflict(f"failed to register '{triton_name}', there is a conflicting mapping for '{triton_name}'")
    target.mkdir()
    model_config.write(config, target)
    calls_by_name = bool(renames) and model_config.backend_of(config) == "python"
    for item in source.iterdir():
        if item.name == CONFIG_FILE:
            continue
        if calls_by_name and item.is_dir() and item.name.isdigit():
            _stage_version(item, target / item.name, renames)
        else:
            (target / item.name).symlink_to(item.resolve(), target_is_directory=item.is_dir())
    return target


def _stage_version(source: Path, target: Path, renames: Mapping[str, str]) -> None:
    """A Python model's version folder: symlinks to its files, and our ``__init__.py`` (then theirs)."""
    target.mkdir()
    init = BLS_NAMES.format(names=dict(renames))
    for item in source.iterdir():
        if item.name == "__init__.py":
            init += _RUN_THEIRS.format(path=str(item.resolve()))
        else:
            (target / item.name).symlink_to(item.resolve(), target_is_directory=item.is_dir())
    (target / "__init__.py").write_text(init)


def remove_staged(managed: Path, names: Iterable[str]) -> None:
    for name in names:
        shutil.rmtree(managed / name, ignore_errors=True)


# What the cause says before it says something: Triton's state line, the status, the exception class of
# the Python-based backends, and the backends' own restatement of the model's (Triton) name.
_PREAMBLE = re.compile(
    r"^(?:.*?version \d+ is at UNAVAILABLE state: )?"
    r"(?:Internal: )?(?:ModelLoadError: )?(?:unable to load model '[^']*'[:,] )?",
    re.DOTALL,
)


def load_failure(name: str, message: str, record: ModelRecord | None = None) -> str:
    """Triton's refusal to load a model, in the caller's terms: the model's name as the caller gave it,
    the cause in one line (a Python traceback left out), and (``record``: an archive's load) the files
    named by their path inside the archive, never by serve's staging path."""
    cause = _PREAMBLE.sub("", message).split("\n\nAt:", 1)[0]
    if record is not None:
        cause = record.in_callers_terms(cause)
    cause = " ".join(cause.split()).rstrip(" ;")
    return f"model '{name}' failed to load: {cause or 'Triton gave no reason'}"
