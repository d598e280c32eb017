//! NVIDIA GPU Operator v26.7.0's Helm values (`deployments/gpu-operator/values.yaml`, a copy in
//! `tests/data/`) work unchanged with kiln's chart (`helm template`, when
//! `testcluster/bin/helm` is built):
//! - the chart's ClusterPolicy, read as kiln reads a stored policy, renders every state it
//!   enables (the validator and node status exporter images get NVIDIA's version, as NVIDIA's
//!   chart tags them with its appVersion; `gpuPodDeletion` becomes `podDeletion`);
//! - `*.config.create` / `*.config.data` create the ConfigMaps NVIDIA's chart creates.

use std::path::Path;
use std::sync::Arc;

use kiln_plugin_host::{HostConfig, PluginHost};
use kiln_render::{Policy, Renderer, defaults};
use serde_json::{Value, json};

use crate::support::repo;

fn data(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .display()
        .to_string()
}

/// `helm template` of `deploy/helm/kiln` with NVIDIA's values and `extra` value files.
fn template(extra: &[&str]) -> Option<Vec<Value>> {
    let files: Vec<String> = std::iter::once("nvidia-v26.7.0-helm-values.yaml")
        .chain(extra.iter().copied())
        .map(data)
        .collect();
    let args: Vec<&str> = files.iter().flat_map(|f| ["-f", f.as_str()]).collect();
    crate::support::helm::template(&args).map(|r| r.unwrap_or_else(|e| panic!("{e}")))
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

#[test]
fn nvidia_values_render_every_enabled_state() {
    let Some(objects) = template(&[]) else {
        return;
    };
    let cp = of_kind(&objects, "ClusterPolicy");
    assert_eq!(cp.len(), 1);
    let policy = Policy::from_object(cp[0]).unwrap();
    assert_eq!(policy.pruned, Vec::<String>::new(), "fields the CRD prunes");
    let spec = &policy.spec_json;
    assert_eq!(spec["validator"]["version"], "v26.7.0");
    assert_eq!(spec["validator"]["image"], "gpu-operator");
    assert_eq!(spec["nodeStatusExporter"]["version"], "v26.7.0");
    assert_eq!(
        spec["driver"]["upgradePolicy"]["podDeletion"],
        json!({"force": false, "timeoutSeconds": 300, "deleteEmptyDir": false})
    );
    assert_eq!(
        policy
            .spec
            .driver
            .upgrade_policy
            .as_ref()
            .map(|u| u.auto_upgrade),
        Some(true)
    );

    let host = PluginHost::new(
        HostConfig {
            cache_dir: Some(repo().join("target/kiln-test-plugin-cache")),
            ..HostConfig::in_memory()
        },
        kiln_bundled_plugins::BUNDLED,
    )
    .unwrap();
    let rendered = Renderer::new(Arc::new(host)).render(&policy, &defaults::render_context());
    let failed: Vec<String> = rendered
        .iter()
        .filter_map(|(s, r)| r.as_ref().err().map(|e| format!("{s}: {e}")))
        .collect();
    assert_eq!(failed, Vec::<String>::new());
    let states: Vec<&str> = rendered.iter().map(|(s, _)| s.name()).collect();
    assert_eq!(
        states,
        [
            "pre-requisites",
            "operator-metrics",
            "driver",
            "container-toolkit",
            "operator-validation",
            "device-plugin",
            "mps-control-daemon",
            "dcgm-exporter",
            "gpu-feature-discovery",
            "mig-manager",
        ]
    );
    // NVIDIA's validator image, tagged as NVIDIA's chart tags it.
    let validator = rendered
        .iter()
        .find(|(s, _)| s.name() == "operator-validation")
        .and_then(|(_, r)| r.as_ref().ok())
        .unwrap();
    let ds = validator
        .objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .unwrap();
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["image"],
        "nvcr.io/nvidia/gpu-operator:v26.7.0"
    );
    // With `create: false` (NVIDIA's defaults) the chart creates no ConfigMap.
    assert!(of_kind(&objects, "ConfigMap").is_empty());
}

#[test]
fn config_create_and_data_create_nvidias_config_maps() {
    let Some(objects) = template(&["helm-config-maps-values.yaml"]) else {
        return;
    };
    let maps: Vec<(&str, Vec<&str>)> = of_kind(&objects, "ConfigMap")
        .into_iter()
        .map(|m| {
            assert_eq!(m["metadata"]["namespace"], "gpu-operator");
            let keys = m["data"]
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            (m["metadata"]["name"].as_str().unwrap(), keys)
        })
        .collect();
    assert_eq!(
        maps,
        [
            ("device-plugin-config", vec!["any"]),
            ("custom-mig-parted-configs", vec!["config.yaml"]),
            ("custom-dcgm-exporter-metrics", vec!["dcgm-metrics.csv"]),
        ]
    );
    let cm = |name: &str| {
        of_kind(&objects, "ConfigMap")
            .into_iter()
            .find(|m| m["metadata"]["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(
        cm("custom-dcgm-exporter-metrics")["data"]["dcgm-metrics.csv"],
        "# Clocks\nDCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).\n"
    );
    assert!(
        cm("custom-mig-parted-configs")["data"]["config.yaml"]
            .as_str()
            .unwrap()
            .starts_with("version: v1\nmig-configs:\n")
    );
    // The ClusterPolicy points at the same ConfigMaps, without the chart-only keys.
    let cp = of_kind(&objects, "ClusterPolicy")[0];
    assert_eq!(
        cp["spec"]["devicePlugin"]["config"],
        json!({"name": "device-plugin-config", "default": "any"})
    );
    assert_eq!(
        cp["spec"]["migManager"]["config"],
        json!({"name": "custom-mig-parted-configs", "default": "all-disabled"})
    );
    assert_eq!(
        cp["spec"]["dcgmExporter"]["config"],
        json!({"name": "custom-dcgm-exporter-metrics"})
    );
}
