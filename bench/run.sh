#!/usr/bin/env bash
# The benchmark, one command: `bash bench/run.sh [--duration 5 --warmup 2 --profile ...]`.
# Sets up .venv (scripts/setup.sh) unless VENV names a ready one, adds the bench extra, builds the demo
# model repository when it is not up to date, checks for wrk (installs it with apt-get when run as
# root on Debian/Ubuntu), then runs `python -m bench` with the arguments given.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY="$VENV/bin/python"
if ! [[ -x "$PY" ]] || ! "$PY" -c 'import smtriton.serve, smtriton.cli' >/dev/null 2>&1; then
  VENV="$VENV" bash scripts/setup.sh
fi
if ! "$PY" -c 'import tritonclient.http, rich, fastapi, uvicorn' >/dev/null 2>&1 \
   || ! [[ -x "$VENV/bin/py-spy" ]]; then
  echo "installing the bench extra into $VENV" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check -e ".[bench]"
fi

if ! command -v wrk >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "installing wrk (apt-get)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
  fi
  if ! command -v wrk >/dev/null 2>&1; then
    echo "error: the benchmark needs wrk: apt-get install -y wrk (Debian/Ubuntu), brew install wrk (macOS)," >&2
    echo "       or build it from https://github.com/wg/wrk and put it on PATH" >&2
    exit 2
  fi
fi

"$VENV/bin/smtriton" build-repository model_repository/recipe.toml --output model_repository
exec "$PY" -m bench "$@"
