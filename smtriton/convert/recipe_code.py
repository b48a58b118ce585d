"""The code a recipe names, found and imported beside the recipe: a model's factory, a Python-backend
source, a samples function (each as ``package.module:function`` or a path relative to the recipe)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from smtriton.convert.recipe import ModelSpec, RecipeError


@contextmanager
def _importable_from(base_dir: Path) -> Iterator[None]:
    """Let factories live beside the recipe (``my_models:build``) without installing them."""
    entry = str(base_dir)
    added = entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        if added:
            sys.path.remove(entry)


def module_file(module: str, base_dir: Path) -> Path:
    """The source file of ``module`` without executing it (its parent packages are imported)."""
    with _importable_from(base_dir):
        found = importlib.util.find_spec(module)
    if found is None or not found.origin or not found.has_location:
        raise RecipeError(f"cannot find module {module!r}")
    return Path(found.origin)


def factory_file(spec: ModelSpec) -> Path:
    assert spec.factory is not None
    return module_file(spec.factory.split(":", 1)[0], spec.base_dir)


def source_file(spec: ModelSpec) -> Path:
    """The Python-backend ``model.py`` to copy: a path relative to the recipe or a module name."""
    assert spec.source is not None
    if spec.source.endswith(".py"):
        path = spec.base_dir / spec.source
        if not path.is_file():
            raise RecipeError(f"model {spec.name!r}: source {path} not found")
        return path
    return module_file(spec.source, spec.base_dir)


def import_factory(spec: ModelSpec) -> Callable[[], Any]:
    assert spec.factory is not None
    return import_function(spec, spec.factory, "factory")


def samples_file(spec: ModelSpec) -> Path:
    assert spec.samples is not None
    return module_file(spec.samples.split(":", 1)[0], spec.base_dir)


def import_function(spec: ModelSpec, reference: str, what: str) -> Callable[..., Any]:
    """The callable ``package.module:function`` names, imported beside the recipe first."""
    module_name, attr = reference.split(":", 1)
    with _importable_from(spec.base_dir):
        module = importlib.import_module(module_name)
    try:
        function = getattr(module, attr)
    except AttributeError:
        raise RecipeError(f"model {spec.name!r}: {module_name} has no {attr!r}") from None
    if not callable(function):
        raise RecipeError(f"model {spec.name!r}: {what} {reference} is not callable")
    return function
