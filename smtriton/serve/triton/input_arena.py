"""Large binary inputs handed to Triton through shared memory of the worker's own, not in the HTTP body.

A 600 KB image sent in the body of Triton's HTTP request costs the front the loopback send (the
kernel copies it and runs TCP over it) and costs Triton its receive and the body's handling: measured
on the image benchmark's body, Triton spent 1.28 ms of CPU a request read from its HTTP body and 0.52
ms read from a registered region of system shared memory (bench/NOTES.md Part 18). So each front worker
keeps an arena: one file in ``/dev/shm`` cut into pages of 1 MiB, registered with the current Triton
as one region through its shared-memory API (behind the access key), and unlinked once Triton has
mapped it, so that nothing is left in ``/dev/shm`` when the worker or Triton dies. A request whose
binary part is 64 KiB to 8 MiB is copied into free consecutive pages (its slot), and its JSON part
names the slot instead of the bytes after it; the answer comes back in the HTTP answer as before.

Only requests Triton reads alike either way take this path (:func:`binary_inputs`): every input's
data is binary, of a fixed-size datatype, exactly as many bytes as its shape says, and the inputs'
bytes fill the body after the JSON part. Anything else, and every request while no slot is free or
Triton refused the region, goes in the HTTP body as before.

A slot's bytes may be read by Triton until its answer comes, so the call runs to its answer even when
the client leaves (Triton 2.51 does not stop a request whose HTTP connection closes). A request that
ends without an answer (out of time, the connection lost) may still be queued in Triton, so its pages
are never used again in this arena; a new Triton gets a new arena. Pages are given memory when first
used (``posix_fallocate``: a full ``/dev/shm`` refuses a slot, it never faults a write), so an arena
takes from ``/dev/shm`` and from the memory limit only what the requests in flight through it at once
ever needed.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from smtriton.serve.triton.request_body import BodyPieces, HeldBody

SHM_DIR: Final = Path("/dev/shm")
# Names this front gives its regions: a client's request that names one is refused (it could read or
# overwrite another client's tensors).
REGION_PREFIX: Final = "smtriton_inputs_"
PAGE_BYTES: Final = 1024 * 1024  # what an arena is cut into
LARGEST_BYTES: Final = 8 * 1024 * 1024  # the largest binary part that goes through the arena
MIN_BYTES: Final = 64 * 1024  # smaller binary parts cost less in the body than the copy into a slot
# Bytes of one element of each fixed-size datatype (a BYTES tensor frames its own elements); the
# merging of requests checks binary sizes by the same table.
ITEM_BYTES: Final = {
    "BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
    "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8,
}  # fmt: skip


def binary_inputs(header: dict[str, Any], header_length: int, body_length: int) -> list[int] | None:
    """Each input's byte count, when every input of the request is binary data of a fixed-size datatype
    whose count its shape gives and together they fill the body after ``header_length``; else None."""
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        return None
    sizes = []
    for spec in inputs:
        if not isinstance(spec, dict) or "data" in spec:
            return None
        parameters = spec.get("parameters")
        shape = spec.get("shape")
        item = ITEM_BYTES.get(spec.get("datatype"))  # type: ignore[arg-type]
        if not isinstance(parameters, dict) or item is None or not isinstance(shape, list):
            return None
        size = parameters.get("binary_data_size")
        if type(size) is not int or set(parameters) != {"binary_data_size"}:
            return None
        if not all(type(d) is int and d >= 0 for d in shape) or size != math.prod(shape) * item:
            return None
        sizes.append(size)
    return sizes if header_length + sum(sizes) == body_length else None


def names_own_region(parameters: Any) -> bool:
    """Whether a client's parameters name a region of this front's (refused: module docstring)."""
    if not isinstance(parameters, dict):
        return False
    region = parameters.get("shared_memory_region")
    return isinstance(region, str) and region.startswith(REGION_PREFIX)


# Where a request's bytes lie in an arena: its first page and how many pages follow.
Slot = tuple[int, int]


class InputArena:
    """One worker's region for one Triton: a file in ``/dev/shm``, mapped here, cut into pages; a
    request takes as many consecutive pages as its binary part needs (a slot)."""

    def __init__(self, total_bytes: int, page_bytes: int = PAGE_BYTES, directory: Path = SHM_DIR) -> None:
        self.page_bytes = min(page_bytes, total_bytes)  # a smaller arena is one page
        self.pages = total_bytes // self.page_bytes
        self.byte_size = self.pages * self.page_bytes
        self.largest = min(self.byte_size, LARGEST_BYTES)  # the largest binary part a slot takes
        self.name = f"{REGION_PREFIX}{os.getpid()}_{secrets.token_hex(16)}"  # unguessable: see module docstring
        self.path = directory / self.name
        self._fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(self._fd, self.byte_size)
            self._map = mmap.mmap(self._fd, self.byte_size)
        except BaseException:
            os.close(self._fd)
            self.path.unlink(missing_ok=True)
            raise
        self._free = (1 << self.pages) - 1  # bit i: page i is free (the lowest taken first)
        self._backed = 0  # bit i: page i has its pages of memory
        self.retired = 0  # pages never used again (their request ended without an answer)

    @property
    def key(self) -> str:
        """The name Triton opens the region by (``shm_open``'s)."""
        return f"/{self.name}"

    def unlink(self) -> None:
        """Take the file's name away: Triton has mapped it (or never will)."""
        self.path.unlink(missing_ok=True)

    def take(self, size: int) -> Slot | None:
        """Free consecutive pages for ``size`` bytes, given memory, or None (none free, or ``/dev/shm``
        full)."""
        count = -(-size // self.page_bytes)
        if count > self.pages or size > self.largest:
            return None
        run = (1 << count) - 1
        free = self._free
        if count == 1:
            start = (free & -free).bit_length() - 1 if free else -1
        else:
            start = next((i for i in range(self.pages - count + 1) if (free >> i) & run == run), -1)
        if start < 0:
            return None
        mask = run << start
        if mask & ~self._backed:
            try:
                os.posix_fallocate(self._fd, start * self.page_bytes, count * self.page_bytes)
            except OSError:
                return None  # no room now: tried again by a later request
            self._backed |= mask
        self._free &= ~mask
        return start, count

    def give_back(self, slot: Slot) -> None:
        """Triton answered the slot's request: it reads the slot no more."""
        start, count = slot
        self._free |= ((1 << count) - 1) << start

    def retire(self, slot: Slot) -> None:
        """The slot's request ended without an answer: Triton may still read it, so it is never used again."""
        self.retired += slot[1]

    def fill(self, slot: Slot, body: HeldBody, start: int) -> None:
        """Copy ``body`` from byte ``start`` on into ``slot``."""
        at = slot[0] * self.page_bytes
        pieces: Sequence[bytes | bytearray | memoryview] = (
            body.after(start) if isinstance(body, BodyPieces) else [memoryview(body)[start:]]
        )
        for piece in pieces:
            self._map[at : at + len(piece)] = piece
            at += len(piece)

    def request(self, header: dict[str, Any], sizes: list[int], slot: Slot) -> bytes:
        """The JSON request that names ``slot`` for the inputs' bytes (``sizes`` each, in order)."""
        offset = slot[0] * self.page_bytes
        inputs = []
        for spec, size in zip(header["inputs"], sizes, strict=True):
            region = {
                "shared_memory_region": self.name,
                "shared_memory_offset": offset,
                "shared_memory_byte_size": size,
            }
            inputs.append({**spec, "parameters": region})
            offset += size
        return orjson.dumps({**header, "inputs": inputs})

    def close(self) -> None:
        self.unlink()
        with contextlib.suppress(BufferError):  # a slot's bytes still referenced: the map closes when they go
            self._map.close()
        os.close(self._fd)
