package main

// Each control-plane component runs in its own process (see up.go): `up`
// re-executes this binary with the component's name as the first argument, so
// process-wide state of the upstream code (feature gates, metric registries,
// klog flags) is never shared between two components.

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kwokconfig "sigs.k8s.io/kwok/pkg/config"
	kwokcmd "sigs.k8s.io/kwok/pkg/kwok/cmd"
	kwoklog "sigs.k8s.io/kwok/pkg/log"

	_ "k8s.io/component-base/logs/json/register"
)

// shiftArgs drops the component name so upstream flag parsing sees only its flags.
func shiftArgs() []string {
	os.Args = append([]string{os.Args[0]}, os.Args[2:]...)
	return os.Args[1:]
}

func runAPIServer() int {
	args := shiftArgs()
	cmd := apiserver.NewAPIServerCommand()
	cmd.SetArgs(args)
	return cli.Run(cmd)
}

func runControllerManager() int {
	args := shiftArgs()
	cmd := controllermanager.NewControllerManagerCommand()
	cmd.SetArgs(args)
	return cli.Run(cmd)
}

func runScheduler() int {
	args := shiftArgs()
	cmd := scheduler.NewSchedulerCommand()
	cmd.SetArgs(args)
	return cli.Run(cmd)
}

// runKwok runs the kwok controller (simulated kubelets) with stages read from
// the config files named by --config.
func runKwok() int {
	shiftArgs()
	// Upstream packages linked into this binary register a --version flag of
	// their own on the global pflag set; kwok's command declares a boolean one.
	pflag.CommandLine = pflag.NewFlagSet(os.Args[0], pflag.ExitOnError)
	global := pflag.NewFlagSet("global", pflag.ContinueOnError)
	global.ParseErrorsAllowlist.UnknownFlags = true
	global.Usage = func() {}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, logger := kwoklog.InitFlags(ctx, global)
	ctx, err := kwokconfig.InitFlags(ctx, global)
	if err != nil {
		logger.Error("kwok config", "err", err)
		return 1
	}
	cmd := kwokcmd.NewCommand(ctx)
	cmd.PersistentFlags().AddFlagSet(global)
	if err := cmd.ExecuteContext(ctx); err != nil {
		logger.Error("kwok exited", "err", err)
		return 1
	}
	return 0
}

// runEtcd starts an embedded etcd server: etcd --data-dir D --client-port P --peer-port Q
func runEtcd() int {
	fs := pflag.NewFlagSet("etcd", pflag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "etcd data directory")
	clientPort := fs.Int("client-port", 2379, "client port on 127.0.0.1")
	peerPort := fs.Int("peer-port", 2380, "peer port on 127.0.0.1")
	if err := fs.Parse(shiftArgs()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Name = "testcluster"
	cfg.Dir = *dataDir
	cfg.LogLevel = "warn"
	cfg.Logger = "zap"
	cfg.LogOutputs = []string{"stderr"}
	client := mustURL(fmt.Sprintf("http://127.0.0.1:%d", *clientPort))
	peer := mustURL(fmt.Sprintf("http://127.0.0.1:%d", *peerPort))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = client, client
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = peer, peer
	cfg.InitialCluster = fmt.Sprintf("%s=%s", cfg.Name, peer[0].String())
	cfg.ListenMetricsUrls = nil
	// A test cluster does not need fsync durability across machine crashes.
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 1
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintln(os.Stderr, "etcd ready on", client[0].String())
	case <-time.After(60 * time.Second):
		fmt.Fprintln(os.Stderr, "etcd: not ready after 60s")
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case s := <-sig:
		fmt.Fprintln(os.Stderr, "etcd: stopping on", s)
		return 0
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 1
	}
}

// componentNames lists the internal subcommands `up` starts, in start order.
var componentNames = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}

func mustURL(s string) []url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return []url.URL{*u}
}
