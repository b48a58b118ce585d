#!/usr/bin/env bash
# Create (or refresh) the project's virtualenv in .venv: CPU torch, the project with its local
# Triton (nvidia-pytriton), conversion and test extras, every version as requirements-dev.lock pins it
# (the runtime ones as the image ships them). A no-op when pyproject.toml and the lock are unchanged.
#
#   bash scripts/setup.sh [--torchvision]
#
# --torchvision  also install torchvision, as the CPU build that matches the CPU torch (PyPI's Linux
#                torchvision is built against CUDA torch and fails at import beside the CPU one)
set -euo pipefail
cd "$(dirname "$0")/.."

TORCHVISION=0
for arg in "$@"; do
  case "$arg" in
    --torchvision) TORCHVISION=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "error: unknown option $arg (bash scripts/setup.sh --help)" >&2; exit 2 ;;
  esac
done

PYTHON=${PYTHON:-}
if [[ -z "$PYTHON" ]]; then
  # torch's CPU wheel on this kind of machine is built for CPython 3.11; prefer it.
  for candidate in python3.11 python3.12 python3.10 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PYTHON=$candidate; break; fi
  done
fi
VENV=${VENV:-.venv}
stamp="$VENV/.smtriton-setup"
want="$(cat pyproject.toml requirements-dev.lock | sha256sum | cut -d' ' -f1)"
[[ $TORCHVISION == 1 ]] && want="$want torchvision"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi

step() { echo "setup [$1/4] $2" >&2; }
step 1 "creating $VENV with $($PYTHON --version 2>&1)"
"$PYTHON" -m venv "$VENV"
WHEELS=${WHEELS:-/opt/wheels}
pip_args=(--quiet --disable-pip-version-check)
[[ -d "$WHEELS" ]] && pip_args+=(--find-links "$WHEELS")
step 2 "upgrading pip"
"$VENV/bin/python" -m pip install "${pip_args[@]}" --upgrade pip
# Torch first, at the lock's version, as its CPU build (2.13.0+cpu sorts after 2.13.0, so pip prefers
# it): from $WHEELS where it lies there, else from PyTorch's CPU index. PyPI's Linux build is the CUDA
# one, which pulls several GB of NVIDIA libraries this project never uses on a CPU host.
# torchvision likewise: the CPU build made for the lock's torch (its exact torch requirement lets pip
# pick it).
torch_packages=(torch)
wheel_globs=("$WHEELS/torch-*+cpu-*.whl")
if [[ $TORCHVISION == 1 ]]; then
  torch_packages+=(torchvision)
  wheel_globs+=("$WHEELS/torchvision-*+cpu-*.whl")
fi
torch_args=()
for glob in "${wheel_globs[@]}"; do
  if ! compgen -G "$glob" >/dev/null; then
    torch_args=(--extra-index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}")
  fi
done
if [[ $TORCHVISION == 1 ]]; then
  step 3 "installing PyTorch and torchvision (CPU builds, about 1 minute)"
else
  step 3 "installing PyTorch (CPU build, about 1 minute)"
fi
"$VENV/bin/python" -m pip install "${pip_args[@]}" "${torch_args[@]}" -c requirements-dev.lock "${torch_packages[@]}"
if [[ $TORCHVISION == 1 ]] && ! "$VENV/bin/python" -c "import torchvision" >/dev/null 2>&1; then
  # Where PyTorch's index cannot be reached, pip falls back to PyPI's torchvision, built for CUDA torch.
  echo "error: torchvision does not import beside this torch (PyPI's CUDA build?): reach" \
    "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu} (or set TORCH_INDEX_URL, or put a" \
    "torchvision-*+cpu wheel in $WHEELS) and run again" >&2
  exit 1
fi
step 4 "installing smtriton with a local Triton, the conversion tools and the test tools (2-3 minutes)"
"$VENV/bin/python" -m pip install "${pip_args[@]}" -c requirements-dev.lock -e ".[local,convert,test]"
echo "$want" > "$stamp"
# Not "ready": the demo's one line with that word is serve's, once its model answers.
echo "setup done: $VENV" >&2
