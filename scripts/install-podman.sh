#!/usr/bin/env bash
# Installs what builds and runs the operator's image without a daemon, from Debian's packages:
# podman (its `podman build` is buildah's library), runc (crun fails on this kind of machine's
# hybrid cgroup v1 + v2 mounts) and debootstrap (no registry is reachable, so the base image
# is made locally). Idempotent: nothing happens when all three are there.
set -euo pipefail
missing=()
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-podman: installing ${missing[*]} from Debian's packages" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
  podman runc debootstrap >/dev/null
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null
done
