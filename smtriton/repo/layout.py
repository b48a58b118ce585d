"""Which of the two folders Triton knows a path is: a model repository (one directory per model) or a
model directory (``config.pbtxt`` and numeric version folders), and the one message for each given
where the other is expected, so that every command answers that mistake in the same words.

Light on purpose (no protobuf): the local endpoint checks its ``--model-data`` with it before anything
heavy is imported.
"""

from __future__ import annotations

from pathlib import Path

from smtriton.errors import ToolUsageError

CONFIG_FILE = "config.pbtxt"  # the name smtriton.model_config reads and writes


class LayoutError(ToolUsageError, ValueError):
    """A model directory where a repository is expected, or the other way round."""


def model_directories(repository: Path) -> list[Path]:
    """The model directories of a repository: its sub-directories, sorted, hidden ones excepted."""
    return sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))


def model_names(repository: Path) -> list[str]:
    """The names of :func:`model_directories`."""
    return [p.name for p in model_directories(repository)]


def is_model_directory(path: Path) -> bool:
    """A folder holding a config.pbtxt, or numeric version folders (a model converted with --no-config)."""
    return path.is_dir() and ((path / CONFIG_FILE).is_file() or any(p.name.isdigit() for p in model_directories(path)))


def model_directory_given(path: Path, label: str | None = None) -> str | None:
    """The message when ``path``, given where a repository is expected, is a model directory; else None.

    ``label`` names what the user gave when ``path`` is where it was extracted to (an archive)."""
    if not is_model_directory(path):
        return None
    if label is not None:
        return (
            f"{label} holds a model directory at its root ({CONFIG_FILE}, version folders), not a model "
            "repository (one directory per model): pack the model's folder, e.g. `tar czf model.tar.gz -C "
            "REPOSITORY MODEL`, or `smtriton package sme REPOSITORY`"
        )
    return (
        f"{path} is a model directory ({CONFIG_FILE}, version folders), not a model repository (one directory "
        f"per model): give its parent, {path.resolve().parent}"
    )


def repository_given(path: Path) -> str | None:
    """The message when ``path``, given where a model directory is expected, is a repository; else None."""
    if is_model_directory(path):
        return None
    models = [name for name in model_names(path) if is_model_directory(path / name)]
    if not models:
        return None
    return (
        f"{path} is a model repository (models: {', '.join(models)}), not a model directory: give one of its "
        f"models, e.g. {path / models[0]}"
    )


def require_repository(path: Path, label: str | None = None) -> None:
    """Refuse a model directory given where a repository is expected (:func:`model_directory_given`)."""
    message = model_directory_given(path, label)
    if message is not None:
        raise LayoutError(message)


def require_model_directory(path: Path) -> None:
    """Refuse a repository given where a model directory is expected (:func:`repository_given`)."""
    message = repository_given(path)
    if message is not None:
        raise LayoutError(message)
