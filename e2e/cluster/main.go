// Command cluster is a multicall binary that runs one Kubernetes control-plane
// component per OS process: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and kwok, plus "up", the supervisor that starts them all.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata" // for timeZone support in CronJob

	"github.com/spf13/pflag"
	etcdmain "go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kwokconfig "sigs.k8s.io/kwok/pkg/config"
	kwokcmd "sigs.k8s.io/kwok/pkg/kwok/cmd"
	kwoklog "sigs.k8s.io/kwok/pkg/log"
	kwoksignals "sigs.k8s.io/kwok/pkg/utils/signals"
)

const usage = `usage: cluster <etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kwok|up|apply-nodes|stages|version> [flags]`

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	// Allow invocation through a symlink named after the component too.
	switch name {
	case "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok":
	default:
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
		name = args[0]
		args = args[1:]
	}
	// Shift os.Args so that the upstream entry points see their own argv.
	os.Args = append([]string{name}, args...)

	switch name {
	case "etcd":
		etcdmain.Main(os.Args)
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kwok":
		os.Exit(runKwok())
	case "up":
		os.Exit(runUp(args))
	case "apply-nodes":
		os.Exit(runApplyNodes(args))
	case "stages":
		fmt.Print(StagesYAML())
	case "version":
		fmt.Println(gitVersion())
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
}

// runKwok mirrors sigs.k8s.io/kwok/cmd/kwok/main.go.
func runKwok() int {
	// The Kubernetes packages linked into this binary register flags (e.g. component-base's
	// "--version" of type version) in pflag.CommandLine, which cobra merges into every root
	// command; kwok has its own bool --version, and cobra then fails with "trying to get
	// bool value of flag of type version". kwok's own binary has an empty CommandLine.
	pflag.CommandLine = pflag.NewFlagSet(os.Args[0], pflag.ExitOnError)

	flagset := pflag.NewFlagSet("global", pflag.ContinueOnError)
	flagset.ParseErrorsAllowlist.UnknownFlags = true
	flagset.Usage = func() {}

	ctx := kwoksignals.SetupSignalContext()
	ctx, logger := kwoklog.InitFlags(ctx, flagset)

	ctx, err := kwokconfig.InitFlags(ctx, flagset)
	if err != nil {
		_, _ = os.Stderr.Write([]byte(flagset.FlagUsages()))
		logger.Error("Init config flags", "err", err)
		return 1
	}

	command := kwokcmd.NewCommand(ctx)
	command.PersistentFlags().AddFlagSet(flagset)
	if err := command.ExecuteContext(ctx); err != nil {
		logger.Error("Execute exit", "err", err)
		return 1
	}
	return 0
}
