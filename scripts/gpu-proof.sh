#!/usr/bin/env bash
# Prove the production image on a real GPU host: build the `triton` target on NVIDIA's Triton image, run
# the image checks CI runs on its stand-in, convert a model to a TensorRT plan inside that image with the
# project's own conversion, and run the GPU tests inside the image on the GPU. Prints one report.
#
#   bash scripts/gpu-proof.sh [BASE_IMAGE]        (default nvcr.io/nvidia/tritonserver:<the Dockerfile's release>-py3)
#
#   docker     docker with a daemon and the buildx plugin
#   gpu        an NVIDIA GPU (nvidia-smi -L lists GPU $GPU)
#   base       BASE_IMAGE present or pulled (NGC refuses anonymous pulls: `docker login nvcr.io`)
#   toolkit    docker hands the GPU to a container of BASE_IMAGE (the NVIDIA container toolkit)
#   build      `smtriton build-image --base-image BASE_IMAGE`: the triton target, as users build it
#   image      `scripts/image-test.sh` on that base: SME, MME, labels, non-root, SIGTERM, size (no GPU needed)
#   convert    the demo text encoder exported to ONNX here (CPU torch), then built into a TensorRT plan
#              inside the image on the GPU (smtriton/convert/build_tensorrt_in_image.sh)
#   gpu-tests  tests/gpu inside the image on the GPU (scripts/gpu-tests-in-image.sh): TensorRT builds and
#              tune, ONNX Runtime and TorchScript on CUDA, a multi-model endpoint's GPU memory and its
#              507, and the plan of `convert` served
#
# A step that cannot run here says why (no Docker, no GPU, no NGC access, ...) and the steps that need it
# say so too; nothing is attempted that cannot work. Exit status: 0 every step ran and passed, 1 a step
# failed, 3 nothing failed but some steps could not run here.
#
# GPU picks the GPU (index, default 0); WORK keeps logs, the converted repository and the tests' JUnit
# report (default /var/tmp/smtriton-gpu-proof); IMAGE_TAG names the image (smtriton:gpu-proof); VENV is
# the environment with the project (.venv, set up by scripts/setup.sh when needed).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -gt 1 || ${1:-} == -* ]]; then
  sed -n '2,26p' "$0" >&2
  exit 2
fi
release=$(sed -n 's/^ARG BASE_IMAGE=nvcr.io\/nvidia\/tritonserver:\([0-9.]*\)-py3$/\1/p' Dockerfile)
BASE=${1:-nvcr.io/nvidia/tritonserver:${release}-py3}
GPU=${GPU:-0}
WORK=${WORK:-/var/tmp/smtriton-gpu-proof}
TAG=${IMAGE_TAG:-smtriton:gpu-proof}
VENV=${VENV:-.venv}
mkdir -p "$WORK/logs"
rm -f "$WORK"/logs/*.log "$WORK/gpu-tests.xml"
began=$(date +%s)

names=() results=() details=()
record() { names+=("$1"); results+=("$2"); details+=("$3"); echo "gpu-proof: $1: $2${3:+ - $3}" >&2; }
passed() { local i; for i in "${!names[@]}"; do [[ ${names[$i]} == "$1" && ${results[$i]} == PASS ]] && return 0; done; return 1; }
why_not() {
  # Why a step cannot run: the first step it needs that did not pass, named by the cause at the root.
  local step i
  for step in "$@"; do
    passed "$step" && continue
    for i in "${!names[@]}"; do
      [[ ${names[$i]} == "$step" ]] || continue
      if [[ ${results[$i]} == FAIL ]]; then
        echo "needs $step, which failed"
      elif [[ ${details[$i]} == "needs "* ]]; then
        echo "${details[$i]}"
      else
        echo "needs $step: ${details[$i]}"
      fi
      return
    done
  done
}
last_line() { grep -v '^[[:space:]]*$' "$1" | tail -n 1 | cut -c1-240; }
venv() {
  # The project's environment, set up on first use (scripts/setup.sh is a no-op when it is current).
  if [[ $VENV == .venv ]]; then bash scripts/setup.sh >"$WORK/logs/setup.log" 2>&1 || return 1; fi
  [[ -x $VENV/bin/smtriton ]]
}
since() { echo "$(($(date +%s) - $1)) s"; }

# 1. docker
if ! command -v docker >/dev/null; then
  record docker "CANNOT RUN" "no docker command on this host (install Docker with the buildx plugin)"
elif ! docker info >"$WORK/logs/docker-info.log" 2>&1; then
  record docker "CANNOT RUN" "the Docker daemon does not answer: $(last_line "$WORK/logs/docker-info.log")"
elif ! docker buildx version >/dev/null 2>&1; then
  record docker "CANNOT RUN" "docker has no buildx plugin (the Dockerfile needs BuildKit)"
else
  record docker PASS "$(docker version --format 'server {{.Server.Version}}' 2>/dev/null || echo answers)"
fi

# 2. gpu
if ! command -v nvidia-smi >/dev/null; then
  record gpu "CANNOT RUN" "no NVIDIA driver on this host (nvidia-smi not found)"
elif ! nvidia-smi -L >"$WORK/logs/nvidia-smi.log" 2>&1 || ! grep -q "^GPU $GPU:" "$WORK/logs/nvidia-smi.log"; then
  record gpu "CANNOT RUN" "no NVIDIA GPU $GPU: $(last_line "$WORK/logs/nvidia-smi.log")"
else
  record gpu PASS "$(grep "^GPU $GPU:" "$WORK/logs/nvidia-smi.log" | sed 's/ (UUID.*//')"
fi

# 3. base
if ! passed docker; then
  record base "CANNOT RUN" "$(why_not docker)"
elif ! docker image inspect "$BASE" >/dev/null 2>&1 && ! docker pull "$BASE" >"$WORK/logs/pull.log" 2>&1; then
  record base "CANNOT RUN" "cannot pull $BASE (NGC: docker login nvcr.io as \$oauthtoken with an NGC API key): $(
    last_line "$WORK/logs/pull.log")"
else
  record base PASS "$BASE"
fi

# 4. toolkit: docker hands the GPU to a container
if ! passed gpu || ! passed base; then
  record toolkit "CANNOT RUN" "$(why_not gpu base)"
elif docker run --rm --gpus "device=$GPU" --entrypoint nvidia-smi "$BASE" -L >"$WORK/logs/toolkit.log" 2>&1; then
  record toolkit PASS "a container sees $(last_line "$WORK/logs/toolkit.log" | sed 's/ (UUID.*//')"
else
  record toolkit FAIL "docker cannot give a container GPU $GPU (is the NVIDIA container toolkit installed?): $(
    last_line "$WORK/logs/toolkit.log")"
fi

# 5. build: the triton target, as users build it
if ! passed base; then
  record build "CANNOT RUN" "$(why_not base)"
elif ! venv; then
  record build FAIL "the project's environment $VENV could not be set up (log: $WORK/logs/setup.log)"
else
  started=$(date +%s)
  if "$VENV/bin/smtriton" build-image --tag "$TAG" --base-image "$BASE" >"$WORK/logs/build.log" 2>&1; then
    size=$(docker image inspect --format '{{.Size}}' "$TAG")
    record build PASS "$TAG, $((size / 1000000)) MB, $(since "$started")"
  else
    # BuildKit's own error line says more than the exit status smtriton reports after it.
    reason=$(grep '^ERROR' "$WORK/logs/build.log" | tail -n 1 | cut -c1-240 || true)
    record build FAIL "smtriton build-image: ${reason:-$(last_line "$WORK/logs/build.log")} (log: $WORK/logs/build.log)"
  fi
fi

# 6. image: the checks CI runs on its stand-in, on the real base (no GPU needed)
if ! passed build; then
  record image "CANNOT RUN" "$(why_not build)"
else
  started=$(date +%s)
  if IMAGE_TARGETS=triton TRITON_BASE_IMAGE=$BASE VENV=$VENV bash scripts/image-test.sh >"$WORK/logs/image.log" 2>&1; then
    record image PASS "$(grep -Eo '[0-9]+ passed[^=]*' "$WORK/logs/image.log" | tail -n 1), $(since "$started")"
  else
    record image FAIL "scripts/image-test.sh: $(last_line "$WORK/logs/image.log") (log: $WORK/logs/image.log)"
  fi
fi

# 7. convert: ONNX here, the TensorRT plan inside the image on the GPU
repo=$WORK/repository
if ! passed build || ! passed toolkit; then
  record convert "CANNOT RUN" "$(why_not build toolkit)"
else
  started=$(date +%s)
  rm -rf "$repo"
  if "$VENV/bin/smtriton" convert onnx -m text_encoder -o "$repo" >"$WORK/logs/convert.log" 2>&1 \
    && GPU=$GPU bash smtriton/convert/build_tensorrt_in_image.sh "$TAG" "$repo" "$repo/text_encoder" \
      --model text_encoder --profile batch=1:16:16,sequence=1:32:128 --precision fp16 \
      --timing-cache "$repo/.timing-cache" >>"$WORK/logs/convert.log" 2>&1 \
    && plan=$(compgen -G "$repo/*/[0-9]*/model.plan" | head -n 1) && [[ -n $plan ]]; then
    record convert PASS "text_encoder to ${plan#"$repo"/} (fp16), $(since "$started")"
  else
    record convert FAIL "$(last_line "$WORK/logs/convert.log") (log: $WORK/logs/convert.log)"
  fi
fi

# 8. gpu-tests: tests/gpu inside the image on the GPU
if ! passed build || ! passed toolkit; then
  record gpu-tests "CANNOT RUN" "$(why_not build toolkit)"
else
  plan_env=()
  if passed convert; then plan_env=(--env SMTRITON_GPU_PLAN_REPOSITORY=/work/repository); fi
  started=$(date +%s)
  if docker run --rm --gpus "device=$GPU" --shm-size 1g -v "$PWD:/src:ro" -v "$WORK:/work" \
    "${plan_env[@]}" --entrypoint bash "$TAG" /src/scripts/gpu-tests-in-image.sh >"$WORK/logs/gpu-tests.log" 2>&1; then
    outcome=PASS
  else
    outcome=FAIL
  fi
  counts=$(grep -Eo '[0-9]+ (passed|failed|skipped|error)[^=]*' "$WORK/logs/gpu-tests.log" | tail -n 1 || true)
  record gpu-tests "$outcome" "${counts:-$(last_line "$WORK/logs/gpu-tests.log")}, $(since "$started") (log: $WORK/logs/gpu-tests.log)"
fi

# The report.
echo
echo "smtriton GPU proof, $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname), $(($(date +%s) - began)) s; base $BASE"
status=0
for i in "${!names[@]}"; do
  printf '  %-10s %-10s %s\n' "${names[$i]}" "${results[$i]}" "${details[$i]}"
  case ${results[$i]} in
    FAIL) status=1 ;;
    "CANNOT RUN") [[ $status -eq 1 ]] || status=3 ;;
  esac
done
# What pytest said about each test that did not pass, from the steps that ran tests.
for step in image gpu-tests; do
  if [[ -f $WORK/logs/$step.log ]]; then
    grep -E '^(FAILED|ERROR|SKIPPED) ' "$WORK/logs/$step.log" | cut -c1-240 | sed "s/^/    $step: /" || true
  fi
done
echo "  logs in $WORK/logs"
exit $status
