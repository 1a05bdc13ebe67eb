# The Kubernetes version the control plane (build-cluster.sh) and the real node's kubelet
# (build-node.sh) link, and its link flags: without them the binaries report v0.0.0-master and
# Helm's kubeVersion checks fail. Sourced, not executed.
# shellcheck shell=bash
K8S_VERSION="v1.36.4"
KUBE_LDFLAGS="-s -w \
 -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=36 \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION} \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=36"
