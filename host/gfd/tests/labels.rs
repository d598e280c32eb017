//! GFD labels from fake GPUs and device-plugin configs: exact values for an H100 node, a
//! time-sliced node, MIG single/mixed, the NodeFeature object and the features.d file.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kiln_device_plugin::config::{Config, MigStrategy};
use kiln_gfd::{
    GpuMode, LabelInput, Labels, make_labels, node_feature, node_feature_differs, owners_of,
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
        ("vgpu.present", "false"),
    ]);
    pretty_assertions::assert_eq!(got, want);
}

#[test]
fn vgpu_guest_and_nvlink_clique_labels_are_written_and_validated() {
    let guest = H100.replace(
        "    mig_enabled: false\n",
        "    mig_enabled: false\n    vgpu: {host_driver_version: 550.54.16, host_driver_branch: r550_00}\n    clique: {cluster_uuid: 7c5e2b6a-1f0d-4c6e-9a51-0c3b2f1e8d4a, clique_id: 32766}\n",
    );
    let got = labels(&guest, "", None);
    assert_eq!(got["nvidia.com/vgpu.present"], "true");
    assert_eq!(got["nvidia.com/vgpu.host-driver-version"], "550.54.16");
    assert_eq!(got["nvidia.com/vgpu.host-driver-branch"], "r550_00");
    assert_eq!(
        got["nvidia.com/gpu.clique"],
        "7c5e2b6a-1f0d-4c6e-9a51-0c3b2f1e8d4a.32766"
    );
    // GPUs in two cliques: no clique label (upstream warns and leaves it out).
    let split = guest.replacen("clique_id: 32766", "clique_id: 1", 1);
    assert!(!labels(&split, "", None).contains_key("nvidia.com/gpu.clique"));
    // A vGPU whose host driver is unknown (NVML's mode only): present, no version labels.
    let bare = H100.replacen(
        "    mig_enabled: false\n",
        "    mig_enabled: false\n    vgpu: {}\n",
        1,
    );
    let got = labels(&bare, "", None);
    assert_eq!(got["nvidia.com/vgpu.present"], "true");
    assert!(!got.contains_key("nvidia.com/vgpu.host-driver-version"));
    // Values outside the label syntax are sanitised like every other label's.
    let hostile = guest.replace("r550_00", "r550 00!");
    assert_eq!(
        labels(&hostile, "", None)["nvidia.com/vgpu.host-driver-branch"],
        "r550-00"
    );
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
      - {uuid: MIG-00000000-0000-0000-0000-000000000001, profile: 1g.5gb,
         attributes: {multiprocessors: 14, copy_engines: 1, decoders: 0, encoders: 0, jpeg_engines: 0, ofa_engines: 0}}
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
    assert_eq!(got["nvidia.com/gpu.multiprocessors"], "14");
    assert_eq!(got["nvidia.com/gpu.engines.copy"], "1");
    assert_eq!(got["nvidia.com/gpu.engines.ofa"], "0");
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
        ("mig-1g.5gb.engines.copy", "1"),
        ("mig-1g.5gb.engines.decoder", "0"),
        ("mig-1g.5gb.engines.encoder", "0"),
        ("mig-1g.5gb.engines.jpeg", "0"),
        ("mig-1g.5gb.engines.ofa", "0"),
        ("mig-1g.5gb.multiprocessors", "14"),
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
fn node_feature_is_nvidias_object_owned_by_the_daemonset_and_pod() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "gpu-feature-discovery-abcde",
            "namespace": "gpu-operator",
            "uid": "pod-uid",
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpu-feature-discovery",
                "uid": "ds-uid", "controller": true, "blockOwnerDeletion": true
            }]
        }
    }))
    .unwrap();
    let owners = owners_of(&pod);
    let labels = expect(&[("gpu.count", "2"), ("gpu.product", "NVIDIA-H100-80GB-HBM3")]);
    let nf = node_feature("gpu-1", "gpu-operator", &labels, &owners);
    assert_eq!(
        nf,
        json!({
            "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
            "kind": "NodeFeature",
            "metadata": {
                "name": "nvidia-features-for-gpu-1",
                "namespace": "gpu-operator",
                "labels": {"nfd.node.kubernetes.io/node-name": "gpu-1"},
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpu-feature-discovery",
                     "uid": "ds-uid", "controller": true},
                    {"apiVersion": "v1", "kind": "Pod", "name": "gpu-feature-discovery-abcde",
                     "uid": "pod-uid"}
                ]
            },
            "spec": {
                "features": {"flags": {}, "attributes": {}, "instances": {}},
                "labels": {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
            }
        })
    );
    // What the API server returns (with its own metadata) is not written again; a label
    // change or a new pod (owner) is.
    let mut live = nf.clone();
    live["metadata"]["resourceVersion"] = json!("7");
    live["metadata"]["labels"]["other"] = json!("x");
    assert!(!node_feature_differs(&live, &nf));
    let relabelled = node_feature(
        "gpu-1",
        "gpu-operator",
        &expect(&[("gpu.count", "1")]),
        &owners,
    );
    assert!(node_feature_differs(&live, &relabelled));
    let mut new_pod = pod.clone();
    new_pod.metadata.uid = Some("pod-uid-2".into());
    let reowned = node_feature("gpu-1", "gpu-operator", &labels, &owners_of(&new_pod));
    assert!(node_feature_differs(&live, &reowned));
    // Without a pod name the object is unowned, and an unowned desired object leaves the
    // live owners alone.
    let unowned = node_feature("gpu-1", "gpu-operator", &labels, &[]);
    assert!(unowned["metadata"].get("ownerReferences").is_none());
    assert!(!node_feature_differs(&live, &unowned));
}

#[test]
fn features_file_is_sorted_key_value_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("features.d/gfd");
    let labels = expect(&[("gpu.product", "NVIDIA-H100-80GB-HBM3"), ("gpu.count", "2")]);
    kiln_gfd::write_features_file(&path, &labels).unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "nvidia.com/gpu.count=2\nnvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3\n"
    );
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o644
    );
    // A regular file is replaced; anything else at the path is refused and left alone
    // (`--output-file /dev/full` once became a regular file).
    kiln_gfd::write_features_file(&path, &labels).unwrap();
    let socket = dir.path().join("gfd.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    for (target, kind) in [
        (socket, "socket"),
        (dir.path().join("features.d"), "directory"),
    ] {
        let e = kiln_gfd::write_features_file(&target, &labels).unwrap_err();
        let text = kiln_gpu::error_chain(&e);
        assert!(
            text.contains(&format!(
                "not a regular file ({kind}); refusing to replace it"
            )),
            "{text}"
        );
        assert!(
            !std::fs::symlink_metadata(&target)
                .unwrap()
                .file_type()
                .is_file()
        );
    }
}
