//! deploy/: RBAC without wildcards, the Helm chart's copies in sync, and the chart's
//! ClusterPolicy accepted by kiln (`helm template`, when `testcluster/bin/helm` is built).

use std::path::PathBuf;
use std::process::Command;

use serde::Deserialize as _;
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn docs(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .filter_map(|d| Option::<Value>::deserialize(d).unwrap())
        .collect()
}

fn rules(docs: &[Value]) -> Value {
    docs.iter()
        .find(|d| d["kind"] == "ClusterRole")
        .map(|d| d["rules"].clone())
        .unwrap()
}

#[test]
fn rbac_has_no_wildcards_and_the_chart_matches() {
    let rbac = docs(&read("deploy/rbac/kiln-operator.yaml"));
    let r = rules(&rbac);
    let rule_list = r.as_array().unwrap();
    assert!(rule_list.len() >= 10);
    for rule in rule_list {
        for key in ["verbs", "resources", "apiGroups"] {
            let items = rule[key].as_array().unwrap();
            assert!(!items.iter().any(|v| v == "*"), "wildcard in {key}: {rule}");
        }
    }
    let chart_rules: Value =
        serde_yaml_ng::from_str(&read("deploy/helm/kiln/files/rules.yaml")).unwrap();
    assert_eq!(
        chart_rules, r,
        "deploy/helm/kiln/files/rules.yaml differs from deploy/rbac"
    );
    assert_eq!(
        read("deploy/helm/kiln/crds/clusterpolicies.nvidia.com.yaml"),
        kiln_operator::crd::crd_yaml(),
        "the chart's CRD copy drifted; copy deploy/crds/clusterpolicies.nvidia.com.yaml"
    );
}

#[test]
fn helm_template_renders_a_valid_policy() {
    let helm = repo().join("testcluster/bin/helm");
    if !helm.exists() {
        eprintln!("testcluster/bin/helm not built; skipping");
        return;
    }
    let out = Command::new(&helm)
        .args([
            "template",
            "kiln",
            "deploy/helm/kiln",
            "--namespace",
            "gpu-operator",
        ])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let objects = docs(&String::from_utf8(out.stdout).unwrap());
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "ClusterPolicy"
        ]
    );
    let cp = objects
        .iter()
        .find(|o| o["kind"] == "ClusterPolicy")
        .unwrap();
    let policy = kiln_render::Policy::from_object(cp).unwrap();
    assert_eq!(policy.name, "cluster-policy");
    assert_eq!(
        policy.spec.mig.strategy.map(|s| format!("{s:?}")),
        Some("Single".into())
    );
    assert_eq!(policy.spec.dcgm.common.enabled, Some(false));
    assert_eq!(
        rules(&objects),
        rules(&docs(&read("deploy/rbac/kiln-operator.yaml")))
    );
    let dep = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(
        dep.pointer("/spec/template/spec/containers/0/args")
            .unwrap(),
        &serde_json::json!(["operator", "--leader-elect"])
    );
}
