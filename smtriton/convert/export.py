"""The exporter interface: one implementation per artifact format (``export_onnx``,
``export_torchscript``), chosen by the recipe's ``format`` in :func:`smtriton.convert.runners.exporter_for`.

Kept narrow (export a module, load the artifact back as a numpy runner) so that new formats, such as
an AOTInductor ``model.pt2`` beside TorchScript, plug in with one line in that dispatcher and no change
to the build steps or the parity check. This module imports none of them, so none imports it back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from smtriton.convert.recipe import ModelSpec, TensorSpec
from smtriton.errors import ToolError

if TYPE_CHECKING:
    import torch

Runner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


class ExportError(ToolError, RuntimeError):
    """The exported artifact does not match the recipe (names, dtypes) or the exporter failed."""


class Exporter(Protocol):
    format: str  # the recipe's `format`
    filename: str  # the backend's default_model_filename, inside <model>/<version>/

    def export(
        self,
        module: torch.nn.Module,
        spec: ModelSpec,
        outputs: Sequence[TensorSpec],
        example: Mapping[str, np.ndarray],
        path: Path,
    ) -> None:
        """Write the artifact for ``module`` to ``path``, tracing with ``example`` inputs."""
        ...

    def load(self, spec: ModelSpec, outputs: Sequence[TensorSpec], path: Path) -> Runner:
        """Load the artifact the way its Triton backend would and return a name -> array runner."""
        ...


# Loggers whose warnings during an export say nothing about its result: transformers warns about
# training-only attributes tracing reads (``loss_type``); the torch.export-based ONNX exporter about
# the opset it exports at before converting down, and about torchvision ops it skips.
QUIET_DURING_EXPORT = ("transformers", "torch.onnx", "onnxscript")


@contextmanager
def quiet_tracing_logs() -> Iterator[None]:
    """Hold back the warnings of :data:`QUIET_DURING_EXPORT` meanwhile (errors still show): the
    parity check after the export is what tells whether it worked."""
    loggers = [logging.getLogger(name) for name in QUIET_DURING_EXPORT]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
