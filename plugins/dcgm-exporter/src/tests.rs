use super::*;
use kiln_plugin_std::apply_native;
use kiln_plugin_std::kiln_core::spec::EnvVarSpec;
use serde_json::{Value, json};

#[test]
fn cases() {
    kiln_plugin_std::testing::assert_cases::<DcgmExporter>(env!("CARGO_MANIFEST_DIR"), 30);
}

fn exporter_spec(env: &[(&str, &str)]) -> DcgmExporterSpec {
    let mut e = DcgmExporterSpec::default();
    e.common.env = env
        .iter()
        .map(|(n, v)| EnvVarSpec {
            name: n.to_string(),
            value: v.to_string(),
        })
        .collect();
    e
}

#[test]
fn api_access_rule() {
    assert!(!needs_api_access(&exporter_spec(&[]), true));
    assert!(needs_api_access(
        &exporter_spec(&[(POD_LABELS_ENV, "TRUE")]),
        false
    ));
    assert!(!needs_api_access(
        &exporter_spec(&[(POD_UID_ENV, "yes")]),
        true
    ));
    let cm = exporter_spec(&[(CONFIGMAP_DATA_ENV, "ns:cm")]);
    assert!(needs_api_access(&cm, true));
    assert!(!needs_api_access(&cm, false));
    assert!(!needs_api_access(
        &exporter_spec(&[(CONFIGMAP_DATA_ENV, "none")]),
        true
    ));
    assert!(!needs_api_access(
        &exporter_spec(&[(CONFIGMAP_DATA_ENV, "")]),
        true
    ));
    let flag = DcgmExporterSpec {
        enable_pod_uid: Some(true),
        ..Default::default()
    };
    assert!(needs_api_access(&flag, false));
}

/// The state's real assets with a default-ish policy: the DaemonSet keeps its token off and
/// gets the host-engine env; the gated RBAC and the ServiceMonitor are left out.
#[test]
fn real_assets_default_policy() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/state-dcgm-exporter");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.to_string_lossy().contains("openshift"))
        .collect();
    files.sort();
    let objects: Vec<Value> = files
        .iter()
        .map(|f| serde_yaml_ng::from_str(&std::fs::read_to_string(f).unwrap()).unwrap())
        .collect();
    let kiln = "ghcr.io/kiln-dev/kiln:0.1.0";
    let spec = json!({"dcgmExporter": {"image": kiln}, "validator": {"image": kiln}});
    let ctx = TransformContext {
        has_service_monitor_crd: true,
        ..Default::default()
    };
    let out = apply_native::<DcgmExporter>(&objects, &spec, &ctx).unwrap();
    let kept: Vec<String> = out
        .iter()
        .flatten()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        !kept
            .iter()
            .any(|k| k.contains("read-pods") || k.starts_with("ServiceMonitor")),
        "{kept:?}"
    );
    let ds = out
        .iter()
        .flatten()
        .find(|o| o["kind"] == "DaemonSet")
        .unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["runtimeClassName"], "nvidia");
    let ctr = &pod["containers"][0];
    assert_eq!(ctr["command"], json!(["kiln", "exporter"]));
    let env = ctr["env"].as_array().unwrap();
    assert!(
        env.contains(&json!({"name": REMOTE_HOSTENGINE_ENV, "value": REMOTE_HOSTENGINE})),
        "{env:?}"
    );
    // kiln's exporter reads its Hostname label from KILN_EXPORTER_NODE_NAME (NVIDIA's asset
    // has NODE_NAME only).
    assert!(
        env.iter().any(|e| e["name"] == "KILN_EXPORTER_NODE_NAME"),
        "{env:?}"
    );
}
