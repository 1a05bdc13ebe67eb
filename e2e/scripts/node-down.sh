#!/usr/bin/env bash
# Stops the real node of node-up.sh (the kubelet, its pods, containerd and its shims), deletes
# its Node object and removes its state dir and cgroups. Idempotent: without a node it says
# "no node running" and exits 0. Env: GPUSIZER_CLUSTER_DIR, GPUSIZER_NODE_DIR (as node-up.sh).
set -euo pipefail
# shellcheck source=e2e/scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=e2e/scripts/node-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/node-lib.sh"
lock_node

if ! [ -d "$NODE" ]; then
  echo "no node running"
  exit 0
fi
name="$(node_env_get NODE_NAME)"
start=$(date +%s)
node_stop_and_remove
if [ -n "$name" ] && cluster_running; then
  "$REPO/.venv/bin/kubectl" --kubeconfig "$(env_get KUBECONFIG)" delete node "$name" \
    --ignore-not-found --wait=false >/dev/null
fi
echo "node stopped in $(( $(date +%s) - start ))s, $NODE removed"
