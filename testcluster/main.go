// Command testcluster runs a real Kubernetes control plane (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, all from upstream Go modules) plus
// kwok-simulated nodes on loopback ports, for kiln's end-to-end tests.
package main

import (
	"fmt"
	"os"
)

const usage = `usage: testcluster COMMAND [flags]

commands:
  up --dir DIR [--nodes 8] [--gpu-nodes 5] [--gpus-per-node 1] [--watch-pid PID]
  down --dir DIR
  restart-apiserver --dir DIR
  add-node --dir DIR [--gpu] [--gpus N] NAME
  delete-node --dir DIR NAME
  label-node --dir DIR NAME key=value... (key- removes a label)
  logs --dir DIR [--lines N]

internal (started by up, one process each):
  etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, reaper
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var code int
	switch os.Args[1] {
	case "etcd":
		code = runEtcd()
	case "kube-apiserver":
		code = runAPIServer()
	case "kube-controller-manager":
		code = runControllerManager()
	case "kube-scheduler":
		code = runScheduler()
	case "kwok":
		code = runKwok()
	case "reaper":
		code = runReaper(os.Args[2:])
	case "up":
		code = cmdUp(os.Args[2:])
	case "down":
		code = cmdDown(os.Args[2:])
	case "restart-apiserver":
		code = cmdRestartAPIServer(os.Args[2:])
	case "add-node":
		code = cmdAddNode(os.Args[2:])
	case "delete-node":
		code = cmdDeleteNode(os.Args[2:])
	case "label-node":
		code = cmdLabelNode(os.Args[2:])
	case "logs":
		code = cmdLogs(os.Args[2:])
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "testcluster: unknown command %q\n\n%s", os.Args[1], usage)
		code = 2
	}
	os.Exit(code)
}
