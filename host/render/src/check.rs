//! Rendered objects checked against the API server's validation of the fields plugins commonly
//! set, so a bad value fails the render with a short message naming the object and the field,
//! not later at apply (where the API server's answer quotes the whole object: 7–16 KiB in the
//! operator's status).
//!
//! Rules (apimachinery and `k8s.io/kubernetes/pkg/apis/core/validation`):
//! - `metadata.labels`, a pod template's labels, `spec.selector.matchLabels` and a pod's
//!   `nodeSelector`: keys are qualified names ([`is_label_key`]), values label values
//!   ([`is_label_value`]); `metadata.annotations` keys are qualified names;
//! - container `env[].name`: 1 or more printable ASCII characters other than `=` (the API
//!   server's rule since Kubernetes 1.34; control characters were never allowed);
//! - `tolerations`: a key is a qualified name (an empty key needs `operator: Exists`),
//!   `operator` is `Exists` or `Equal`, `Equal` takes a label value and `Exists` none, `effect`
//!   is `NoSchedule`, `PreferNoSchedule` or `NoExecute` (and `tolerationSeconds` needs
//!   `NoExecute`);
//! - `imagePullPolicy`: `Always`, `Never` or `IfNotPresent`;
//! - probes: `initialDelaySeconds`, `timeoutSeconds`, `periodSeconds`, `successThreshold`,
//!   `failureThreshold` at least 0;
//! - a DaemonSet's `rollingUpdate.maxUnavailable`: the one int-or-percent rule
//!   ([`IntOrPercent`]), and not 0 while `maxSurge` is 0 or unset;
//! - `hostPath.path`: no NUL (no path can hold one) and no `..` element (the API server's
//!   `validatePathNoBacksteps`).

use kiln_core::intstr::IntOrPercent;
use kiln_input::k8s::{is_label_key, is_label_value};
use serde_json::{Map, Value};

/// Why a rendered object would be refused by the API server: the object (`DaemonSet
/// gpu-operator/nvidia-device-plugin-daemonset`), the field path inside it and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {path}: {message}")]
pub struct ObjectError {
    /// `Kind namespace/name` (or `Kind name`).
    pub object: String,
    /// Field path in the object, `spec.template.spec.containers[0].env[2].name` style.
    pub path: String,
    /// What is wrong, with the value cut to 80 characters and escaped.
    pub message: String,
}

/// `s` for a message: quoted and escaped, cut to 80 characters.
fn shown(s: &str) -> String {
    let cut: String = s.chars().take(80).collect();
    let more = if cut.len() < s.len() { "…" } else { "" };
    format!("{cut:?}{more}")
}

struct Checker<'a> {
    object: &'a Value,
}

type Found = Result<(), (String, String)>;

fn bad(path: &str, message: String) -> Found {
    Err((path.to_string(), message))
}

impl Checker<'_> {
    fn labels(&self, map: &Value, path: &str) -> Found {
        for (k, v) in map.as_object().into_iter().flatten() {
            if !is_label_key(k) {
                return bad(path, format!("{} is not a valid label key", shown(k)));
            }
            match v.as_str() {
                Some(s) if is_label_value(s) => {}
                Some(s) => {
                    return bad(
                        &format!("{path}.{k}"),
                        format!(
                            "{} is not a valid label value (at most 63 of [-_.A-Za-z0-9], \
                             alphanumeric at both ends)",
                            shown(s)
                        ),
                    );
                }
                None => return bad(&format!("{path}.{k}"), "must be a string".into()),
            }
        }
        Ok(())
    }

    fn metadata(&self, meta: &Value, path: &str) -> Found {
        if let Some(labels) = meta.get("labels") {
            self.labels(labels, &format!("{path}.labels"))?;
        }
        for k in meta
            .get("annotations")
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(Map::keys)
        {
            if !is_label_key(k) {
                return bad(
                    &format!("{path}.annotations"),
                    format!("{} is not a valid annotation key", shown(k)),
                );
            }
        }
        Ok(())
    }

    fn pod_spec(&self, pod: &Value, path: &str) -> Found {
        if let Some(sel) = pod.get("nodeSelector") {
            self.labels(sel, &format!("{path}.nodeSelector"))?;
        }
        for (i, t) in list(pod, "tolerations") {
            toleration(t, &format!("{path}.tolerations[{i}]"))?;
        }
        for kind in ["initContainers", "containers"] {
            for (i, c) in list(pod, kind) {
                container(c, &format!("{path}.{kind}[{i}]"))?;
            }
        }
        for (i, v) in list(pod, "volumes") {
            if let Some(p) = v.pointer("/hostPath/path").and_then(Value::as_str) {
                let at = format!("{path}.volumes[{i}].hostPath.path");
                if p.contains('\0') {
                    return bad(&at, format!("{} contains a NUL character", shown(p)));
                }
                if p.split('/').any(|e| e == "..") {
                    return bad(&at, format!("{} must not contain '..'", shown(p)));
                }
            }
        }
        Ok(())
    }
}

fn list<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = (usize, &'a Value)> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
}

fn toleration(t: &Value, path: &str) -> Found {
    let s = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or_default();
    let (key, op, value, effect) = (s("key"), s("operator"), s("value"), s("effect"));
    if !key.is_empty() && !is_label_key(key) {
        return bad(
            &format!("{path}.key"),
            format!("{} is not a valid toleration key", shown(key)),
        );
    }
    match op {
        "Exists" if !value.is_empty() => {
            return bad(
                &format!("{path}.value"),
                "must be empty when operator is Exists".into(),
            );
        }
        "Exists" => {}
        "" | "Equal" if key.is_empty() => {
            return bad(
                &format!("{path}.operator"),
                "must be Exists when key is empty".into(),
            );
        }
        "" | "Equal" if !is_label_value(value) => {
            return bad(
                &format!("{path}.value"),
                format!("{} is not a valid label value", shown(value)),
            );
        }
        "" | "Equal" => {}
        other => {
            return bad(
                &format!("{path}.operator"),
                format!(
                    "unsupported value {}, expected Exists or Equal",
                    shown(other)
                ),
            );
        }
    }
    if !matches!(effect, "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return bad(
            &format!("{path}.effect"),
            format!(
                "unsupported value {}, expected NoSchedule, PreferNoSchedule or NoExecute",
                shown(effect)
            ),
        );
    }
    if t.get("tolerationSeconds").is_some_and(|v| !v.is_null()) && effect != "NoExecute" {
        return bad(
            &format!("{path}.effect"),
            "must be NoExecute when tolerationSeconds is set".into(),
        );
    }
    Ok(())
}

fn container(c: &Value, path: &str) -> Found {
    for (i, e) in list(c, "env") {
        let name = e.get("name").and_then(Value::as_str).unwrap_or_default();
        if name.is_empty() || !name.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'=') {
            return bad(
                &format!("{path}.env[{i}].name"),
                format!(
                    "{} is not a valid environment variable name (printable ASCII other \
                     than '=')",
                    shown(name)
                ),
            );
        }
    }
    if let Some(p) = c.get("imagePullPolicy").and_then(Value::as_str)
        && !kiln_core::spec::PULL_POLICIES.contains(&p)
    {
        return bad(
            &format!("{path}.imagePullPolicy"),
            format!(
                "unsupported value {}, expected Always, Never or IfNotPresent",
                shown(p)
            ),
        );
    }
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        let Some(p) = c.get(probe) else { continue };
        for f in [
            "initialDelaySeconds",
            "timeoutSeconds",
            "periodSeconds",
            "successThreshold",
            "failureThreshold",
        ] {
            if p.get(f).and_then(Value::as_i64).is_some_and(|n| n < 0) {
                return bad(
                    &format!("{path}.{probe}.{f}"),
                    "must be greater than or equal to 0".into(),
                );
            }
        }
    }
    Ok(())
}

fn daemonset_strategy(spec: &Value) -> Found {
    let Some(ru) = spec.pointer("/updateStrategy/rollingUpdate") else {
        return Ok(());
    };
    let at = "spec.updateStrategy.rollingUpdate.maxUnavailable";
    let parse = |v: &Value| -> Result<Option<IntOrPercent>, String> {
        match v {
            Value::Null => Ok(None),
            Value::String(s) => IntOrPercent::parse(
                &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s.clone()),
            )
            .map(Some),
            Value::Number(n) => match n.as_i64().and_then(|n| i32::try_from(n).ok()) {
                Some(n) => IntOrPercent::parse(
                    &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n),
                )
                .map(Some),
                None => Err(format!("{n} is out of range")),
            },
            other => Err(format!("must be an integer or a string, got {other}")),
        }
    };
    let max =
        parse(ru.get("maxUnavailable").unwrap_or(&Value::Null)).map_err(|m| (at.to_string(), m))?;
    let surge = parse(ru.get("maxSurge").unwrap_or(&Value::Null))
        .map_err(|m| ("spec.updateStrategy.rollingUpdate.maxSurge".to_string(), m))?;
    let zero = |v: Option<IntOrPercent>| {
        matches!(
            v,
            Some(IntOrPercent::Count(0) | IntOrPercent::Percent(0)) | None
        )
    };
    if ru.get("maxUnavailable").is_some_and(|v| !v.is_null()) && zero(max) && zero(surge) {
        return bad(at, "may not be 0 when maxSurge is 0".into());
    }
    Ok(())
}

fn check(c: &Checker<'_>) -> Found {
    let obj = c.object;
    if let Some(meta) = obj.get("metadata") {
        c.metadata(meta, "metadata")?;
    }
    let Some(spec) = obj.get("spec") else {
        return Ok(());
    };
    if let Some(sel) = spec.pointer("/selector/matchLabels") {
        c.labels(sel, "spec.selector.matchLabels")?;
    }
    if obj.get("kind").and_then(Value::as_str) == Some("DaemonSet") {
        daemonset_strategy(spec)?;
    }
    if let Some(template) = spec.get("template") {
        if let Some(meta) = template.get("metadata") {
            c.metadata(meta, "spec.template.metadata")?;
        }
        if let Some(pod) = template.get("spec") {
            c.pod_spec(pod, "spec.template.spec")?;
        }
    } else if obj.get("kind").and_then(Value::as_str) == Some("Pod") {
        c.pod_spec(spec, "spec")?;
    }
    Ok(())
}

/// Check one rendered object (see the module docs for the rules).
///
/// # Errors
/// [`ObjectError`]: the object, the field, and the rule, e.g. `DaemonSet
/// gpu-operator/nvidia-device-plugin-daemonset: spec.updateStrategy.rollingUpdate.maxUnavailable:
/// must be a non-negative integer or a percentage from 0% to 100% (e.g. 25%), got "150%"`.
pub fn check_object(object: &Value) -> Result<(), ObjectError> {
    check(&Checker { object }).map_err(|(path, message)| {
        let s = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or("?");
        let ns = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(|n| format!("{n}/"))
            .unwrap_or_default();
        ObjectError {
            object: format!("{} {ns}{}", s("/kind"), s("/metadata/name")),
            path,
            message,
        }
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ds(pod: Value) -> Value {
        json!({"kind": "DaemonSet", "metadata": {"name": "nvidia-x", "namespace": "gpu-operator",
               "labels": {"app": "nvidia-x"}},
               "spec": {"selector": {"matchLabels": {"app": "nvidia-x"}},
                        "template": {"metadata": {"labels": {"app": "nvidia-x"}}, "spec": pod}}})
    }

    fn err(o: &Value) -> String {
        check_object(o).unwrap_err().to_string()
    }

    #[test]
    fn valid_objects_pass() {
        let o = ds(json!({
            "nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                            {"operator": "Exists"},
                            {"key": "a", "value": "b", "effect": "NoExecute", "tolerationSeconds": 5}],
            "containers": [{"name": "c", "imagePullPolicy": "IfNotPresent",
                            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                                    {"name": "my.var-1", "value": "\u{7}"}],
                            "startupProbe": {"periodSeconds": 5}}],
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}]
        }));
        check_object(&o).unwrap();
        check_object(&json!({"kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}})).unwrap();
    }

    #[test]
    fn bad_values_name_object_and_field_shortly() {
        let cases = [
            (
                json!({"containers": [{"name": "c", "env": [{"name": "A\u{1}B"}]}]}),
                "spec.template.spec.containers[0].env[0].name: \"A\\u{1}B\" is not a valid environment variable name",
            ),
            (
                json!({"containers": [{"name": "c", "env": [{"name": "A=B"}]}]}),
                "containers[0].env[0].name",
            ),
            (
                json!({"tolerations": [{"key": "bad key", "operator": "Exists"}]}),
                "spec.template.spec.tolerations[0].key: \"bad key\" is not a valid toleration key",
            ),
            (
                json!({"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}),
                "tolerations[0].value: must be empty",
            ),
            (
                json!({"tolerations": [{"key": "a", "effect": "Sometimes"}]}),
                "tolerations[0].effect: unsupported value",
            ),
            (
                json!({"nodeSelector": {"a": "b\nc"}}),
                "spec.template.spec.nodeSelector.a: \"b\\nc\" is not a valid label value",
            ),
            (
                json!({"initContainers": [{"name": "i", "imagePullPolicy": "Sometimes"}]}),
                "initContainers[0].imagePullPolicy: unsupported value \"Sometimes\"",
            ),
            (
                json!({"containers": [{"name": "c", "livenessProbe": {"failureThreshold": -1}}]}),
                "containers[0].livenessProbe.failureThreshold",
            ),
            (
                json!({"volumes": [{"name": "r", "hostPath": {"path": "/a\u{0}b"}}]}),
                "volumes[0].hostPath.path: \"/a\\0b\" contains a NUL character",
            ),
            (
                json!({"volumes": [{"name": "r", "hostPath": {"path": "/a/../etc"}}]}),
                "must not contain '..'",
            ),
        ];
        for (pod, want) in cases {
            let e = err(&ds(pod));
            assert!(
                e.starts_with("DaemonSet gpu-operator/nvidia-x: ") && e.contains(want),
                "{want}: {e}"
            );
            assert!(e.len() < 300, "{e}");
        }
        let mut o = ds(json!({}));
        o["metadata"]["labels"]["nvidia.com/\u{1b}x"] = json!("1");
        assert!(
            err(&o).contains("metadata.labels: \"nvidia.com/\\u{1b}x\" is not a valid label key")
        );
        let mut o = ds(json!({}));
        o["spec"]["template"]["metadata"]["labels"]["x"] = json!("y".repeat(1000));
        let e = err(&o);
        assert!(e.contains("spec.template.metadata.labels.x"), "{e}");
        assert!(e.len() < 300, "{e}");
    }

    #[test]
    fn max_unavailable_follows_the_one_rule() {
        for (v, ok) in [
            (json!(1), true),
            (json!("10%"), true),
            (json!("100%"), true),
            (json!("150%"), false),
            (json!("-1"), false),
            (json!(-1), false),
            (json!("1"), false),
            (json!(0), false),
            (json!("0%"), false),
        ] {
            let mut o = ds(json!({}));
            o["spec"]["updateStrategy"] = json!({"type": "RollingUpdate",
                                                 "rollingUpdate": {"maxUnavailable": v}});
            match check_object(&o) {
                Ok(()) => assert!(ok, "{v} accepted"),
                Err(e) => {
                    assert!(!ok, "{v}: {e}");
                    assert_eq!(e.path, "spec.updateStrategy.rollingUpdate.maxUnavailable");
                }
            }
        }
        let mut o = ds(json!({}));
        o["spec"]["updateStrategy"] =
            json!({"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}});
        check_object(&o).unwrap();
    }
}
