"""Which model directories an archive holds, and which of them is its entry (docs/contract.md §4.2)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from smtriton import model_config
from smtriton.model_config import CONFIG_FILE, ConfigParseError
from smtriton.serve.errors import BadRequest
from smtriton.serve.multimodel.names import utf8_folder


@dataclass(frozen=True)
class ArchiveLayout:
    """Model directories of one archive and the entry among them (docs/contract.md §4.2)."""

    entry: Path
    others: tuple[Path, ...]
    ensemble: bool


def find_layout(root: Path, target_model: str | None) -> ArchiveLayout:
    if (root / CONFIG_FILE).is_file():
        return ArchiveLayout(entry=root, others=(), ensemble=False)
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and (p / CONFIG_FILE).is_file())
    for folder in dirs:
        utf8_folder(folder.name)
    if not dirs:
        raise BadRequest(f"failed to register '{root.name}', repository not found: no config.pbtxt in the archive")
    if len(dirs) == 1:
        return ArchiveLayout(entry=dirs[0], others=(), ensemble=False)
    ensembles = [d for d in dirs if _is_ensemble(d)]
    if len(ensembles) == 1:
        return ArchiveLayout(ensembles[0], tuple(d for d in dirs if d != ensembles[0]), ensemble=True)
    by_name = {d.name: d for d in dirs}
    stem = (target_model or "").rsplit("/", 1)[-1].removesuffix(".tar.gz")
    choice = by_name.get(stem)
    if choice is None and (root / "sagemaker_entry").is_file():
        choice = by_name.get((root / "sagemaker_entry").read_text().strip())
    if choice is None:
        raise BadRequest(f"ambiguous model archive: {', '.join(sorted(by_name))}")
    return ArchiveLayout(choice, tuple(d for d in dirs if d != choice), ensemble=False)


def _is_ensemble(model_dir: Path) -> bool:
    """A config that does not parse is no ensemble here: staging the model reports it."""
    try:
        return model_config.is_ensemble(model_config.read(model_dir))
    except ConfigParseError:
        return False
