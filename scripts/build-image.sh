#!/usr/bin/env bash
# `make image`: builds the operator's image from the Dockerfile without a daemon (podman's
# builder, runc), offline: FROM the Debian 12 base that build-base-image.sh makes, with the
# lock's wheels downloaded beforehand by the venv's pip into a wheelhouse that the build
# mounts (`--network none`: no registry and no index is reached from inside the build).
# Tags localhost/gpusizer:<version>, localhost/gpusizer:dev and
# localhost/gpusizer:build-<hash>, and prints the last: the hash covers every input (the
# Dockerfile, the build context it copies, the base image, this script), so an unchanged tree
# reuses the image without building, and tests name the image of their own tree.
#
# Env: GPUSIZER_CACHE (default ~/.cache/gpusizer), PYTHON (default .venv/bin/python).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${GPUSIZER_CACHE:-$HOME/.cache/gpusizer}"
PY="${PYTHON:-$REPO/.venv/bin/python}"
NAME=localhost/gpusizer
KEEP=5  # build-<hash> images kept (other worktrees build theirs into the same storage)
export CONTAINERS_CONF="$REPO/scripts/containers.conf"

log() { echo "build-image: $*" >&2; }

BASE="$("$REPO/scripts/build-base-image.sh")"
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO/pyproject.toml" | head -n 1)"
[ -n "$VERSION" ] || { log "no version in pyproject.toml"; exit 1; }

# The build context as .dockerignore leaves it: these files and operator/ without caches.
context_files() {
  cd "$REPO"
  printf '%s\n' Dockerfile .dockerignore pyproject.toml README.md requirements.lock
  find operator -type f -not -path '*/__pycache__/*' -not -name '*.pyc' \
    -not -path 'operator/*.egg-info/*' | LC_ALL=C sort
}

hash_inputs() {
  {
    podman image inspect --format '{{.Id}}' "$BASE"
    cat "${BASH_SOURCE[0]}"
    context_files | while read -r f; do
      echo "== $f"
      cat "$REPO/$f"
    done
  } | sha256sum | cut -c1-16
}

mkdir -p "$CACHE/image"
exec 8>"$CACHE/image/build.lock"
flock -w 1800 8

HASH="$(hash_inputs)"
REF="$NAME:build-$HASH"
if ! podman image exists "$REF"; then
  start=$(date +%s)
  # The wheels of exactly the lock, for the image's Python (3.11, this machine's platform),
  # plus the package's build backend (pyproject's build-system), kept per lock.
  WHEELS="$CACHE/image/wheels-$(cat "$REPO/requirements.lock" "$REPO/pyproject.toml" |
    sha256sum | cut -c1-16)"
  if ! [ -f "$WHEELS/.complete" ]; then
    log "downloading the lock's wheels into $WHEELS"
    rm -rf -- "$WHEELS"
    backend="$("$PY" -c 'import tomllib, sys; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' "$REPO/pyproject.toml")"
    mapfile -t backend <<< "$backend"
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
      --dest "$WHEELS" -r "$REPO/requirements.lock" "${backend[@]}" >&2
    touch "$WHEELS/.complete"
  fi
  log "building $REF from $BASE"
  podman build --quiet --network none --pull=never \
    --build-arg "BASE=$BASE" --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/wheels \
    --volume "$WHEELS:/wheels:ro" \
    --label "io.gpusizer.inputs=$HASH" --label "org.opencontainers.image.version=$VERSION" \
    --tag "$REF" "$REPO" >/dev/null
  log "built $REF in $(( $(date +%s) - start ))s"
  # newest first: all but the KEEP newest go
  podman images --noheading --sort created --filter "reference=$NAME:build-*" \
    --format '{{.Repository}}:{{.Tag}}' | tail -n "+$((KEEP + 1))" |
    xargs -r podman rmi >/dev/null 2>&1 || true
  ls -1dt "$CACHE"/image/wheels-* 2>/dev/null | tail -n +3 | xargs -r rm -rf --
fi
podman tag "$REF" "$NAME:$VERSION" "$NAME:dev"
echo "$REF"
