//! Edits of the non-DaemonSet monitoring objects (upstream §2.4 ServiceMonitor and Service
//! control functions), on the raw JSON the host hands [`crate::Operand::object`].

use kiln_core::context::TransformContext;
use kiln_core::spec::ServiceMonitorSpec;
use serde_json::{Value, json};

use crate::Decision;

/// The object's `kind` (empty when absent).
pub fn kind(obj: &Value) -> &str {
    obj.get("kind").and_then(Value::as_str).unwrap_or_default()
}

/// The object's `metadata.name` (empty when absent).
pub fn name(obj: &Value) -> &str {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Upstream §2.4 ConfigMap rule: a state's shipped default ConfigMap `default` is omitted when
/// the policy names a *different* ConfigMap (`configured` non-empty and ≠ `default`); an empty
/// or equal name keeps it. Objects other than that ConfigMap are kept.
pub fn default_config_map_gate(obj: &Value, default: &str, configured: &str) -> Decision {
    let replaced = !configured.is_empty() && configured != default;
    if kind(obj) == "ConfigMap" && name(obj) == default && replaced {
        Decision::Omit
    } else {
        Decision::Keep
    }
}

/// Upstream ServiceMonitor control: without the `servicemonitors.monitoring.coreos.com` CRD the
/// object is skipped ([`Decision::Omit`]), otherwise kept.
pub fn service_monitor_gate(ctx: &TransformContext) -> Decision {
    if ctx.has_service_monitor_crd {
        Decision::Keep
    } else {
        Decision::Omit
    }
}

/// Upstream ServiceMonitor custom edits (dcgm-exporter and operator-metrics):
/// `additionalLabels` merged into `metadata.labels`; `interval`, `scrapeTimeout`, `honorLabels`
/// (when set) and `relabelings` (when non-empty) onto `spec.endpoints[0]` (created if missing).
pub fn apply_service_monitor_spec(obj: &mut Value, sm: &ServiceMonitorSpec) {
    if !sm.additional_labels.is_empty() {
        let labels = entry_object(ensure_object(obj, "metadata"), "labels");
        for (k, v) in &sm.additional_labels {
            labels.insert(k.clone(), json!(v));
        }
    }
    let wants_endpoint = sm.interval.as_deref().is_some_and(|s| !s.is_empty())
        || sm.scrape_timeout.as_deref().is_some_and(|s| !s.is_empty())
        || sm.honor_labels.is_some()
        || !sm.relabelings.is_empty();
    if !wants_endpoint {
        return;
    }
    let spec = ensure_object(obj, "spec");
    let endpoints = spec.entry("endpoints").or_insert_with(|| json!([]));
    if !endpoints.is_array() {
        *endpoints = json!([]);
    }
    let list = endpoints.as_array_mut().expect("endpoints is an array");
    if list.is_empty() {
        list.push(json!({}));
    }
    let ep = &mut list[0];
    if !ep.is_object() {
        *ep = json!({});
    }
    let ep = ep.as_object_mut().expect("endpoint is an object");
    if let Some(i) = sm.interval.as_deref().filter(|s| !s.is_empty()) {
        ep.insert("interval".into(), json!(i));
    }
    if let Some(t) = sm.scrape_timeout.as_deref().filter(|s| !s.is_empty()) {
        ep.insert("scrapeTimeout".into(), json!(t));
    }
    if let Some(h) = sm.honor_labels {
        ep.insert("honorLabels".into(), json!(h));
    }
    if !sm.relabelings.is_empty() {
        ep.insert("relabelings".into(), Value::Array(sm.relabelings.clone()));
    }
}

/// `obj[key]` as a JSON object, created (or replaced when not an object) where needed.
pub fn ensure_object<'a>(obj: &'a mut Value, key: &str) -> &'a mut serde_json::Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    entry_object(obj.as_object_mut().expect("object"), key)
}

/// `map[key]` as a JSON object, created (or replaced when not an object) where needed.
pub fn entry_object<'a>(
    map: &'a mut serde_json::Map<String, Value>,
    key: &str,
) -> &'a mut serde_json::Map<String, Value> {
    let v = map.entry(key).or_insert_with(|| json!({}));
    if !v.is_object() {
        *v = json!({});
    }
    v.as_object_mut().expect("object")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_land_on_labels_and_first_endpoint() {
        let mut sm = json!({"kind": "ServiceMonitor", "metadata": {"name": "m", "labels": {"app": "a"}},
            "spec": {"endpoints": [{"port": "p"}, {"port": "q"}]}});
        let spec = ServiceMonitorSpec {
            interval: Some("15s".into()),
            honor_labels: Some(false),
            additional_labels: [("release".to_string(), "prom".to_string())].into(),
            relabelings: vec![json!({"action": "drop"})],
            ..Default::default()
        };
        apply_service_monitor_spec(&mut sm, &spec);
        assert_eq!(
            sm["metadata"]["labels"],
            json!({"app": "a", "release": "prom"})
        );
        assert_eq!(
            sm["spec"]["endpoints"],
            json!([{"port": "p", "interval": "15s", "honorLabels": false,
                    "relabelings": [{"action": "drop"}]}, {"port": "q"}])
        );
    }

    #[test]
    fn nothing_set_changes_nothing() {
        let mut sm = json!({"kind": "ServiceMonitor", "metadata": {"name": "m"}});
        let before = sm.clone();
        apply_service_monitor_spec(&mut sm, &ServiceMonitorSpec::default());
        assert_eq!(sm, before);
        assert_eq!(kind(&sm), "ServiceMonitor");
        assert_eq!(name(&sm), "m");
    }
}
