// Command pause is the sandbox ("infra") container of the e2e cluster's pods: it holds the pod's
// namespaces, reaps zombies when it is PID 1, and exits on SIGINT or SIGTERM. No image registry is
// reachable from the test machines, so this replaces registry.k8s.io/pause in a local image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// Reap every exited child; more than one may have exited behind a single SIGCHLD.
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
