"""What a multi-model load will cost in memory, and whether a failure was the memory running out
(docs/contract.md §4.6)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from smtriton.serve.host import cgroups

# docs/contract.md §4.6: native's OOM patterns (case-sensitive substrings), extended with the allocation
# failures of the ONNX Runtime and PyTorch backends.
OOM_PATTERNS = (
    "CUDA out of memory",
    "CUDA_OUT_OF_MEMORY",
    "Out of memory",
    "Out Of Memory",
    "out of memory",
    "MemoryError",
    "OutOfMemory",
    "Dst tensor is not initialized",
    "Src tensor is not initialized",
    "CNMEM_STATUS_OUT_OF_MEMORY",
    "CUDNN_STATUS_NOT_INITIALIZED",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUBLAS_STATUS_NOT_INITIALIZED",
    "Failed to allocate memory",
    "failed to allocate memory",
    "No space left on device",
    "std::bad_alloc",
    "DefaultCPUAllocator: can't allocate memory",
)
_OOM_WORD = re.compile(r"\bOOM\b")  # native matches "OOM" anywhere (docs/contract.md §6 B15); a whole word here

# Triton's answers to an invoke that may come from the OOM killer: a model instance's process that died
# (a Python stub: "Stub process ... is not healthy") is an internal error. A 4xx is Triton refusing
# the request itself (a wrong shape, a wrong type), which no killed process explains.
KILLABLE_STATUS = 500


def is_oom(message: str) -> bool:
    return any(p in message for p in OOM_PATTERNS) or bool(_OOM_WORD.search(message))


def out_of_memory(message: str, kills_before: int | None, group: cgroups.MemoryGroup | None) -> bool:
    """An OOM by its message, or a failure while the OOM killer struck in this cgroup since
    ``kills_before`` was read (docs/contract.md §6 B15; None: not counted, nothing struck)."""
    if is_oom(message):
        return True
    if kills_before is None or group is None:
        return False
    kills = group.oom_kills()
    return kills is not None and kills > kills_before


def tree_size(root: Path) -> int:
    """Bytes the regular files under ``root`` really hold on disk: the first estimate of what loading
    it costs. Counted by blocks allocated, not by apparent size, so that a sparse file (a terabyte that
    takes kilobytes) cannot make a load look too large to fit and turn into a 507, which the platform
    answers by evicting other models; a file is never counted above its apparent size."""
    total = 0
    for dirpath, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            info = (Path(dirpath) / name).lstat()
            if stat.S_ISREG(info.st_mode):  # a link inside the url points at a file counted already
                total += min(info.st_size, info.st_blocks * 512)
    return total
