//! The chart's monitoring and operability wiring, by `helm template` of `deploy/helm/kiln` with
//! its own defaults (skipped when `testcluster/bin/helm` is not built):
//! - the operator-metrics Service `gpu-operator` (rendered by the operator from
//!   `assets/state-operator-metrics`) selects the operator pods of the chart's Deployment and of
//!   `deploy/operator/deployment.yaml`, and the ServiceMonitor selects that Service;
//! - the PrometheusRule `kiln-operator` is rendered only where its kind is served, with the
//!   allocatable-below-hardware alert held for 10 minutes;
//! - site plugins mount at `/etc/kiln/plugins` from a ConfigMap or any volume;
//! - the default exporter is kiln's (kiln's image running `kiln exporter`);
//! - `psa.enabled` reaches the ClusterPolicy, and the operator may label its own namespace.

use std::collections::BTreeMap;
use std::sync::Arc;

use kiln_core::State;
use kiln_plugin_host::{HostConfig, PluginHost};
use kiln_render::{Policy, Renderer, defaults};
use serde_json::Value;

use crate::support::helm::{docs, template as helm};
use crate::support::repo;

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

/// Whether every `selector` pair is among `labels` (a Service's selector semantics).
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn operator_metrics_asset(kind: &str) -> Value {
    kiln_render::assets::load_state(State::OperatorMetrics, false)
        .unwrap()
        .into_iter()
        .map(|a| a.object)
        .find(|o| o["kind"] == kind)
        .unwrap()
}

#[test]
fn the_operator_metrics_service_selects_the_operator_pods() {
    let Some(objects) = helm(&[]) else { return };
    let objects = objects.unwrap();
    let service = operator_metrics_asset("Service");
    assert_eq!(service["metadata"]["name"], "gpu-operator");
    let selector = string_map(&service["spec"]["selector"]);
    let chart = find(&objects, "Deployment", "kiln-operator").unwrap();
    let plain_text =
        std::fs::read_to_string(repo().join("deploy/operator/deployment.yaml")).unwrap();
    let plain = docs(&plain_text);
    let plain = find(&plain, "Deployment", "kiln-operator").unwrap();
    for (what, d) in [("chart", chart), ("deploy/operator", plain)] {
        let pod = string_map(&d["spec"]["template"]["metadata"]["labels"]);
        assert!(selects(&selector, &pod), "{what}: {selector:?} vs {pod:?}");
        // The Deployment's own selector still matches its pods (and is unchanged).
        let own = string_map(&d["spec"]["selector"]["matchLabels"]);
        assert!(selects(&own, &pod), "{what}");
        assert_eq!(
            own,
            BTreeMap::from([("app.kubernetes.io/name".into(), "kiln-operator".into())])
        );
        // The Service's target port is the operator's metrics port.
        let ports = &d["spec"]["template"]["spec"]["containers"][0]["ports"];
        assert_eq!(
            ports[0]["containerPort"],
            service["spec"]["ports"][0]["targetPort"]
        );
    }
    let monitor = operator_metrics_asset("ServiceMonitor");
    assert!(selects(
        &string_map(&monitor["spec"]["selector"]["matchLabels"]),
        &string_map(&service["metadata"]["labels"])
    ));
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
}

#[test]
fn the_prometheus_rule_is_rendered_where_its_kind_is_served() {
    let served = ["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"];
    let Some(without) = helm(&[]) else { return };
    assert!(find(&without.unwrap(), "PrometheusRule", "kiln-operator").is_none());
    let with = helm(&served).unwrap().unwrap();
    let rule = find(&with, "PrometheusRule", "kiln-operator").unwrap();
    assert_eq!(rule["metadata"]["namespace"], "gpu-operator");
    let rules = &rule["spec"]["groups"][0]["rules"];
    let below = rules
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["alert"] == "GPUAllocatableBelowHardware")
        .unwrap();
    assert_eq!(
        below["expr"],
        "kiln_node_gpus_allocatable < kiln_node_gpus_expected"
    );
    assert_eq!(below["for"], "10m");
    // On by default: the operator exports the gauge (kiln_operator::signals::stuck).
    let stuck = rules
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["alert"] == "GPUNodeStuck")
        .expect("GPUNodeStuck on by default");
    assert!(
        stuck["expr"]
            .as_str()
            .unwrap()
            .contains(kiln_core::node_stuck::GAUGE)
    );
    assert!(
        below["annotations"]["summary"]
            .as_str()
            .unwrap()
            .contains("{{ $labels.node }}"),
        "Prometheus templates survive Helm's"
    );
    let off = helm(&[
        served[0],
        served[1],
        "--set",
        "operator.prometheusRule.enabled=false",
    ])
    .unwrap()
    .unwrap();
    assert!(find(&off, "PrometheusRule", "kiln-operator").is_none());
}

fn site_plugin_mounts(d: &Value) -> Vec<(String, Value)> {
    let spec = &d["spec"]["template"]["spec"];
    let mut out = Vec::new();
    for c in spec["initContainers"]
        .as_array()
        .into_iter()
        .chain(spec["containers"].as_array())
        .flatten()
    {
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            if m["name"] == "site-plugins" {
                out.push((c["name"].as_str().unwrap().to_string(), m.clone()));
            }
        }
    }
    out
}

fn site_plugin_volume(d: &Value) -> Option<Value> {
    d["spec"]["template"]["spec"]["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == "site-plugins")
        .cloned()
}

#[test]
fn site_plugins_mount_from_a_config_map_or_a_volume() {
    let Some(plain) = helm(&[]) else { return };
    let plain = plain.unwrap();
    let d = find(&plain, "Deployment", "kiln-operator").unwrap();
    assert!(site_plugin_mounts(d).is_empty() && site_plugin_volume(d).is_none());

    let cm = helm(&["--set", "operator.sitePlugins.configMap=site-plugins"])
        .unwrap()
        .unwrap();
    let d = find(&cm, "Deployment", "kiln-operator").unwrap();
    let mounts = site_plugin_mounts(d);
    let containers: Vec<&str> = mounts.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(containers, ["precompile-plugins", "operator"]);
    for (_, m) in &mounts {
        assert_eq!(m["mountPath"], kiln_plugin_host::DEFAULT_DROP_IN_DIR);
        assert_eq!(m["readOnly"], true);
    }
    assert_eq!(
        site_plugin_volume(d).unwrap()["configMap"]["name"],
        "site-plugins"
    );
    // The init container precompiles the drop-ins too.
    let init_env = &d["spec"]["template"]["spec"]["initContainers"][0]["env"];
    assert!(
        init_env
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "KILN_PLUGINS_DIR"
                && e["value"] == kiln_plugin_host::DEFAULT_DROP_IN_DIR),
        "{init_env}"
    );

    let pvc = helm(&[
        "--set",
        "operator.sitePlugins.volume.persistentVolumeClaim.claimName=kiln-plugins",
    ])
    .unwrap()
    .unwrap();
    let d = find(&pvc, "Deployment", "kiln-operator").unwrap();
    assert_eq!(site_plugin_mounts(d).len(), 2);
    assert_eq!(
        site_plugin_volume(d).unwrap(),
        serde_json::json!({"name": "site-plugins",
            "persistentVolumeClaim": {"claimName": "kiln-plugins"}})
    );

    let both = helm(&[
        "--set",
        "operator.sitePlugins.configMap=a",
        "--set",
        "operator.sitePlugins.volume.emptyDir.medium=Memory",
    ])
    .unwrap();
    assert!(
        both.as_ref()
            .is_err_and(|e| e.contains("set configMap or volume, not both")),
        "{both:?}"
    );
}

#[test]
fn the_default_exporter_is_kilns() {
    let Some(objects) = helm(&[]) else { return };
    let objects = objects.unwrap();
    let cp = find(&objects, "ClusterPolicy", "cluster-policy").unwrap();
    let exporter = &cp["spec"]["dcgmExporter"];
    assert_eq!(exporter["enabled"], true);
    for key in ["repository", "image", "version"] {
        assert!(exporter.get(key).is_none(), "{key}: {exporter}");
    }
    let policy = Policy::from_object(cp).unwrap();
    let host = PluginHost::new(
        HostConfig {
            cache_dir: Some(repo().join("target/kiln-test-plugin-cache")),
            ..HostConfig::in_memory()
        },
        kiln_bundled_plugins::BUNDLED,
    )
    .unwrap();
    let tctx = defaults::render_context();
    let rendered = Renderer::new(Arc::new(host))
        .render_state(State::DcgmExporter, &policy, &tctx)
        .unwrap();
    let ds = rendered
        .objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .unwrap();
    let ctr = &ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        ctr["image"].as_str(),
        tctx.fallback_image("DCGM_EXPORTER_IMAGE"),
        "kiln's image"
    );
    assert_eq!(ctr["command"], serde_json::json!(["kiln", "exporter"]));
}

#[test]
fn psa_reaches_the_policy_and_the_operator_may_label_its_namespace() {
    let Some(objects) = helm(&["--set", "psa.enabled=true"]) else {
        return;
    };
    let objects = objects.unwrap();
    let cp = find(&objects, "ClusterPolicy", "cluster-policy").unwrap();
    assert_eq!(cp["spec"]["psa"]["enabled"], true);
    // The Role in the operator's namespace grants get and patch on namespaces (its own only).
    let role = find(&objects, "Role", "kiln-operator").unwrap();
    assert_eq!(role["metadata"]["namespace"], "gpu-operator");
    let grants = role["rules"].as_array().unwrap().iter().any(|r| {
        r["resources"] == serde_json::json!(["namespaces"])
            && r["verbs"] == serde_json::json!(["get", "patch"])
    });
    assert!(grants, "{role}");
}
