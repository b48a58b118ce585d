#!/usr/bin/env bash
# Build the serving image's targets and check each as SageMaker runs it (`IMAGE serve`, models at
# /opt/ml/model or /opt/ml/models): single- and multi-model endpoints, labels and entry, a non-root user,
# a read-only root filesystem, SIGTERM under load, and `smtriton local-endpoint --image`. Prints each
# image's size and start-up time.
#
#   cpu     on python:3.11-slim-bookworm where it can be pulled; where no registry of images is reachable,
#           on a stand-in with the same Python built from Debian's packages with debootstrap.
#   triton  on TRITON_BASE_IMAGE when it is set (e.g. nvcr.io/nvidia/tritonserver:25.04-py3 where NGC can be
#           reached); else on a stand-in laid out as NVIDIA's image is (scripts/tritonserver-stand-in/), built
#           on that Debian base with the Triton of the nvidia-pytriton wheel that requirements.lock pins.
#
# Stand-ins are kept in the engine's image store and reused while their inputs are unchanged, so only the
# first run on a machine builds them. Uses docker where a daemon answers, else podman (installed with
# apt-get when missing and run as root); the Debian stand-in needs root and debootstrap either way.
#
# IMAGE_TARGETS picks targets ("cpu triton"); images are tagged IMAGE_REPOSITORY:<target>-test
# (localhost/smtriton); VENV is the environment that runs the checks; extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=${IMAGE_TARGETS:-cpu triton}
REPOSITORY=${IMAGE_REPOSITORY:-localhost/smtriton}
VENV=${VENV:-.venv}
PULLED_BASE=docker.io/library/python:3.11-slim-bookworm
DEBIAN_STAND_IN=localhost/smtriton-stand-in-base:bookworm
TRITON_STAND_IN=localhost/smtriton-stand-in-tritonserver
STAND_IN_DIR=scripts/tritonserver-stand-in
scratch=$(mktemp -d /var/tmp/smtriton-image-test.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
say() { echo "image-test: $*" >&2; }
for target in $TARGETS; do
  [[ $target == cpu || $target == triton ]] || { say "IMAGE_TARGETS: unknown target '$target' (cpu, triton)"; exit 2; }
done
# The checks run from the project's environment (a no-op when it is set up).
if [[ $VENV == .venv ]]; then bash scripts/setup.sh; fi
began=$(date +%s)

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
  local conf=/etc/containers/containers.conf marker="# smtriton scripts/image-test.sh"
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

image_exists() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }
image_id() { "$ENGINE" image inspect --format '{{.Id}}' "$1"; }

debian_stand_in() {
  # Debian bookworm's python3.11 laid out like the official slim image: /usr/local/bin/python3,
  # libpython3.11.so.1.0 (the Python backend stub links it), pip allowed to install, and this host's CA
  # bundle (package downloads inside the builds go through whatever this host trusts).
  if image_exists "$DEBIAN_STAND_IN"; then
    return
  fi
  if [[ $(id -u) -ne 0 ]] || ! command -v debootstrap >/dev/null; then
    say "the Debian stand-in base needs root and debootstrap (apt-get install debootstrap)"
    exit 1
  fi
  say "building the stand-in base $DEBIAN_STAND_IN with debootstrap"
  local root=$scratch/rootfs started
  started=$(date +%s)
  debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,libpython3.11,ca-certificates \
    bookworm "$root" http://deb.debian.org/debian >/dev/null
  ln -sf /usr/bin/python3.11 "$root/usr/local/bin/python3"
  ln -sf /usr/bin/python3.11 "$root/usr/local/bin/python"
  rm -f "$root"/usr/lib/python3.*/EXTERNALLY-MANAGED
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | "$ENGINE" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV UV_NATIVE_TLS=1' \
    --change 'CMD ["python3"]' - "$DEBIAN_STAND_IN" >/dev/null
  rm -rf "$root"
  say "built $DEBIAN_STAND_IN in $(($(date +%s) - started)) s"
}

triton_stand_in() {
  # NVIDIA's image as scripts/tritonserver-stand-in/ lays it out, on the Debian stand-in, with the versions of
  # nvidia-pytriton, onnxruntime and numpy that requirements.lock pins; tagged by what went into it (the
  # Debian base, the Containerfile and its files, those pins), so that a change rebuilds it.
  debian_stand_in
  local context=$scratch/stand-in key
  cp -r "$STAND_IN_DIR" "$context"
  grep -E '^(nvidia-pytriton|onnxruntime|numpy)==' requirements.lock >"$context/constraints.txt" \
    || { say "requirements.lock pins none of nvidia-pytriton, onnxruntime, numpy"; exit 1; }
  key=$( { image_id "$DEBIAN_STAND_IN"; cat "$context"/*; } | sha256sum | cut -c1-12)
  triton_base=$TRITON_STAND_IN:$key
  if image_exists "$triton_base"; then
    return
  fi
  say "building $triton_base, a stand-in for NVIDIA's Triton image ($(grep ^nvidia-pytriton "$context/constraints.txt"))"
  local started
  started=$(date +%s)
  "${build[@]}" --build-arg "DEBIAN_BASE=$DEBIAN_STAND_IN" -t "$triton_base" "$context" >"$scratch/stand-in.log" 2>&1 \
    || { tail -n 40 "$scratch/stand-in.log" >&2; say "building the Triton stand-in failed"; exit 1; }
  say "built $triton_base in $(($(date +%s) - started)) s ($(("$("$ENGINE" image inspect --format '{{.Size}}' "$triton_base")" / 1000000)) MB)"
  # Stand-ins of earlier inputs are not used again.
  local old
  for old in $("$ENGINE" images --format '{{.Repository}}:{{.Tag}}'); do
    if [[ $old == "$TRITON_STAND_IN":* && $old != "$triton_base" ]]; then "$ENGINE" rmi "$old" >/dev/null 2>&1 || true; fi
  done
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

# The Debian base: the cpu target's, and the uv stage's of both targets.
if timeout 120 "$ENGINE" pull -q "$PULLED_BASE" >/dev/null 2>&1; then
  cpu_base=$PULLED_BASE
else
  say "$PULLED_BASE cannot be pulled: using a stand-in built from Debian's packages"
  debian_stand_in
  cpu_base=$DEBIAN_STAND_IN
fi
triton_base=${TRITON_BASE_IMAGE:-}
if [[ " $TARGETS " == *" triton "* ]]; then
  if [[ -n $triton_base ]]; then
    timeout 1800 "$ENGINE" pull -q "$triton_base" >/dev/null 2>&1 || image_exists "$triton_base" \
      || { say "TRITON_BASE_IMAGE=$triton_base cannot be pulled"; exit 1; }
  else
    triton_stand_in
  fi
fi
ready=$(date +%s)
say "bases ready in $((ready - began)) s"

# The context is a copy of what .dockerignore lets in: the build's read-write bind mount of the
# source writes build outputs into it under podman's chroot isolation, never into this checkout.
mkdir "$scratch/context"
tar -c --exclude=__pycache__ --exclude='*.pyc' Dockerfile .dockerignore pyproject.toml README.md \
  requirements.lock smtriton | tar -x -C "$scratch/context"

summary=()
failed=()
for target in $TARGETS; do
  tag=$REPOSITORY:$target-test
  if [[ $target == cpu ]]; then base=$cpu_base; else base=$triton_base; fi
  say "building $tag (target $target) on $base with $ENGINE"
  started=$(date +%s)
  previous=$("$ENGINE" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
  "${build[@]}" --target "$target" --build-arg "CPU_BASE_IMAGE=$cpu_base" --build-arg "BASE_IMAGE=$base" \
    -t "$tag" "$scratch/context" >"$scratch/build-$target.log" 2>&1 \
    || { tail -n 40 "$scratch/build-$target.log" >&2; say "building $tag failed"; exit 1; }
  built=$(date +%s)
  # The image this build replaced under the same tag, so that repeated runs do not fill the disk.
  if [[ -n $previous && $previous != $(image_id "$tag") ]]; then
    "$ENGINE" rmi "$previous" >/dev/null 2>&1 || true
  fi
  size=$("$ENGINE" image inspect --format '{{.Size}}' "$tag")

  report=$scratch/report-$target
  touch "$report"
  say "checking $tag"
  status=0
  PYTHONPATH=$PWD SMTRITON_TEST_IMAGE=$tag SMTRITON_TEST_TARGET=$target SMTRITON_TEST_BASE=$base \
    SMTRITON_CONTAINER_ENGINE=$ENGINE SMTRITON_IMAGE_REPORT=$report \
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/image "$@" || status=$?
  checked=$(date +%s)
  [[ $status -eq 0 ]] || failed+=("$target")
  summary+=("$tag: $((size / 1000000)) MB on $base; build $((built - started)) s, checks $((checked - built)) s$(
    [[ $status -eq 0 ]] || echo ", FAILED")")
  while read -r line; do summary+=("  $line"); done <"$report"
done

for line in "${summary[@]}"; do say "$line"; done
say "total $(($(date +%s) - began)) s"
if [[ ${#failed[@]} -gt 0 ]]; then
  say "checks failed for: ${failed[*]}"
  exit 1
fi
