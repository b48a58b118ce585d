#!/usr/bin/env bash
# Create (or refresh) the project's virtualenv in .venv: CPU torch, the project with its local
# Triton (nvidia-pytriton), conversion and test extras. A no-op when pyproject.toml is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-}
if [[ -z "$PYTHON" ]]; then
  # torch's CPU wheel on this kind of machine is built for CPython 3.11; prefer it.
  for candidate in python3.11 python3.12 python3.10 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PYTHON=$candidate; break; fi
  done
fi
VENV=${VENV:-.venv}
stamp="$VENV/.smtriton-setup"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi

echo "setting up $VENV with $($PYTHON --version)" >&2
"$PYTHON" -m venv "$VENV"
pip_args=(--quiet --disable-pip-version-check)
[[ -d /opt/wheels ]] && pip_args+=(--find-links /opt/wheels)
"$VENV/bin/python" -m pip install "${pip_args[@]}" --upgrade pip
# Torch first, pinned to the CPU build: an unpinned `torch` would pull a multi-GB CUDA build.
"$VENV/bin/python" -m pip install "${pip_args[@]}" "torch==${TORCH_VERSION:-2.13.0}"
"$VENV/bin/python" -m pip install "${pip_args[@]}" -e ".[local,convert,test]"
echo "$want" > "$stamp"
