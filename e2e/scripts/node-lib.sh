# Shared helpers of node-up.sh and node-down.sh (sourced after lib.sh).
# shellcheck shell=bash

NODE="$(absolute_dir "${GPUSIZER_NODE_DIR:-$REPO/.node}")"
NODE_MARKER=".gpusizer-node"

# lock_node: node-up.sh/node-down.sh on one node dir (fd 7, which the node never inherits).
lock_node() {
  lock_dir node "$NODE" 7
}

node_env_get() {
  [ -f "$NODE/env" ] || return 0
  sed -n "s/^$1=//p" "$NODE/env" | tail -n 1
}

# node_supervisor_alive: node-run.sh of this node dir runs.
node_supervisor_alive() {
  local pid
  pid="$(cat "$NODE/node.pid" 2>/dev/null || true)"
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "$NODE"
}

node_running() {
  [ -f "$NODE/env" ] && node_supervisor_alive
}

# make_cgroup_root PATH: PATH in every cgroup v1 hierarchy (and the hybrid v2 one), with the
# parent's CPUs and memory nodes for cpuset, which a new cpuset cgroup otherwise lacks.
make_cgroup_root() {
  local dir
  for dir in /sys/fs/cgroup/*/; do
    [ -f "$dir/cgroup.procs" ] || continue
    mkdir -p "$dir${1#/}"
  done
  if [ -f /sys/fs/cgroup/cpuset/cpuset.cpus ]; then
    cat /sys/fs/cgroup/cpuset/cpuset.cpus > "/sys/fs/cgroup/cpuset${1}/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems > "/sys/fs/cgroup/cpuset${1}/cpuset.mems"
  fi
}

# remove_cgroup_root PATH: the (empty) cgroups under PATH, deepest first.
remove_cgroup_root() {
  local dir
  for dir in /sys/fs/cgroup/*/; do
    [ -d "$dir${1#/}" ] || continue
    find "$dir${1#/}" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

# node_stop_and_remove: stop the supervisor (which stops the kubelet, the pods, containerd
# and the shims), SIGKILL after 30 s, remove the node's cgroups and its dir.
node_stop_and_remove() {
  local pid cgroup_root
  pid="$(cat "$NODE/node.pid" 2>/dev/null || true)"
  cgroup_root="$(sed -n 's/^CGROUP_ROOT=//p' "$NODE/node.conf" 2>/dev/null || true)"
  if node_supervisor_alive; then
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_gone "$pid" 30; then
      echo "node-down: supervisor $pid ignored SIGTERM: SIGKILL" >&2
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
      wait_gone "$pid" 5 || true
    fi
  fi
  [ -n "$cgroup_root" ] && remove_cgroup_root "$cgroup_root"
  if [ -f "$NODE/$NODE_MARKER" ]; then
    rm -rf -- "$NODE"
  fi
}
