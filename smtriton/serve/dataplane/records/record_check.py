"""A record of a multi-record body checked against its model before any record of the body reaches Triton.

Triton refuses a request that names an input its model does not have, or gives one another data type, a
shape its configuration does not take, a batch past ``max_batch_size``, data that does not fill its shape
or holds no values of its type, or leaves a required input out, or asks for an output the model does not
have. Checked here, such a record fails with its own short error (its line named) before any record of
its body is sent, and costs no Triton request; a body's Triton requests follow its records' batches, not
its lines. Only what Triton refuses is refused, in Triton's words where they are short: what this does not
check (a model's own refusal, say) Triton answers. What the model takes is read from its configuration as
Triton completed it (:func:`model_rules`); a model whose configuration says nothing of its inputs gets the
checks that need none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from smtriton import dtypes
from smtriton.serve.dataplane.reading.codec import DATA_ELSEWHERE
from smtriton.serve.errors import BadRequest

NO_INPUTS = "the record has no 'inputs' array"
BINARY_OUTPUTS = (
    "the record asks for binary outputs (binary_data_output): an answer line carries JSON; "
    "leave binary_data_output out of the records"
)
_HALF_FLOATS = frozenset({"FP16", "BF16"})  # Triton takes none in JSON
_INT64 = (-(1 << 63), 1 << 63)  # the integers Triton's reader takes as integers, by signedness
_UINT64 = (0, 1 << 64)


@dataclass(frozen=True, slots=True)
class InputRule:
    """What a model takes as one input: its data type ("": not checked) and its dims after the batch
    dimension (-1: any size; None: not checked, as for a shape tensor or a ragged batch)."""

    datatype: str
    dims: tuple[int, ...] | None
    optional: bool = False


@dataclass(frozen=True, slots=True)
class ModelRules:
    """What a model takes: its inputs and outputs by name (None: not known, not checked)."""

    model: str
    max_batch_size: int = 0
    inputs: dict[str, InputRule] | None = None
    outputs: frozenset[str] | None = None


def model_rules(model: str, config: dict[str, Any]) -> ModelRules:
    """What ``model`` takes, from its configuration as Triton gives it (JSON)."""
    max_batch = config.get("max_batch_size")
    inputs = config.get("input")
    outputs = config.get("output")
    rules = {spec["name"]: _input_rule(spec) for spec in inputs} if _named(inputs) else None
    names = frozenset(spec["name"] for spec in outputs) if _named(outputs) else None
    return ModelRules(model, max_batch if type(max_batch) is int and max_batch > 0 else 0, rules, names)


def _named(specs: Any) -> TypeGuard[list[dict[str, Any]]]:
    """Whether ``specs`` is a configuration's list of inputs (or outputs), each with its name."""
    return isinstance(specs, list) and all(isinstance(s, dict) and isinstance(s.get("name"), str) for s in specs)


def _input_rule(spec: dict[str, Any]) -> InputRule:
    try:
        datatype = dtypes.from_config_type(str(spec.get("data_type")))
    except ValueError:
        datatype = ""
    dims = spec.get("dims")
    shaped = not spec.get("is_shape_tensor") and not spec.get("allow_ragged_batch") and isinstance(dims, list)
    try:
        # (protobuf's JSON may write an int64 as text)
        known = tuple(int(d) for d in dims) if shaped else None  # type: ignore[union-attr]
    except (TypeError, ValueError):
        known = None
    return InputRule(datatype, known, spec.get("optional") is True)


def check(header: dict[str, Any], rules: ModelRules, binary: bool) -> None:
    """Refuse (400, short) a record Triton would refuse (the module docstring). ``header`` is its whole JSON
    part as read; ``binary``: the record was re-encoded binary (its data after its JSON part)."""
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest("the record's 'id' must be a string")
    inputs = header.get("inputs")
    if not isinstance(inputs, list):
        raise BadRequest(NO_INPUTS)
    seen: set[str] = set()
    batch: int | None = None
    for spec in inputs:
        name, shape = _input(spec, rules, binary, seen)
        if rules.max_batch_size and shape:
            if batch is not None and shape[0] != batch:
                raise BadRequest(f"input '{name}' batch size does not match other inputs for '{rules.model}'")
            batch = shape[0]
    if rules.inputs is not None:
        missing = sorted(name for name, rule in rules.inputs.items() if not rule.optional and name not in seen)
        if missing:
            raise BadRequest(f"missing required input(s) {missing} for model '{rules.model}'")
    _outputs(header, rules)


def _input(spec: Any, rules: ModelRules, binary: bool, seen: set[str]) -> tuple[str, list[int]]:
    """One input checked: its name and shape."""
    if not isinstance(spec, dict):
        raise BadRequest("each input must be an object of 'name', 'shape', 'datatype' and 'data'")
    name = spec.get("name")
    if not isinstance(name, str):
        raise BadRequest("an input has no 'name'")
    if name in seen:
        raise BadRequest(f"input '{name}' already exists in request")
    seen.add(name)
    datatype = spec.get("datatype")
    if not isinstance(datatype, str):
        raise BadRequest(f"input '{name}' has no 'datatype'")
    if datatype not in dtypes.TRITON_DTYPES:
        raise BadRequest(f"invalid datatype for input {name}")
    shape = spec.get("shape")
    if not isinstance(shape, list):  # (the reading checked the dims of a shape that is a list)
        raise BadRequest(f"input '{name}' has no 'shape'")
    if rules.inputs is not None:
        rule = rules.inputs.get(name)
        if rule is None:
            raise BadRequest(f"unexpected inference input '{name}' for model '{rules.model}'")
        if rule.datatype and datatype != rule.datatype:
            raise BadRequest(
                f"inference input '{name}' data-type is '{datatype}', but model '{rules.model}' expects "
                f"'{rule.datatype}'"
            )
        _shape(name, shape, rule, rules)
    _data(name, spec, datatype, shape, binary)
    return name, shape


def _shape(name: str, shape: list[int], rule: InputRule, rules: ModelRules) -> None:
    if rule.dims is None:
        return
    batched = rules.max_batch_size > 0
    expected = [-1, *rule.dims] if batched else list(rule.dims)
    if len(shape) != len(expected) or any(want not in (-1, got) for want, got in zip(expected, shape, strict=True)):
        raise BadRequest(
            f"unexpected shape for input '{name}' for model '{rules.model}'. Expected {_dims(expected)}, "
            f"got {_dims(shape)}"
        )
    if batched and shape[0] > rules.max_batch_size:
        raise BadRequest(f"inference request batch-size must be <= {rules.max_batch_size} for '{rules.model}'")


def _outputs(header: dict[str, Any], rules: ModelRules) -> None:
    """The outputs a record asks for: the model's, and in JSON (a line carries no binary data)."""
    parameters = header.get("parameters")
    if isinstance(parameters, dict) and parameters.get("binary_data_output") is True:
        raise BadRequest(BINARY_OUTPUTS)
    if "outputs" not in header:
        return
    outputs = header["outputs"]
    if not isinstance(outputs, list):
        raise BadRequest("the record's 'outputs' must be an array")
    for output in outputs:
        name = output.get("name") if isinstance(output, dict) else None
        if not isinstance(name, str):
            raise BadRequest("each output must be an object with a 'name'")
        if rules.outputs is not None and name not in rules.outputs:
            raise BadRequest(f"unexpected inference output '{name}' for model '{rules.model}'")
        parameters = output.get("parameters")
        if isinstance(parameters, dict) and parameters.get("binary_data") is True:
            raise BadRequest(BINARY_OUTPUTS)


def _dims(shape: list[int]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _data(name: str, spec: dict[str, Any], datatype: str, shape: list[int], binary: bool) -> None:
    """An input's data: as many values as its shape holds, each of its type (JSON), or elsewhere."""
    parameters = spec.get("parameters")
    parameters = parameters if isinstance(parameters, dict) else {}
    if "binary_data_size" in parameters and not binary:
        raise BadRequest(f"input '{name}' has binary_data_size, but a record carries no binary data: send 'data'")
    if any(key in parameters for key in DATA_ELSEWHERE):
        return  # binary (a record re-encoded, checked as it was) or in shared memory: Triton sizes it
    if "data" not in spec:
        raise BadRequest(f"input '{name}' has no 'data'")
    if datatype in _HALF_FLOATS:
        raise BadRequest(f"input '{name}': Triton takes no {datatype} data in JSON")
    values = _flat(spec["data"])
    if values is None:
        raise BadRequest(f"input '{name}': its data must be an array")
    count = math.prod(shape)
    if len(values) != count:
        raise BadRequest(f"input '{name}': {len(values)} values for its shape {shape} ({count})")
    why = _not_of_type(values, datatype)
    if why:
        raise BadRequest(f"input '{name}': {datatype} data must be {why}")


def _flat(data: Any) -> list[Any] | None:
    """JSON data's values, its nesting flattened (as Triton reads it); None if it is no array."""
    if not isinstance(data, list):
        return None
    if list not in map(type, data):
        return data  # flat, as clients mostly send it
    flat: list[Any] = []
    for item in data:
        if type(item) is list:
            inner = _flat(item)
            assert inner is not None
            flat += inner
        else:
            flat.append(item)
    return flat


def _not_of_type(values: list[Any], datatype: str) -> str:
    """What ``datatype``'s data must be, when ``values`` are not all that (else "")."""
    kinds = set(map(type, values))  # exact types: a boolean is no integer here, as for Triton
    if datatype == "BYTES":
        return "" if kinds <= {str} else "strings"
    if datatype == "BOOL":
        return "" if kinds <= {bool} else "true or false"
    if datatype in dtypes.INTEGER:
        low, end = _UINT64 if datatype.startswith("U") else _INT64
        fits = kinds <= {int} and (not values or (low <= min(values) and max(values) < end))
        return "" if fits else ("integers of 0 or more" if datatype.startswith("U") else "integers")
    if not kinds <= {int, float}:
        return "numbers"
    return ""
