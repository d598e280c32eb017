package transformation

// kiln's golden harness, MIG case: upstream's PodMapper.Process in virtual-GPU mode and its text
// template on the GPU-instance series of kiln's MIG fixture
// (host/exporter/tests/data/mig-virtual-gpus.yaml) with the pods of
// host/exporter/tests/exporter/mig_virtual_gpus.rs. The per-process values come from upstream's
// own processMIGEnabledGPU / createPerProcessMetrics; NVML (the MIG devices' process lists and
// the MIG device → GPU instance lookup) and the pid → pod UID step are answered from tables.
// Writes the body to $KILN_GOLDEN_MIG_OUT.

import (
	"bytes"
	"context"
	"net"
	stdos "os"
	"testing"

	"github.com/NVIDIA/go-dcgm/pkg/dcgm"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	listerv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	mockdeviceinfo "github.com/NVIDIA/dcgm-exporter/internal/mocks/pkg/deviceinfo"
	mocknvmlprovider "github.com/NVIDIA/dcgm-exporter/internal/mocks/pkg/nvmlprovider"
	"github.com/NVIDIA/dcgm-exporter/internal/pkg/appconfig"
	"github.com/NVIDIA/dcgm-exporter/internal/pkg/collector"
	"github.com/NVIDIA/dcgm-exporter/internal/pkg/counters"
	"github.com/NVIDIA/dcgm-exporter/internal/pkg/deviceinfo"
	"github.com/NVIDIA/dcgm-exporter/internal/pkg/nvmlprovider"
	"github.com/NVIDIA/dcgm-exporter/internal/pkg/rendermetrics"
)

const (
	kMigGPU = "GPU-33333333-2222-3333-4444-555555555555"
	kMigA   = "MIG-aaaaaaaa-1111-2222-3333-444444444444"
	kMigB   = "MIG-bbbbbbbb-1111-2222-3333-444444444444"
	kUIDI   = "4f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f"
	kUIDTA  = "5f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f"
	kUIDTB  = "6f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f"
	kUIDNB  = "7f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f"
)

// Three replicas of MIG device A (GPU instance 1), the whole MIG device B (instance 5); no pod
// holds MIG device C (instance 6).
var kMigPods = []kPod{
	{"ml", "idle", "main", kUIDI, kMigA + "::2"},
	{"ml", "train-a", "main", kUIDTA, kMigA + "::0"},
	{"ml", "train-b", "main", kUIDTB, kMigA + "::1"},
	{"research", "notebook", "jupyter", kUIDNB, kMigB},
}

type kMigLister struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
}

func (kMigLister) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	var out []*podresourcesapi.PodResources
	for _, p := range kMigPods {
		out = append(out, &podresourcesapi.PodResources{
			Name: p.name, Namespace: p.ns,
			Containers: []*podresourcesapi.ContainerResources{{
				Name:    p.ctr,
				Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{p.id}}},
			}},
		})
	}
	return &podresourcesapi.ListPodResourcesResponse{PodResources: out}, nil
}

func TestKilnGoldenMIG(t *testing.T) {
	sock := t.TempDir() + "/kubelet.sock"
	server := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(server, kMigLister{})
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go server.Serve(lis)
	defer server.Stop()

	ctrl := gomock.NewController(t)
	nv := mocknvmlprovider.NewMockNVML(ctrl)
	nv.EXPECT().GetMIGDeviceInfoByID(kMigA).Return(&nvmlprovider.MIGDeviceInfo{ParentUUID: kMigGPU, GPUInstanceID: 1}, nil).AnyTimes()
	nv.EXPECT().GetMIGDeviceInfoByID(kMigB).Return(&nvmlprovider.MIGDeviceInfo{ParentUUID: kMigGPU, GPUInstanceID: 5}, nil).AnyTimes()
	// The fixture's mig_processes, by GPU instance id.
	nv.EXPECT().GetAllMIGDevicesProcessMemory(kMigGPU).Return(map[uint]map[uint32]uint64{
		1: {201: 1074528256, 202: 537657344, 203: 268435456, 204: 104857600},
		5: {301: 2147483648},
		6: {401: 67108864},
	}, nil).AnyTimes()
	nvmlprovider.SetClient(nv)
	kilnPIDMapper = func() PIDMapper {
		return &pidToPodMapper{pidToUID: map[uint32]string{201: kUIDTA, 202: kUIDTA, 203: kUIDTB, 204: "", 301: kUIDNB, 401: ""}}
	}

	pm := NewPodMapper(&appconfig.Config{
		KubernetesGPUIdType:       appconfig.GPUUID,
		PodResourcesKubeletSocket: sock,
		KubernetesVirtualGPUs:     true,
	})
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, p := range kMigPods {
		_ = idx.Add(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: p.ns, UID: types.UID(p.uid)}})
	}
	pm.podLister = listerv1.NewPodLister(idx)

	instance := func(gi uint, profile string) deviceinfo.GPUInstanceInfo {
		return deviceinfo.GPUInstanceInfo{
			Info:        dcgm.MigEntityInfo{GpuUuid: kMigGPU, NvmlGpuIndex: 0, NvmlInstanceId: gi},
			ProfileName: profile,
		}
	}
	di := mockdeviceinfo.NewMockProvider(ctrl)
	di.EXPECT().GPUCount().Return(uint(1)).AnyTimes()
	di.EXPECT().GPU(uint(0)).Return(deviceinfo.GPUInfo{
		DeviceInfo:   dcgm.Device{UUID: kMigGPU, GPU: 0},
		MigEnabled:   true,
		GPUInstances: []deviceinfo.GPUInstanceInfo{instance(1, "3g.20gb"), instance(5, "1g.5gb"), instance(6, "1g.5gb")},
	}).AnyTimes()

	type field struct {
		id         uint16
		name, help string
		v          [3]string // per GPU instance 1, 5, 6
	}
	// The CSV rows of tests/exporter/mig_virtual_gpus.rs, values (MiB) from the fixture's
	// mig_samples.
	fields := []field{
		{250, "DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).", [3]string{"19968", "4864", "4864"}},
		{252, "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", [3]string{"2048", "2096", "100"}},
	}
	instances := []struct{ gi, profile string }{{"1", "3g.20gb"}, {"5", "1g.5gb"}, {"6", "1g.5gb"}}
	var order []counters.Counter
	metrics := collector.MetricsByCounter{}
	for _, f := range fields {
		c := counters.Counter{FieldID: dcgm.Short(f.id), FieldName: f.name, PromType: "gauge", Help: f.help}
		order = append(order, c)
		for i, in := range instances {
			metrics[c] = append(metrics[c], collector.Metric{Counter: c, Value: f.v[i], GPU: "0", GPUUUID: kMigGPU,
				GPUDevice: "nvidia0", GPUModelName: "NVIDIA A100-SXM4-40GB", GPUPCIBusID: "00000000:07:00.0",
				UUID: "UUID", MigProfile: in.profile, GPUInstanceID: in.gi, Hostname: "node-a",
				Labels: map[string]string{}, Attributes: map[string]string{}})
		}
	}
	if err := pm.Process(metrics, di); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for _, c := range order {
		if err := rendermetrics.RenderGroup(&buf, dcgm.FE_GPU, collector.MetricsByCounter{c: metrics[c]}); err != nil {
			t.Fatal(err)
		}
	}
	if out := stdos.Getenv("KILN_GOLDEN_MIG_OUT"); out != "" {
		if err := stdos.WriteFile(out, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Log("\n" + buf.String())
}
