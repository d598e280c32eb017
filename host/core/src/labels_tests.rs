//! Node label rules: the N4 cases of upstream `updateGPUStateLabels` plus §2.3 detection.

use super::*;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

fn deploy(c: &str) -> String {
    format!("{DEPLOY_PREFIX}{c}")
}

/// Labels after applying the deploy step, as N4 states its expected results.
fn after_deploy(initial: &Labels, policy: &LabelPolicy) -> Labels {
    apply_patch(initial, &plan_deploy_labels(initial, policy))
}

fn with_container_labels(mut l: Labels) -> Labels {
    for c in CONTAINER_COMPONENTS {
        l.insert(deploy(c), "true".into());
    }
    l
}

fn sandbox(mode: SandboxMode) -> LabelPolicy {
    LabelPolicy {
        sandbox: true,
        mode,
        ..LabelPolicy::default()
    }
}

#[test]
fn n4_empty_node_stays_empty() {
    let l = Labels::new();
    assert!(plan_deploy_labels(&l, &LabelPolicy::default()).is_empty());
    assert!(plan_node_labels(&l, &LabelPolicy::default()).is_empty());
}

#[test]
fn n4_node_without_gpu_present_loses_deploy_labels_only() {
    let l = labels(&[
        ("nvidia.com/gpu.deploy.driver", "true"),
        ("nvidia.com/gpu.deploy.device-plugin", "true"),
        ("foo", "bar"),
    ]);
    assert_eq!(
        after_deploy(&l, &LabelPolicy::default()),
        labels(&[("foo", "bar")])
    );
}

#[test]
fn n4_gpu_present_gets_every_container_label() {
    let l = labels(&[(GPU_PRESENT, "true")]);
    let patch = plan_deploy_labels(&l, &LabelPolicy::default());
    assert_eq!(patch.len(), 9);
    assert_eq!(
        after_deploy(&l, &LabelPolicy::default()),
        with_container_labels(l.clone())
    );
    assert_eq!(
        patch.get("nvidia.com/gpu.deploy.client"),
        Some(&Some("true".to_string()))
    );
}

#[test]
fn n4_empty_values_are_filled_and_paused_driver_is_kept() {
    let l = labels(&[
        (GPU_PRESENT, "true"),
        ("nvidia.com/gpu.deploy.operator-validator", ""),
        ("nvidia.com/gpu.deploy.container-toolkit", ""),
        ("nvidia.com/gpu.deploy.device-plugin", ""),
        ("nvidia.com/gpu.deploy.gpu-feature-discovery", ""),
        ("nvidia.com/gpu.deploy.driver", "paused-for-driver-upgrade"),
    ]);
    let mut want = with_container_labels(labels(&[(GPU_PRESENT, "true")]));
    want.insert(deploy("driver"), "paused-for-driver-upgrade".into());
    assert_eq!(after_deploy(&l, &LabelPolicy::default()), want);
}

#[test]
fn n4_operands_false_removes_every_deploy_label() {
    let l = with_container_labels(labels(&[(GPU_PRESENT, "true"), (DEPLOY_OPERANDS, "false")]));
    assert_eq!(
        after_deploy(&l, &LabelPolicy::default()),
        labels(&[(GPU_PRESENT, "true"), (DEPLOY_OPERANDS, "false")])
    );
}

#[test]
fn n4_per_operand_false_is_kept() {
    let mut l = with_container_labels(labels(&[(GPU_PRESENT, "true")]));
    l.insert(deploy("dcgm-exporter"), "false".into());
    assert!(plan_deploy_labels(&l, &LabelPolicy::default()).is_empty());
}

#[test]
fn n4_kubevirt_vm_passthrough_swaps_the_sets() {
    let l = with_container_labels(labels(&[
        (GPU_PRESENT, "true"),
        (WORKLOAD_CONFIG, "vm-passthrough"),
    ]));
    let mut want = labels(&[(GPU_PRESENT, "true"), (WORKLOAD_CONFIG, "vm-passthrough")]);
    for c in [
        "sandbox-device-plugin",
        "sandbox-validator",
        "vfio-manager",
        "kata-manager",
        "cc-manager",
        "client",
    ] {
        want.insert(deploy(c), "true".into());
    }
    assert_eq!(after_deploy(&l, &sandbox(SandboxMode::Kubevirt)), want);
}

#[test]
fn n4_kata_vm_passthrough_uses_the_kata_device_plugin() {
    let l = with_container_labels(labels(&[
        (GPU_PRESENT, "true"),
        (WORKLOAD_CONFIG, "vm-passthrough"),
    ]));
    let got = after_deploy(&l, &sandbox(SandboxMode::Kata));
    assert_eq!(
        got.get(&deploy("kata-sandbox-device-plugin"))
            .map(String::as_str),
        Some("true")
    );
    assert!(!got.contains_key(&deploy("sandbox-device-plugin")));
    assert!(!got.contains_key(&deploy("driver")));
    assert_eq!(got.len(), 2 + 6);
}

#[test]
fn vm_vgpu_set_and_invalid_workload_falls_back_to_default() {
    let l = labels(&[(GPU_PRESENT, "true"), (WORKLOAD_CONFIG, "vm-vgpu")]);
    let got = after_deploy(&l, &sandbox(SandboxMode::Kubevirt));
    for c in VM_VGPU_COMPONENTS {
        assert_eq!(got.get(&deploy(c)).map(String::as_str), Some("true"), "{c}");
    }
    let bogus = labels(&[(GPU_PRESENT, "true"), (WORKLOAD_CONFIG, "bogus")]);
    let policy = LabelPolicy {
        default_workload: Workload::VmVgpu,
        ..sandbox(SandboxMode::Kubevirt)
    };
    assert_eq!(workload_config(&bogus, &policy), Workload::VmVgpu);
    // Sandbox off: every node is `container`, whatever its label says.
    assert_eq!(
        workload_config(&l, &LabelPolicy::default()),
        Workload::Container
    );
}

fn mig_policy() -> LabelPolicy {
    LabelPolicy {
        mig_manager: true,
        mig_default_config: "all-disabled".into(),
        ..LabelPolicy::default()
    }
}

#[test]
fn n4_mig_capable_node_gets_mig_manager_and_default_config() {
    let l = labels(&[(GPU_PRESENT, "true"), (MIG_CAPABLE, "true")]);
    let mut want = with_container_labels(l.clone());
    want.insert(deploy("mig-manager"), "true".into());
    want.insert(MIG_CONFIG.into(), "all-disabled".into());
    assert_eq!(after_deploy(&l, &mig_policy()), want);
}

#[test]
fn n4_existing_mig_config_is_kept() {
    let l = labels(&[
        (GPU_PRESENT, "true"),
        (MIG_CAPABLE, "true"),
        (MIG_CONFIG, "all-1g.10gb"),
    ]);
    let got = after_deploy(&l, &mig_policy());
    assert_eq!(got.get(MIG_CONFIG).map(String::as_str), Some("all-1g.10gb"));
    assert_eq!(
        got.get(&deploy("mig-manager")).map(String::as_str),
        Some("true")
    );
}

#[test]
fn mig_default_needs_the_policy_default_and_an_enabled_manager() {
    let l = labels(&[(GPU_PRESENT, "true"), (MIG_CAPABLE, "true")]);
    // nil migManager.config reads as "" upstream: no mig.config label.
    assert!(!after_deploy(&l, &LabelPolicy::default()).contains_key(MIG_CONFIG));
    let off = LabelPolicy {
        mig_manager: false,
        ..mig_policy()
    };
    assert!(!after_deploy(&l, &off).contains_key(MIG_CONFIG));
}

#[test]
fn mig_capability_rules() {
    assert!(is_mig_capable(&labels(&[(
        GPU_PRODUCT,
        "NVIDIA-A100-SXM4-40GB"
    )])));
    assert!(is_mig_capable(&labels(&[(
        GPU_PRODUCT,
        "NVIDIA-H100-80GB-HBM3"
    )])));
    assert!(!is_mig_capable(&labels(&[(GPU_PRODUCT, "Tesla-T4")])));
    // The explicit label wins over the product name.
    assert!(!is_mig_capable(&labels(&[
        (GPU_PRODUCT, "NVIDIA-A100"),
        (MIG_CAPABLE, "false")
    ])));
    // vGPU hosts are never MIG capable.
    assert!(!is_mig_capable(&labels(&[
        (MIG_CAPABLE, "true"),
        (VGPU_HOST_DRIVER_VERSION, "550.54")
    ])));
}

#[test]
fn gpu_detection_uses_any_of_the_three_pci_labels() {
    for key in NFD_GPU_LABELS {
        assert!(has_gpu_pci_labels(&labels(&[(key, "true")])), "{key}");
        assert!(!has_gpu_pci_labels(&labels(&[(key, "false")])), "{key}");
    }
    assert!(has_nfd_labels(&labels(&[(
        "feature.node.kubernetes.io/cpu-model.vendor_id",
        "Intel"
    )])));
    assert!(!has_nfd_labels(&labels(&[("kubernetes.io/os", "linux")])));
}

#[test]
fn new_gpu_node_is_labelled_in_one_patch_then_steady() {
    let l = labels(&[(NFD_GPU_LABELS[0], "true")]);
    let patch = plan_node_labels(&l, &LabelPolicy::default());
    assert_eq!(patch.get(GPU_PRESENT), Some(&Some("true".to_string())));
    assert_eq!(patch.len(), 1 + 9);
    let labelled = apply_patch(&l, &patch);
    assert!(plan_node_labels(&labelled, &LabelPolicy::default()).is_empty());
}

#[test]
fn node_that_loses_its_gpu_loses_the_labels() {
    let l = with_container_labels(labels(&[(GPU_PRESENT, "true"), ("foo", "bar")]));
    let patch = plan_node_labels(&l, &LabelPolicy::default());
    assert_eq!(patch.get(GPU_PRESENT), Some(&Some("false".to_string())));
    assert_eq!(
        apply_patch(&l, &patch),
        labels(&[(GPU_PRESENT, "false"), ("foo", "bar")])
    );
}

#[test]
fn cpu_node_gets_no_patch() {
    let l = labels(&[("kubernetes.io/os", "linux"), (NFD_PREFIX, "x")]);
    assert!(plan_node_labels(&l, &mig_policy()).is_empty());
}

#[test]
fn policy_defaults_from_spec() {
    let spec = ClusterPolicySpec::from_json(&serde_json::json!({
        "sandboxWorkloads": {"enabled": true, "mode": "kata", "defaultWorkload": "vm-passthrough"},
        "migManager": {"config": {"default": "all-disabled"}}
    }))
    .unwrap();
    assert_eq!(
        LabelPolicy::from_spec(&spec),
        LabelPolicy {
            sandbox: true,
            default_workload: Workload::VmPassthrough,
            mode: SandboxMode::Kata,
            mig_manager: true,
            mig_default_config: "all-disabled".into(),
        }
    );
}
