#!/usr/bin/env bash
# Set everything up; lint, format-check and type-check; run the whole test suite (unit, integration with
# the real serve + Triton; GPU tests skip on hosts without one). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest -q -ra "$@"
