//! Virtual-GPU mode (`--kubernetes-virtual-gpus`) against dcgm-exporter's: one series per
//! container and replica with a `vgpu` label, and for `DCGM_FI_DEV_GPU_UTIL` /
//! `DCGM_FI_DEV_FB_USED` the device-level series plus each pod's own processes' values (from
//! the fake backend's process lists, pids mapped through a fake `/proc` and pod log directory).
//!
//! `tests/data/golden-virtual-gpus.prom` is dcgm-exporter's own output for this scene: its
//! `PodMapper.Process` (virtual-GPU mode, GPU UUID ids) and its text template, run on the
//! fixture's values, the same pods and processes, with NVML and the pid → pod UID step answered
//! from tables (see `tests/data/README.md`). It is never rewritten from kiln's output.

use std::{
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
};

use kiln_exporter::{
    attribution::{Allocation, Attribution, attribute},
    catalogue::Catalogue,
    exposition::{Format, encode},
    poller::collect,
    process::ProcessMapper,
    render::{RenderOptions, render_gpus},
    snapshot::Snapshot,
};
use kiln_gpu::{
    DeviceSample, FakeBackend, GpuDevice, GpuError, GpuInventory, GpuProcess, SystemInfo, XidEvent,
};

use crate::{fixture, parse};

const GPU0: &str = "GPU-11111111-2222-3333-4444-555555555555";
const GPU1: &str = "GPU-22222222-2222-3333-4444-555555555555";

/// The three fields of the scene, with the help texts of kiln's (and dcgm-exporter's) list.
const CSV: &str = "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n\
                   DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n\
                   DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n";

/// (namespace, pod, container, pod UID, device id): three replicas of the H100, the whole T4.
const PODS: [(&str, &str, &str, &str, &str); 4] = [
    (
        "ml",
        "trainer-a",
        "main",
        "0f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f",
        "::0",
    ),
    (
        "ml",
        "trainer-b",
        "main",
        "1f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f",
        "::1",
    ),
    (
        "research",
        "notebook",
        "jupyter",
        "2f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f",
        "::2",
    ),
    (
        "batch",
        "render",
        "worker",
        "3f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f",
        "",
    ),
];

fn allocations() -> Vec<Allocation> {
    PODS.iter()
        .map(|(ns, pod, ctr, _, replica)| Allocation {
            namespace: (*ns).into(),
            pod: (*pod).into(),
            container: (*ctr).into(),
            resource_name: "nvidia.com/gpu".into(),
            device_ids: vec![if replica.is_empty() {
                GPU1.to_owned()
            } else {
                format!("{GPU0}{replica}")
            }],
        })
        .collect()
}

/// A node's `/proc` (pids 101 and 102 in trainer-a and trainer-b, 103 outside any pod) and its
/// kubelet pod log directory (all four pods).
fn node(dir: &Path) -> ProcessMapper {
    let cgroups = [
        (101, format!("0::/kubepods/burstable/pod{}/c1\n", PODS[0].3)),
        (
            102,
            format!(
                "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-2.scope\n",
                PODS[1].3.replace('-', "_")
            ),
        ),
        (103, "0::/system.slice/sshd.service\n".to_owned()),
    ];
    fake_node(dir, &cgroups, &PODS)
}

/// A fake node under `dir`: a `/proc` with one `cgroup` file per `(pid, text)` and a kubelet pod
/// log directory `<namespace>_<pod>_<uid>` per entry of `pods` (namespace, pod, _, uid, _).
pub fn fake_node(
    dir: &Path,
    cgroups: &[(u32, String)],
    pods: &[(&str, &str, &str, &str, &str)],
) -> ProcessMapper {
    let proc_root = dir.join("proc");
    for (pid, text) in cgroups {
        std::fs::create_dir_all(proc_root.join(pid.to_string())).unwrap();
        std::fs::write(proc_root.join(format!("{pid}/cgroup")), text).unwrap();
    }
    let logs = dir.join("pods");
    for (ns, pod, _, uid, _) in pods {
        std::fs::create_dir_all(logs.join(format!("{ns}_{pod}_{uid}"))).unwrap();
    }
    ProcessMapper {
        proc_root,
        pod_logs_dir: logs,
    }
}

fn render(inv: &dyn GpuInventory, mapper: Option<&ProcessMapper>) -> String {
    render_virtual(inv, mapper, CSV, &allocations())
}

/// One poll of `inv` (with process lists through `mapper`) rendered in virtual-GPU mode as
/// text, for the metrics `csv`, the GPUs attributed from `allocations`, host `node-a`.
pub fn render_virtual(
    inv: &dyn GpuInventory,
    mapper: Option<&ProcessMapper>,
    csv: &str,
    allocations: &[Allocation],
) -> String {
    let (snap, errors) = collect(inv, &Snapshot::default(), mapper);
    assert_eq!(errors, 0);
    let attribution = attribute(allocations, &inv.devices().unwrap(), &[]);
    let opts = RenderOptions {
        hostname: Some("node-a".into()),
        per_pod: true,
        ..Default::default()
    };
    text(&Catalogue::parse(csv).unwrap(), &snap, &attribution, &opts)
}

/// `snap` rendered with `cat`, `attribution` and `opts`, as text exposition.
pub fn text(
    cat: &Catalogue,
    snap: &Snapshot,
    attribution: &Attribution,
    opts: &RenderOptions,
) -> String {
    let mut out = String::new();
    encode(
        &mut out,
        Format::Text,
        render_gpus(cat, snap, attribution, opts),
    )
    .unwrap();
    out
}

/// One series: name, labels in order, value.
pub type Series = (String, Vec<(String, String)>, String);

/// Every series, in output order.
pub fn series(body: &str) -> Vec<Series> {
    parse(body);
    body.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, rest) = l.split_once('{').unwrap();
            let (labels, value) = rest.rsplit_once("} ").unwrap();
            let labels = labels
                .split("\",")
                .map(|kv| {
                    let (k, v) = kv.split_once("=\"").unwrap();
                    (k.to_owned(), v.trim_end_matches('"').to_owned())
                })
                .collect();
            (name.to_owned(), labels, value.to_owned())
        })
        .collect()
}

/// What kiln's output has beyond dcgm-exporter's: its own families (README, "kiln's own
/// families"). Each must be there, so an entry that no longer applies fails too.
const KILN_ONLY_FAMILIES: [&str; 2] = [
    kiln_exporter::render::POD_INFO,
    kiln_exporter::render::XID_TOTAL,
];

#[test]
fn virtual_gpu_mode_equals_dcgm_exporter_series_by_series() {
    let dir = tempfile::tempdir().unwrap();
    let mapper = node(dir.path());
    let inv = FakeBackend::from_file(&fixture()).unwrap();
    let kiln = render(&inv, Some(&mapper));
    let golden = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden-virtual-gpus.prom"),
    )
    .unwrap();
    let (extra, ours): (Vec<_>, Vec<_>) = series(&kiln)
        .into_iter()
        .partition(|(name, ..)| KILN_ONLY_FAMILIES.contains(&name.as_str()));
    for family in KILN_ONLY_FAMILIES {
        assert!(
            extra.iter().any(|(name, ..)| name == family),
            "allowlisted {family} is not in kiln's output any more: drop it from the list"
        );
    }
    let theirs = series(&golden);
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a, b, "series {i}");
    }
    assert_eq!(ours.len(), theirs.len(), "{kiln}");
    // The families' HELP and TYPE lines, in order.
    let heads = |b: &str| {
        b.lines()
            .filter(|l| l.starts_with('#'))
            .filter(|l| {
                !KILN_ONLY_FAMILIES
                    .iter()
                    .any(|f| l.contains(&format!(" {f} ")))
            })
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(heads(&kiln), heads(&golden));
}

#[test]
fn idle_and_unmapped_pods_read_zero_and_the_device_value_stays() {
    // No process list read at all (no mapper): every pod's per-process value is 0, as
    // dcgm-exporter reports when it cannot map a pid, and pod_uid is empty.
    let inv = FakeBackend::from_file(&fixture()).unwrap();
    let scrape = parse(&render(&inv, None));
    let util: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "DCGM_FI_DEV_GPU_UTIL" && s.labels.get("gpu") == Some("0"))
        .map(|s| {
            (
                s.labels.get("pod").unwrap_or("-").to_owned(),
                s.labels.get("pod_uid").map(str::to_owned),
                s.value.clone(),
            )
        })
        .collect();
    let g = prometheus_parse::Value::Gauge;
    assert_eq!(
        util,
        [
            ("-".to_owned(), None, g(87.0)),
            ("trainer-a".to_owned(), Some(String::new()), g(0.0)),
            ("trainer-b".to_owned(), Some(String::new()), g(0.0)),
            ("notebook".to_owned(), Some(String::new()), g(0.0)),
        ]
    );
}

/// The fake backend, counting the NVML reads a poll makes.
struct Counting {
    inner: FakeBackend,
    samples: AtomicU64,
    processes: AtomicU64,
}

impl GpuInventory for Counting {
    fn system(&self) -> Result<SystemInfo, GpuError> {
        self.inner.system()
    }
    fn devices(&self) -> Result<Vec<GpuDevice>, GpuError> {
        self.inner.devices()
    }
    fn sample(&self, index: u32) -> Result<DeviceSample, GpuError> {
        self.samples.fetch_add(1, Ordering::Relaxed);
        self.inner.sample(index)
    }
    fn processes(&self, index: u32) -> Result<Vec<GpuProcess>, GpuError> {
        self.processes.fetch_add(1, Ordering::Relaxed);
        self.inner.processes(index)
    }
    fn drain_xid_events(&self) -> Vec<XidEvent> {
        self.inner.drain_xid_events()
    }
}

#[test]
fn one_process_list_read_per_gpu_per_poll_whatever_the_number_of_series() {
    let dir = tempfile::tempdir().unwrap();
    let mapper = node(dir.path());
    let inv = Counting {
        inner: FakeBackend::from_file(&fixture()).unwrap(),
        samples: AtomicU64::new(0),
        processes: AtomicU64::new(0),
    };
    // 64 replicas of the H100 held by 32 containers of trainer-a: 64 series per field.
    let allocs: Vec<Allocation> = (0..32)
        .map(|c| Allocation {
            namespace: "ml".into(),
            pod: "trainer-a".into(),
            container: format!("c{c:02}"),
            resource_name: "nvidia.com/gpu".into(),
            device_ids: vec![
                format!("{GPU0}::{}", 2 * c),
                format!("{GPU0}::{}", 2 * c + 1),
            ],
        })
        .collect();
    let (snap, _) = collect(&inv, &Snapshot::default(), Some(&mapper));
    assert_eq!(inv.processes.load(Ordering::Relaxed), 2, "one per GPU");
    assert_eq!(inv.samples.load(Ordering::Relaxed), 2, "one per GPU");
    let attribution = attribute(&allocs, &inv.devices().unwrap(), &[]);
    let opts = RenderOptions {
        per_pod: true,
        ..Default::default()
    };
    let cat = Catalogue::parse(CSV).unwrap();
    for _ in 0..3 {
        let out = text(&cat, &snap, &attribution, &opts);
        let scrape = parse(&out);
        let fb: Vec<_> = scrape
            .samples
            .iter()
            .filter(|s| s.metric == "DCGM_FI_DEV_FB_USED" && s.labels.get("gpu") == Some("0"))
            .collect();
        assert_eq!(fb.len(), 1 + 64);
        // Every share of trainer-a carries the pod's own 2 GiB, not the device's 38912 MiB.
        assert!(
            fb[1..]
                .iter()
                .all(|s| s.value == prometheus_parse::Value::Gauge(2048.0)),
            "{out}"
        );
    }
    assert_eq!(
        inv.processes.load(Ordering::Relaxed),
        2,
        "scrapes read nothing"
    );
    assert_eq!(inv.samples.load(Ordering::Relaxed), 2);
}
