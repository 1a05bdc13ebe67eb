#!/usr/bin/env bash
# Builds helm from its Go module (nothing is downloaded but Go modules) into a cache OUTSIDE
# the repository and prints its path on stdout. Idempotent: a binary built with the same
# version and flags (recorded in a stamp file next to it) is reused without invoking Go.
#
# The link flags are those of helm's own Makefile: the version, and the Kubernetes version
# helm assumes when no cluster is asked (`helm template`, `helm install --dry-run=client`),
# which otherwise defaults to v1.20 and fails charts that declare a kubeVersion.
#
# Env: GPUSIZER_CACHE (default ~/.cache/gpusizer), GPUSIZER_HELM_VERSION (default v3.21.4),
#      GPUSIZER_BUILD_JOBS (go build -p).
set -euo pipefail

VERSION="${GPUSIZER_HELM_VERSION:-v3.21.4}"
K8S_MINOR="${GPUSIZER_HELM_K8S_MINOR:-36}"  # helm v3.21 builds against client-go v0.36
CACHE="${GPUSIZER_CACHE:-$HOME/.cache/gpusizer}"
BIN_DIR="$CACHE/bin"
HELM="$BIN_DIR/helm"
STAMP="$BIN_DIR/.helm.stamp"

LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=${VERSION} \
 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${K8S_MINOR} \
 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${K8S_MINOR}"
WANT="${VERSION} ${LDFLAGS}"

log() { echo "install-helm: $*" >&2; }

if [ -x "$HELM" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  log "helm $VERSION already at $HELM"
  echo "$HELM"
  exit 0
fi

command -v go >/dev/null 2>&1 || { log "go is required to build helm"; exit 1; }

mkdir -p "$BIN_DIR"
log "building helm $VERSION with go install (first time: several minutes)"
jobs=()
if [ -n "${GPUSIZER_BUILD_JOBS:-}" ]; then jobs=(-p "$GPUSIZER_BUILD_JOBS"); fi
GOBIN="$BIN_DIR" CGO_ENABLED=0 go install "${jobs[@]}" -trimpath -ldflags "$LDFLAGS" \
  "helm.sh/helm/v3/cmd/helm@${VERSION}"
if ! "$HELM" version --template '{{.Version}}' | grep -qx "$VERSION"; then
  log "built $HELM but it does not report $VERSION"
  exit 1
fi
echo "$WANT" > "$STAMP"
log "helm $VERSION installed at $HELM"
echo "$HELM"
