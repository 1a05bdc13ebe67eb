#!/usr/bin/env bash
# Starts the local GPU cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kwok with the GPU node pools), Prometheus, and the GPU emulator when e2e/gpusim exists.
# Idempotent: with a live cluster it says so and exits 0. Writes $GPUSIZER_CLUSTER_DIR/env
# (default .cluster/env) with KUBECONFIG, PROMETHEUS_URL, GPUSIM_URL, the PIDs and POD_BLOCK.
#
# Env: GPUSIZER_CLUSTER_DIR  state dir (default <repo>/.cluster)
#      GPUSIZER_NODEPOOLS    node pools file (default e2e/cluster/nodepools.yaml)
#      GPUSIZER_CLUSTER_TIMEOUT seconds to wait for readiness (default 300)
#      GPUSIZER_GPUSIM       auto (default: start e2e.gpusim if it exists) | 0 (never) | 1 (required)
#      GPUSIZER_CLUSTER_BIN  use this binary instead of build-cluster.sh's
#      PROMETHEUS            Prometheus binary (default: /usr/bin/prometheus, else from PATH)
#      GPUSIZER_CLIENT_QPS   API request rate of the controller-manager and scheduler (default:
#                            theirs, 20 and 50/s); the scale benchmark raises it
#      GPUSIZER_MIG_SECONDS_PER_NODE, GPUSIZER_MIG_SECONDS_PER_GPU  the emulated mig-manager's
#                            time per reconfiguration and per GPU changed (default 3 and 1: ten
#                            times faster than its realistic defaults, 30 and 10, so tests wait
#                            seconds, not minutes)
set -euo pipefail
# shellcheck source=e2e/scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TIMEOUT="${GPUSIZER_CLUSTER_TIMEOUT:-300}"
NODEPOOLS="${GPUSIZER_NODEPOOLS:-$REPO/e2e/cluster/nodepools.yaml}"
GPUSIM_MODE="${GPUSIZER_GPUSIM:-auto}"
lock_state

if cluster_running; then
  echo "cluster already running (state $STATE): source $STATE/env"
  exit 0
fi

# A stale state dir (crash, reboot): stop whatever is left and start clean.
if [ -d "$STATE" ]; then
  stop_all
  remove_state
  if [ -d "$STATE" ]; then
    echo "cluster-up: $STATE exists and is not a gpusizer cluster dir; refusing to touch it" >&2
    exit 1
  fi
fi

t0=$(date +%s.%N)
BIN="${GPUSIZER_CLUSTER_BIN:-$("$REPO/e2e/scripts/build-cluster.sh")}"
PROM="${PROMETHEUS:-}"
if [ -z "$PROM" ]; then
  if [ -x /usr/bin/prometheus ]; then PROM=/usr/bin/prometheus; else PROM="$(command -v prometheus || true)"; fi
fi
[ -n "$PROM" ] || { echo "cluster-up: prometheus not found (make prometheus)" >&2; exit 1; }

mkdir -p "$STATE/logs" "$STATE/prometheus-targets"
touch "$MARKER"
t1=$(date +%s.%N)

# The pods' IPs (e2e/cluster/podnet.go PodNetwork) are routed to the loopback device, so
# the inference servers and activators run for pods listen there and nothing leaves the
# host. Once per host, for every cluster: each takes blocks of its own (POD_BLOCK), which
# `cluster up` holds while it runs.
POD_NETWORK=198.18.0.0/15
if ! ip route show table local 2>/dev/null | grep -q "^local $POD_NETWORK dev lo"; then
  if ! ip route add local "$POD_NETWORK" dev lo table local 2>/dev/null; then
    echo "cluster-up: warning: cannot route the pod network $POD_NETWORK to lo (needs" \
      "CAP_NET_ADMIN): the pods' HTTP endpoints are unreachable (e2e/tests/test_activator.py" \
      "fails)" >&2
  fi
fi

fail() {
  echo "cluster-up: $*" >&2
  for f in "$STATE/logs/up.log" "$STATE/logs/prometheus.log" "$STATE/logs/gpusim.log"; do
    [ -f "$f" ] && { echo "--- tail $f" >&2; tail -n 30 "$f" >&2; }
  done
  stop_all
  exit 1
}

# 1. The control plane, supervised by `cluster up` in its own session/process group.
#    Ports are picked free by `cluster up`, but another process can take one before the
#    component binds it: on "address already in use" start again (3 attempts).
for attempt in 1 2 3; do
  setsid "$BIN" up --state-dir "$STATE" --nodepools "$NODEPOOLS" \
    --client-qps "${GPUSIZER_CLIENT_QPS:-0}" --timeout "${TIMEOUT}s" > "$STATE/logs/up.log" 2>&1 < /dev/null 9>&- &
  CLUSTER_PID=$!
  echo "$CLUSTER_PID" > "$STATE/cluster.pid"
  deadline=$(( $(date +%s) + TIMEOUT ))
  while ! [ -f "$STATE/ready" ] && [ -d "/proc/$CLUSTER_PID" ] && [ "$(date +%s)" -lt "$deadline" ]; do
    sleep 0.2
  done
  [ -f "$STATE/ready" ] && break
  if [ -d "/proc/$CLUSTER_PID" ]; then
    fail "cluster not ready after ${TIMEOUT}s"
  fi
  wait "$CLUSTER_PID" || true
  if [ "$attempt" -lt 3 ] && grep -qs "address already in use" "$STATE"/logs/*.log; then
    echo "cluster-up: a port was taken meanwhile (attempt $attempt); starting again" >&2
    stop_all
    rm -rf -- "$STATE/etcd" "$STATE/pki" "$STATE/pids" "$STATE/up.pid"
    for f in "$STATE"/logs/*.log; do mv -f "$f" "$f.attempt$attempt"; done
    continue
  fi
  fail "cluster up exited before it was ready"
done
KUBECONFIG_PATH="$(sed -n 's/^KUBECONFIG=//p' "$STATE/ready")"
OPERATOR_KUBECONFIG="$(sed -n 's/^OPERATOR_KUBECONFIG=//p' "$STATE/ready")"
APISERVER_URL="$(sed -n 's/^APISERVER=//p' "$STATE/ready")"
POD_BLOCK="$(sed -n 's/^POD_BLOCK=//p' "$STATE/ready")"

# 2. Prometheus: scrape every 5 s; other processes register targets by writing
#    $STATE/prometheus-targets/<name>.json (file_sd format, see e2e/cluster/README.md).
PROM_PORT="$(free_port)"
cat > "$STATE/prometheus.yml" <<YAML
global:
  scrape_interval: 5s
  scrape_timeout: 4s
  evaluation_interval: 5s
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ['127.0.0.1:${PROM_PORT}']
  - job_name: file-sd
    file_sd_configs:
      - files: ['${STATE}/prometheus-targets/*.json']
        refresh_interval: 5s
YAML
setsid "$PROM" --config.file="$STATE/prometheus.yml" \
  --storage.tsdb.path="$STATE/prometheus" \
  --web.listen-address="127.0.0.1:${PROM_PORT}" \
  --web.enable-lifecycle --web.enable-admin-api \
  > "$STATE/logs/prometheus.log" 2>&1 < /dev/null 9>&- &
PROMETHEUS_PID=$!
echo "$PROMETHEUS_PID" > "$STATE/prometheus.pid"
PROMETHEUS_URL="http://127.0.0.1:${PROM_PORT}"
wait_http "$PROMETHEUS_URL/-/ready" 60 "$PROMETHEUS_PID" || fail "Prometheus not ready"

# 3. The GPU emulator, when it exists (someone else's module): optional.
GPUSIM_PORT="$(free_port)"
GPUSIM_URL="http://127.0.0.1:${GPUSIM_PORT}"
GPUSIM_PID=""
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PY="$REPO/.venv/bin/python"; else PY=python3; fi
fi
if [ "$GPUSIM_MODE" != "0" ] && [ -f "$REPO/e2e/gpusim/__main__.py" ]; then
  # Scraped the way a dcgm-exporter DaemonSet is: one target per GPU node, which the emulator
  # writes itself (and rewrites as nodes come and go), each at a scrape phase of its own.
  ( cd "$REPO" && exec setsid "$PY" -m e2e.gpusim --kubeconfig "$KUBECONFIG_PATH" \
      --listen "127.0.0.1:${GPUSIM_PORT}" \
      --targets-file "$STATE/prometheus-targets/gpusim.json" \
      --mig-seconds-per-node "${GPUSIZER_MIG_SECONDS_PER_NODE:-3}" \
      --mig-seconds-per-gpu "${GPUSIZER_MIG_SECONDS_PER_GPU:-1}" \
      > "$STATE/logs/gpusim.log" 2>&1 < /dev/null 9>&- ) &
  GPUSIM_PID=$!
  echo "$GPUSIM_PID" > "$STATE/gpusim.pid"
  if wait_http "$GPUSIM_URL/metrics" 60 "$GPUSIM_PID"; then
    echo "cluster-up: GPU emulator on $GPUSIM_URL, scraped per node" >&2
  elif [ "$GPUSIM_MODE" = "1" ]; then
    fail "GPU emulator (python -m e2e.gpusim) did not serve $GPUSIM_URL/metrics"
  else
    echo "cluster-up: warning: GPU emulator did not start; see $STATE/logs/gpusim.log" >&2
    tail -n 20 "$STATE/logs/gpusim.log" >&2 || true
    stop_group gpusim "$GPUSIM_PID"
    GPUSIM_PID=""
  fi
elif [ "$GPUSIM_MODE" = "1" ]; then
  fail "GPUSIZER_GPUSIM=1 but e2e/gpusim/__main__.py does not exist"
fi

cat > "$STATE/env.tmp" <<ENV
KUBECONFIG=${KUBECONFIG_PATH}
PROMETHEUS_URL=${PROMETHEUS_URL}
GPUSIM_URL=${GPUSIM_URL}
PROMETHEUS_PID=${PROMETHEUS_PID}
CLUSTER_PID=${CLUSTER_PID}
GPUSIM_PID=${GPUSIM_PID}
CLUSTER_STATE_DIR=${STATE}
PROMETHEUS_TARGETS_DIR=${STATE}/prometheus-targets
APISERVER_URL=${APISERVER_URL}
OPERATOR_KUBECONFIG=${OPERATOR_KUBECONFIG}
POD_BLOCK=${POD_BLOCK}
ENV
mv -f "$STATE/env.tmp" "$STATE/env"
t2=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" -v c="$t2" \
  'BEGIN { printf "cluster-up: ready in %.1fs (%.1fs after the binary was ready)\n", c - a, c - b }'
cat "$STATE/env"
