// Command kubelet is the upstream kubelet (k8s.io/kubernetes/cmd/kubelet), built from this
// module so that it links the same Kubernetes version as the control plane: the real node
// of e2e/scripts/node-up.sh.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
