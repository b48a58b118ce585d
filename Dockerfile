# syntax=docker/dockerfile:1
#
# The serving image: `serve` (SageMaker's hosting contract) in front of an embedded Triton.
#
#   triton (default): on a Triton image with every native backend, for GPU and CPU instances.
#       BASE_IMAGE=nvcr.io/nvidia/tritonserver:<YY.MM>-py3 (NVIDIA's, the default), or AWS's
#       <account>.dkr.ecr.<region>.amazonaws.com/sagemaker-tritonserver:<YY.MM>-py3, which AWS
#       requires for multi-model endpoints on GPU instances.
#   cpu: no NGC image needed; a slim Python with the Triton binary of the nvidia-pytriton wheel and the
#       project's Python-based onnxruntime/pytorch backends. For CPU instances, serverless and local runs.
#
#   docker buildx build --load --provenance=false --platform linux/amd64 -t smtriton .
#   docker buildx build --load --provenance=false --platform linux/amd64 --target cpu -t smtriton:cpu .
#   (or: smtriton build-image / smtriton push-image)
#
# Python dependencies are installed with the versions locked in requirements.lock
# (uv pip compile, see its header). The base's own python3 runs `serve`: Triton's Python backend stub
# embeds that interpreter, so Python models see the same packages. It must be 3.10 to 3.12 (what
# requirements.lock covers): NVIDIA's releases on Ubuntu 22.04 have 3.10, those on Ubuntu 24.04 (after
# 24.10) have 3.12. Which release the default pins, and why: docs/deployment.md, "The base image".
#
# SageMaker runs `docker run IMAGE serve`, as root; the image works as any other user too
# (`docker run --user 1000:1000 ...`): nothing in it needs to be written, scratch goes to /tmp.

ARG BASE_IMAGE=nvcr.io/nvidia/tritonserver:25.04-py3
ARG CPU_BASE_IMAGE=python:3.11-slim-bookworm
ARG UV_VERSION=0.13.9

# uv, used only while building (bind-mounted, never copied into an image).
FROM ${CPU_BASE_IMAGE} AS uv
ARG UV_VERSION
RUN pip install --no-cache-dir "uv==${UV_VERSION}"

# Local runs and CPU instances without an NGC image.
FROM ${CPU_BASE_IMAGE} AS cpu
ARG CPU_BASE_IMAGE
# Opt-in CPU PyTorch for the Python-based pytorch backend (TorchScript models), e.g. 2.13.0.
ARG TORCH_VERSION=""
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PATH=/opt/smtriton/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    UV_NO_CACHE=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_PYTHON_DOWNLOADS=never
# The `local` extra, less what serve never imports: nvidia-pytriton is there for its Triton binary and
# libraries only, so its Python dependencies (tritonclient[all], gevent, zmq, ...) are left out.
RUN --mount=type=bind,from=uv,source=/usr/local/bin/uv,target=/usr/local/bin/uv \
    --mount=type=bind,target=/src,rw \
    uv venv --seed --python /usr/local/bin/python3 /opt/smtriton \
    && uv pip install --python /opt/smtriton/bin/python --constraint /src/requirements.lock /src onnxruntime \
    && uv pip install --python /opt/smtriton/bin/python --constraint /src/requirements.lock \
       --no-deps nvidia-pytriton \
    && rm -f /opt/smtriton/bin/smtriton \
    && mkdir -p /opt/ml/model /opt/ml/models
RUN --mount=type=bind,from=uv,source=/usr/local/bin/uv,target=/usr/local/bin/uv \
    if [ -n "${TORCH_VERSION}" ]; then \
      uv pip install --python /opt/smtriton/bin/python --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"; \
    fi
LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true \
      com.amazonaws.sagemaker.capabilities.multi-models=true \
      org.opencontainers.image.title=smtriton \
      org.opencontainers.image.base.name=${CPU_BASE_IMAGE} \
      io.smtriton.target=cpu
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/smtriton/bin/serve"]

# The default target: NVIDIA's (or AWS's SageMaker) Triton image with its native backends.
FROM ${BASE_IMAGE} AS triton
ARG BASE_IMAGE
ENV PATH=/opt/smtriton/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    UV_NO_CACHE=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_PYTHON_DOWNLOADS=never
# --system-site-packages: Python models keep seeing what the base image (or a derived image) put in
# the system Python, as they do under NVIDIA's own serve. Add packages with /opt/smtriton/bin/pip.
RUN --mount=type=bind,from=uv,source=/usr/local/bin/uv,target=/usr/local/bin/uv \
    --mount=type=bind,target=/src,rw \
    uv venv --seed --system-site-packages --python /usr/bin/python3 /opt/smtriton \
    && uv pip install --python /opt/smtriton/bin/python --constraint /src/requirements.lock /src \
    && rm -f /opt/smtriton/bin/smtriton \
    && mkdir -p /opt/ml/model /opt/ml/models
LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true \
      com.amazonaws.sagemaker.capabilities.multi-models=true \
      org.opencontainers.image.title=smtriton \
      org.opencontainers.image.base.name=${BASE_IMAGE} \
      io.smtriton.target=triton
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/smtriton/bin/serve"]
