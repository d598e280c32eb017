//! The exposition: golden output for the fake GPUs, a text-format parse, and OpenMetrics.

use std::path::Path;

use kiln_exporter::{
    attribution::{Allocation, attribute},
    catalogue::Catalogue,
    exposition::{Format, encode},
    poller::collect,
    process::ProcessMapper,
    render::{RenderOptions, render_gpus},
    snapshot::Snapshot,
};
use kiln_gpu::{FakeBackend, GpuInventory};

use crate::{fixture, parse, standin::PODS};

/// The stand-in's pods as allocations.
pub fn allocations() -> Vec<Allocation> {
    PODS.iter()
        .map(|(ns, pod, ctr, id)| Allocation {
            namespace: (*ns).into(),
            pod: (*pod).into(),
            container: (*ctr).into(),
            resource_name: "nvidia.com/gpu".into(),
            device_ids: vec![(*id).into()],
        })
        .collect()
}

fn body(format: Format) -> String {
    body_with(format, false)
}

fn body_with(format: Format, legacy_hostname_label: bool) -> String {
    let inv = FakeBackend::from_file(&fixture()).unwrap();
    let (snap, errors) = collect(&inv, &Snapshot::default(), None);
    assert_eq!(errors, 0);
    let devices: Vec<_> = inv.devices().unwrap();
    let attribution = attribute(&allocations(), &devices, &[]);
    let opts = RenderOptions {
        hostname: Some("node-a".into()),
        legacy_hostname_label,
        ..Default::default()
    };
    let families = render_gpus(&Catalogue::default_list(), &snap, &attribution, &opts);
    let mut out = String::new();
    encode(&mut out, format, families).unwrap();
    out
}

/// Compares with `tests/data/<name>`; `KILN_UPDATE_GOLDEN=1` rewrites it instead.
pub fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    if std::env::var_os("KILN_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap();
    pretty_assertions::assert_eq!(
        expected,
        actual,
        "golden {name}; KILN_UPDATE_GOLDEN=1 to rewrite"
    );
}

#[test]
fn text_output_matches_golden_and_parses() {
    let text = body(Format::Text);
    golden("golden.prom", &text);
    let scrape = parse(&text);
    let power = scrape
        .samples
        .iter()
        .find(|s| s.metric == "DCGM_FI_DEV_POWER_USAGE" && s.labels.get("gpu") == Some("0"))
        .unwrap();
    assert_eq!(power.value, prometheus_parse::Value::Gauge(72.345));
    assert_eq!(
        power.labels.get("UUID"),
        Some("GPU-11111111-2222-3333-4444-555555555555")
    );
    assert_eq!(power.labels.get("modelName"), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(power.labels.get("hostname"), Some("node-a"));
    assert_eq!(power.labels.get("Hostname"), None);
    assert_eq!(
        power.labels.get("DCGM_FI_DRIVER_VERSION"),
        Some("550.144.03")
    );
    assert_eq!(
        scrape
            .docs
            .get("DCGM_FI_DEV_POWER_USAGE")
            .map(String::as_str),
        Some("Power draw (in W).")
    );
    // The T4 has no memory clock in the fixture: no sample, not a zero.
    assert!(!text.contains("DCGM_FI_DEV_MEM_CLOCK{gpu=\"1\""));
}

#[test]
fn dcgm_label_order_is_kept() {
    let text = body(Format::Text);
    let line = text
        .lines()
        .find(|l| l.starts_with("DCGM_FI_DEV_XID_ERRORS{gpu=\"0\""))
        .unwrap();
    let names: Vec<&str> = line
        .split(['{', ','])
        .skip(1)
        .map(|kv| kv.split('=').next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "gpu",
            "UUID",
            "pci_bus_id",
            "device",
            "modelName",
            "hostname",
            "DCGM_FI_DRIVER_VERSION",
            "container",
            "err_code",
            "err_msg",
            "namespace",
            "pod"
        ]
    );
    assert!(line.ends_with("} 31"), "{line}");
    assert!(
        line.contains(",err_msg=\"GPU memory page fault\","),
        "{line}"
    );
}

#[test]
fn pod_uid_and_pod_labels_join_the_pod_series_in_dcgm_exporters_order() {
    use kiln_exporter::attribution::{PodMeta, PodMetas};
    let inv = FakeBackend::from_file(&fixture()).unwrap();
    let (snap, _) = collect(&inv, &Snapshot::default(), None);
    let mut meta = PodMetas::new();
    meta.insert(
        ("ml".into(), "trainer-a".into()),
        PodMeta {
            uid: Some("0b7c".into()),
            labels: vec![
                // Sorted by name, as `podmeta::pod_meta` gives them.
                ("DCGM_FI_DRIVER_VERSION".into(), "spoof".into()),
                ("Zeta".into(), "z".into()),
                ("app".into(), "train".into()),
                ("gpu".into(), "spoof".into()),
                ("pod".into(), "spoof".into()),
            ],
        },
    );
    let attribution =
        attribute(&allocations(), &inv.devices().unwrap(), &[]).with_meta(meta.into());
    let opts = RenderOptions {
        hostname: Some("node-a".into()),
        ..Default::default()
    };
    let families = render_gpus(&Catalogue::default_list(), &snap, &attribution, &opts);
    let mut text = String::new();
    encode(&mut text, Format::Text, families).unwrap();
    parse(&text);
    let line = text
        .lines()
        .find(|l| l.starts_with("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\""))
        .unwrap();
    assert!(
        line.ends_with(
            "hostname=\"node-a\",DCGM_FI_DRIVER_VERSION=\"550.144.03\",Zeta=\"z\",app=\"train\",\
             container=\"main\",namespace=\"ml\",pod=\"trainer-a\",pod_uid=\"0b7c\"} 41"
        ),
        "{line}"
    );
    // The T4's pod has no metadata: no pod_uid.
    let t4 = text
        .lines()
        .find(|l| l.starts_with("DCGM_FI_DEV_GPU_TEMP{gpu=\"1\""))
        .unwrap();
    assert!(!t4.contains("pod_uid") && !t4.contains("app="), "{t4}");
}

#[test]
fn the_old_host_label_name_is_an_option() {
    let text = body_with(Format::Text, true);
    let old = text.matches(",Hostname=\"node-a\"").count();
    assert!(old > 20, "{old}");
    assert_eq!(
        old,
        body(Format::Text).matches(",hostname=\"node-a\"").count()
    );
    assert!(!text.contains("hostname="));
}

#[test]
fn openmetrics_output_matches_golden() {
    let om = body(Format::OpenMetrics);
    golden("golden.om.txt", &om);
    assert!(om.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown\n"));
    assert!(om.contains("# TYPE kiln_gpu_xid_errors counter\n"));
}

#[test]
fn per_pod_process_usage_is_mapped_through_cgroups_and_pod_log_dirs() {
    let dir = tempfile::tempdir().unwrap();
    let uid_a = "0f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f";
    let uid_b = "1f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f";
    let proc_root = dir.path().join("proc");
    for (pid, uid) in [(101, uid_a), (102, uid_b)] {
        std::fs::create_dir_all(proc_root.join(pid.to_string())).unwrap();
        let cg = format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-1.scope\n",
            uid.replace('-', "_")
        );
        std::fs::write(proc_root.join(format!("{pid}/cgroup")), cg).unwrap();
    }
    std::fs::create_dir_all(proc_root.join("103")).unwrap();
    std::fs::write(
        proc_root.join("103/cgroup"),
        "0::/system.slice/sshd.service\n",
    )
    .unwrap();
    let logs = dir.path().join("pods");
    std::fs::create_dir_all(logs.join(format!("ml_trainer-a_{uid_a}"))).unwrap();
    std::fs::create_dir_all(logs.join(format!("ml_trainer-b_{uid_b}"))).unwrap();
    let mapper = ProcessMapper {
        proc_root,
        pod_logs_dir: logs,
    };

    let inv = FakeBackend::from_file(&fixture()).unwrap();
    let (snap, _) = collect(&inv, &Snapshot::default(), Some(&mapper));
    let opts = RenderOptions {
        hostname: None,
        process_metrics: true,
        ..Default::default()
    };
    let families = render_gpus(
        &Catalogue::default_list(),
        &snap,
        &attribute(&[], &[], &[]),
        &opts,
    );
    let mut out = String::new();
    encode(&mut out, Format::Text, families).unwrap();
    let scrape = parse(&out);
    let value = |metric: &str, pod: &str| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == metric && s.labels.get("pod") == Some(pod))
            .map(|s| s.value.clone())
    };
    assert_eq!(
        value("kiln_gpu_pod_fb_used_mib", "trainer-a"),
        Some(prometheus_parse::Value::Gauge(2048.0))
    );
    assert_eq!(
        value("kiln_gpu_pod_fb_used_mib", "trainer-b"),
        Some(prometheus_parse::Value::Gauge(1024.0))
    );
    assert_eq!(
        value("kiln_gpu_pod_sm_util", "trainer-a"),
        Some(prometheus_parse::Value::Gauge(40.0))
    );
    let mapped = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "kiln_gpu_pod_fb_used_mib")
        .count();
    assert_eq!(mapped, 2, "the process outside any pod has no series");
    let a = scrape
        .samples
        .iter()
        .find(|s| s.metric == "kiln_gpu_pod_sm_util")
        .unwrap();
    assert_eq!(a.labels.get("pod_uid"), Some(uid_a));
    assert_eq!(a.labels.get("namespace"), Some("ml"));
}

#[test]
fn dashboard_queries_only_metrics_the_exporter_emits() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/grafana/kiln-exporter-dashboard.json");
    let json = std::fs::read_to_string(path).unwrap();
    let kiln_families = [
        kiln_exporter::render::POD_INFO,
        kiln_exporter::render::XID_TOTAL,
        "kiln_gpu_pod_fb_used_mib",
        "kiln_gpu_pod_sm_util",
        "kiln_exporter_pod_resources_errors_total",
        "kiln_exporter_last_collect_timestamp_seconds",
    ];
    let mut seen = 0;
    for word in json.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("DCGM_FI_") {
            assert!(
                kiln_exporter::fields::field_by_name(word).is_some(),
                "dashboard uses unknown {word}"
            );
            seen += 1;
        } else if word.starts_with("kiln_") && word != "kiln_gpu_exporter" {
            assert!(
                kiln_families.contains(&word),
                "dashboard uses unknown {word}"
            );
            seen += 1;
        }
    }
    assert!(seen >= 10, "only {seen} metric references found");
}
