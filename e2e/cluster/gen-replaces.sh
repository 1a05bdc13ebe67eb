#!/usr/bin/env bash
# Regenerates the replace block of go.mod from k8s.io/kubernetes' own go.mod: every
# "k8s.io/X => ./staging/src/k8s.io/X" becomes "k8s.io/X => k8s.io/X v0.<minor>.<patch>".
# Usage: e2e/cluster/gen-replaces.sh v1.36.4   (prints the block; paste it into go.mod,
# update the require of k8s.io/kubernetes, then `go mod tidy`).
set -euo pipefail
K8S="${1:?usage: $0 v1.36.x}"
STAGING="v0.${K8S#v1.}"
cd "$(mktemp -d)"
go mod init tmp >/dev/null 2>&1
DIR="$(GOTOOLCHAIN=local go mod download -json "k8s.io/kubernetes@$K8S" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')"
echo "replace ("
grep -E '=> \./staging/src/' "$DIR/go.mod" |
  sed -E "s#^[[:space:]]*(k8s\.io/[^ ]+) => \./staging/src/.*#\t\1 => \1 $STAGING#"
echo ")"
