#!/usr/bin/env bash
# Run inside the serving image on a GPU host (scripts/gpu-proof.sh starts it, with the project at /src
# read-only and its work folder at /work): installs what the GPU tests need into the image's environment
# of this throwaway container, then runs tests/gpu. Nothing is installed in the image itself.
#
#   - the TensorRT Python package of the image's own TensorRT (NVIDIA's images set TRT_VERSION; else it
#     is read off libnvinfer), and cuda-python for the image's CUDA, as build_tensorrt_in_image.sh does;
#   - CPU PyTorch at requirements-dev.lock's version (it makes the TorchScript and ONNX test models;
#     Triton's own backends run them on the GPU);
#   - the project with its tensorrt, convert and test extras, at requirements-dev.lock's versions less its
#     CUDA stack (cuda-*, nvidia-*, triton: what a CUDA build of torch would pull, pinned for CUDA 13),
#     which must follow the image's CUDA instead.
set -euo pipefail
say() { echo "gpu-tests: $*" >&2; }

trt=${TRT_VERSION:-}
if [[ -z $trt ]]; then
  lib=$(compgen -G '/usr/lib/*-linux-gnu/libnvinfer.so.*' | sort -V | tail -n 1 || true)
  trt=${lib##*libnvinfer.so.}
fi
cuda=${CUDA_VERSION%%.*}
if [[ -z $trt || -z $cuda ]]; then
  say "this image has no TensorRT or CUDA (TRT_VERSION, libnvinfer, CUDA_VERSION): is it built on NVIDIA's Triton image?"
  exit 1
fi
python=/opt/smtriton/bin/python
torch=$(sed -n 's/^torch==\([^ ;]*\).*/\1/p' /src/requirements-dev.lock | head -n 1)
say "TensorRT $trt, CUDA $cuda, $("$python" --version), torch $torch (CPU)"

# A writable copy of the project without what the host built into it.
mkdir -p /tmp/src
tar -C /src --exclude=./.venv --exclude=./.git --exclude=./model_repository --exclude='*.egg-info' \
  --exclude=__pycache__ -cf - . | tar -C /tmp/src -xf -
grep -Ev '^(cuda-|nvidia-|triton==)' /tmp/src/requirements-dev.lock >/tmp/constraints.txt
pip=("$python" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore)
"${pip[@]}" --index-url https://download.pytorch.org/whl/cpu "torch==$torch"
"${pip[@]}" --constraint /tmp/constraints.txt "tensorrt-cu${cuda}==${trt}" "cuda-python==${cuda}.*" \
  "/tmp/src[tensorrt,convert,test]"

cd /tmp/src
say "running tests/gpu${SMTRITON_GPU_PLAN_REPOSITORY:+ (the converted plans in $SMTRITON_GPU_PLAN_REPOSITORY)}"
exec "$python" -m pytest -q -rs -p no:cacheprovider --junitxml /work/gpu-tests.xml tests/gpu
