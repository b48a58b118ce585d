"""Parts of one model merged into one Triton request, and Triton's answer split back.

Exactly: a binary input is the concatenation of the requests' bytes; a JSON input's ``data`` is the
requests' own text, joined, so Triton parses the very characters each client sent. The answer is split
by rows, from Triton's own text (:mod:`~smtriton.serve.dataplane.batching.answer_rows`): each client's
answer is Triton's answer with its ``id``, its outputs' shapes, its ``binary_data_size`` and its rows of
each output's data in place of the whole request's — the JSON data of its rows is the very text Triton
wrote, binary outputs the very bytes. An answer that cannot be split that way (an output that is not the
batch dimension first, as the model's configuration declares it) is None, and the requests are then
sent alone; one Triton refused as a whole (:func:`refused_as_a_whole`: it was unavailable, overloaded or
out of time) is every client's own refusal, never sent again.
"""

from __future__ import annotations

import struct
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from smtriton.serve.dataplane.batching import answer_rows
from smtriton.serve.dataplane.batching.json_text import NotPlain
from smtriton.serve.dataplane.batching.mergeable import MERGED_BYTES_MAX, Part, requested_outputs
from smtriton.serve.dataplane.batching.rule import ModelBatching
from smtriton.serve.dataplane.reading.inference import Inference
from smtriton.serve.triton.client import UpstreamResponse
from smtriton.serve.triton.request_body import contiguous


def groups(parts: Sequence[Part | None], max_batch_size: int) -> list[list[int]]:
    """Which parts go together (their indices, in order; a None part alone): each group agrees on the
    key and fits ``max_batch_size`` and :data:`MERGED_BYTES_MAX`; a part joins the latest group of its key."""
    out: list[list[int]] = []
    latest: dict[Hashable, tuple[list[int], list[int]]] = {}  # key -> (group, [rows, bytes])
    for index, item in enumerate(parts):
        if item is None:
            out.append([index])
            continue
        found = latest.get(item.key)
        if found is not None and fits(found[1][0], found[1][1], item, max_batch_size):
            found[0].append(index)
            found[1][0] += item.batch
            found[1][1] += item.size
            continue
        group = [index]
        out.append(group)
        latest[item.key] = (group, [item.batch, item.size])
    return out


def fits(rows: int, size: int, item: Part, max_batch_size: int) -> bool:
    """Whether ``item`` joins a group of ``rows`` rows and ``size`` bytes."""
    return rows + item.batch <= max_batch_size and size + item.size <= MERGED_BYTES_MAX


@dataclass(frozen=True, slots=True)
class Merged:
    """Requests merged into ``inference``, one Triton request; :meth:`split` gives each its answer."""

    inference: Inference
    parts: tuple[Part, ...]

    def split(self, response: UpstreamResponse, model: ModelBatching) -> list[UpstreamResponse] | None:
        """Each part's answer as it would have had it alone, or None when Triton's answer cannot be split
        (not a success, or an output that is not the batch dimension first)."""
        if response.status != 200:
            return None
        try:
            ids = [item.request_id for item in self.parts]
            return answer_rows.split(response, tuple(item.batch for item in self.parts), ids, model.outputs)
        except (NotPlain, TypeError, ValueError, KeyError, IndexError, AttributeError, struct.error):
            return None


def refused_as_a_whole(response: UpstreamResponse) -> bool:
    """Whether Triton refused a merged request for what it is as a whole — unavailable, its queue full,
    out of time — rather than for a client's rows: then it is each client's own refusal, as it would
    have met alone at that moment, and sending the rows again would only load an overloaded Triton
    more."""
    return response.status in (429, 503, 504)


def merge(parts: Sequence[Part]) -> Merged:
    """One request of all ``parts`` (of one key, as :func:`groups` puts them), rows in their order."""
    first = parts[0]
    header = first.inference.header
    assert header is not None
    rows = sum(item.batch for item in parts)
    pieces: list[bytes] = [b'{"inputs":[']
    tensors: list[memoryview] = []
    specs: list[dict[str, Any]] = []
    for index, spec in enumerate(header["inputs"]):
        entry: dict[str, Any] = {
            "name": spec["name"],
            "datatype": spec["datatype"],
            "shape": [rows, *spec["shape"][1:]],
        }
        parameters = {key: value for key, value in spec.get("parameters", {}).items() if key != "binary_data_size"}
        texts = []
        for item in parts:
            tensor = item.tensors[index]
            if isinstance(tensor, tuple):
                tensors.append(memoryview(contiguous(item.inference.body))[tensor[0] : tensor[0] + tensor[1]])
                parameters["binary_data_size"] = parameters.get("binary_data_size", 0) + tensor[1]
            elif tensor:
                texts.append(tensor)
        if parameters:
            entry["parameters"] = parameters
        specs.append(entry)
        pieces.append(b"," if index else b"")
        if isinstance(first.tensors[index], tuple):
            pieces.append(orjson.dumps(entry))
        else:
            pieces += [orjson.dumps(entry)[:-1], b',"data":[', b",".join(texts), b"]}"]
    pieces.append(b"]")
    merged: dict[str, Any] = {"inputs": specs}
    if "outputs" in header:
        merged["outputs"] = requested_outputs(header["outputs"])
        pieces += [b',"outputs":', orjson.dumps(merged["outputs"])]
    if header.get("parameters"):
        merged["parameters"] = header["parameters"]
        pieces += [b',"parameters":', orjson.dumps(header["parameters"])]
    pieces.append(b"}")
    head = b"".join(pieces)
    if first.inference.header_length is None:
        return Merged(Inference(head, None, merged, complete=False), tuple(parts))
    return Merged(Inference(b"".join([head, *tensors]), len(head), merged, complete=False), tuple(parts))
