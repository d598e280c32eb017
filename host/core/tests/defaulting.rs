//! Defaulting a ClusterPolicy offline gives what the API server stores with NVIDIA's CRD: for
//! every variant of the NVIDIA GPU Operator v26.7.0 fidelity data, `default_spec` of the policy
//! as written equals the `defaultedPolicy` NVIDIA's API server returned (`tests/data/defaulting/`:
//! `<variant>.yaml` as written, `<variant>.defaulted.json` as stored).

use kiln_core::spec::ClusterPolicySpec;
use kiln_core::spec::schema::default_spec;
use serde_json::Value;

const VARIANTS: [&str; 12] = [
    "i-cdi-disabled",
    "ii-b-crio-cdi-disabled",
    "ii-crio",
    "iii-timeslicing",
    "iv-mig-mixed",
    "ix-nvidia-images",
    "sample",
    "v-b-dcgm-disabled",
    "v-dcgm-enabled",
    "vi-gds-gdrcopy",
    "vii-rdma",
    "viii-k3s",
];

fn data(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/defaulting")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_variant_defaults_to_the_stored_policy() {
    for variant in VARIANTS {
        let written: Value = serde_yaml_ng::from_str(&data(&format!("{variant}.yaml"))).unwrap();
        let stored: Value =
            serde_json::from_str(&data(&format!("{variant}.defaulted.json"))).unwrap();
        let mut spec = written["spec"].clone();
        let pruned = default_spec(&mut spec);
        assert_eq!(pruned, Vec::<String>::new(), "{variant}: pruned");
        assert_eq!(spec, stored["spec"], "{variant}");
        // Idempotent: the stored policy is a fixed point (the operator reads stored objects).
        let mut again = stored["spec"].clone();
        default_spec(&mut again);
        assert_eq!(again, stored["spec"], "{variant}: stored");
        // And the typed spec reads it.
        ClusterPolicySpec::from_json(&spec).unwrap_or_else(|e| panic!("{variant}: {e}"));
    }
}

#[test]
fn upgrade_policy_is_typed_and_validated() {
    let parse = |v: Value| {
        ClusterPolicySpec::from_json(&serde_json::json!({"driver": {"upgradePolicy": v}}))
    };
    let err = parse(serde_json::json!({"maxParallelUpgrades": "many"})).unwrap_err();
    assert_eq!(err.path, "spec.driver.upgradePolicy.maxParallelUpgrades");
    assert!(parse(serde_json::json!({"maxParallelUpgrades": -1})).is_err());
    assert!(parse(serde_json::json!({"drain": {"timeoutSeconds": "5m"}})).is_err());
    let spec = parse(serde_json::json!({"maxUnavailable": 2, "drain": {"enable": true}})).unwrap();
    let up = spec.driver.upgrade_policy.unwrap();
    assert!(!up.auto_upgrade);
    assert_eq!(up.max_parallel_upgrades, 1);
    assert_eq!(
        up.max_unavailable,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2)
    );
    let drain = up.drain.unwrap();
    assert!(drain.enable && !drain.force);
    assert_eq!(drain.timeout_seconds, 300);
    assert!(up.pod_deletion.is_none() && up.wait_for_completion.is_none());
}
