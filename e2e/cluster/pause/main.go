// Command pause is the sandbox ("pause") container of the real node's pods: it holds the
// pod's namespaces, reaps the zombies it inherits as PID 1, and exits on SIGINT or SIGTERM,
// as Kubernetes' own build/pause/linux/pause.c does. Built here because no registry is
// reachable to pull registry.k8s.io/pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	children := make(chan os.Signal, 16)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-children:
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
