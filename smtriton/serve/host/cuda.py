"""The GPU driver against the image's CUDA: said at start, and a driver too old refused in one line.

A CUDA runtime needs a driver at least as new as itself. SageMaker's GPU hosts run the driver of their
AMI (`InferenceAmiVersion`; the default on many instance types is older than NVIDIA's current images),
and a container whose CUDA is newer fails at its first CUDA call, deep in Triton's log, with every model
unavailable. Data-center GPUs can run a newer CUDA through NVIDIA's forward-compatibility package in the
image (`/usr/local/cuda/compat`), but only on some driver branches; NVIDIA's own entry point sets that
up, and `serve`, which replaces it, does the same: when the driver is too old it tries the package in a
child process (`cuInit`) and uses it for Triton when it works. Otherwise a driver of the image's CUDA
major version still runs it (CUDA's minor-version compatibility: everything but PTX compiled for the
newer CUDA), so `serve` warns with the versions and runs, as NVIDIA's entry point does; only a driver of
an older major version is refused, with the versions and the AMI to deploy on.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from smtriton.serve.host.gpu import each_gpu, nvml_text

log = logging.getLogger("serve")

CUDA_ROOT = Path("/usr/local/cuda")
Version = tuple[int, int]

# SageMaker's GPU AMIs (`InferenceAmiVersion`), oldest first: NVIDIA driver branch and the CUDA it runs,
# as botocore's service model documents them (a test compares the two).
GPU_AMIS: tuple[tuple[str, int, Version], ...] = (
    ("al2-ami-sagemaker-inference-gpu-2", 535, (12, 2)),
    ("al2-ami-sagemaker-inference-gpu-2-1", 535, (12, 2)),
    ("al2-ami-sagemaker-inference-gpu-3-1", 550, (12, 4)),
    ("al2023-ami-sagemaker-inference-gpu-4-1", 580, (13, 0)),
)


def parse_version(text: str) -> Version | None:
    """``"12.9.0.043"`` or ``"12.9"`` -> (12, 9)."""
    match = re.match(r"\s*(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def shown(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


def image_cuda(env: Mapping[str, str] = os.environ, root: Path = CUDA_ROOT) -> Version | None:
    """The CUDA this image was built with: NVIDIA's images say so in ``CUDA_VERSION`` and in the
    toolkit's ``version.json``; None on an image without CUDA."""
    if env.get("CUDA_VERSION"):
        return parse_version(env["CUDA_VERSION"])
    try:
        return parse_version(json.loads((root / "version.json").read_text())["cuda"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Driver:
    version: str  # "535.54.03"
    cuda: Version  # the newest CUDA it runs
    gpus: tuple[str, ...]


def gpu_driver() -> Driver | None:
    """The NVIDIA driver as NVML sees it; None without a GPU (or NVML)."""
    found: dict[str, object] = {}

    def read(nvml: object, handle: object) -> str:
        if not found:
            found["version"] = nvml_text(nvml.nvmlSystemGetDriverVersion())  # type: ignore[attr-defined]
            found["cuda"] = nvml.nvmlSystemGetCudaDriverVersion_v2()  # type: ignore[attr-defined]
        return nvml_text(nvml.nvmlDeviceGetName(handle))  # type: ignore[attr-defined]

    names = each_gpu(read)
    if not names or not found:
        return None
    return Driver(str(found["version"]), _cuda_version(int(str(found["cuda"]))), tuple(names))


def _cuda_version(number: int) -> Version:
    """CUDA's integer form of a version (12040: what NVML and ``cuDriverGetVersion`` report) -> (12, 4)."""
    return number // 1000, number % 1000 // 10


def compat_libraries(root: Path = CUDA_ROOT) -> Path | None:
    """Where the image keeps CUDA's forward-compatibility driver libraries, if it has them."""
    for directory in (root / "compat" / "lib.real", root / "compat" / "lib", root / "compat"):
        if (directory / "libcuda.so.1").exists():
            return directory
    return None


_PROBE = """
import ctypes, sys
cuda = ctypes.CDLL(sys.argv[1] + "/libcuda.so.1")
status = cuda.cuInit(0)
version = ctypes.c_int(0)
cuda.cuDriverGetVersion(ctypes.byref(version))
print(status, version.value)
"""


def probe_compat(libraries: Path) -> tuple[int, Version | None]:
    """``cuInit``'s status and the CUDA version with the compatibility libraries loaded, in a child
    process (this one never loads a CUDA driver)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, str(libraries)], capture_output=True, text=True, timeout=60, check=False
        )
        status, version = (int(field) for field in done.stdout.split())
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return -1, None
    return status, _cuda_version(version) if version else None


def ami_for(cuda: Version) -> str | None:
    """The newest SageMaker GPU AMI whose driver runs ``cuda``."""
    fitting = [name for name, _, runs in GPU_AMIS if runs >= cuda]
    return fitting[-1] if fitting else None


@dataclass(frozen=True)
class Verdict:
    """What start-up does about the driver: log ``says`` (at ``level``); with ``libraries`` Triton runs
    on the forward-compatibility package; with ``refusal`` `serve` stops."""

    says: str
    level: int = logging.INFO
    libraries: Path | None = None
    refusal: str | None = None


def judge(driver: Driver, image: Version | None, compat: Path | None, probe: object = probe_compat) -> Verdict:
    """The driver found against the image's CUDA (``probe`` tries the compatibility libraries)."""
    gpus = f"{len(driver.gpus)} GPU{'s' * (len(driver.gpus) != 1)} ({', '.join(sorted(set(driver.gpus)))})"
    found = f"{gpus}, NVIDIA driver {driver.version} (runs CUDA up to {shown(driver.cuda)})"
    if image is None:
        return Verdict(f"{found}; this image names no CUDA version")
    if driver.cuda >= image:
        return Verdict(f"{found}; this image's CUDA {shown(image)}")
    why = "the image has no forward-compatibility libraries"
    if compat is not None:
        status, version = probe(compat)  # type: ignore[operator]
        if status == 0 and version is not None and version >= image:
            return Verdict(
                f"{found}, older than this image's CUDA {shown(image)}: running it on CUDA's forward "
                f"compatibility ({compat})",
                logging.WARNING,
                libraries=compat,
            )
        why = f"CUDA's forward compatibility does not work on this GPU and driver (cuInit: {status})"
    if driver.cuda[0] == image[0]:
        return Verdict(
            f"{found}, older than this image's CUDA {shown(image)}, and {why}: running it on CUDA's minor-version "
            f"compatibility (a CUDA {image[0]} driver runs CUDA {image[0]}.x, but not PTX compiled for CUDA "
            f"{shown(image)})",
            logging.WARNING,
        )
    ami = ami_for(image)
    pick = f"deploy with InferenceAmiVersion={ami}" if ami else "use an image built for an older CUDA"
    return Verdict(
        found,
        logging.ERROR,
        refusal=f"the GPU driver {driver.version} runs CUDA up to {shown(driver.cuda)}, a major version older than "
        f"this image's CUDA {shown(image)}, and {why}: {pick}",
    )


def check_driver(env: Mapping[str, str] = os.environ) -> Verdict | None:
    """The verdict on this host's driver (None without a GPU)."""
    driver = gpu_driver()
    if driver is None:
        return None
    return judge(driver, image_cuda(env), compat_libraries())
