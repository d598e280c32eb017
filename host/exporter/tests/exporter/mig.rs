//! MIG: per-MIG-device series with `GPU_I_PROFILE`, `GPU_I_ID` and `mig_device_uuid`, attributed
//! to the pods holding each MIG device (by `MIG-<uuid>` and by the pre-R470
//! `MIG-GPU-<uuid>/<gi>/<ci>` id).

use std::path::Path;

use kiln_exporter::{
    attribution::{Allocation, attribute},
    catalogue::Catalogue,
    exposition::{Format, encode},
    poller::collect,
    render::{RenderOptions, render_gpus},
    snapshot::Snapshot,
};
use kiln_gpu::{FakeBackend, GpuInventory};

use crate::parse;

const CSV: &str = "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n\
                   DCGM_FI_DEV_FB_TOTAL, gauge, Framebuffer memory total (in MiB).\n\
                   DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n\
                   DCGM_FI_DRIVER_VERSION, label, Driver Version\n";

fn alloc(pod: &str, container: &str, resource: &str, id: &str) -> Allocation {
    Allocation {
        namespace: "ml".into(),
        pod: pod.into(),
        container: container.into(),
        resource_name: resource.into(),
        device_ids: vec![id.into()],
    }
}

fn body(per_pod: bool) -> String {
    let inv =
        FakeBackend::from_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mig.yaml"))
            .unwrap();
    let (snap, errors) = collect(&inv, &Snapshot::default(), None);
    assert_eq!(errors, 0);
    let allocations = [
        alloc(
            "train",
            "main",
            "nvidia.com/mig-3g.20gb",
            "MIG-aaaaaaaa-1111-2222-3333-444444444444",
        ),
        alloc(
            "infer",
            "srv",
            "nvidia.com/mig-1g.5gb",
            "MIG-GPU-33333333-2222-3333-4444-555555555555/5/0",
        ),
    ];
    let attribution = attribute(&allocations, &inv.devices().unwrap(), &[]);
    let opts = RenderOptions {
        hostname: Some("node-a".into()),
        per_pod,
        ..Default::default()
    };
    let families = render_gpus(&Catalogue::parse(CSV).unwrap(), &snap, &attribution, &opts);
    let mut out = String::new();
    encode(&mut out, Format::Text, families).unwrap();
    out
}

const GPU: &str = "gpu=\"0\",UUID=\"GPU-33333333-2222-3333-4444-555555555555\",\
                   pci_bus_id=\"00000000:07:00.0\",device=\"nvidia0\",modelName=\"NVIDIA A100-SXM4-40GB\"";
const TAIL: &str = "hostname=\"node-a\",DCGM_FI_DRIVER_VERSION=\"550.144.03\"";
const MIG_A: &str = "GPU_I_PROFILE=\"3g.20gb\",GPU_I_ID=\"1\"";
const MIG_B: &str = "GPU_I_PROFILE=\"1g.5gb\",GPU_I_ID=\"5\"";
const POD_A: &str = "container=\"main\",mig_device_uuid=\"MIG-aaaaaaaa-1111-2222-3333-444444444444\",namespace=\"ml\",pod=\"train\"";
const POD_B: &str = "container=\"srv\",mig_device_uuid=\"MIG-bbbbbbbb-1111-2222-3333-444444444444\",namespace=\"ml\",pod=\"infer\"";

#[test]
fn framebuffer_series_are_per_mig_device_with_instance_labels_and_their_pods() {
    let text = body(false);
    let expected = [
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).".to_owned(),
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge".to_owned(),
        // Whole-GPU reading: the GPU's series, owned by the first pod on any of its MIG devices.
        format!(
            "DCGM_FI_DEV_GPU_TEMP{{{GPU},{TAIL},container=\"srv\",namespace=\"ml\",pod=\"infer\"}} 35"
        ),
        "# HELP DCGM_FI_DEV_FB_TOTAL Framebuffer memory total (in MiB).".to_owned(),
        "# TYPE DCGM_FI_DEV_FB_TOTAL gauge".to_owned(),
        format!("DCGM_FI_DEV_FB_TOTAL{{{GPU},{MIG_A},{TAIL},{POD_A}}} 19968"),
        format!("DCGM_FI_DEV_FB_TOTAL{{{GPU},{MIG_B},{TAIL},{POD_B}}} 4864"),
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).".to_owned(),
        "# TYPE DCGM_FI_DEV_FB_USED gauge".to_owned(),
        format!("DCGM_FI_DEV_FB_USED{{{GPU},{MIG_A},{TAIL},{POD_A}}} 1024"),
        format!("DCGM_FI_DEV_FB_USED{{{GPU},{MIG_B},{TAIL},{POD_B}}} 0"),
    ];
    let dcgm: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("# HELP kiln_"))
        .collect();
    pretty_assertions::assert_eq!(dcgm, expected);
    let scrape = parse(&text);
    let used: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "DCGM_FI_DEV_FB_USED")
        .map(|s| {
            (
                s.labels.get("GPU_I_ID").unwrap().to_owned(),
                s.labels.get("pod").unwrap().to_owned(),
                s.value.clone(),
            )
        })
        .collect();
    assert_eq!(
        used,
        [
            (
                "1".into(),
                "train".into(),
                prometheus_parse::Value::Gauge(1024.0)
            ),
            (
                "5".into(),
                "infer".into(),
                prometheus_parse::Value::Gauge(0.0)
            ),
        ]
    );
    // Both pods are listed against the GPU in the info metric.
    let info: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "kiln_gpu_pod_info")
        .map(|s| s.labels.get("pod").unwrap().to_owned())
        .collect();
    assert_eq!(info, ["infer", "train"]);
}

#[test]
fn per_pod_mode_copies_whole_gpu_readings_per_pod_and_splits_per_process_fields_per_mig_device() {
    let scrape = parse(&body(true));
    let count = |m: &str| scrape.samples.iter().filter(|s| s.metric == m).count();
    assert_eq!(count("DCGM_FI_DEV_GPU_TEMP"), 2);
    assert_eq!(count("DCGM_FI_DEV_FB_TOTAL"), 2);
    // A per-process field: each MIG device's own series, then its pod's (no process list read
    // here, so 0; see mig_virtual_gpus.rs).
    assert_eq!(count("DCGM_FI_DEV_FB_USED"), 4);
}
