"""The request bodies a run sends: random inputs from a model's config.pbtxt, ``.npy`` files, or a ready body.

Bodies are built once, before the first request, so the hot loop only sends bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smtriton.errors import ToolUsageError

BINARY_JSON = "application/vnd.sagemaker-triton.binary+json"
JSON = "application/json"
POOL_SIZE = 8  # distinct random bodies, sent in turn (a cache keyed on the body sees different ones)


@dataclass(frozen=True)
class Body:
    data: bytes
    content_type: str


def parse_shapes(items: Sequence[str]) -> dict[str, list[int]]:
    """``NAME=1,16`` options into {name: [1, 16]}."""
    shapes: dict[str, list[int]] = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            raise ToolUsageError(f"--shape {item!r}: expected NAME=D1,D2,... with integer dims") from None
    return shapes


def random_array(dtype: str, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Random values of a Triton dtype: small non-negative integers (valid as ids), normal floats."""
    from smtriton.dtypes import FLOAT, INTEGER, numpy_dtype

    if dtype == "BYTES":
        return np.array(
            [b"perf %d" % v for v in rng.integers(0, 1000, size=int(np.prod(shape)))], dtype=object
        ).reshape(shape)
    if dtype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype in INTEGER:
        return rng.integers(0, 100, size=shape).astype(numpy_dtype(dtype))
    if dtype in FLOAT:
        return rng.standard_normal(size=shape).astype(numpy_dtype(dtype))
    raise ToolUsageError(f"perf cannot generate {dtype} inputs; give them with --input-file NAME=file.npy")


def inputs_from_config(
    model_dir: Path, batch_size: int, shapes: Mapping[str, list[int]], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """One random request for the model in ``model_dir``: its config's inputs with variable dims filled.

    A -1 dim takes ``shapes[name]`` (the full shape without the batch dim) or 1; a batching model
    (max_batch_size > 0) gets ``batch_size`` as its first dim.
    """
    from smtriton import model_config
    from smtriton.dtypes import from_config_type

    try:
        config = model_config.read(model_dir)
    except OSError as exc:
        raise ToolUsageError(f"--model-dir {model_dir}: {exc.strerror or exc}") from None
    if config.max_batch_size and batch_size > config.max_batch_size:
        raise ToolUsageError(f"--batch-size {batch_size} is above the model's max_batch_size {config.max_batch_size}")
    arrays: dict[str, np.ndarray] = {}
    for spec in config.input:
        dims = list(spec.dims)
        if spec.name in shapes:
            given = shapes[spec.name]
            if len(given) != len(dims) or any(d not in (-1, g) for d, g in zip(dims, given, strict=True)):
                raise ToolUsageError(f"--shape {spec.name}: {given} does not fit the config's dims {dims}")
            dims = given
        dims = [1 if d < 0 else d for d in dims]
        if config.max_batch_size > 0:
            dims = [batch_size, *dims]
        dtype = from_config_type(model_config.data_type_name(spec.data_type))
        arrays[spec.name] = random_array(dtype, dims, rng)
    if not arrays:
        raise ToolUsageError(f"{model_dir}: the config lists no inputs")
    return arrays


def binary_json_header_size(data: bytes) -> int | None:
    """Length of the JSON header that starts a binary+json body; None when the body is JSON only."""
    try:
        _, end = json.JSONDecoder().raw_decode(data.decode("latin-1"))  # one byte per char: end is a byte offset
    except ValueError:
        raise ToolUsageError("the body file does not start with a JSON object") from None
    return None if end == len(data) else end


def body_from_file(path: Path) -> Body:
    """A ready request body (``.json``, or ``.bin``: binary+json, its header size found in the body)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ToolUsageError(f"--input-file {path}: {exc.strerror or exc}") from None
    size = binary_json_header_size(data)
    if size is None:
        return Body(data, JSON)
    return Body(data, f"{BINARY_JSON};json-header-size={size}")


def load_npy(items: Sequence[str]) -> dict[str, np.ndarray]:
    """``NAME=file.npy`` options into arrays (sent as they are: the file holds the batch dim too)."""
    arrays: dict[str, np.ndarray] = {}
    for item in items:
        name, sep, file = item.partition("=")
        if not sep or not name:
            raise ToolUsageError(f"--input-file {item!r}: expected NAME=FILE.npy, or one .json/.bin body")
        try:
            arrays[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ToolUsageError(f"--input-file {item}: {exc}") from None
    return arrays


def build_bodies(
    *,
    model_dir: Path | None,
    input_files: Sequence[str],
    batch_size: int,
    shapes: Mapping[str, list[int]],
    binary: bool,
    seed: int = 0,
) -> list[Body]:
    """The pool of bodies a run sends in turn: random ones from the config, or those the files give."""
    from smtriton.aws.invoke import encode_request

    ready = [f for f in input_files if "=" not in f]
    if ready:
        if len(ready) != len(input_files):
            raise ToolUsageError("--input-file: give either NAME=FILE.npy files or ready .json/.bin bodies, not both")
        return [body_from_file(Path(f)) for f in ready]
    if input_files:
        arrays_list = [load_npy(input_files)]
    elif model_dir is not None:
        rng = np.random.default_rng(seed)
        arrays_list = [inputs_from_config(model_dir, batch_size, shapes, rng) for _ in range(POOL_SIZE)]
    else:
        raise ToolUsageError("say what to send: --model-dir DIR (random inputs from its config) or --input-file")
    bodies = []
    for arrays in arrays_list:
        try:
            data, content_type = encode_request(arrays, binary=binary)
        except ValueError as exc:
            raise ToolUsageError(str(exc)) from None
        bodies.append(Body(data, content_type))
    return bodies
