# Shared helpers of cluster-up.sh and cluster-down.sh (sourced, not executed).
# shellcheck shell=bash

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# absolute_dir DIR: DIR as an absolute path without a trailing slash.
absolute_dir() {
  case "$1" in /*) printf '%s' "${1%/}" ;; *) printf '%s' "$(pwd)/${1%/}" ;; esac
}

STATE="$(absolute_dir "${GPUSIZER_CLUSTER_DIR:-$REPO/.cluster}")"
MARKER="$STATE/.gpusizer-cluster"

# lock_dir KIND DIR FD: serialise the up/down scripts of KIND on DIR, holding the lock on file
# descriptor FD. The lock file lives in /tmp (named after the dir), not in the dir, which the
# down script removes.
lock_dir() {
  local lock
  lock="${TMPDIR:-/tmp}/gpusizer-$1-$(printf '%s' "$2" | sha256sum | cut -c1-16).lock"
  eval "exec $3>\"\$lock\""
  if ! flock -w "${GPUSIZER_LOCK_TIMEOUT:-600}" "$3"; then
    echo "$(basename "$0"): another $1-up/down holds $lock" >&2
    exit 1
  fi
}

# lock_state: cluster-up.sh/cluster-down.sh on the cluster's state dir (fd 9, which the
# cluster's long-running children never inherit).
lock_state() {
  lock_dir cluster "$STATE" 9
}

# alive PID: the process exists and its command line mentions our state dir
# (protects against signalling a recycled PID).
alive() {
  local pid="${1:-}"
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "$STATE"
}

# env_get KEY: value of KEY in $STATE/env (empty if absent).
env_get() {
  [ -f "$STATE/env" ] || return 0
  sed -n "s/^$1=//p" "$STATE/env" | tail -n 1
}

# wait_gone PID SECONDS: poll until the process is gone; false on timeout.
wait_gone() {
  local pid="$1" deadline=$(( $(date +%s) + $2 ))
  while [ -d "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != "Z" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

# stop_group NAME PID: SIGTERM the process group led by PID, SIGKILL after 15 s.
stop_group() {
  local name="$1" pid="$2"
  alive "$pid" || return 0
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  if ! wait_gone "$pid" 15; then
    echo "cluster-down: $name (pid $pid) ignored SIGTERM: SIGKILL" >&2
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 5 || true
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# wait_http URL SECONDS PID: poll until URL answers 200; false on timeout or if PID dies.
wait_http() {
  local url="$1" deadline=$(( $(date +%s) + $2 )) pid="${3:-}"
  until python3 - "$url" <<'PY' 2>/dev/null
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
    sys.exit(0 if r.status == 200 else 1)
PY
  do
    if [ -n "$pid" ] && ! [ -d "/proc/$pid" ]; then return 1; fi
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

# cluster_running: the env file exists and the supervisor and Prometheus are alive.
# $STATE/prometheus.pid is the current Prometheus (tests may restart it and rewrite the file).
cluster_running() {
  [ -f "$STATE/env" ] && [ -f "$STATE/ready" ] && alive "$(env_get CLUSTER_PID)" || return 1
  alive "$(env_get PROMETHEUS_PID)" || alive "$(cat "$STATE/prometheus.pid" 2>/dev/null)"
}

# stop_all: stop everything recorded in the state dir, newest first.
stop_all() {
  local pid name
  stop_group gpusim "$(env_get GPUSIM_PID)"
  [ -f "$STATE/gpusim.pid" ] && stop_group gpusim "$(cat "$STATE/gpusim.pid")"
  stop_group prometheus "$(env_get PROMETHEUS_PID)"
  [ -f "$STATE/prometheus.pid" ] && stop_group prometheus "$(cat "$STATE/prometheus.pid")"
  # The supervisor stops its own children on SIGTERM.
  [ -f "$STATE/up.pid" ] && stop_group cluster "$(cat "$STATE/up.pid")"
  [ -f "$STATE/cluster.pid" ] && stop_group cluster "$(cat "$STATE/cluster.pid")"
  stop_group cluster "$(env_get CLUSTER_PID)"
  # Fallback: components left behind if the supervisor was SIGKILLed.
  if [ -f "$STATE/pids" ]; then
    while read -r name pid; do
      stop_group "$name" "$pid"
    done < "$STATE/pids"
  fi
}

# remove_state: delete the state dir, but only if it is one of ours.
remove_state() {
  if [ -f "$MARKER" ]; then
    rm -rf -- "$STATE"
  elif [ -d "$STATE" ] && [ -z "$(ls -A "$STATE")" ]; then
    rmdir -- "$STATE"
  fi
}
