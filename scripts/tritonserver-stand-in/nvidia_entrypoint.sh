#!/bin/bash
# Where NVIDIA's image has its entrypoint (a banner and driver checks, then the command). An image built
# FROM this stand-in sets its own ENTRYPOINT; this one only runs what it is given.
set -euo pipefail
echo "Triton Server stand-in (release ${NVIDIA_TRITON_SERVER_VERSION:-?}, Triton ${TRITON_SERVER_VERSION:-?})" >&2
if [[ $# -eq 0 ]]; then exec bash; fi
exec "$@"
