"""TensorRT plans without TensorRT: optimization profiles, plus the sidecar and compatibility rule.

The sidecar (``model.plan.json``: TensorRT version, GPU, precision, profiles, I/O signature, sha256)
and :func:`check_compatibility` live in :mod:`smtriton.serve.triton.tensorrt_sidecar`, because `serve` refuses plans
built for another runtime and the serving image ships only ``serve``; they are re-exported here for
the build-time tools. Everything here is standard library only, so validation and config generation
can read and check a sidecar on any host.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from smtriton.errors import ToolUsageError
from smtriton.repo.artifacts import profile_batch_limits, sha256_file
from smtriton.serve.triton.tensorrt_sidecar import (
    HARDWARE_LEVELS,
    PRECISIONS,
    SIDECAR_FORMAT,
    SIDECAR_SUFFIX,
    RuntimeInfo,
    Sidecar,
    SidecarError,
    check_compatibility,
    read_sidecar,
    sidecar_path,
    write_sidecar,
)

__all__ = [
    "HARDWARE_LEVELS",
    "PRECISIONS",
    "SIDECAR_FORMAT",
    "SIDECAR_SUFFIX",
    "TOLERANCES",
    "AxisRange",
    "Profile",
    "ProfileError",
    "RuntimeInfo",
    "Shape",
    "Sidecar",
    "SidecarError",
    "check_compatibility",
    "input_shapes",
    "parse_profile",
    "parse_size",
    "profile_batch_limits",
    "profile_text",
    "read_sidecar",
    "recipe_profile",
    "sha256_file",
    "sidecar_path",
    "write_sidecar",
]

Shape = tuple[int, ...]

# Default verification tolerances (atol, rtol) per precision (TF32 is on by default for FP32 builds on Ampere+).
TOLERANCES = {"fp32": (1e-3, 1e-2), "fp16": (5e-2, 5e-2), "bf16": (1e-1, 1e-1), "int8": (2e-1, 2e-1),
              "strongly-typed": (5e-2, 5e-2)}  # fmt: skip


class ProfileError(ToolUsageError, ValueError):
    """Profile ranges that are malformed or do not cover an input's dynamic dimensions."""


@dataclass(frozen=True)
class AxisRange:
    """min <= opt <= max sizes of one dynamic axis in one optimization profile."""

    min: int
    opt: int
    max: int

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.opt <= self.max:
            raise ProfileError(f"need 1 <= min <= opt <= max, got {self.min}:{self.opt}:{self.max}")


Profile = Mapping[str, AxisRange]  # axis name -> range


def parse_profile(text: str) -> dict[str, AxisRange]:
    """``"batch=1:4:8,sequence=1:64:128"`` (``axis=size`` fixes an axis) -> axis -> range."""
    profile: dict[str, AxisRange] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        axis, sep, sizes = part.partition("=")
        values = sizes.split(":")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", axis.strip()) or len(values) not in (1, 3):
            raise ProfileError(f"profile entry {part!r}: write axis=min:opt:max (or axis=size)")
        try:
            numbers = [int(v) for v in values]
        except ValueError:
            raise ProfileError(f"profile entry {part!r}: sizes must be integers") from None
        profile[axis.strip()] = AxisRange(numbers[0], numbers[len(numbers) // 2], numbers[-1])
    if not profile:
        raise ProfileError(f"empty profile {text!r}")
    return profile


def profile_text(profile: Profile) -> str:
    """What :func:`parse_profile` reads back: ``batch=1:4:8,sequence=1:64:128``."""
    return ",".join(f"{axis}={r.min}:{r.opt}:{r.max}" for axis, r in profile.items())


def recipe_profile(
    bounds: Mapping[str, Sequence[int]], max_batch_size: int, preferred_batch_sizes: Sequence[int] = ()
) -> dict[str, AxisRange]:
    """One profile from a recipe's TensorRT entry: each axis its (min, opt, max) bounds; the batch axis
    spans 1..max_batch_size, tuned for the largest preferred batch size."""
    profile = {axis: AxisRange(*sizes) for axis, sizes in bounds.items()}
    if max_batch_size > 0:
        opt = max(preferred_batch_sizes, default=max_batch_size)
        profile["batch"] = AxisRange(1, min(opt, max_batch_size), max_batch_size)
    return profile


def input_shapes(name: str, shape: Sequence[int | str | None], profile: Profile) -> tuple[Shape, Shape, Shape]:
    """(min, opt, max) shapes of one input for one profile; ``shape`` uses axis names for dynamic dims."""
    mins: list[int] = []
    opts: list[int] = []
    maxs: list[int] = []
    for index, dim in enumerate(shape):
        if isinstance(dim, int) and dim >= 0:
            mins.append(dim)
            opts.append(dim)
            maxs.append(dim)
            continue
        if not isinstance(dim, str):
            raise ProfileError(
                f"input {name!r}: dimension {index} is dynamic without a name; export it with a named dynamic "
                "axis so a profile can size it"
            )
        if dim not in profile:
            raise ProfileError(f"input {name!r}: the profile has no range for axis {dim!r} (dimension {index})")
        r = profile[dim]
        mins.append(r.min)
        opts.append(r.opt)
        maxs.append(r.max)
    return tuple(mins), tuple(opts), tuple(maxs)


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``4GiB``, ``512MiB``, ``1G``, ``1073741824`` -> bytes (powers of 1024)."""
    m = _SIZE.match(text.strip())
    if not m:
        raise ValueError(f"size {text!r}: write e.g. 4GiB, 512MiB or a number of bytes")
    unit = (m.group(2) or "B").upper()[0]
    return int(float(m.group(1)) * 1024 ** {"B": 0, "K": 1, "M": 2, "G": 3, "T": 4}[unit])
