#!/usr/bin/env bash
# Set everything up, build the demo model repository (skipped when up to date) and serve it:
# the front server on 127.0.0.1:8080 (HOST=0.0.0.0 opens it to the network; PORT moves it),
# embedded Triton on loopback, no Docker, no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/smtriton build-repository model_repository/recipe.toml --output model_repository
# Plain log lines for a person at a terminal; the container keeps JSON lines for CloudWatch.
export SMTRITON_LOG_FORMAT=${SMTRITON_LOG_FORMAT:-text}
# The one line that says it serves is serve's own, "model NAME is ready": nothing before it says "ready".
echo "demo: starting serve for ${DEMO_MODEL:-text_encoder} on http://${HOST:-127.0.0.1}:${PORT:-8080}; it answers once the model has loaded" >&2
exec .venv/bin/serve --model-repository model_repository \
  --default-model "${DEMO_MODEL:-text_encoder}" --host "${HOST:-127.0.0.1}" --port "${PORT:-8080}" "$@"
