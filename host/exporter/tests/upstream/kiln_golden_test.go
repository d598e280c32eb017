package transformation

// kiln's golden harness: upstream's PodMapper.Process in virtual-GPU mode and its text template,
// fed with kiln's H100/T4 fixture (host/exporter/tests/data/gpus.yaml) and the pods of
// host/exporter/tests/exporter/virtual_gpus.rs. Writes the body to $KILN_GOLDEN_OUT.

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
	kUUID0 = "GPU-11111111-2222-3333-4444-555555555555"
	kUUID1 = "GPU-22222222-2222-3333-4444-555555555555"
	kUIDA  = "0f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f"
	kUIDB  = "1f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f"
	kUIDN  = "2f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f"
	kUIDR  = "3f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f"
)

type kPod struct{ ns, name, ctr, uid, id string }

var kPods = []kPod{
	{"ml", "trainer-a", "main", kUIDA, kUUID0 + "::0"},
	{"ml", "trainer-b", "main", kUIDB, kUUID0 + "::1"},
	{"research", "notebook", "jupyter", kUIDN, kUUID0 + "::2"},
	{"batch", "render", "worker", kUIDR, kUUID1},
}

type kLister struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
}

func (kLister) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	var out []*podresourcesapi.PodResources
	for _, p := range kPods {
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

func TestKilnGolden(t *testing.T) {
	sock := t.TempDir() + "/kubelet.sock"
	server := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(server, kLister{})
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go server.Serve(lis)
	defer server.Stop()

	ctrl := gomock.NewController(t)
	nv := mocknvmlprovider.NewMockNVML(ctrl)
	// The fixture's H100 processes: 2 GiB/40 %, 1 GiB/20 %, and pid 103 outside any pod.
	nv.EXPECT().GetDeviceProcessMemory(kUUID0).Return(map[uint32]uint64{101: 2147483648, 102: 1073741824, 103: 5}, nil).AnyTimes()
	nv.EXPECT().GetDeviceProcessUtilization(kUUID0).Return(map[uint32]uint32{101: 40, 102: 20, 103: 1}, nil).AnyTimes()
	nv.EXPECT().GetDeviceProcessMemory(kUUID1).Return(map[uint32]uint64{}, nil).AnyTimes()
	nv.EXPECT().GetDeviceProcessUtilization(kUUID1).Return(map[uint32]uint32{}, nil).AnyTimes()
	nvmlprovider.SetClient(nv)
	kilnPIDMapper = func() PIDMapper {
		return &pidToPodMapper{pidToUID: map[uint32]string{101: kUIDA, 102: kUIDB, 103: ""}}
	}

	pm := NewPodMapper(&appconfig.Config{
		KubernetesGPUIdType:       appconfig.GPUUID,
		PodResourcesKubeletSocket: sock,
		KubernetesVirtualGPUs:     true,
	})
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, p := range kPods {
		_ = idx.Add(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: p.ns, UID: types.UID(p.uid)}})
	}
	pm.podLister = listerv1.NewPodLister(idx)

	gpu := func(i uint, uuid string) deviceinfo.GPUInfo {
		return deviceinfo.GPUInfo{DeviceInfo: dcgm.Device{UUID: uuid, GPU: i}}
	}
	di := mockdeviceinfo.NewMockProvider(ctrl)
	di.EXPECT().GPUCount().Return(uint(2)).AnyTimes()
	di.EXPECT().GPU(uint(0)).Return(gpu(0, kUUID0)).AnyTimes()
	di.EXPECT().GPU(uint(1)).Return(gpu(1, kUUID1)).AnyTimes()

	type field struct {
		id         uint16
		name, help string
		v0, v1     string
	}
	// The CSV rows of tests/exporter/virtual_gpus.rs, values from the fixture.
	fields := []field{
		{150, "DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "41", "33"},
		{203, "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "87", "0"},
		{252, "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "38912", "0"},
	}
	var order []counters.Counter
	metrics := collector.MetricsByCounter{}
	for _, f := range fields {
		c := counters.Counter{FieldID: dcgm.Short(f.id), FieldName: f.name, PromType: "gauge", Help: f.help}
		order = append(order, c)
		mk := func(i, uuid, bus, model, v string) collector.Metric {
			return collector.Metric{Counter: c, Value: v, GPU: i, GPUUUID: uuid, GPUDevice: "nvidia" + i,
				GPUModelName: model, GPUPCIBusID: bus, UUID: "UUID", Hostname: "node-a",
				Labels: map[string]string{}, Attributes: map[string]string{}}
		}
		metrics[c] = []collector.Metric{
			mk("0", kUUID0, "00000000:8D:00.0", "NVIDIA H100 80GB HBM3", f.v0),
			mk("1", kUUID1, "00000000:3B:00.0", "Tesla T4", f.v1),
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
	if out := stdos.Getenv("KILN_GOLDEN_OUT"); out != "" {
		if err := stdos.WriteFile(out, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Log("\n" + buf.String())
}
