#!/usr/bin/env bash
# Builds what the real node of node-up.sh runs, into a cache OUTSIDE the repository, and
# prints the directory:
#   kubelet, pause   from this repository's e2e/cluster module: the kubelet links the same
#                    Kubernetes modules (v1.36.4) as the control plane;
#   containerd, containerd-shim-runc-v2, ctr   github.com/containerd/containerd/v2 (Debian
#                    12's containerd 1.6 has no CRI v1: kubelet 1.36 needs 2.2 or later);
#   cni/loopback     from github.com/containernetworking/plugins: the node's pods use the
#                    host's network (hostNetwork), so the CNI configuration that containerd
#                    needs before it reports its network ready is a loopback-only one;
#   pause.tar        the pods' sandbox image (pause, FROM scratch), for `ctr images import`.
# runc is Debian's (scripts/install-podman.sh). The directory is named after a hash of every
# input (this script with its versions, the module's go.mod/go.sum, the two main packages, the
# link flags, the Go version), so an unchanged tree reuses it without running Go.
#
# Env: GPUSIZER_CACHE (default ~/.cache/gpusizer), GPUSIZER_BUILD_JOBS (go build -p).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SRC="$REPO/e2e/cluster"
CACHE="${GPUSIZER_CACHE:-$HOME/.cache/gpusizer}"
CONTAINERD_VERSION="v2.3.7"
CNI_PLUGINS_VERSION="v1.10.0"
export CONTAINERS_CONF="$REPO/scripts/containers.conf"

# shellcheck source=e2e/scripts/kube-version.sh
. "$REPO/e2e/scripts/kube-version.sh"
CONTAINERD_LDFLAGS="-s -w -X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION}"
CNI_LDFLAGS="-s -w \
 -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=${CNI_PLUGINS_VERSION}"

log() { echo "build-node: $*" >&2; }

hash_inputs() {
  {
    cat "${BASH_SOURCE[0]}" "$REPO/e2e/scripts/kube-version.sh"
    go version
    go env GOOS GOARCH
    cd "$SRC"
    for f in go.mod go.sum kubelet/*.go pause/*.go; do
      echo "== $f"
      cat "$f"
    done
  } | sha256sum | cut -c1-16
}

command -v go >/dev/null 2>&1 || { log "Go is required to build the node (Go >= 1.26)"; exit 1; }
"$REPO/scripts/install-podman.sh"

HASH="$(hash_inputs)"
OUT="$CACHE/node-$HASH"
if [ -f "$OUT/.complete" ]; then
  echo "$OUT"
  exit 0
fi

mkdir -p "$CACHE"
exec 8>"$CACHE/node.lock"
flock -w 3600 8
if [ -f "$OUT/.complete" ]; then
  echo "$OUT"
  exit 0
fi
rm -rf -- "$OUT"
mkdir -p "$OUT/cni"
jobs=()
[ -n "${GPUSIZER_BUILD_JOBS:-}" ] && jobs=(-p "$GPUSIZER_BUILD_JOBS")
export GOTOOLCHAIN=local CGO_ENABLED=0
start=$(date +%s)
log "building the kubelet and pause from e2e/cluster"
(cd "$SRC" && go build "${jobs[@]}" -trimpath -ldflags "$KUBE_LDFLAGS" -o "$OUT/kubelet" ./kubelet)
(cd "$SRC" && go build "${jobs[@]}" -trimpath -ldflags "-s -w" -o "$OUT/pause" ./pause)
log "building containerd $CONTAINERD_VERSION"
GOBIN="$OUT" go install "${jobs[@]}" -trimpath -ldflags "$CONTAINERD_LDFLAGS" \
  "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
log "building the CNI loopback plugin $CNI_PLUGINS_VERSION"
GOBIN="$OUT/cni" go install "${jobs[@]}" -trimpath -ldflags "$CNI_LDFLAGS" \
  "github.com/containernetworking/plugins/plugins/main/loopback@$CNI_PLUGINS_VERSION"

context="$(mktemp -d)"
trap 'rm -rf -- "$context"' EXIT
cp "$OUT/pause" "$context/pause"
printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' \
  > "$context/Containerfile"
podman build --quiet --network none --tag "localhost/gpusizer-pause:$HASH" "$context" >/dev/null
podman save --quiet --format docker-archive --output "$OUT/pause.tar" \
  "localhost/gpusizer-pause:$HASH"
podman rmi "localhost/gpusizer-pause:$HASH" >/dev/null
echo "localhost/gpusizer-pause:$HASH" > "$OUT/pause.ref"
touch "$OUT/.complete"
log "built $OUT in $(( $(date +%s) - start ))s"
# Keep only the newest few node builds (~250 MB each).
ls -1dt "$CACHE"/node-* 2>/dev/null | tail -n +4 | xargs -r rm -rf --
echo "$OUT"
