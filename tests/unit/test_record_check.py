"""A record of a multi-record body checked against its model before any record reaches Triton: what the
model takes read from its configuration, what Triton would refuse refused in its words (short), and what
Triton takes let through."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from smtriton.serve.dataplane.records.record_check import (
    BINARY_OUTPUTS,
    NO_INPUTS,
    InputRule,
    ModelRules,
    check,
    model_rules,
)
from smtriton.serve.errors import BadRequest

ADDSUB = model_rules(
    "addsub",
    {
        "max_batch_size": 8,
        "input": [
            {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]},
            {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": ["16"], "optional": False},
            {"name": "MASK", "data_type": "TYPE_BOOL", "dims": [-1], "optional": True},
        ],
        "output": [{"name": "OUTPUT0"}, {"name": "OUTPUT1"}],
    },
)


def test_what_a_model_takes_is_read_from_its_configuration():
    read = ADDSUB
    assert read == ModelRules(
        "addsub",
        8,
        {
            "INPUT0": InputRule("INT32", (16,)),
            "INPUT1": InputRule("INT32", (16,)),
            "MASK": InputRule("BOOL", (-1,), optional=True),
        },
        frozenset({"OUTPUT0", "OUTPUT1"}),
    )
    shapes = model_rules(
        "m", {"input": [{"name": "S", "data_type": "TYPE_STRING", "dims": [2], "is_shape_tensor": True}]}
    )
    assert shapes == ModelRules("m", 0, {"S": InputRule("BYTES", None)}, None)
    assert model_rules("m", {"name": "m"}) == ModelRules("m")  # says nothing of its inputs: none checked


def request(**changes: Any) -> dict[str, Any]:
    """A request addsub takes, with ``changes`` made to its first input (None: a key removed)."""
    header = {
        "inputs": [
            {"name": "INPUT0", "shape": [2, 16], "datatype": "INT32", "data": [[1] * 16, [2] * 16]},
            {"name": "INPUT1", "shape": [2, 16], "datatype": "INT32", "data": list(range(32))},
        ]
    }
    for key, value in changes.items():
        if value is None:
            del header["inputs"][0][key]
        else:
            header["inputs"][0][key] = value
    return header


def test_a_record_the_model_takes_passes():
    check(request(), ADDSUB, binary=False)
    with_mask = request()
    with_mask["inputs"].append({"name": "MASK", "shape": [2, 3], "datatype": "BOOL", "data": [True] * 6})
    check(
        with_mask | {"outputs": [{"name": "OUTPUT1", "parameters": {"binary_data": False}}], "id": "7"}, ADDSUB, False
    )
    check(request(parameters={"binary_data_size": 128}, data=None), ADDSUB, binary=True)  # re-encoded binary
    check({"inputs": []}, ModelRules("m"), binary=False)  # a model that says nothing of its inputs


@pytest.mark.parametrize(
    ("header", "error"),
    [
        ({}, NO_INPUTS),
        ({"inputs": {}}, NO_INPUTS),
        ({"inputs": [3]}, "each input must be an object of 'name', 'shape', 'datatype' and 'data'"),
        ({"inputs": [{"shape": [1]}]}, "an input has no 'name'"),
        (request(name="NOPE"), "unexpected inference input 'NOPE' for model 'addsub'"),
        (request(datatype="FP32"), "inference input 'INPUT0' data-type is 'FP32', but model 'addsub' expects 'INT32'"),
        (request(datatype="FLOAT"), "invalid datatype for input INPUT0"),
        (request(datatype=None), "input 'INPUT0' has no 'datatype'"),
        (request(shape=None), "input 'INPUT0' has no 'shape'"),
        (request(shape=[2, 15]),
         "unexpected shape for input 'INPUT0' for model 'addsub'. Expected [-1,16], got [2,15]"),
        (request(shape=[32]), "unexpected shape for input 'INPUT0' for model 'addsub'. Expected [-1,16], got [32]"),
        (request(shape=[9, 16], data=[1] * 144), "inference request batch-size must be <= 8 for 'addsub'"),
        (request(shape=[1, 16], data=[1] * 16), "input 'INPUT1' batch size does not match other inputs for 'addsub'"),
        (request(data=[1] * 31), "input 'INPUT0': 31 values for its shape [2, 16] (32)"),
        (request(data=None), "input 'INPUT0' has no 'data'"),
        (request(data=7), "input 'INPUT0': its data must be an array"),
        (request(data=[1.0] * 32), "input 'INPUT0': INT32 data must be integers"),
        (request(data=[True] * 32), "input 'INPUT0': INT32 data must be integers"),
        (request(data=[2**63] * 32), "input 'INPUT0': INT32 data must be integers"),
        (request(parameters={"binary_data_size": 128}, data=None),
         "input 'INPUT0' has binary_data_size, but a record carries no binary data: send 'data'"),
        ({"inputs": request()["inputs"][:1]}, "missing required input(s) ['INPUT1'] for model 'addsub'"),
        (request() | {"inputs": request()["inputs"] * 2}, "input 'INPUT0' already exists in request"),
        (request() | {"outputs": [{"name": "NOPE"}]}, "unexpected inference output 'NOPE' for model 'addsub'"),
        (request() | {"outputs": {}}, "the record's 'outputs' must be an array"),
        (request() | {"outputs": [{}]}, "each output must be an object with a 'name'"),
        (request() | {"outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}, BINARY_OUTPUTS),
        (request() | {"parameters": {"binary_data_output": True}}, BINARY_OUTPUTS),
        (request() | {"id": 7}, "the record's 'id' must be a string"),
    ],
)  # fmt: skip
def test_a_record_triton_would_refuse_is_refused_in_its_words(header, error):
    with pytest.raises(BadRequest) as caught:
        check(copy.deepcopy(header), ADDSUB, binary=False)
    assert caught.value.message == error


@pytest.mark.parametrize(
    ("datatype", "data", "why"),
    [
        ("FP32", ["1"], "FP32 data must be numbers"),
        ("FP32", [None], "FP32 data must be numbers"),
        ("UINT8", [-1], "UINT8 data must be integers of 0 or more"),
        ("BOOL", [1], "BOOL data must be true or false"),
        ("BYTES", [1], "BYTES data must be strings"),
        ("FP16", [1.5], "Triton takes no FP16 data in JSON"),
        ("BF16", [1.5], "Triton takes no BF16 data in JSON"),
    ],
)
def test_data_that_is_no_value_of_its_type_is_refused_whatever_the_model(datatype, data, why):
    header = {"inputs": [{"name": "x", "shape": [1], "datatype": datatype, "data": data}]}
    with pytest.raises(BadRequest, match=f"^input 'x': {why}$"):
        check(header, ModelRules("m"), binary=False)
    ok = {"FP32": [1, 2.5], "UINT8": [0, 255], "BOOL": [False], "BYTES": ["a"]}.get(datatype)
    if ok is not None:
        check({"inputs": [{"name": "x", "shape": [len(ok)], "datatype": datatype, "data": ok}]}, ModelRules("m"), False)
