#!/usr/bin/env bash
# Makes the local base image of `make image`: Debian 12 (minbase) with its Python 3.11, made
# by debootstrap from Debian's packages and imported into podman, because no container
# registry is reachable here (users build FROM the official python:3.11-slim-bookworm).
# Prints the image's name; an image made from this same script is reused, so a warm run costs
# nothing. The image is named after a hash of this script, which holds the whole recipe.
#
# Env: GPUSIZER_CACHE (default ~/.cache/gpusizer), GPUSIZER_DEBIAN_MIRROR.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${GPUSIZER_CACHE:-$HOME/.cache/gpusizer}"
MIRROR="${GPUSIZER_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
# python3-venv is the build stage's (`python3 -m venv`); ca-certificates for TLS to Prometheus
PACKAGES=python3,python3-venv,ca-certificates
export CONTAINERS_CONF="$REPO/scripts/containers.conf"

log() { echo "build-base-image: $*" >&2; }

[ "$(id -u)" -eq 0 ] || { log "debootstrap and rootful podman need root"; exit 1; }
"$REPO/scripts/install-podman.sh"

HASH="$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)"
REF="localhost/gpusizer-base:${SUITE}-${HASH}"

mkdir -p "$CACHE/image"
exec 8>"$CACHE/image/base.lock"
flock -w 1800 8

if podman image exists "$REF"; then
  echo "$REF"
  exit 0
fi

start=$(date +%s)
ROOTFS="$(mktemp -d "$CACHE/image/rootfs.XXXXXX")"
trap 'rm -rf -- "$ROOTFS"' EXIT
log "debootstrap $SUITE ($PACKAGES) from $MIRROR"
if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" \
    > "$CACHE/image/debootstrap.log" 2>&1; then
  tail -n 30 "$CACHE/image/debootstrap.log" >&2
  log "debootstrap failed (whole log: $CACHE/image/debootstrap.log)"
  exit 1
fi
# What the slim images leave out too: package caches and lists, documentation, translations.
rm -rf -- "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
  "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* \
  "$ROOTFS"/usr/share/locale/* "$ROOTFS"/var/log/*.log "$ROOTFS"/var/cache/debconf/*-old
tar --numeric-owner -C "$ROOTFS" -c . | podman import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  --message "debootstrap --variant=minbase --include=$PACKAGES $SUITE" \
  --quiet - "$REF" >/dev/null
log "made $REF in $(( $(date +%s) - start ))s"
echo "$REF"
