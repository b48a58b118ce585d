"""Which models' requests may merge, read from Triton's configuration of each (:class:`ModelBatching`).

Why merge: behind a front, Triton pays per HTTP request — it parses the request, schedules it and writes
its answer — and a dynamic batcher fed one small request at a time forms small batches. Requests a
worker holds for the same model at the same moment, merged along the batch dimension, cost Triton
one request and one execution (:mod:`~smtriton.serve.dataplane.batching.coalescing` decides when; a
batch transform body of several records can use the same merge).

Only where the answer cannot change (:func:`model_batching`): the model's rows are answered each on its
own (its backend runs a batch as one concatenated tensor, or its config declares it:
:mod:`smtriton.row_merging`); it has ``dynamic_batching`` and ``max_batch_size`` ≥ 2, is not decoupled,
has no sequence batcher and no ragged inputs (Triton's batches of those are no plain concatenation
along the batch dimension). Which requests of such a model merge is
:mod:`~smtriton.serve.dataplane.batching.mergeable`'s to say.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from smtriton.row_merging import RowMerging, config_parameter, row_merging

_INTEGER = re.compile(r"-?[0-9]{1,18}\Z")


@dataclass(frozen=True, slots=True)
class ModelBatching:
    """What Triton's configuration of a model says about merging its requests."""

    max_batch_size: int
    instances: int
    # Each output's dims after the batch dimension, as the configuration declares them (-1: any size).
    # An answer is split only where each output has its declared rank and sizes: the first dimension
    # is then the batch. None: not known (the rows are then checked by count alone).
    outputs: tuple[tuple[str, tuple[int, ...]], ...] | None = None


def model_batching(config: dict[str, Any]) -> ModelBatching | None:
    """How a model's requests may be merged, from its configuration as Triton completed it; None when
    they may not: Triton would not batch them itself, or a row's answer may depend on its batch."""
    max_batch = config.get("max_batch_size")
    if type(max_batch) is not int or max_batch < 2 or not isinstance(config.get("dynamic_batching"), dict):
        return None  # (a batch of one row merges with nothing)
    if isinstance(config.get("sequence_batching"), dict) or config.get("batch_input") or config.get("batch_output"):
        return None
    inputs = config.get("input")
    if any(isinstance(spec, dict) and spec.get("allow_ragged_batch") for spec in inputs or []):
        return None
    policy = config.get("model_transaction_policy")
    if isinstance(policy, dict) and policy.get("decoupled"):
        return None
    if not row_merging_of(config).allowed:
        return None
    return ModelBatching(max_batch, _instances(config.get("instance_group")), _output_dims(config.get("output")))


def row_merging_of(config: dict[str, Any]) -> RowMerging:
    """The rule of :mod:`smtriton.row_merging` for a configuration as Triton gives it in JSON."""
    backend, platform = config.get("backend"), config.get("platform")
    return row_merging(
        backend if isinstance(backend, str) else "",
        platform if isinstance(platform, str) else "",
        config_parameter(config.get("parameters")),
    )


def _output_dims(outputs: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    declared = []
    for spec in outputs if isinstance(outputs, list) else []:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            continue
        dims = spec.get("dims")
        # (protobuf's JSON may write an int64 as text)
        if isinstance(dims, list) and all(type(d) is int or (isinstance(d, str) and _INTEGER.match(d)) for d in dims):
            declared.append((spec["name"], tuple(int(d) for d in dims)))
    return tuple(declared)


def _instances(groups: Any) -> int:
    total = 0
    for group in groups if isinstance(groups, list) else []:
        if isinstance(group, dict):
            count = group.get("count", 1)
            gpus = group.get("gpus")
            devices = len(gpus) if isinstance(gpus, list) and gpus else 1  # the count is per GPU listed
            total += (count if type(count) is int and count > 0 else 1) * devices
    return max(1, total)
