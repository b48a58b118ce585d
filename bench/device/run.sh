#!/usr/bin/env bash
# Issue 44's 16-core rows on a lent GPU host, from what bench/device/pack.sh put in .device/: unpacks it
# (once a machine), then runs the stages asked for, each one's output kept in $OUT as it ends (the
# device tool brings $OUT back; elsewhere it defaults to bench/results/device/).
#
#   bash bench/device/run.sh rows          # tiny, text (merged and not), image body: ~4.5 minutes
#   bash bench/device/run.sh faults        # the fault tests with 8 workers: ~3.5 minutes
#   bash bench/device/run.sh rows faults   # both, in one call of at most 10 minutes
#
# ROUNDS and SECONDS_PER_RUN change the interleaved runs (default 6 rounds of 3 s); WORKERS the workers
# of every serve (default 8, a 16-core host's default).
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
KIT=${KIT:-.device}
RUNTIME=${RUNTIME:-/tmp/smtriton-device}
OUT=${OUT:-$repo/bench/results/device}
ROUNDS=${ROUNDS:-6}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-3}
WORKERS=${WORKERS:-8}
HOST_PYTHON=${HOST_PYTHON:-python3}
mkdir -p "$OUT"

# A virtual environment of the kit, the host's packages after it (its numpy 2 among them) through a .pth
# file: Triton's Python stub ignores PYTHONPATH and finds its packages through the venv whose bin is
# first on PATH (serve puts its own interpreter's there), so the kit must be a venv's, not a path's.
venv=$RUNTIME/venv
PYTHON=$venv/bin/python
if [[ ! -f "$RUNTIME/.unpacked" ]]; then
  [[ -f "$KIT/site.tar.xz" && -f "$KIT/triton.tar.xz" ]] || {
    echo "error: $KIT has no kit: run bash bench/device/pack.sh where pip reaches PyPI, and carry $KIT" >&2
    exit 2
  }
  rm -rf "$RUNTIME" && mkdir -p "$RUNTIME" || exit 2
  "$HOST_PYTHON" -m venv --without-pip "$venv" || exit 2
  site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  tar -xJf "$KIT/site.tar.xz" -C "$site" && tar -xJf "$KIT/triton.tar.xz" -C "$site" || exit 2
  "$HOST_PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/zz-host-packages.pth" || exit 2
  echo "$repo" >"$site/smtriton-checkout.pth"
  cp -r "$KIT/bin" "$KIT/lib" "$RUNTIME/" || exit 2
  touch "$RUNTIME/.unpacked"
fi
if [[ ! -f model_repository/text_encoder/config.pbtxt ]]; then
  cp -r "$KIT/models/text_encoder" model_repository/ || exit 2
fi
export PATH="$venv/bin:$RUNTIME/bin:$PATH" LD_LIBRARY_PATH="$RUNTIME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1

{
  date -u +%FT%TZ
  nproc
  "$PYTHON" -V
  git rev-parse HEAD 2>/dev/null || echo "(no git history here)"
  wrk --version 2>&1 | head -1
  "$PYTHON" - <<'EOF'
import importlib.metadata as md

from smtriton.serve.triton.installation import find_triton

for name in ("numpy", "uvloop", "httptools", "uvicorn", "orjson", "pydantic", "fastapi", "onnxruntime", "onnx"):
    print(name, md.version(name))
print("tritonserver", find_triton().binary)
# What a worker, the benchmark and the fault tests import: a package missing fails here, in seconds, not
# as servers that never answer /ping.
import bench.interleaved_ab, smtriton.serve.http.worker, smtriton.serve.owner.cli, tests.integration.test_faults
EOF
} 2>&1 | tee "$OUT/host.txt" || exit 2

rows() {
  local ab=("$PYTHON" -m bench.interleaved_ab --rounds "$ROUNDS" --seconds "$SECONDS_PER_RUN" --connections 64)
  local ours="ours=.@SAGEMAKER_MODEL_SERVER_WORKERS=$WORKERS"
  # Half the workers beside: on 2 cores at c=64, one worker merged fuller and spent less CPU a request than
  # two (bench/NOTES.md Part 22); whether the same holds with 16 cores is what this variant tells.
  local half="half=.@SAGEMAKER_MODEL_SERVER_WORKERS=$(((WORKERS + 1) / 2))"
  local failed=0  # a row that fails is reported; the next rows still run
  "${ab[@]}" --scenario tiny_binary --instances 8 anchor "$ours" "$half" 2>&1 | tee "$OUT/tiny-c64.txt" || failed=1
  "${ab[@]}" --scenario text_binary --instances 4 anchor "$ours" "$half" \
    "unmerged=.@SAGEMAKER_MODEL_SERVER_WORKERS=$WORKERS,SMTRITON_MERGE_REQUESTS=false" 2>&1 |
    tee "$OUT/text-c64.txt" || failed=1
  "${ab[@]}" --scenario image_binary anchor "$ours" 2>&1 | tee "$OUT/image-c64.txt" || failed=1
  return $failed
}

faults() {
  SMTRITON_TEST_WORKERS=$WORKERS "$PYTHON" -m pytest -p no:cacheprovider -q tests/integration/test_faults.py 2>&1 |
    tee "$OUT/faults.txt"
}

status=0
for stage in "${@:-rows}"; do
  case "$stage" in
    rows | faults) echo "== $stage $(date -u +%T)" && "$stage" || status=1 ;;
    *) echo "error: unknown stage $stage (rows, faults)" >&2 && exit 2 ;;
  esac
done
echo "== done $(date -u +%T)"
exit $status
