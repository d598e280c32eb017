package main

// up / down / restart-apiserver / reaper / logs: process management for one
// cluster directory. Layout of DIR:
//
//	kubeconfig          admin kubeconfig (client certificate, group system:masters)
//	ports.json          the loopback ports chosen at start
//	pids/NAME.pid       PID of each component process
//	args/NAME.json      the arguments each component was started with
//	logs/NAME.log       stdout+stderr of each component
//	pki/, etcd/         certificates and etcd data
//	kwok.yaml           kwok stages (node initialize + heartbeat, pod ready/running-unready/complete/delete) and options

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	kwoknodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	kwoklease "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	kwokpodfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
)

type ports struct {
	Etcd       int `json:"etcd"`
	EtcdPeer   int `json:"etcdPeer"`
	APIServer  int `json:"apiserver"`
	Controller int `json:"controllerManager"`
	Scheduler  int `json:"scheduler"`
	Kwok       int `json:"kwok"`
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "[testcluster %s] %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
}

// freePorts returns n distinct free ports on 127.0.0.1. Every listener stays open until all n
// are chosen, so the kernel cannot hand the same port out twice (a closed port may come back
// from the very next bind to port 0: once etcd and kube-apiserver were given the same one).
func freePorts(n int) ([]int, error) {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		held = append(held, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func pidFile(dir, name string) string  { return filepath.Join(dir, "pids", name+".pid") }
func argsFile(dir, name string) string { return filepath.Join(dir, "args", name+".json") }
func logFile(dir, name string) string  { return filepath.Join(dir, "logs", name+".log") }

// ownedPID returns the PID recorded for component name if that process is
// still alive and still runs this program's `name` subcommand (so a recycled
// PID is never signalled).
func ownedPID(dir, name string) (int, bool) {
	b, err := os.ReadFile(pidFile(dir, name))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return pid, false
	}
	if len(cmdline) == 0 {
		// A process that has just exec'd shows an empty command line until the kernel has
		// laid out its arguments (the exec already reported success to the parent): still
		// starting, not exited. Under load that window lasts long enough for waitReadyz's
		// first look, which took it for a dead kube-apiserver.
		return pid, !isZombie(pid)
	}
	argv := strings.Split(string(cmdline), "\x00")
	if len(argv) < 2 || argv[1] != name {
		return pid, false
	}
	if isZombie(pid) {
		return pid, false
	}
	return pid, true
}

func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && errors.Is(err, syscall.ESRCH) {
		return false
	}
	return !isZombie(pid)
}

// spawn starts `self name args...` detached in its own session, logging to
// DIR/logs/NAME.log, and records its PID and arguments.
func spawn(dir, name string, args []string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	lf, err := os.OpenFile(logFile(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	fmt.Fprintf(lf, "=== %s: starting %s %s\n", time.Now().Format(time.RFC3339), name, strings.Join(args, " "))
	cmd := exec.Command(self, append([]string{name}, args...)...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	if err := os.WriteFile(pidFile(dir, name), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return nil, err
	}
	a, _ := json.Marshal(args)
	if err := os.WriteFile(argsFile(dir, name), a, 0o644); err != nil {
		return nil, err
	}
	// Reap the child if it dies while this process still runs.
	go func() { _ = cmd.Wait() }()
	return cmd, nil
}

// stop sends SIGTERM to the component, then SIGKILL after the grace period.
func stop(dir, name string, grace time.Duration) {
	pid, ok := ownedPID(dir, name)
	if !ok {
		_ = os.Remove(pidFile(dir, name))
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) && alive(pid) {
		time.Sleep(50 * time.Millisecond)
	}
	if alive(pid) {
		logf("%s (pid %d) did not stop in %s, killing", name, pid, grace)
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for i := 0; i < 100 && alive(pid); i++ {
			time.Sleep(50 * time.Millisecond)
		}
	}
	_ = os.Remove(pidFile(dir, name))
}

func stopAll(dir string) {
	for i := len(componentNames) - 1; i >= 0; i-- {
		stop(dir, componentNames[i], 10*time.Second)
	}
}

func readPorts(dir string) (ports, error) {
	var p ports
	b, err := os.ReadFile(filepath.Join(dir, "ports.json"))
	if err != nil {
		return p, err
	}
	return p, json.Unmarshal(b, &p)
}

func writeKubeconfig(dir string, f pkiFiles, apiPort int) error {
	read := func(p string) (string, error) {
		b, err := os.ReadFile(p)
		return base64.StdEncoding.EncodeToString(b), err
	}
	ca, err := read(f.CACert)
	if err != nil {
		return err
	}
	crt, err := read(f.AdminCert)
	if err != nil {
		return err
	}
	key, err := read(f.AdminKey)
	if err != nil {
		return err
	}
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: testcluster
  cluster:
    server: https://127.0.0.1:%d
    certificate-authority-data: %s
users:
- name: admin
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: testcluster
  context:
    cluster: testcluster
    user: admin
    namespace: default
current-context: testcluster
`, apiPort, ca, crt, key)
	return os.WriteFile(filepath.Join(dir, "kubeconfig"), []byte(kc), 0o600)
}

func adminHTTPClient(dir string) (*http.Client, error) {
	f := pkiPaths(dir)
	pair, err := tls.LoadX509KeyPair(f.AdminCert, f.AdminKey)
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(f.CACert)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}},
	}, nil
}

// waitReadyz polls the apiserver's /readyz until it answers 200.
func waitReadyz(dir string, port int, timeout time.Duration) error {
	client, err := adminHTTPClient(dir)
	if err != nil {
		return err
	}
	url := fmt.Sprintf("https://127.0.0.1:%d/readyz", port)
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		if _, ok := ownedPID(dir, "kube-apiserver"); !ok {
			return fmt.Errorf("kube-apiserver exited (see %s)", logFile(dir, "kube-apiserver"))
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready after %s: %s", timeout, last)
}

func waitTCP(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not reachable after %s", addr, timeout)
}

func apiserverArgs(dir string, p ports, f pkiFiles) []string {
	const issuer = "https://kubernetes.default.svc.cluster.local"
	return []string{
		"--etcd-servers=" + fmt.Sprintf("http://127.0.0.1:%d", p.Etcd),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", p.APIServer),
		"--cert-dir=" + filepath.Join(dir, "pki", "generated"),
		"--tls-cert-file=" + f.ServingCert,
		"--tls-private-key-file=" + f.ServingKey,
		"--client-ca-file=" + f.CACert,
		"--service-account-issuer=" + issuer,
		"--api-audiences=" + issuer,
		"--service-account-key-file=" + f.SAPub,
		"--service-account-signing-key-file=" + f.SAKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=RBAC",
		"--allow-privileged=true",
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=1",
	}
}

// ExternalReadinessAnnotation on a pod (any value) means: kwok starts the pod (Running,
// containers running) but leaves it NotReady; whoever stands in for the kubelet's prober
// (a test running the pod's process locally) sets its Ready condition through the pod status.
const ExternalReadinessAnnotation = "kiln.dev/testcluster-readiness"

// PendingAnnotation on a pod (any value) means: kwok does not start the pod; it stays Pending
// (as while a kubelet pulls its image) until a test removes the annotation, and kwok then
// starts it as any other pod.
const PendingAnnotation = "kiln.dev/testcluster-pending"

// RunningAnnotation on a pod (any value) means: kwok does not complete it. kwok's pod-complete
// stage ends a Job's pod as soon as it runs (Succeeded); with this annotation the pod runs
// until a test removes the annotation (kwok then completes it: the job ended) or sets its
// phase itself.
const RunningAnnotation = "kiln.dev/testcluster-running"

// podRunningUnready is kwok's pod-ready stage for pods with ExternalReadinessAnnotation:
// Running, containers started, Ready and ContainersReady False.
const podRunningUnready = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-running-unready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.metadata.annotations["` + ExternalReadinessAnnotation + `"]'
      operator: 'Exists'
    - key: '.metadata.annotations["` + PendingAnnotation + `"]'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Pending'
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        type: ContainersReady
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
`

// nodeLeaseSeconds is the simulated kubelets' node lease duration for a cluster of `nodes`:
// a kubelet's 40 s up to 500 nodes, then growing with the fleet (400 s at 5,000). kwok renews
// each lease every quarter of its duration, so a real kubelet's 40 s would cost 500 lease
// writes a second at 5,000 nodes: more than this 2-core control plane can take beside a
// 45,000-pod rollout (nodes then miss renewals, go NotReady and drop out of every DaemonSet).
// The controller-manager's grace period follows ([nodeMonitorGracePeriod]).
func nodeLeaseSeconds(nodes int) int {
	return max(40, 40*nodes/500)
}

// nodeMonitorGracePeriod: how long the node lifecycle controller waits for a lease renewal
// before it marks a node NotReady; a kubelet's default is 50 s for 40 s leases.
func nodeMonitorGracePeriod(nodes int) string {
	return fmt.Sprintf("%ds", nodeLeaseSeconds(nodes)+10)
}

// kwokConfig is kwok's configuration for `nodes` nodes: its stages ([kwokStages]) and options.
// Pod stages run 16 at a time (kwok's default is 4: about 15 pods made Ready a second on 2
// busy cores, 50 minutes for a 45,000-pod rollout). kwok does not default the options of a
// configuration file, so every one it reads is given (its defaults, except those three).
func kwokConfig(nodes int) string {
	return kwokStages() + fmt.Sprintf(`
---
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  cidr: 10.0.0.0/24
  podPlayStageParallelism: 16
  nodePlayStageParallelism: 4
  nodeLeaseParallelism: 8
  podsOnNodeSyncParallelism: 1
  nodeLeaseDurationSeconds: %d
  nodeStatusUpdateFrequencyMilliseconds: 10000
`, nodeLeaseSeconds(nodes))
}

// withoutAnnotations is kwok stage `stage` (named `name` in a panic) that also requires each of
// `annotations` to be absent from the pod.
func withoutAnnotations(name, stage string, annotations ...string) string {
	marker := "    matchExpressions:\n"
	if !strings.Contains(stage, marker) {
		panic("kwok's " + name + " stage changed shape: no matchExpressions")
	}
	extra := ""
	for _, a := range annotations {
		extra += "    - key: '.metadata.annotations[\"" + a + "\"]'\n" +
			"      operator: 'DoesNotExist'\n"
	}
	return strings.Replace(stage, marker, marker+extra, 1)
}

func kwokStages() string {
	// kwok's own pod-ready stage, except for pods whose readiness is set from outside and
	// pods held Pending; its pod-complete stage, except for pods held running.
	podReady := withoutAnnotations("pod-ready", kwokpodfast.DefaultPodReady,
		ExternalReadinessAnnotation, PendingAnnotation)
	podComplete := withoutAnnotations("pod-complete", kwokpodfast.DefaultPodComplete,
		RunningAnnotation)
	return strings.Join([]string{
		kwoknodefast.DefaultNodeInit,
		kwoklease.DefaultNodeHeartbeatWithLease,
		podReady,
		podRunningUnready,
		podComplete,
		kwokpodfast.DefaultPodDelete,
	}, "\n---\n")
}

func cmdUp(argv []string) int {
	fs := pflag.NewFlagSet("up", pflag.ContinueOnError)
	dir := fs.String("dir", "", "cluster directory (created; a leftover one is cleaned)")
	nodes := fs.Int("nodes", 8, "total number of simulated nodes")
	gpuNodes := fs.Int("gpu-nodes", 5, "how many of the nodes carry an NVIDIA GPU")
	gpusPerNode := fs.Int("gpus-per-node", 1, "nvidia.com/gpu capacity of each GPU node")
	watchPID := fs.Int("watch-pid", 0, "tear the cluster down (and remove DIR) when this process exits")
	timeout := fs.Duration("timeout", 180*time.Second, "how long to wait for the cluster to become ready")
	if err := fs.Parse(argv); err != nil {
		return 2
	}
	if *dir == "" {
		logf("up: --dir is required")
		return 2
	}
	if *gpuNodes > *nodes {
		logf("up: --gpu-nodes (%d) exceeds --nodes (%d)", *gpuNodes, *nodes)
		return 2
	}
	d, err := filepath.Abs(*dir)
	if err != nil {
		logf("up: %v", err)
		return 1
	}
	for attempt := 1; ; attempt++ {
		err := up(d, *nodes, *gpuNodes, *gpusPerNode, *watchPID, *timeout)
		if err == nil {
			return 0
		}
		retry := attempt < upAttempts && portTaken(d)
		if !retry {
			logf("up failed: %v", err)
			printLogTails(d, 30)
		}
		stopAll(d)
		stop(d, "reaper", 2*time.Second)
		if !retry {
			return 1
		}
		// freePorts releases the ports before the components bind them, so another process on
		// the machine can take one in between; new ports fix that.
		logf("up: a component's port was taken before it bound it (%v); attempt %d of %d on new ports",
			err, attempt+1, upAttempts)
	}
}

// upAttempts is how many times `up` starts the cluster when a component found its port taken.
const upAttempts = 3

// portTaken reports whether a component's log (its last 30 lines) says its port was bound by
// another process first.
func portTaken(dir string) bool {
	for _, c := range componentNames {
		for _, l := range tail(logFile(dir, c), 30) {
			if strings.Contains(l, "address already in use") {
				return true
			}
		}
	}
	return false
}

func up(dir string, nodes, gpuNodes, gpusPerNode, watchPID int, timeout time.Duration) error {
	start := time.Now()
	// A directory left over from a crashed run: stop whatever it still runs,
	// then start from empty state.
	if _, err := os.Stat(dir); err == nil {
		stop(dir, "reaper", 2*time.Second)
		stopAll(dir)
		for _, sub := range []string{"etcd", "pki", "pids", "args", "logs", "kubeconfig", "ports.json", "kwok.yaml"} {
			if err := os.RemoveAll(filepath.Join(dir, sub)); err != nil {
				return err
			}
		}
	}
	for _, sub := range []string{"pids", "args", "logs", "etcd"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	var p ports
	slots := []*int{&p.Etcd, &p.EtcdPeer, &p.APIServer, &p.Controller, &p.Scheduler, &p.Kwok}
	free, err := freePorts(len(slots))
	if err != nil {
		return err
	}
	for i, pp := range slots {
		*pp = free[i]
	}
	pb, _ := json.MarshalIndent(p, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "ports.json"), pb, 0o644); err != nil {
		return err
	}
	f, err := generatePKI(dir)
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := writeKubeconfig(dir, f, p.APIServer); err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(filepath.Join(dir, "kwok.yaml"), []byte(kwokConfig(nodes)), 0o644); err != nil {
		return err
	}

	if watchPID > 0 {
		if _, err := spawn(dir, "reaper", []string{"--dir", dir, "--pid", strconv.Itoa(watchPID), "--remove-dir"}); err != nil {
			return err
		}
	}

	logf("starting etcd on 127.0.0.1:%d", p.Etcd)
	if _, err := spawn(dir, "etcd", []string{"--data-dir", filepath.Join(dir, "etcd"),
		"--client-port", strconv.Itoa(p.Etcd), "--peer-port", strconv.Itoa(p.EtcdPeer)}); err != nil {
		return err
	}
	if err := waitTCP(fmt.Sprintf("127.0.0.1:%d", p.Etcd), 60*time.Second); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}

	logf("starting kube-apiserver on https://127.0.0.1:%d", p.APIServer)
	if _, err := spawn(dir, "kube-apiserver", apiserverArgs(dir, p, f)); err != nil {
		return err
	}
	if err := waitReadyz(dir, p.APIServer, timeout); err != nil {
		return err
	}
	logf("kube-apiserver ready (%.1fs)", time.Since(start).Seconds())

	logf("starting kube-controller-manager, kube-scheduler and kwok")
	if _, err := spawn(dir, "kube-controller-manager", []string{
		"--kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", p.Controller),
		"--leader-elect=false",
		"--controllers=*",
		"--service-account-private-key-file=" + f.SAKey,
		"--root-ca-file=" + f.CACert,
		"--cluster-signing-cert-file=" + f.CACert,
		"--cluster-signing-key-file=" + f.CAKey,
		"--use-service-account-credentials=false",
		"--concurrent-daemonset-syncs=5",
		"--node-monitor-grace-period=" + nodeMonitorGracePeriod(nodes),
		// The default 20 requests/s would take 37 min to create the 45,000 operand pods of
		// a 5,000-node benchmark; a real control plane runs with more.
		"--kube-api-qps=300",
		"--kube-api-burst=600",
		"--v=1",
	}); err != nil {
		return err
	}
	if _, err := spawn(dir, "kube-scheduler", []string{
		"--kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", p.Scheduler),
		"--leader-elect=false",
		"--kube-api-qps=300",
		"--kube-api-burst=600",
		"--v=1",
	}); err != nil {
		return err
	}
	if _, err := spawn(dir, "kwok", []string{
		"--kubeconfig=" + kubeconfig,
		"--config=" + filepath.Join(dir, "kwok.yaml"),
		"--manage-all-nodes=true",
		fmt.Sprintf("--server-address=127.0.0.1:%d", p.Kwok),
	}); err != nil {
		return err
	}

	cs, err := clientset(dir)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var names []string
	for i := 1; i <= nodes; i++ {
		gpu := i <= gpuNodes
		name := fmt.Sprintf("cpu-node-%d", i-gpuNodes)
		if gpu {
			name = fmt.Sprintf("gpu-node-%d", i)
		}
		g := 0
		if gpu {
			g = gpusPerNode
		}
		if err := createNode(ctx, cs, name, g); err != nil {
			return err
		}
		names = append(names, name)
	}
	for _, name := range names {
		if err := waitNodeReady(ctx, cs, name, func() error { return checkAlive(dir) }); err != nil {
			return err
		}
	}
	if err := checkAlive(dir); err != nil {
		return err
	}
	logf("ready in %.1fs: %d nodes (%d with nvidia.com/gpu=%d)", time.Since(start).Seconds(), nodes, gpuNodes, gpusPerNode)
	fmt.Printf("KUBECONFIG=%s\n", kubeconfig)
	return nil
}

func cmdDown(argv []string) int {
	fs := pflag.NewFlagSet("down", pflag.ContinueOnError)
	dir := fs.String("dir", "", "cluster directory")
	if err := fs.Parse(argv); err != nil || *dir == "" {
		logf("down: --dir is required")
		return 2
	}
	stopAll(*dir)
	stop(*dir, "reaper", 2*time.Second)
	logf("stopped cluster in %s", *dir)
	return 0
}

func cmdRestartAPIServer(argv []string) int {
	fs := pflag.NewFlagSet("restart-apiserver", pflag.ContinueOnError)
	dir := fs.String("dir", "", "cluster directory")
	kill := fs.Bool("kill", true, "SIGKILL instead of a graceful SIGTERM")
	if err := fs.Parse(argv); err != nil || *dir == "" {
		logf("restart-apiserver: --dir is required")
		return 2
	}
	p, err := readPorts(*dir)
	if err != nil {
		logf("restart-apiserver: %v", err)
		return 1
	}
	b, err := os.ReadFile(argsFile(*dir, "kube-apiserver"))
	if err != nil {
		logf("restart-apiserver: %v", err)
		return 1
	}
	var args []string
	if err := json.Unmarshal(b, &args); err != nil {
		logf("restart-apiserver: %v", err)
		return 1
	}
	if pid, ok := ownedPID(*dir, "kube-apiserver"); ok && *kill {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for i := 0; i < 200 && alive(pid); i++ {
			time.Sleep(50 * time.Millisecond)
		}
	}
	stop(*dir, "kube-apiserver", 10*time.Second)
	// The port may linger briefly after the old process died.
	if err := waitPortFree(p.APIServer, 30*time.Second); err != nil {
		logf("restart-apiserver: %v", err)
		return 1
	}
	start := time.Now()
	if _, err := spawn(*dir, "kube-apiserver", args); err != nil {
		logf("restart-apiserver: %v", err)
		return 1
	}
	if err := waitReadyz(*dir, p.APIServer, 120*time.Second); err != nil {
		logf("restart-apiserver: %v", err)
		printLogTails(*dir, 30)
		return 1
	}
	logf("kube-apiserver restarted, ready in %.1fs", time.Since(start).Seconds())
	return 0
}

func waitPortFree(port int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			l.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("port %d still in use: %v", port, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runReaper waits for --pid to exit, then stops the cluster (and removes the
// directory with --remove-dir). `up --watch-pid` starts it, so a test process
// that dies without running its cleanup still leaves nothing behind.
func runReaper(argv []string) int {
	fs := pflag.NewFlagSet("reaper", pflag.ContinueOnError)
	dir := fs.String("dir", "", "cluster directory")
	pid := fs.Int("pid", 0, "process to watch")
	remove := fs.Bool("remove-dir", false, "remove DIR after stopping")
	if err := fs.Parse(argv); err != nil || *dir == "" || *pid <= 0 {
		return 2
	}
	for alive(*pid) {
		if _, err := os.Stat(filepath.Join(*dir, "pids")); err != nil {
			return 0
		}
		time.Sleep(500 * time.Millisecond)
	}
	logf("reaper: process %d exited, stopping the cluster", *pid)
	stopAll(*dir)
	if *remove && os.Getenv("KILN_TESTCLUSTER_KEEP") == "" {
		_ = os.RemoveAll(*dir)
	}
	return 0
}

func tail(path string, n int) []string {
	fh, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer fh.Close()
	var lines []string
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return lines
}

func printLogTails(dir string, n int) {
	for _, c := range append(append([]string{}, componentNames...), "reaper") {
		lines := tail(logFile(dir, c), n)
		if lines == nil {
			continue
		}
		fmt.Fprintf(os.Stderr, "----- %s (last %d lines of %s) -----\n", c, len(lines), logFile(dir, c))
		for _, l := range lines {
			fmt.Fprintln(os.Stderr, l)
		}
	}
}

func cmdLogs(argv []string) int {
	fs := pflag.NewFlagSet("logs", pflag.ContinueOnError)
	dir := fs.String("dir", "", "cluster directory")
	n := fs.Int("lines", 40, "lines per component")
	if err := fs.Parse(argv); err != nil || *dir == "" {
		return 2
	}
	printLogTails(*dir, *n)
	return 0
}

func checkAlive(dir string) error {
	for _, c := range componentNames {
		if _, ok := ownedPID(dir, c); !ok {
			return fmt.Errorf("%s exited during start-up (see %s)", c, logFile(dir, c))
		}
	}
	return nil
}
