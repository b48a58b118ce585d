"""An ensemble (``platform: "ensemble"``) as a graph of tensors between steps: the one model of it that
repository validation, the recipe builder and packaging share.

A tensor of an ensemble has one source, an ensemble input or one step's output, and is read by steps
(through their ``input_map``) or returned as an ensemble output. :func:`check` applies Triton's rules to
that graph before Triton sees it, from the configs alone:

- every step names a model and maps inputs and outputs; the keys are that model's own inputs and
  outputs, and every input the model needs (not ``optional``) is mapped;
- every tensor a step reads has a source, and only one; a step does not write an ensemble input;
- a tensor agrees with its source in data type and shape: fixed dims must be equal, -1 matches any
  size, and as in Triton the dims may also agree once a batching side's batch dimension is put in
  front (a tensor may pass between a batching and a non-batching model);
- every ensemble input is read by a step, every ensemble output is written by one, and every step
  output is read by another step or returned (no dangling tensor);
- the steps form no cycle, and the ensemble's ``max_batch_size`` is at most each step model's.

Each problem is one line naming the step and the tensor. Imports only the ModelConfig protobuf.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from smtriton import model_config
from smtriton.model_config import ModelConfig

Members = Mapping[str, "ModelConfig | None"]  # step model name -> its config (None: unreadable)


@dataclass(frozen=True)
class TensorEnd:
    """One declaration of an ensemble tensor: an ensemble input or output, or a step model's I/O."""

    what: str  # for messages: "ensemble input 'IMAGE'", "output 'logits' of step 2 (resnet)"
    data_type: int
    dims: tuple[int, ...]
    batching: bool  # the declaring config has max_batch_size > 0: a batch dimension precedes dims

    @property
    def full_dims(self) -> tuple[int, ...]:
        return (-1, *self.dims) if self.batching else self.dims

    def dims_for(self, batching: bool) -> tuple[int, ...]:
        """These dims as a config that batches (or not) declares them."""
        if batching == self.batching:
            return self.dims
        if not batching:
            return self.full_dims
        return self.dims[1:] if self.dims[:1] == (-1,) else self.dims

    def agrees_with(self, other: TensorEnd) -> bool:
        return _dims_match(self.dims, other.dims) or _dims_match(self.full_dims, other.full_dims)

    def describe(self) -> str:
        return f"{model_config.data_type_name(self.data_type)} {list(self.dims)}"


def _dims_match(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def step_label(number: int, step: Any) -> str:
    return f"step {number} ({step.model_name})"


def step_models(config: ModelConfig) -> list[str]:
    """The models an ensemble's steps use, once each, in step order."""
    return list(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step if step.model_name))


def _io(config: ModelConfig, kind: str) -> dict[str, Any]:
    return {t.name: t for t in (config.input if kind == "input" else config.output)}


def _end(what: str, tensor: Any, batching: bool) -> TensorEnd:
    return TensorEnd(what, int(tensor.data_type), tuple(int(d) for d in tensor.dims), batching)


def sources(config: ModelConfig, members: Members) -> dict[str, TensorEnd]:
    """Each tensor's source, as declared: the ensemble input, or the first step output written to it
    (a step whose model config is unknown declares nothing)."""
    found = {t.name: _end(f"ensemble input {t.name!r}", t, config.max_batch_size > 0) for t in config.input}
    for number, step in enumerate(config.ensemble_scheduling.step, 1):
        member = members.get(step.model_name)
        outputs = _io(member, "output") if member is not None else {}
        for key, tensor in step.output_map.items():
            if tensor not in found and key in outputs:
                what = f"output {key!r} of {step_label(number, step)}"
                found[tensor] = _end(what, outputs[key], member is not None and member.max_batch_size > 0)
    return found


def execution_order(config: ModelConfig) -> list[int] | None:
    """Step indices (0-based) in an order that runs each step after the steps it reads from; None
    when the steps form a cycle."""
    order, _ = _order(config)
    return order if len(order) == len(config.ensemble_scheduling.step) else None


def _order(config: ModelConfig) -> tuple[list[int], list[set[int]]]:
    """(the steps that can be ordered, in order; each step's producers): what is left out depends on a cycle."""
    steps = list(config.ensemble_scheduling.step)
    inputs = {t.name for t in config.input}
    producer: dict[str, int] = {}  # a tensor's first writer: the one it is read from (a second is an error)
    for i, s in enumerate(steps):
        for t in s.output_map.values():
            if t not in inputs:
                producer.setdefault(t, i)
    needs = [{producer[t] for t in s.input_map.values() if t in producer} for s in steps]
    order: list[int] = []
    while True:
        ready = [i for i in range(len(steps)) if i not in order and needs[i] <= set(order)]
        if not ready:
            return order, needs
        order.append(ready[0])


def check(config: ModelConfig, members: Members) -> list[str]:
    """Every problem of the ensemble ``config``, one line each; ``members`` holds its step models'
    configs (a model missing from it is the caller's to report: only its graph is checked here)."""
    steps = list(config.ensemble_scheduling.step)
    if not steps:
        return ["ensemble has no ensemble_scheduling steps"]
    problems: list[str] = []
    for number, step in enumerate(steps, 1):
        problems += _check_step(config, number, step, members.get(step.model_name))
    problems += _check_tensors(config, members)
    problems += _check_cycle(config)
    return problems


def _check_step(config: ModelConfig, number: int, step: Any, member: ModelConfig | None) -> list[str]:
    where = f"ensemble {step_label(number, step)}"
    if not step.model_name:
        return [f"ensemble step {number}: names no model"]
    problems = []
    if not step.input_map:
        problems.append(f"{where}: maps no inputs (input_map)")
    if not step.output_map:
        problems.append(f"{where}: maps no outputs (output_map)")
    if member is None:
        return problems
    if config.max_batch_size > member.max_batch_size:
        problems.append(
            f"{where}: ensemble max_batch_size {config.max_batch_size} exceeds the model's {member.max_batch_size}"
        )
    member_in, member_out = _io(member, "input"), _io(member, "output")
    for key in step.input_map:
        if key not in member_in:
            problems.append(
                f"{where}: input_map key {key!r} is not an input of {step.model_name} "
                f"({', '.join(member_in) or 'none'})"
            )
    for key, tensor in member_in.items():
        if key not in step.input_map and not tensor.optional:
            problems.append(f"{where}: {step.model_name} input {key!r} is not mapped (input_map)")
    for key in step.output_map:
        if key not in member_out:
            problems.append(
                f"{where}: output_map key {key!r} is not an output of {step.model_name} "
                f"({', '.join(sorted(member_out)) or 'none'})"
            )
    return problems


def _check_tensors(config: ModelConfig, members: Members) -> list[str]:
    """Sources, consumers, and agreement of every tensor with its source."""
    problems: list[str] = []
    steps = list(config.ensemble_scheduling.step)
    inputs, outputs = _io(config, "input"), _io(config, "output")
    found = sources(config, members)
    written: dict[str, int] = {}
    read: set[str] = set()
    for number, step in enumerate(steps, 1):
        where = f"ensemble {step_label(number, step)}"
        for tensor in step.output_map.values():
            if tensor in inputs:
                problems.append(f"{where}: output_map writes tensor {tensor!r}, which is an ensemble input")
            elif tensor in written:
                first = written[tensor]
                problems.append(
                    f"{where}: tensor {tensor!r} is also written by {step_label(first, steps[first - 1])}; "
                    "a tensor has one source"
                )
            else:
                written[tensor] = number
        problems += _check_reads(config, number, step, members.get(step.model_name), found)
        read.update(step.input_map.values())
    for name in inputs:
        if name not in read:
            problems.append(f"ensemble input {name!r} is read by no step")
    for name, tensor in outputs.items():
        if name not in written:
            problems.append(f"ensemble output {name!r} is produced by no step")
            continue
        declared = _end(f"ensemble output {name!r}", tensor, config.max_batch_size > 0)
        source = found.get(name)
        if source is not None and not _agree(declared, source):
            problems.append(f"ensemble output {name!r} is declared {declared.describe()}, {source.what} is "
                            f"{source.describe()}")  # fmt: skip
    for number, step in enumerate(steps, 1):
        for key, tensor in step.output_map.items():
            if tensor not in read and tensor not in outputs and tensor not in inputs:
                problems.append(
                    f"ensemble {step_label(number, step)}: output {key!r} goes to tensor {tensor!r}, which no step "
                    "reads and which is no ensemble output"
                )
    return problems


def _check_reads(
    config: ModelConfig,
    number: int,
    step: Any,
    member: ModelConfig | None,
    found: Mapping[str, TensorEnd],
) -> list[str]:
    where = f"ensemble {step_label(number, step)}"
    problems = []
    produced = {t for s in config.ensemble_scheduling.step for t in s.output_map.values()}
    config_inputs = _io(config, "input")
    member_in = _io(member, "input") if member is not None else {}
    for key, tensor in step.input_map.items():
        if tensor not in produced and tensor not in config_inputs:
            problems.append(f"{where}: tensor {tensor!r} is neither an ensemble input nor produced by a step")
            continue
        source = found.get(tensor)
        if source is None or key not in member_in or member is None:
            continue
        wanted = _end(f"{step.model_name} input {key!r}", member_in[key], member.max_batch_size > 0)
        if not _agree(wanted, source):
            problems.append(
                f"{where}: tensor {tensor!r} is {source.describe()} ({source.what}), {wanted.what} is "
                f"{wanted.describe()}"
            )
    return problems


def _agree(a: TensorEnd, b: TensorEnd) -> bool:
    return a.data_type == b.data_type and a.agrees_with(b)


def _check_cycle(config: ModelConfig) -> list[str]:
    order, needs = _order(config)
    steps = list(config.ensemble_scheduling.step)
    left = [i for i in range(len(steps)) if i not in order]
    if not left:
        return []
    # Every step left waits on another step left; following those waits must come round to a step again.
    path: list[int] = []
    current = left[0]
    while current not in path:
        path.append(current)
        current = min(needs[current] - set(order))
    cycle = path[path.index(current) :]
    links = []
    for i, reader in enumerate(cycle):
        writer = cycle[(i + 1) % len(cycle)]
        tensor = next(t for t in steps[reader].input_map.values() if t in steps[writer].output_map.values())
        links.append(
            f"{step_label(reader + 1, steps[reader])} reads {tensor!r} from {step_label(writer + 1, steps[writer])}"
        )
    return [f"ensemble steps form a cycle: {', '.join(links)}"]
