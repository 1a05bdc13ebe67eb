#!/usr/bin/env bash
# Joins one real node to the local cluster (cluster-up.sh), beside the kwok GPU nodes: the
# kubelet of build-node.sh with containerd v2 and Debian's runc, supervised by node-run.sh in
# a mount namespace of its own. The node is tainted gpusizer.io/real-node=true:NoSchedule
# (only pods that tolerate it run there) and labelled gpusizer.io/real-node=true. Its pods
# use the host's network (hostNetwork: true); nothing of the machine's own configuration is
# changed: no kernel setting, no network interface, no iptables rule. Waits until the Node is
# Ready and writes $GPUSIZER_NODE_DIR/env (NODE_NAME, CONTAINERD_ADDRESS, CTR, ...).
#
# Env: GPUSIZER_CLUSTER_DIR  the cluster's state dir (default <repo>/.cluster)
#      GPUSIZER_NODE_DIR     the node's state dir (default <repo>/.node; keep it short: it
#                            holds unix sockets)
#      GPUSIZER_NODE_NAME    default real-node
#      GPUSIZER_NODE_TIMEOUT seconds to wait for Ready (default 180)
set -euo pipefail
# shellcheck source=e2e/scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=e2e/scripts/node-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/node-lib.sh"

NAME="${GPUSIZER_NODE_NAME:-real-node}"
TIMEOUT="${GPUSIZER_NODE_TIMEOUT:-180}"
log() { echo "node-up: $*" >&2; }

[ "$(id -u)" -eq 0 ] || { log "the kubelet and containerd need root"; exit 1; }
if ! command -v openssl >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
fi
cluster_running || { log "no cluster running in $STATE (make cluster-up)"; exit 1; }
lock_node
if node_running; then
  echo "node already running (state $NODE): source $NODE/env"
  exit 0
fi
[ -d "$NODE" ] && node_stop_and_remove

t0=$(date +%s)
BIN="$("$REPO/e2e/scripts/build-node.sh")"
KUBECONFIG="$(env_get KUBECONFIG)"
APISERVER="$(env_get APISERVER_URL)"
export KUBECONFIG
kubectl() { "$REPO/.venv/bin/kubectl" "$@"; }

mkdir -p "$NODE"/{logs,kubelet,kubelet-pki,container-logs,pod-logs,containerd,cni} "$NODE/sysctl"
touch "$NODE/$NODE_MARKER"
# The kubelet's cgroups live under a root of this node's own (other worktrees may run one).
CGROUP_ROOT="/gpusizer-node-$(printf '%s' "$NODE" | sha256sum | cut -c1-12)"
make_cgroup_root "$CGROUP_ROOT"
# Mount points the namespace binds over (made empty once on the machine, left empty).
mkdir -p /var/lib/kubelet /var/log/containers /run/containerd

fail() {
  log "$*"
  for f in "$NODE"/logs/*.log; do
    [ -f "$f" ] && { echo "--- tail $f" >&2; tail -n 25 "$f" >&2; }
  done
  node_stop_and_remove
  exit 1
}

# 1. The kubelet's client certificate, through the CSR API as a kubelet bootstraps
#    (signer kube-apiserver-client-kubelet; the controller-manager signs with the cluster CA).
openssl ecparam -genkey -name prime256v1 -noout -out "$NODE/kubelet-pki/client.key" 2>/dev/null
openssl req -new -key "$NODE/kubelet-pki/client.key" -subj "/O=system:nodes/CN=system:node:$NAME" \
  -out "$NODE/kubelet-pki/client.csr"
CSR="node-$NAME-$(date +%s)"
kubectl create -f - >/dev/null <<YAML
apiVersion: certificates.k8s.io/v1
kind: CertificateSigningRequest
metadata: {name: $CSR}
spec:
  signerName: kubernetes.io/kube-apiserver-client-kubelet
  usages: [digital signature, client auth]
  expirationSeconds: 86400
  request: $(base64 -w0 < "$NODE/kubelet-pki/client.csr")
YAML
kubectl certificate approve "$CSR" >/dev/null
deadline=$(( $(date +%s) + 60 ))
until cert="$(kubectl get csr "$CSR" -o jsonpath='{.status.certificate}')" && [ -n "$cert" ]; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "CSR $CSR not signed after 60s"
  sleep 0.2
done
echo "$cert" | base64 -d > "$NODE/kubelet-pki/client.crt"
kubectl delete csr "$CSR" >/dev/null
CA="$STATE/pki/ca.crt"
cat > "$NODE/kubelet.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$APISERVER", certificate-authority: "$CA"}}]
users: [{name: kubelet, user: {client-certificate: "$NODE/kubelet-pki/client.crt", client-key: "$NODE/kubelet-pki/client.key"}}]
contexts: [{name: kubelet, context: {cluster: local, user: kubelet}}]
current-context: kubelet
YAML

# 2. containerd: its own root, state and socket; runc from Debian; cgroupfs (no systemd).
SOCKET="$NODE/containerd/containerd.sock"
PAUSE_REF="$(cat "$BIN/pause.ref")"
cat > "$NODE/containerd.toml" <<TOML
version = 4
root = "$NODE/containerd/root"
state = "$NODE/containerd/state"
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[plugins.'io.containerd.server.v1.grpc']
  address = "$SOCKET"
[plugins.'io.containerd.server.v1.ttrpc']
  address = "$SOCKET.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "$NODE/containerd/opt"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_REF"
[plugins.'io.containerd.cri.v1.runtime']
  # no CAP_SYS_RESOURCE here: runc cannot lower a pod's oom_score_adj below containerd's
  # ("failed to update /proc/self/oom_score_adj: Permission denied" for the sandbox's -998)
  restrict_oom_score_adj = true
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "${GPUSIZER_NODE_RUNC:-$(command -v runc)}"
      Root = "/run/containerd/runc"
      SystemdCgroup = false
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["$BIN/cni"]
  conf_dir = "$NODE/cni"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
TOML
cat > "$NODE/cni/10-loopback.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "gpusizer-node", "plugins": [{"type": "loopback"}]}
JSON

# 3. The kubelet: cgroup v1 allowed (failCgroupV1: false), on loopback ports of its own.
KUBELET_PORT="$(free_port)"
HEALTHZ_PORT="$(free_port)"
cat > "$NODE/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
containerRuntimeEndpoint: unix://$SOCKET
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $CA}
authorization: {mode: Webhook}
podLogsDir: $NODE/pod-logs
failSwapOn: false
resolvConf: /etc/resolv.conf
maxPods: 16
registerWithTaints:
  - {key: gpusizer.io/real-node, value: "true", effect: NoSchedule}
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
YAML
cat > "$NODE/node.conf" <<CONF
NODE_NAME=$NAME
NODE_LABELS=gpusizer.io/real-node=true
CGROUP_ROOT=$CGROUP_ROOT
SOCKET=$SOCKET
PAUSE_REF=$PAUSE_REF
CONF

# 4. The supervisor, in a mount namespace of its own.
setsid unshare --mount --propagation private "$REPO/e2e/scripts/node-run.sh" "$NODE" "$BIN" \
  > "$NODE/logs/node.log" 2>&1 < /dev/null 7>&- 9>&- &
NODE_PID=$!
echo "$NODE_PID" > "$NODE/node.pid"
deadline=$(( $(date +%s) + TIMEOUT ))
until [ "$(kubectl get node "$NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = "True" ]; do
  [ -d "/proc/$NODE_PID" ] || fail "the node's supervisor exited"
  [ "$(date +%s)" -lt "$deadline" ] || fail "node $NAME not Ready after ${TIMEOUT}s"
  sleep 0.5
done

cat > "$NODE/env.tmp" <<ENV
NODE_NAME=$NAME
CLUSTER_STATE_DIR=$STATE
NODE_DIR=$NODE
NODE_PID=$NODE_PID
CONTAINERD_ADDRESS=$SOCKET
CTR=$BIN/ctr
KUBELET_HEALTHZ=http://127.0.0.1:$HEALTHZ_PORT/healthz
POD_LOGS=$NODE/pod-logs
CGROUP_ROOT=$CGROUP_ROOT
ENV
mv -f "$NODE/env.tmp" "$NODE/env"
log "node $NAME Ready in $(( $(date +%s) - t0 ))s"
cat "$NODE/env"
