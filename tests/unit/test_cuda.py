"""The GPU driver against the image's CUDA: what start-up says and does, decided from the versions found."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from smtriton.serve.host import cuda
from smtriton.serve.host.cuda import Driver

H100 = ("NVIDIA H100 80GB HBM3",)
A10G = ("NVIDIA A10G",) * 4


def _never(libraries: Path) -> tuple[int, cuda.Version | None]:
    raise AssertionError("the compatibility libraries were tried although the driver is new enough")


def test_a_driver_new_enough_is_said_and_nothing_else_happens():
    verdict = cuda.judge(Driver("580.159.04", (13, 0), H100), (12, 9), None, _never)
    assert verdict.says == (
        "1 GPU (NVIDIA H100 80GB HBM3), NVIDIA driver 580.159.04 (runs CUDA up to 13.0); this image's CUDA 12.9"
    )
    assert (verdict.level, verdict.libraries, verdict.refusal) == (logging.INFO, None, None)


def test_a_driver_of_an_older_major_version_without_forward_compatibility_stops_with_the_versions_and_the_ami():
    verdict = cuda.judge(Driver("535.54.03", (12, 2), A10G), (13, 0), None, _never)
    assert verdict.refusal == (
        "the GPU driver 535.54.03 runs CUDA up to 12.2, a major version older than this image's CUDA 13.0, and the "
        "image has no forward-compatibility libraries: deploy with "
        "InferenceAmiVersion=al2023-ami-sagemaker-inference-gpu-4-1"
    )
    assert verdict.says.startswith("4 GPUs (NVIDIA A10G), NVIDIA driver 535.54.03")
    assert verdict.level == logging.ERROR


def test_a_driver_of_the_same_major_version_runs_the_image_on_minor_version_compatibility_with_a_warning():
    """CUDA 12.8 on a 12.4 driver: CUDA's minor-version compatibility runs it (PTX JIT excepted), as
    NVIDIA's own entry point lets it."""
    verdict = cuda.judge(Driver("550.90.07", (12, 4), A10G), (12, 8), None, _never)
    assert (verdict.refusal, verdict.libraries, verdict.level) == (None, None, logging.WARNING)
    assert verdict.says == (
        "4 GPUs (NVIDIA A10G), NVIDIA driver 550.90.07 (runs CUDA up to 12.4), older than this image's CUDA 12.8, "
        "and the image has no forward-compatibility libraries: running it on CUDA's minor-version compatibility "
        "(a CUDA 12 driver runs CUDA 12.x, but not PTX compiled for CUDA 12.8)"
    )


def test_forward_compatibility_is_used_where_it_works_and_else_minor_or_refused_by_major(tmp_path):
    old = Driver("535.54.03", (12, 2), H100)
    works = cuda.judge(old, (12, 9), tmp_path, lambda libraries: (0, (12, 9)))
    assert works.libraries == tmp_path
    assert works.refusal is None
    assert works.level == logging.WARNING
    assert "running it on CUDA's forward compatibility" in works.says
    # 804: CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE (a GPU that is not a data-center one)
    minor = cuda.judge(old, (12, 9), tmp_path, lambda libraries: (804, None))
    assert (minor.refusal, minor.libraries, minor.level) == (None, None, logging.WARNING)
    assert (
        "forward compatibility does not work on this GPU and driver (cuInit: 804): running it on CUDA's "
        "minor-version compatibility"
    ) in minor.says
    refused = cuda.judge(old, (13, 0), tmp_path, lambda libraries: (804, None))
    assert refused.refusal is not None
    assert "forward compatibility does not work on this GPU and driver (cuInit: 804)" in refused.refusal
    assert refused.refusal.endswith("InferenceAmiVersion=al2023-ami-sagemaker-inference-gpu-4-1")


def test_an_image_newer_than_every_ami_says_so():
    verdict = cuda.judge(Driver("580.1", (13, 0), H100), (14, 0), None, _never)
    assert verdict.refusal is not None
    assert verdict.refusal.endswith("use an image built for an older CUDA")


def test_the_images_cuda_is_read_from_nvidias_variable_or_the_toolkit(tmp_path):
    assert cuda.image_cuda({"CUDA_VERSION": "12.9.0.043"}, tmp_path) == (12, 9)
    assert cuda.image_cuda({}, tmp_path) is None  # the cpu image: no CUDA
    (tmp_path / "version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.4.1"}}))
    assert cuda.image_cuda({}, tmp_path) == (12, 4)
    assert cuda.ami_for((12, 2)) == "al2023-ami-sagemaker-inference-gpu-4-1"  # the newest that runs it


def test_the_compatibility_libraries_are_found_where_nvidias_images_keep_them(tmp_path):
    assert cuda.compat_libraries(tmp_path) is None
    (tmp_path / "compat" / "lib.real").mkdir(parents=True)
    (tmp_path / "compat" / "lib.real" / "libcuda.so.1").write_bytes(b"")
    assert cuda.compat_libraries(tmp_path) == tmp_path / "compat" / "lib.real"


def test_the_ami_table_is_botocores():
    """SageMaker's GPU AMIs as botocore's service model documents them: a new AMI fails this test until
    the table (and docs/deployment.md's) knows it."""
    botocore_session = pytest.importorskip("botocore.session")
    model = botocore_session.get_session().get_service_model("sagemaker")
    names = model.shape_for("ProductionVariantInferenceAmiVersion").enum
    text = re.sub(r"<[^>]+>", " ", model.shape_for("ProductionVariant").members["InferenceAmiVersion"].documentation)
    documented = {}
    for name, body in re.findall(r"(al2\S*-ami-sagemaker-inference-gpu-\S+)(.*?)(?=al2\S*-ami-|$)", text):
        driver = re.search(r"NVIDIA driver version:\s*(\d+)", body)
        version = re.search(r"CUDA version:\s*(\d+)\.(\d+)", body)
        assert driver is not None
        assert version is not None
        documented[name] = (int(driver.group(1)), (int(version.group(1)), int(version.group(2))))
    gpu_names = {n for n in names if "-gpu-" in n}
    assert set(documented) == gpu_names
    assert {name: (driver, runs) for name, driver, runs in cuda.GPU_AMIS} == documented
