#!/usr/bin/env bash
# Pack what a lent GPU host needs for issue 44's 16-core rows into .device/ (git ignores it), so that one
# call there runs them (bench/device/run.sh). Such a host has Python 3.12, torch, onnx, onnxruntime,
# pytest, hypothesis, requests, aiohttp, grpcio and pillow, no network and no wrk; what travels must stay
# under 64 MiB with the repository. Run here, where pip reaches PyPI:
#
#   bash bench/device/pack.sh            # then carry .device (and nothing else) to the host
#
# PYTHON_VERSION=3.11 packs for another Python (to try run.sh on this machine). What it packs:
#   .device/site.tar.xz    the serving runtime at requirements.lock's versions, for that Python (numpy 1.26
#                          among them: Triton 2.51's Python stub needs numpy 1), less what the host has
#   .device/triton.tar.xz  the nvidia-pytriton wheel's tritonserver, with only that Python's backend stub
#   .device/bin/wrk, .device/lib/  wrk and its LuaJIT, from this machine
#   .device/models/text_encoder    the demo's text encoder, built here (the host's transformers does not
#                          import beside numpy 1)
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON_VERSION=${PYTHON_VERSION:-3.12}
TAG=cp${PYTHON_VERSION/./}
OUT=.device
# Locked packages the host already has and that no row measures: left out for room.
ON_HOST='aiohttp|aiohappyeyeballs|aiosignal|attrs|frozenlist|multidict|propcache|yarl|grpcio|pillow|ml-dtypes|rich|pygments|markdown-it-py|mdurl|click|typer|shellingham|certifi|idna|urllib3|packaging|typing-extensions|prometheus-client|nvidia-ml-py|async-timeout|exceptiongroup'
# Packages of the lock's local extra that serve does not import (the wheel's Python side, the ONNX
# Runtime the host has): only the wheel's binaries are used.
NOT_NEEDED='nvidia-pytriton|onnxruntime|sympy|mpmath|flatbuffers|coloredlogs|humanfriendly|pyreadline3|pyzmq|sh|wrapt|typing-inspect|mypy-extensions|importlib-metadata|lazy-importer|zipp'
platforms=()
for p in manylinux_2_35 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
  platforms+=(--platform "${p}_x86_64")
done
pip_target=(--only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp --abi "$TAG" "${platforms[@]}")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$OUT" && mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/models"

echo "pack [1/4] the serving runtime for $TAG (requirements.lock)" >&2
grep -vE "^($ON_HOST|$NOT_NEEDED)==" requirements.lock >"$work/lock.txt"
python3 -m pip download --quiet --disable-pip-version-check --no-deps "${pip_target[@]}" -d "$work/wheels" \
  -r "$work/lock.txt"
python3 -m pip install --quiet --disable-pip-version-check --no-deps --no-compile --no-index "${pip_target[@]}" \
  --target "$work/site" "$work"/wheels/*.whl
tar -cJf "$OUT/site.tar.xz" -C "$work/site" .

echo "pack [2/4] tritonserver from nvidia-pytriton (its $PYTHON_VERSION stub only)" >&2
pytriton=$(grep -oE '^nvidia-pytriton==[^ ;]+' requirements.lock)
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$PYTHON_VERSION" "${platforms[@]}" -d "$work/pytriton" "$pytriton"
mkdir "$work/triton"
python3 -m zipfile -e "$work"/pytriton/*.whl "$work/triton"
find "$work/triton/pytriton/tritonserver/python_backend_stubs" -mindepth 1 -maxdepth 1 \
  ! -name "$PYTHON_VERSION" -exec rm -rf {} +
# The other Pythons' stubs link the wheel's own libpython (3.13's); the kept stub links the host's.
rm -f "$work"/triton/nvidia_pytriton.libs/libpython3-*
chmod +x "$work"/triton/pytriton/tritonserver/bin/* "$work"/triton/pytriton/tritonserver/python_backend_stubs/*/*
tar -cJf "$OUT/triton.tar.xz" -C "$work/triton" .

echo "pack [3/4] wrk" >&2
wrk=$(command -v wrk) || { echo "error: wrk not found here (apt-get install -y wrk)" >&2; exit 1; }
cp "$wrk" "$OUT/bin/"
ldd "$wrk" | awk '/libluajit/ {print $3}' | xargs -r -I{} cp -L {} "$OUT/lib/"

echo "pack [4/4] the text encoder" >&2
if [[ ! -f model_repository/text_encoder/config.pbtxt ]]; then
  bash scripts/setup.sh
  .venv/bin/smtriton build-repository model_repository/recipe.toml --model text_encoder
fi
cp -r model_repository/text_encoder "$OUT/models/"

tree_bytes=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
kit_bytes=$(du -sb "$OUT" | cut -f1)
total=$((tree_bytes + kit_bytes))
echo "packed: .device $((kit_bytes / 1048576)) MiB + the working tree $((tree_bytes / 1048576)) MiB = $((total / 1048576)) MiB (64 at most)"
if ((total > 64 * 1048576)); then
  echo "error: more than one transfer of 64 MiB" >&2
  exit 1
fi
