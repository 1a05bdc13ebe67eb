#!/usr/bin/env bash
# Stops every process cluster-up.sh started (by process group: the GPU emulator, Prometheus,
# and the `cluster up` supervisor, which stops its components) and removes the state dir.
# Idempotent: with no cluster it says "no cluster running" and exits 0.
# Env: GPUSIZER_CLUSTER_DIR (default <repo>/.cluster).
set -euo pipefail
# shellcheck source=e2e/scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
lock_state

if ! [ -d "$STATE" ]; then
  echo "no cluster running"
  exit 0
fi
# A real node of this cluster (node-up.sh in its default dir) goes first: its kubelet would
# outlive the API server.
if grep -qsxF "CLUSTER_STATE_DIR=$STATE" "${GPUSIZER_NODE_DIR:-$REPO/.node}/env"; then
  "$REPO/e2e/scripts/node-down.sh" >&2
fi
was_running=0
cluster_running && was_running=1
stop_all
remove_state
if [ "$was_running" = 1 ]; then
  echo "cluster stopped, $STATE removed"
else
  echo "no cluster running (removed stale state $STATE)"
fi
