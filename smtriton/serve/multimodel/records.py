"""What a multi-model load decided, one record per model: the registry in the main process keeps
them, and every front worker invokes models through its copy (docs/design.md §3)."""

from __future__ import annotations

import dataclasses
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
    estimate: int = 0  # bytes the load was estimated to need (archive size x factor)
    loaded_at: float = field(default_factory=time.time)

    def to_wire(self) -> dict[str, Any]:
        """The record as the main process sends it to the front workers."""
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, fields: dict[str, Any]) -> ModelRecord:
        return cls(**fields)

    def describe(self) -> dict[str, str]:
        return {"modelName": self.model_name, "modelUrl": self.url}

    def check_target(self, target_model: str | None) -> None:
        """A request's X-Amzn-SageMaker-Target-Model, when sent, must name this model: as it was at load
        time, or by its model_name when the load came without the header (one rule either way)."""
        expected = self.target_model if self.target_model is not None else self.model_name
        if target_model is not None and target_model != expected:
            raise BadRequest("X-Amzn-SageMaker-Target-Model header does not match the model requested in the URL")
