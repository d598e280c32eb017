//! The chart's NetworkPolicies (`deploy/helm/kiln/templates/networkpolicy.yaml`): the
//! operator's and the GPU exporter's `metrics` ports admit only the Prometheus peer, the
//! `networkPolicy.additionalFrom` peers and the `networkPolicy.nodeCIDRs` blocks; they select
//! the pods the chart's Deployment and the exporter's DaemonSet (`assets/`) label, on the port
//! those containers name. `helm template`, when `testcluster/bin/helm` is built.

use serde_json::{Value, json};

use super::{helm_template, repo};

fn policies(objects: &[Value]) -> Vec<&Value> {
    objects
        .iter()
        .filter(|o| o["kind"] == "NetworkPolicy")
        .collect()
}

fn policy<'a>(objects: &'a [Value], name: &str) -> &'a Value {
    policies(objects)
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no NetworkPolicy {name}"))
}

/// Labels of the pod template and the container port named `metrics` of a workload.
fn pods_and_port(workload: &Value) -> (&Value, &Value) {
    let template = &workload["spec"]["template"];
    let port = template["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .find(|p| p["name"] == "metrics")
        .unwrap_or_else(|| panic!("no port `metrics`: {workload}"));
    (&template["metadata"]["labels"], port)
}

/// `selector` (matchLabels) selects pods labelled `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector["matchLabels"]
        .as_object()
        .unwrap()
        .iter()
        .all(|(k, v)| &labels[k] == v)
}

#[test]
fn the_metrics_ports_admit_prometheus_only_by_default() {
    let Some(objects) = helm_template(&[]) else {
        return;
    };
    assert_eq!(policies(&objects).len(), 2);
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "kiln-operator")
        .unwrap();
    let exporter_text =
        std::fs::read_to_string(repo().join("assets/state-dcgm-exporter/0500_daemonset.yaml"))
            .unwrap();
    let exporter: Value = serde_yaml_ng::from_str(&exporter_text).unwrap();
    for (name, workload, port) in [
        ("kiln-operator", deployment, 8080),
        ("nvidia-dcgm-exporter", &exporter, 9400),
    ] {
        let np = policy(&objects, name);
        assert_eq!(np["metadata"]["namespace"], "gpu-operator");
        let (labels, container_port) = pods_and_port(workload);
        assert_eq!(container_port["containerPort"], port, "{name}");
        assert!(selects(&np["spec"]["podSelector"], labels), "{name}: {np}");
        assert_eq!(np["spec"]["policyTypes"], json!(["Ingress"]));
        assert_eq!(
            np["spec"]["ingress"],
            json!([{
                "ports": [{"port": "metrics", "protocol": "TCP"}],
                "from": [{
                    "namespaceSelector": {},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
                }],
            }]),
            "{name}"
        );
    }
}

/// Helm merges a map value into the default, so the default pod label is dropped with `null`.
#[test]
fn peers_namespaces_and_node_cidrs_are_values() {
    let Some(objects) = helm_template(&[
        "--set-json",
        r#"networkPolicy.prometheus={"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}},"podSelector":{"matchLabels":{"app":"prometheus","app.kubernetes.io/name":null}}}"#,
        "--set-json",
        r#"networkPolicy.additionalFrom=[{"namespaceSelector":{"matchLabels":{"team":"obs"}}}]"#,
        "--set-json",
        r#"networkPolicy.nodeCIDRs=["10.0.0.0/16","fd00::/64"]"#,
    ]) else {
        return;
    };
    let want = json!([
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
         "podSelector": {"matchLabels": {"app": "prometheus"}}},
        {"namespaceSelector": {"matchLabels": {"team": "obs"}}},
        {"ipBlock": {"cidr": "10.0.0.0/16"}},
        {"ipBlock": {"cidr": "fd00::/64"}},
    ]);
    for name in ["kiln-operator", "nvidia-dcgm-exporter"] {
        assert_eq!(
            policy(&objects, name)["spec"]["ingress"][0]["from"],
            want,
            "{name}"
        );
    }
}

#[test]
fn no_peer_admits_nothing_and_the_policies_can_be_turned_off() {
    let Some(objects) = helm_template(&["--set-json", "networkPolicy.prometheus=null"]) else {
        return;
    };
    // An empty `from` would admit every source: no peer renders no ingress rule at all.
    for name in ["kiln-operator", "nvidia-dcgm-exporter"] {
        assert_eq!(
            policy(&objects, name)["spec"]["ingress"],
            json!([]),
            "{name}"
        );
    }
    let Some(objects) = helm_template(&["--set", "networkPolicy.enabled=false"]) else {
        return;
    };
    assert!(policies(&objects).is_empty());
}
