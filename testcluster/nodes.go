package main

// Simulated nodes: created through the real API, then kept Ready (with lease
// renewals) by kwok. GPU nodes carry the labels Node Feature Discovery would
// set and the nvidia.com/gpu capacity a registered device plugin would report.

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// GPUResource is the extended resource the NVIDIA device plugin advertises.
const GPUResource corev1.ResourceName = "nvidia.com/gpu"

func clientset(dir string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kubeconfig"))
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200
	return kubernetes.NewForConfig(cfg)
}

func nodeLabels(name string, gpu bool) map[string]string {
	l := map[string]string{
		"kubernetes.io/hostname":           name,
		"kubernetes.io/os":                 "linux",
		"kubernetes.io/arch":               "amd64",
		"type":                             "kwok",
		"kiln.dev/testcluster":             "true",
		"node.kubernetes.io/instance-type": "kiln-sim",
		"feature.node.kubernetes.io/kernel-version.full":                "6.8.0-51-generic",
		"feature.node.kubernetes.io/kernel-version.major":               "6",
		"feature.node.kubernetes.io/kernel-version.minor":               "8",
		"feature.node.kubernetes.io/kernel-version.revision":            "0",
		"feature.node.kubernetes.io/system-os_release.ID":               "ubuntu",
		"feature.node.kubernetes.io/system-os_release.VERSION_ID":       "22.04",
		"feature.node.kubernetes.io/system-os_release.VERSION_ID.major": "22",
		"feature.node.kubernetes.io/system-os_release.VERSION_ID.minor": "04",
		"feature.node.kubernetes.io/cpu-model.vendor_id":                "Intel",
	}
	if gpu {
		l["feature.node.kubernetes.io/pci-10de.present"] = "true"
	}
	return l
}

func nodeResources(gpus int) corev1.ResourceList {
	r := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("32"),
		corev1.ResourceMemory:           resource.MustParse("128Gi"),
		corev1.ResourcePods:             resource.MustParse("110"),
		corev1.ResourceEphemeralStorage: resource.MustParse("500Gi"),
	}
	if gpus > 0 {
		r[GPUResource] = *resource.NewQuantity(int64(gpus), resource.DecimalSI)
	}
	return r
}

func createNode(ctx context.Context, cs *kubernetes.Clientset, name string, gpus int) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      nodeLabels(name, gpus > 0),
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
		},
		Status: corev1.NodeStatus{
			Capacity:    nodeResources(gpus),
			Allocatable: nodeResources(gpus),
			NodeInfo: corev1.NodeSystemInfo{
				KernelVersion:   "6.8.0-51-generic",
				OSImage:         "Ubuntu 22.04.5 LTS",
				OperatingSystem: "linux",
				Architecture:    "amd64",
			},
		},
	}
	created, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	if gpus > 0 {
		if q, ok := created.Status.Capacity[GPUResource]; !ok || q.Value() != int64(gpus) {
			// Status given on create was dropped: report the capacity as a
			// device plugin registration would.
			patch, _ := json.Marshal(map[string]any{"status": map[string]any{
				"capacity":    map[string]string{string(GPUResource): fmt.Sprint(gpus)},
				"allocatable": map[string]string{string(GPUResource): fmt.Sprint(gpus)},
			}})
			if _, err := cs.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
				return fmt.Errorf("patch node %s gpu capacity: %w", name, err)
			}
		}
	}
	return nil
}

func waitNodeReady(ctx context.Context, cs *kubernetes.Clientset, name string, check func() error) error {
	for {
		if check != nil {
			if err := check(); err != nil {
				return err
			}
		}
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s not Ready: %v (last error %v)", name, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func cmdAddNode(argv []string) int {
	fs := pflag.NewFlagSet("add-node", pflag.ContinueOnError)
	dir := fs.String("dir", "", "cluster directory")
	gpu := fs.Bool("gpu", false, "give the node an NVIDIA GPU (NFD labels and nvidia.com/gpu capacity)")
	gpus := fs.Int("gpus", 1, "nvidia.com/gpu capacity with --gpu")
	wait := fs.Bool("wait", true, "wait until the node is Ready")
	if err := fs.Parse(argv); err != nil || *dir == "" || fs.NArg() != 1 {
		logf("usage: add-node --dir DIR [--gpu] [--gpus N] NAME")
		return 2
	}
	cs, err := clientset(*dir)
	if err != nil {
		logf("add-node: %v", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	n := 0
	if *gpu {
		n = *gpus
	}
	name := fs.Arg(0)
	if err := createNode(ctx, cs, name, n); err != nil {
		logf("add-node: %v", err)
		return 1
	}
	if *wait {
		if err := waitNodeReady(ctx, cs, name, nil); err != nil {
			logf("add-node: %v", err)
			return 1
		}
	}
	logf("node %s added (gpus=%d)", name, n)
	return 0
}

func cmdDeleteNode(argv []string) int {
	fs := pflag.NewFlagSet("delete-node", pflag.ContinueOnError)
	dir := fs.String("dir", "", "cluster directory")
	if err := fs.Parse(argv); err != nil || *dir == "" || fs.NArg() != 1 {
		logf("usage: delete-node --dir DIR NAME")
		return 2
	}
	cs, err := clientset(*dir)
	if err != nil {
		logf("delete-node: %v", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cs.CoreV1().Nodes().Delete(ctx, fs.Arg(0), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		logf("delete-node: %v", err)
		return 1
	}
	logf("node %s deleted", fs.Arg(0))
	return 0
}

func cmdLabelNode(argv []string) int {
	fs := pflag.NewFlagSet("label-node", pflag.ContinueOnError)
	dir := fs.String("dir", "", "cluster directory")
	if err := fs.Parse(argv); err != nil || *dir == "" || fs.NArg() < 2 {
		logf("usage: label-node --dir DIR NAME key=value... (key- removes)")
		return 2
	}
	labels := map[string]any{}
	for _, kv := range fs.Args()[1:] {
		if k, v, ok := strings.Cut(kv, "="); ok {
			labels[k] = v
		} else if strings.HasSuffix(kv, "-") {
			labels[strings.TrimSuffix(kv, "-")] = nil
		} else {
			logf("label-node: %q is neither key=value nor key-", kv)
			return 2
		}
	}
	cs, err := clientset(*dir)
	if err != nil {
		logf("label-node: %v", err)
		return 1
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Nodes().Patch(ctx, fs.Arg(0), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		logf("label-node: %v", err)
		return 1
	}
	logf("node %s labelled", fs.Arg(0))
	return 0
}
