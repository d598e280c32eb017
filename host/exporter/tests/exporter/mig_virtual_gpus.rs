//! Virtual-GPU mode on a GPU with MIG: each GPU instance's `DCGM_FI_DEV_FB_USED` carries each
//! pod's own processes' memory on that MIG device (from the fake backend's `mig_processes`,
//! pids mapped through a fake `/proc` and pod log directory), as dcgm-exporter's
//! `processMIGEnabledGPU` / `createPerProcessMetrics` do; other fields and the GPU-level series
//! are copied per pod.
//!
//! `tests/data/golden-mig-virtual-gpus.prom` is dcgm-exporter's own output for the GPU-instance
//! series of this scene (see `tests/data/README.md`); it is never rewritten from kiln's output.
//! The GPU-level series of a MIG GPU are left out of that scene: kiln attributes them to every
//! pod on the GPU's MIG devices (README, "MIG"), where dcgm-exporter looks the pods up under the
//! MIG device UUID without its `MIG-` prefix, which names no GPU, and so labels none.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use kiln_exporter::{
    attribution::{Allocation, attribute},
    catalogue::Catalogue,
    poller::collect,
    process::ProcessMapper,
    render::{MIG_UUID_LABEL, POD_INFO, RenderOptions},
    snapshot::Snapshot,
};
use kiln_gpu::{
    DeviceSample, FakeBackend, GpuDevice, GpuError, GpuInventory, GpuProcess, MigProcesses,
    MigSample, SystemInfo, XidEvent,
};

use crate::{
    parse,
    virtual_gpus::{fake_node, render_virtual, series, text},
};

const MIG_B: &str = "MIG-bbbbbbbb-1111-2222-3333-444444444444";

/// The GPU-instance fields of the scene, with dcgm-exporter's help texts.
const CSV: &str = "DCGM_FI_DEV_FB_TOTAL, gauge, Framebuffer memory total (in MiB).\n\
                   DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n";

/// (namespace, pod, container, pod UID, device id): three replicas of MIG device A (GPU
/// instance 1), the whole MIG device B (instance 5); none holds C (instance 6).
const PODS: [(&str, &str, &str, &str, &str); 4] = [
    (
        "ml",
        "idle",
        "main",
        "4f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f",
        "MIG-aaaaaaaa-1111-2222-3333-444444444444::2",
    ),
    (
        "ml",
        "train-a",
        "main",
        "5f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f",
        "MIG-aaaaaaaa-1111-2222-3333-444444444444::0",
    ),
    (
        "ml",
        "train-b",
        "main",
        "6f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f",
        "MIG-aaaaaaaa-1111-2222-3333-444444444444::1",
    ),
    (
        "research",
        "notebook",
        "jupyter",
        "7f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f",
        MIG_B,
    ),
];

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mig-virtual-gpus.yaml")
}

fn allocations() -> Vec<Allocation> {
    PODS.iter()
        .map(|(ns, pod, ctr, _, id)| Allocation {
            namespace: (*ns).into(),
            pod: (*pod).into(),
            container: (*ctr).into(),
            resource_name: "nvidia.com/gpu".into(),
            device_ids: vec![(*id).into()],
        })
        .collect()
}

/// A node's `/proc` (201 and 202 in train-a, 203 in train-b, 301 in notebook; 204 and 401
/// outside any pod) and its kubelet pod log directory (all four pods).
fn node(dir: &Path) -> ProcessMapper {
    let in_pod = |uid: &str| format!("0::/kubepods/burstable/pod{uid}/c\n");
    let cgroups = [
        (201, in_pod(PODS[1].3)),
        (202, in_pod(PODS[1].3)),
        (203, in_pod(PODS[2].3)),
        (204, "0::/system.slice/dcgm.service\n".to_owned()),
        (301, in_pod(PODS[3].3)),
        (401, "0::/user.slice/user-1000.slice\n".to_owned()),
    ];
    fake_node(dir, &cgroups, &PODS)
}

fn render(inv: &dyn GpuInventory, mapper: Option<&ProcessMapper>, csv: &str) -> String {
    render_virtual(inv, mapper, csv, &allocations())
}

#[test]
fn gpu_instance_series_equal_dcgm_exporter_series_by_series() {
    let dir = tempfile::tempdir().unwrap();
    let mapper = node(dir.path());
    let inv = FakeBackend::from_file(&fixture()).unwrap();
    let kiln = render(&inv, Some(&mapper), CSV);
    let golden = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden-mig-virtual-gpus.prom"),
    )
    .unwrap();
    // What kiln's output has beyond dcgm-exporter's: its own family, and the MIG device's own
    // UUID on every GPU-instance series (README, "MIG"). Each must be there, so an entry that
    // no longer applies fails too.
    let (extra, mut ours): (Vec<_>, Vec<_>) = series(&kiln)
        .into_iter()
        .partition(|(name, ..)| name == POD_INFO);
    assert!(
        !extra.is_empty(),
        "allowlisted {POD_INFO} is not in kiln's output any more: drop it from the list"
    );
    for (name, labels, _) in &mut ours {
        let before = labels.len();
        labels.retain(|(k, _)| k != MIG_UUID_LABEL);
        assert_eq!(
            before,
            labels.len() + 1,
            "allowlisted label {MIG_UUID_LABEL} not on a {name} series any more: drop it from the list"
        );
    }
    let theirs = series(&golden);
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a, b, "series {i}");
    }
    assert_eq!(ours.len(), theirs.len(), "{kiln}");
    let heads = |b: &str| {
        b.lines()
            .filter(|l| l.starts_with('#') && !l.contains(&format!(" {POD_INFO} ")))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(heads(&kiln), heads(&golden));
}

/// `(GPU_I_ID or "-", pod or "-", vgpu or "-", value)` of every `metric` series.
fn rows(body: &str, metric: &str) -> Vec<(String, String, String, f64)> {
    parse(body)
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .map(|s| {
            let l = |k| s.labels.get(k).unwrap_or("-").to_owned();
            let prometheus_parse::Value::Gauge(v) = s.value else {
                panic!("{:?}", s.value)
            };
            (l("GPU_I_ID"), l("pod"), l("vgpu"), v)
        })
        .collect()
}

fn row(gi: &str, pod: &str, vgpu: &str, v: f64) -> (String, String, String, f64) {
    (gi.into(), pod.into(), vgpu.into(), v)
}

#[test]
fn gpu_level_series_of_a_mig_gpu_are_copied_per_pod() {
    // NVML has no utilisation per MIG device: GPU_UTIL stays a GPU-level series, copied to
    // every pod on the GPU's MIG devices, never per process, with no device-level series.
    let dir = tempfile::tempdir().unwrap();
    let inv = FakeBackend::from_file(&fixture()).unwrap();
    let body = render(
        &inv,
        Some(&node(dir.path())),
        "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n",
    );
    assert_eq!(
        rows(&body, "DCGM_FI_DEV_GPU_UTIL"),
        [
            row("-", "idle", "2", 64.0),
            row("-", "train-a", "0", 64.0),
            row("-", "train-b", "1", 64.0),
            row("-", "notebook", "-", 64.0),
        ]
    );
}

/// The fake backend, counting the MIG process-list reads and optionally failing them.
struct Scripted {
    inner: FakeBackend,
    mig_process_reads: AtomicU64,
    fail: bool,
}

impl GpuInventory for Scripted {
    fn system(&self) -> Result<SystemInfo, GpuError> {
        self.inner.system()
    }
    fn devices(&self) -> Result<Vec<GpuDevice>, GpuError> {
        self.inner.devices()
    }
    fn sample(&self, index: u32) -> Result<DeviceSample, GpuError> {
        self.inner.sample(index)
    }
    fn mig_samples(&self, index: u32) -> Result<Vec<MigSample>, GpuError> {
        self.inner.mig_samples(index)
    }
    fn processes(&self, index: u32) -> Result<Vec<GpuProcess>, GpuError> {
        self.inner.processes(index)
    }
    fn mig_processes(&self, index: u32) -> Result<Vec<MigProcesses>, GpuError> {
        self.mig_process_reads.fetch_add(1, Ordering::Relaxed);
        if self.fail {
            return Err(GpuError::GpuLost { index });
        }
        self.inner.mig_processes(index)
    }
    fn drain_xid_events(&self) -> Vec<XidEvent> {
        self.inner.drain_xid_events()
    }
}

fn scripted(fail: bool) -> Scripted {
    Scripted {
        inner: FakeBackend::from_file(&fixture()).unwrap(),
        mig_process_reads: AtomicU64::new(0),
        fail,
    }
}

#[test]
fn per_process_values_per_instance_from_one_read_per_poll() {
    let dir = tempfile::tempdir().unwrap();
    let mapper = node(dir.path());
    let inv = scripted(false);
    let (snap, _) = collect(&inv, &Snapshot::default(), Some(&mapper));
    assert_eq!(
        inv.mig_process_reads.load(Ordering::Relaxed),
        1,
        "one per GPU"
    );
    let attribution = attribute(&allocations(), &inv.devices().unwrap(), &[]);
    let opts = RenderOptions {
        per_pod: true,
        ..Default::default()
    };
    let cat = Catalogue::parse(CSV).unwrap();
    for _ in 0..3 {
        let out = text(&cat, &snap, &attribution, &opts);
        // Instance 1: idle reads 0, train-a 1024 + 512 MiB (1537 if its processes' bytes were
        // summed before rounding), train-b 256; instance 6 has no pod: device-level only.
        assert_eq!(
            rows(&out, "DCGM_FI_DEV_FB_USED"),
            [
                row("1", "-", "-", 2048.0),
                row("1", "idle", "2", 0.0),
                row("1", "train-a", "0", 1536.0),
                row("1", "train-b", "1", 256.0),
                row("5", "-", "-", 2096.0),
                row("5", "notebook", "-", 2048.0),
                row("6", "-", "-", 100.0),
            ]
        );
    }
    assert_eq!(
        inv.mig_process_reads.load(Ordering::Relaxed),
        1,
        "scrapes read nothing"
    );
    // Without process lists to read (no mapper), none is read and every pod reads 0, as on a
    // whole GPU.
    let inv = scripted(false);
    let (snap, _) = collect(&inv, &Snapshot::default(), None);
    assert_eq!(inv.mig_process_reads.load(Ordering::Relaxed), 0);
    let out = text(&cat, &snap, &attribution, &opts);
    let used = rows(&out, "DCGM_FI_DEV_FB_USED");
    assert_eq!(used.len(), 7);
    assert!(
        used.iter().filter(|r| r.1 != "-").all(|r| r.3 == 0.0),
        "{out}"
    );
}

#[test]
fn when_nvml_cannot_list_the_mig_processes_the_instance_values_are_copied_per_pod() {
    let dir = tempfile::tempdir().unwrap();
    let inv = scripted(true);
    let body = render(&inv, Some(&node(dir.path())), CSV);
    assert_eq!(inv.mig_process_reads.load(Ordering::Relaxed), 1);
    assert_eq!(
        rows(&body, "DCGM_FI_DEV_FB_USED"),
        [
            row("1", "idle", "2", 2048.0),
            row("1", "train-a", "0", 2048.0),
            row("1", "train-b", "1", 2048.0),
            row("5", "notebook", "-", 2096.0),
            row("6", "-", "-", 100.0),
        ]
    );
    assert!(!body.contains("pod_uid"), "{body}");
}
