#!/usr/bin/env bash
# Builds helm from its Go module (no binary downloads here) into a cache OUTSIDE the
# repository and prints its path on stdout. Idempotent: an existing binary of the pinned
# version is reused without invoking Go.
#
# Env: GPUSIZER_CACHE (default ~/.cache/gpusizer), GPUSIZER_HELM_VERSION (default v3.21.4),
#      GPUSIZER_BUILD_JOBS (go build -p).
set -euo pipefail

VERSION="${GPUSIZER_HELM_VERSION:-v3.21.4}"
CACHE="${GPUSIZER_CACHE:-$HOME/.cache/gpusizer}"
BIN_DIR="$CACHE/bin"
HELM="$BIN_DIR/helm"

log() { echo "install-helm: $*" >&2; }

if [ -x "$HELM" ] && "$HELM" version --template '{{.Version}}' 2>/dev/null | grep -qx "$VERSION"; then
  log "helm $VERSION already at $HELM"
  echo "$HELM"
  exit 0
fi

command -v go >/dev/null 2>&1 || { log "go is required to build helm (Go >= 1.24)"; exit 1; }

mkdir -p "$BIN_DIR"
log "building helm $VERSION with go install (first time: a few minutes)"
jobs=()
if [ -n "${GPUSIZER_BUILD_JOBS:-}" ]; then jobs=(-p "$GPUSIZER_BUILD_JOBS"); fi
GOBIN="$BIN_DIR" CGO_ENABLED=0 go install "${jobs[@]}" -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${VERSION}" \
  "helm.sh/helm/v3/cmd/helm@${VERSION}"
"$HELM" version --template '{{.Version}}' | grep -qx "$VERSION" || {
  log "built $HELM but it does not report $VERSION"
  exit 1
}
log "helm $VERSION installed at $HELM"
echo "$HELM"
