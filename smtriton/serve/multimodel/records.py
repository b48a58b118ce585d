"""What a multi-model load decided, one record per model: the registry in the main process keeps
them, and every front worker invokes models through its copy (docs/design.md §3)."""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from typing import Any

from smtriton.serve.errors import BadRequest


@dataclass
class ModelRecord:
    """What a load decided; every later request on ``model_name`` resolves through this."""

    model_name: str
    url: str  # as the model list shows it (:func:`listed_url`)
    target_model: str | None
    triton_name: str  # the entry model Triton serves
    triton_names: list[str]  # every Triton model staged for this archive, entry last
    response_name: str  # "model_name" clients see in inference responses
    decoupled: bool = False  # the entry model streams its responses
    estimate: int = 0  # bytes the load was estimated to need (its files' blocks on disk x factor)
    loaded_at: float = field(default_factory=time.time)
    # Each staged Triton model -> its folder inside the archive ("" for an archive that is one model),
    # and where Triton and the archive lie, so that Triton's messages can name files as the caller
    # knows them (:meth:`in_callers_terms`).
    folders: dict[str, str] = field(default_factory=dict)
    staged_root: str = ""  # the managed repository
    source_root: str = ""  # the url, resolved

    def to_wire(self) -> dict[str, Any]:
        """The record as the main process sends it to the front workers."""
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, fields: dict[str, Any]) -> ModelRecord:
        return cls(**fields)

    def in_callers_terms(self, text: str) -> str:
        """``text`` (Triton's words about this archive's models) with serve's staging paths and the
        resolved url replaced by paths inside the archive, and the Triton names of its models by the
        caller's: the model's own name for its entry, the folder's name for the others."""
        for triton_name in sorted(self.folders, key=len, reverse=True):
            folder = self.folders[triton_name]
            if self.staged_root:
                text = _replace_path(text, f"{self.staged_root}/{triton_name}", folder)
            shown = self.response_name if triton_name == self.triton_name else folder
            if shown != triton_name:  # the model, or one of its instances ('<name>_<group>_<index>')
                text = re.sub(rf"'{re.escape(triton_name)}(?:_\d+)*'", f"'{_literal(shown)}'", text)
        if self.source_root:
            text = _replace_path(text, self.source_root, "")
        return text

    def describe(self) -> dict[str, str]:
        return {"modelName": self.model_name, "modelUrl": self.url}

    def check_target(self, target_model: str | None) -> None:
        """A request's X-Amzn-SageMaker-Target-Model, when sent, must name this model: as it was at load
        time, or by its model_name when the load came without the header (one rule either way)."""
        expected = self.target_model if self.target_model is not None else self.model_name
        if target_model is not None and target_model != expected:
            raise BadRequest("X-Amzn-SageMaker-Target-Model header does not match the model requested in the URL")


def _literal(text: str) -> str:
    """``text`` as a replacement :func:`re.sub` inserts as it is."""
    return text.replace("\\", "\\\\")


def _replace_path(text: str, absolute: str, inside: str) -> str:
    """``absolute`` (a folder) and the paths under it, as ``inside`` and the paths under that ("" is the
    archive's root: paths under it lose the prefix)."""
    text = text.replace(f"{absolute}/", f"{inside}/" if inside else "")
    return text.replace(absolute, inside or ".")
