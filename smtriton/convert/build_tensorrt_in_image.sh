#!/usr/bin/env bash
# Build a TensorRT plan inside the serving image, on this host's GPU: the safe way.
#
# A plan loads only with the TensorRT version that built it and on the GPU architecture it was built
# for. Building inside the image that serves it (same TensorRT as its Triton) on the instance type that
# serves it (same GPU) is what makes `serve`'s check of the sidecar pass. This script mounts the
# project and the model repository into the image, installs the TensorRT Python package that matches
# the image's libnvinfer plus `smtriton[tensorrt]` into the throwaway container, and runs
# `smtriton convert tensorrt` there. Results land in REPOSITORY on the host.
#
#   smtriton/convert/build_tensorrt_in_image.sh IMAGE REPOSITORY SOURCE [convert tensorrt options...]
#
#   IMAGE       the serving image (smtriton build-image), e.g. smtriton:latest
#   REPOSITORY  model repository on the host; the plan is written to REPOSITORY/<name>/<version>/
#   SOURCE      model.onnx or a model directory holding one, inside REPOSITORY
#
# e.g. (on a g5 instance, for endpoints on ml.g5.*):
#   smtriton convert onnx -m text_encoder -o model_repository
#   smtriton/convert/build_tensorrt_in_image.sh smtriton:latest model_repository model_repository/text_encoder \
#       --model text_encoder --precision fp16 --timing-cache model_repository/.timing-cache
#   smtriton validate model_repository && smtriton package sme model_repository
#
# GPU=<index> picks the GPU (default 0). Needs docker with the NVIDIA container toolkit.
set -euo pipefail

if [[ $# -lt 3 ]]; then
  sed -n '2,25p' "$0" >&2
  exit 2
fi
image=$1
repo=$(realpath "$2")
source=$(realpath "$3")
shift 3
project=$(cd "$(dirname "$0")/.." && pwd)
case "$source/" in
  "$repo"/*) ;;
  *) echo "error: SOURCE must lie inside REPOSITORY ($repo)" >&2; exit 2 ;;
esac
# Paths the options name (--timing-cache, --reference, ...) are relative to REPOSITORY's parent here and
# there alike: the container works in /work, with REPOSITORY mounted at the same relative place.
parent=$(dirname "$repo")
rel_repo=${repo#"$parent"/}
rel_source=${source#"$parent"/}

exec docker run --rm --gpus "device=${GPU:-0}" \
  -v "$project:/src:ro" -v "$repo:/work/$rel_repo" -w /work \
  --entrypoint bash "$image" -c '
set -euo pipefail
# TensorRT of the image: NGC images export TRT_VERSION; else read it off libnvinfer.
trt=${TRT_VERSION:-}
if [[ -z "$trt" ]]; then
  lib=$(ls /usr/lib/*-linux-gnu/libnvinfer.so.* 2>/dev/null | sort -V | tail -n 1)
  trt=${lib##*libnvinfer.so.}
fi
cuda=${CUDA_VERSION%%.*}
[[ -n "$trt" && -n "$cuda" ]] || { echo "cannot tell the image'"'"'s TensorRT/CUDA version" >&2; exit 1; }
echo "image TensorRT $trt, CUDA $cuda" >&2
python=/opt/smtriton/bin/python
[[ -x $python ]] || python=python3
mkdir /tmp/src && tar -C /src --exclude=./.venv --exclude=./model_repository --exclude=./.git -cf - . | tar -C /tmp/src -xf -
"$python" -m pip install --quiet --disable-pip-version-check "tensorrt-cu${cuda}==${trt}" "cuda-python==${cuda}.*" \
  "/tmp/src[tensorrt]"
exec "$python" -c "from smtriton.cli import main; main()" convert tensorrt "$0" -o "$1" "${@:2}"
' "$rel_source" "$rel_repo" "$@"
