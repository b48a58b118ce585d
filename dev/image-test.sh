#!/usr/bin/env bash
# Build the `cpu` image and check it as SageMaker runs it (`IMAGE serve`, models at /opt/ml/model or
# /opt/ml/models): single- and multi-model endpoints, a non-root user, a read-only root filesystem,
# SIGTERM under load, and `smtriton local-endpoint --image`. Prints the image's size and start-up time.
#
# Uses docker where a daemon answers, else podman (installed with apt-get when missing and run as root).
# The base is python:3.11-slim-bookworm where it can be pulled; where no registry of images is reachable,
# a stand-in with the same Python is built from Debian's packages with debootstrap (kept for later runs).
# Extra arguments go to pytest. IMAGE_TAG names the image; VENV the environment that runs the checks.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${IMAGE_TAG:-localhost/smtriton:cpu-test}
VENV=${VENV:-.venv}
BASE=docker.io/library/python:3.11-slim-bookworm
STAND_IN=localhost/smtriton-stand-in-base:bookworm
began=$(date +%s)
scratch=$(mktemp -d /var/tmp/smtriton-image-test.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
say() { echo "image-test: $*" >&2; }
# The checks run from the project's environment (a no-op when it is set up).
if [[ $VENV == .venv ]]; then bash dev/setup.sh; fi

install_podman() {
  # Debian's podman, as root; quiet and idempotent.
  if command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null; then
    return
  fi
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    say "needs docker (with a daemon) or podman, runc and debootstrap; install them and run again"
    exit 1
  fi
  say "installing podman, buildah, runc, debootstrap"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah runc debootstrap >/dev/null
}

configure_podman() {
  # runc (crun cannot create containers under a hybrid cgroup hierarchy) and ulimits within the hard
  # limits of a sandboxed machine (podman's defaults exceed them and runc refuses the container).
  local conf=/etc/containers/containers.conf marker="# smtriton dev/image-test.sh"
  if [[ $(id -u) -ne 0 ]] || { [[ -f $conf ]] && grep -qF "$marker" "$conf"; }; then
    return
  fi
  if [[ -f $conf ]]; then
    say "$conf exists and was not written by this script; leaving it as it is"
    return
  fi
  local nofile nproc
  nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
  [[ $nofile == unlimited || $nofile -gt 65536 ]] && nofile=65536
  [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
  cat >"$conf" <<EOF
$marker
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
EOF
}

stand_in_base() {
  # Debian bookworm's python3.11 laid out like the official slim image: /usr/local/bin/python3,
  # libpython3.11.so.1.0 (the Python backend stub links it), pip allowed to install, and this host's CA
  # bundle (package downloads inside the build go through whatever this host trusts).
  if podman image exists "$STAND_IN"; then
    return
  fi
  say "no image registry reachable: building the stand-in base $STAND_IN with debootstrap"
  local root=$scratch/rootfs
  debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,libpython3.11,ca-certificates \
    bookworm "$root" http://deb.debian.org/debian >/dev/null
  ln -sf /usr/bin/python3.11 "$root/usr/local/bin/python3"
  ln -sf /usr/bin/python3.11 "$root/usr/local/bin/python"
  rm -f "$root"/usr/lib/python3.*/EXTERNALLY-MANAGED
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV UV_NATIVE_TLS=1' \
    --change 'CMD ["python3"]' - "$STAND_IN" >/dev/null
  rm -rf "$root"
}

if docker info >/dev/null 2>&1; then
  ENGINE=docker
  build=(env DOCKER_BUILDKIT=1 docker build)  # RUN --mount needs BuildKit
else
  install_podman
  configure_podman
  ENGINE=podman
  # No layer cache: buildah does not mount a cached stage for a later stage's RUN --mount=from=.
  build=(podman build --isolation chroot --network host --layers=false)
fi

base=$BASE
if ! timeout 120 "$ENGINE" pull -q "$BASE" >/dev/null 2>&1; then
  [[ $ENGINE == podman ]] || { say "cannot pull $BASE"; exit 1; }
  stand_in_base
  base=$STAND_IN
fi
ready=$(date +%s)

# The context is a copy of what .dockerignore lets in: the build's read-write bind mount of the
# source writes build outputs into it under podman's chroot isolation, never into this checkout.
mkdir "$scratch/context"
tar -c --exclude=__pycache__ --exclude='*.pyc' Dockerfile .dockerignore pyproject.toml README.md \
  requirements.lock smtriton | tar -x -C "$scratch/context"
say "building $TAG (target cpu) on $base with $ENGINE"
previous=$("$ENGINE" image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)
"${build[@]}" --target cpu --build-arg "CPU_BASE_IMAGE=$base" -t "$TAG" "$scratch/context" \
  >"$scratch/build.log" 2>&1 || { tail -n 40 "$scratch/build.log" >&2; say "build failed"; exit 1; }
built=$(date +%s)
# The image this build replaced under the same tag, so that repeated runs do not fill the disk.
if [[ -n $previous && $previous != $("$ENGINE" image inspect --format '{{.Id}}' "$TAG") ]]; then
  "$ENGINE" rmi "$previous" >/dev/null 2>&1 || true
fi
size=$("$ENGINE" image inspect --format '{{.Size}}' "$TAG")

report=$scratch/report
touch "$report"
say "checking $TAG"
PYTHONPATH=$PWD SMTRITON_TEST_IMAGE=$TAG SMTRITON_CONTAINER_ENGINE=$ENGINE SMTRITON_IMAGE_REPORT=$report \
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/image "$@"
done_=$(date +%s)

say "image $TAG: $((size / 1000000)) MB (base $base)"
while read -r line; do say "$line"; done <"$report"
say "base $((ready - began)) s, build $((built - ready)) s, checks $((done_ - built)) s, total $((done_ - began)) s"
