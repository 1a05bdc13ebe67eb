#!/usr/bin/env bash
# The real node's supervisor: node-up.sh runs it under `unshare --mount`, so every mount the
# node makes (the kubelet's volumes, containerd's overlays) lives in a mount namespace of its
# own and goes away with it. Starts containerd, loads the pause image, starts the kubelet;
# on SIGTERM (or when either dies) stops the kubelet, kills what its pods still run, stops
# containerd and its shims. Everything it needs is in the node dir that node-up.sh wrote.
# Usage: node-run.sh NODE_DIR BIN_DIR
set -euo pipefail
NODE="$1"
BIN="$2"
# shellcheck source=/dev/null
. "$NODE/node.conf"  # CGROUP_ROOT, SOCKET, PAUSE_REF

log() { echo "node-run: $(date +%T.%N | cut -c1-12) $*" >&2; }

# The kubelet sets these kernel settings at start (vm.overcommit_memory=1, kernel.panic=10,
# kernel.panic_on_oops=1, ...), for the whole machine: here it reads its own values from
# files bound over them, in this namespace only, and changes nothing.
mkdir -p "$NODE/sysctl"
for setting in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
    kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
  key="${setting%=*}"
  file="$NODE/sysctl/${key//\//.}"
  echo "${setting#*=}" > "$file"
  mount --bind "$file" "/proc/sys/$key"
done
# Paths the kubelet and containerd do not take from their configuration.
mount --bind "$NODE/kubelet" /var/lib/kubelet
mount --bind "$NODE/container-logs" /var/log/containers
mount -t tmpfs -o mode=0711 tmpfs /run/containerd

ctr() { "$BIN/ctr" --address "$SOCKET" --namespace k8s.io "$@"; }

stop() {
  trap - TERM INT EXIT
  log "stopping"
  [ -n "$KUBELET" ] && kill -TERM "$KUBELET" 2>/dev/null && wait "$KUBELET" 2>/dev/null
  # what the pods still run: every process in the node's cgroups
  for _ in 1 2 3 4 5; do
    pids="$(find /sys/fs/cgroup/pids/"$CGROUP_ROOT" -name cgroup.procs -exec cat {} + 2>/dev/null || true)"
    [ -z "$pids" ] && break
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
  done
  log "kubelet stopped, pods killed"
  [ -n "$CONTAINERD" ] && kill -TERM "$CONTAINERD" 2>/dev/null && wait "$CONTAINERD" 2>/dev/null
  # the shims, which left containerd's process group: every other process of this namespace
  mine="$(readlink /proc/self/ns/mnt)"
  for proc in /proc/[0-9]*; do
    pid="${proc#/proc/}"
    [ "$pid" = "$$" ] && continue
    [ "$(readlink "$proc/ns/mnt" 2>/dev/null)" = "$mine" ] && kill -KILL "$pid" 2>/dev/null
  done
  log "stopped"
  exit 0
}

CONTAINERD=""
KUBELET=""
trap stop TERM INT EXIT  # a failed step below stops what started too
PATH="$BIN:$PATH" "$BIN/containerd" --config "$NODE/containerd.toml" \
  > "$NODE/logs/containerd.log" 2>&1 &
CONTAINERD=$!

deadline=$(( $(date +%s) + 60 ))
until ctr version >/dev/null 2>&1; do
  kill -0 "$CONTAINERD" 2>/dev/null || { log "containerd exited"; tail -n 30 "$NODE/logs/containerd.log" >&2; exit 1; }
  [ "$(date +%s)" -lt "$deadline" ] || { log "containerd not serving after 60s"; stop; }
  sleep 0.2
done
ctr images import "$BIN/pause.tar" >/dev/null

"$BIN/kubelet" --config="$NODE/kubelet.yaml" --kubeconfig="$NODE/kubelet.kubeconfig" \
  --hostname-override="$NODE_NAME" --node-labels="$NODE_LABELS" \
  --cert-dir="$NODE/kubelet-pki" --v=2 > "$NODE/logs/kubelet.log" 2>&1 &
KUBELET=$!
log "containerd $CONTAINERD, kubelet $KUBELET"
wait -n "$CONTAINERD" "$KUBELET" || true
log "containerd or the kubelet exited"
stop
