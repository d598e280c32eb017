//! GFD labels from fake GPUs and device-plugin configs: exact values for an H100 node, a
//! time-sliced node, MIG single/mixed, and the node patch.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kiln_device_plugin::config::{Config, MigStrategy};
use kiln_gfd::{
    GpuMode, LabelInput, Labels, OWNED_LABELS_ANNOTATION, make_labels, make_node_patch,
};
use kiln_gpu::{FakeBackend, GpuInventory};
use serde_json::json;

const H100: &str = r#"
driver_version: "550.144.03"
cuda_version: "12.4"
gpus:
  - uuid: GPU-11111111-2222-3333-4444-555555555555
    name: NVIDIA H100 80GB HBM3
    memory_total_mib: 81559
    compute_capability: "9.0"
    mig_enabled: false
  - uuid: GPU-22222222-2222-3333-4444-555555555555
    name: NVIDIA H100 80GB HBM3
    memory_total_mib: 81559
    compute_capability: "9.0"
    mig_enabled: false
"#;

fn labels(fixture: &str, config: &str, mig: Option<MigStrategy>) -> Labels {
    let fake = FakeBackend::new(serde_yaml_ng::from_str(fixture).unwrap());
    let cfg = Config::from_yaml(config).unwrap();
    let input = LabelInput {
        mig_strategy: mig.or(cfg.flags.mig_strategy).unwrap_or_default(),
        sharing: cfg.sharing(),
        timestamp: Some(1_750_000_000),
        machine: Some("PowerEdge XE9680\n".into()),
        pci_modes: vec![GpuMode::Compute; 2],
        mig_memory_mib: BTreeMap::new(),
    };
    make_labels(&fake.system().unwrap(), &fake.devices().unwrap(), &input).unwrap()
}

fn expect(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (format!("nvidia.com/{k}"), (*v).to_owned()))
        .collect()
}

#[test]
fn h100_node_gets_the_full_catalogue() {
    let got = labels(H100, "", None);
    let want = expect(&[
        ("cuda.driver-version.full", "550.144.03"),
        ("cuda.driver-version.major", "550"),
        ("cuda.driver-version.minor", "144"),
        ("cuda.driver-version.revision", "03"),
        ("cuda.driver.major", "550"),
        ("cuda.driver.minor", "144"),
        ("cuda.driver.rev", "03"),
        ("cuda.runtime-version.full", "12.4"),
        ("cuda.runtime-version.major", "12"),
        ("cuda.runtime-version.minor", "4"),
        ("cuda.runtime.major", "12"),
        ("cuda.runtime.minor", "4"),
        ("gfd.timestamp", "1750000000"),
        ("gpu.compute.major", "9"),
        ("gpu.compute.minor", "0"),
        ("gpu.count", "2"),
        ("gpu.family", "hopper"),
        ("gpu.machine", "PowerEdge-XE9680"),
        ("gpu.memory", "81559"),
        ("gpu.mode", "compute"),
        ("gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("gpu.replicas", "1"),
        ("gpu.sharing-strategy", "none"),
        ("mig.capable", "true"),
        ("mps.capable", "false"),
    ]);
    pretty_assertions::assert_eq!(got, want);
}

#[test]
fn time_sliced_node_gets_replicas_strategy_and_shared_product() {
    let cfg = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 5\n";
    let got = labels(H100, cfg, None);
    assert_eq!(got["nvidia.com/gpu.replicas"], "5");
    assert_eq!(got["nvidia.com/gpu.sharing-strategy"], "time-slicing");
    assert_eq!(
        got["nvidia.com/gpu.product"],
        "NVIDIA-H100-80GB-HBM3-SHARED"
    );
    assert_eq!(
        got["nvidia.com/gpu.count"], "2",
        "physical GPUs, not replicas"
    );

    // Renamed to nvidia.com/gpu.shared: same keys, product without the suffix.
    let renamed = cfg.replace(
        "timeSlicing:\n",
        "timeSlicing:\n    renameByDefault: true\n",
    );
    let got = labels(H100, &renamed, None);
    assert_eq!(got["nvidia.com/gpu.replicas"], "5");
    assert_eq!(got["nvidia.com/gpu.sharing-strategy"], "time-slicing");
    assert_eq!(got["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3");

    let mps = cfg.replace("timeSlicing", "mps");
    let got = labels(H100, &mps, None);
    assert_eq!(got["nvidia.com/gpu.sharing-strategy"], "mps");
    assert_eq!(got["nvidia.com/mps.capable"], "true");
}

const A100_MIG: &str = r#"
driver_version: "550.144.03"
cuda_version: "12.4"
gpus:
  - uuid: GPU-aaaaaaaa-2222-3333-4444-555555555555
    name: NVIDIA A100-SXM4-40GB
    memory_total_mib: 40960
    compute_capability: "8.0"
    mig_enabled: true
    mig_devices:
      - {uuid: MIG-00000000-0000-0000-0000-000000000001, profile: 1g.5gb}
      - {uuid: MIG-00000000-0000-0000-0000-000000000002, profile: 1g.5gb}
  - uuid: GPU-bbbbbbbb-2222-3333-4444-555555555555
    name: NVIDIA A100-SXM4-40GB
    memory_total_mib: 40960
    compute_capability: "8.0"
    mig_enabled: true
    mig_devices:
      - {uuid: MIG-00000000-0000-0000-0000-000000000003, profile: 1g.5gb}
"#;

#[test]
fn mig_single_describes_the_one_profile_and_flags_invalid_layouts() {
    let got = labels(A100_MIG, "", Some(MigStrategy::Single));
    assert_eq!(got["nvidia.com/mig.strategy"], "single");
    assert_eq!(
        got["nvidia.com/gpu.product"],
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    );
    assert_eq!(got["nvidia.com/gpu.count"], "3");
    assert_eq!(got["nvidia.com/gpu.replicas"], "1");
    assert_eq!(got["nvidia.com/gpu.sharing-strategy"], "none");
    assert_eq!(got["nvidia.com/gpu.slices.gi"], "1");
    assert_eq!(got["nvidia.com/gpu.slices.ci"], "1");
    assert_eq!(got["nvidia.com/gpu.family"], "ampere");
    assert!(
        !got.contains_key("nvidia.com/gpu.memory"),
        "no MIG memory known"
    );

    let two_profiles = A100_MIG.replacen(
        "000000000003, profile: 1g.5gb",
        "000000000003, profile: 3g.20gb",
        1,
    );
    let got = labels(&two_profiles, "", Some(MigStrategy::Single));
    assert_eq!(
        got["nvidia.com/gpu.product"],
        "NVIDIA-A100-SXM4-40GB-MIG-INVALID"
    );
    assert_eq!(got["nvidia.com/gpu.count"], "0");
    assert_eq!(got["nvidia.com/gpu.replicas"], "0");
    assert_eq!(got["nvidia.com/gpu.sharing-strategy"], "");
    assert_eq!(got["nvidia.com/gpu.memory"], "0");
}

#[test]
fn mig_mixed_labels_each_profile_and_the_full_gpus() {
    let mixed = A100_MIG
        .replacen(
            "000000000003, profile: 1g.5gb",
            "000000000003, profile: 3g.20gb",
            1,
        )
        .replace(
            "  - uuid: GPU-bbbbbbbb",
            "  - uuid: GPU-cccccccc-2222-3333-4444-555555555555\n    name: Tesla T4\n    memory_total_mib: 15360\n    compute_capability: \"7.5\"\n  - uuid: GPU-bbbbbbbb",
        );
    let got = labels(&mixed, "version: v1\nflags:\n  migStrategy: mixed\n", None);
    let mig: Labels = got
        .iter()
        .filter(|(k, _)| {
            k.starts_with("nvidia.com/mig-")
                || k.starts_with("nvidia.com/gpu.")
                || *k == "nvidia.com/mig.strategy"
        })
        .filter(|(k, _)| !k.ends_with(".machine") && !k.ends_with(".mode"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let want = expect(&[
        ("gpu.compute.major", "7"),
        ("gpu.compute.minor", "5"),
        ("gpu.count", "1"),
        ("gpu.family", "turing"),
        ("gpu.memory", "15360"),
        ("gpu.product", "Tesla-T4"),
        ("gpu.replicas", "1"),
        ("gpu.sharing-strategy", "none"),
        ("mig-1g.5gb.count", "2"),
        ("mig-1g.5gb.product", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"),
        ("mig-1g.5gb.replicas", "1"),
        ("mig-1g.5gb.sharing-strategy", "none"),
        ("mig-1g.5gb.slices.ci", "1"),
        ("mig-1g.5gb.slices.gi", "1"),
        ("mig-3g.20gb.count", "1"),
        ("mig-3g.20gb.product", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"),
        ("mig-3g.20gb.replicas", "1"),
        ("mig-3g.20gb.sharing-strategy", "none"),
        ("mig-3g.20gb.slices.ci", "3"),
        ("mig-3g.20gb.slices.gi", "3"),
        ("mig.strategy", "mixed"),
    ]);
    pretty_assertions::assert_eq!(mig, want);
}

#[test]
fn node_patch_sets_changed_labels_and_removes_only_labels_gfd_wrote_before() {
    let node: Node = serde_json::from_value(json!({
        "metadata": {
            "name": "gpu-1",
            "labels": {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/mig.strategy": "single",
                "nvidia.com/gpu.count": "1"
            },
            "annotations": {
                OWNED_LABELS_ANNOTATION: "nvidia.com/gpu.count,nvidia.com/gpu.product,nvidia.com/mig.strategy"
            }
        }
    }))
    .unwrap();
    let new = expect(&[("gpu.count", "2"), ("gpu.product", "NVIDIA-H100-80GB-HBM3")]);
    assert_eq!(
        make_node_patch(&node, &new).unwrap(),
        json!({"metadata": {
            "labels": {"nvidia.com/gpu.count": "2", "nvidia.com/mig.strategy": null},
            "annotations": {OWNED_LABELS_ANNOTATION: "nvidia.com/gpu.count,nvidia.com/gpu.product"}
        }})
    );
    let mut applied = node.clone();
    let l = applied.metadata.labels.as_mut().unwrap();
    l.insert("nvidia.com/gpu.count".into(), "2".into());
    l.remove("nvidia.com/mig.strategy");
    applied.metadata.annotations.as_mut().unwrap().insert(
        OWNED_LABELS_ANNOTATION.into(),
        "nvidia.com/gpu.count,nvidia.com/gpu.product".into(),
    );
    assert_eq!(
        make_node_patch(&applied, &new),
        None,
        "nothing left to change"
    );
}
