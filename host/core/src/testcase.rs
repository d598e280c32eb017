//! Transform test cases as data: one YAML file per case under `plugins/<name>/cases/`, run both
//! natively (each plugin crate's tests, via `kiln_plugin_std::testing`) and through the compiled
//! Wasm plugins (the host's integration tests), so every case proves the component, not only the
//! Rust.
//!
//! File shape:
//! ```yaml
//! name: C9 device plugin, default CDI path     # free text, shown on failure
//! context: {runtime: crio}                      # TransformContext fields over its Default
//! spec: {devicePlugin: {...}}                   # ClusterPolicy spec
//! settings: {nodeSelector: {pool: a}}           # the chain entry's settings (default null)
//! objects: [<object>, ...]                      # input objects; `DaemonSet` shorthand below
//! expect: [<pattern> | omit, ...]               # one per object, or:
//! error: {kind: invalid-field, path: spec.x, contains: "text"}
//! # kinds: invalid-field, invalid-object, failed (transform-error), invalid-settings
//! # (refused by validate-settings; path settings.<field>)
//! ```
//! A *pattern* matches an object when every key it names matches (objects are matched
//! recursively as subsets; arrays must have the same length, element by element; `null` means
//! "absent or null"). An object with `kind: TestDaemonSet` expands to the minimal DaemonSet of
//! upstream's tests: name `test-ds`, namespace `test-ns`, selector `app: test-ds`, and the given
//! `containers`, `initContainers`, `volumes` (and optional `name`, `hostPID`).

use serde::Deserialize;
use serde_json::{Value, json};

use crate::context::TransformContext;

/// One case file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// What the case checks.
    pub name: String,
    /// Context overrides.
    #[serde(default)]
    pub context: TransformContext,
    /// The ClusterPolicy spec.
    #[serde(default = "empty_object")]
    pub spec: Value,
    /// The chain entry's settings (`null` when the case gives none).
    #[serde(default)]
    pub settings: Value,
    /// Input objects.
    pub objects: Vec<Value>,
    /// Expected outcome per object (`"omit"` or a pattern).
    #[serde(default)]
    pub expect: Vec<Value>,
    /// Expected error instead of outcomes.
    #[serde(default)]
    pub error: Option<ExpectedError>,
}

/// An expected transform error.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedError {
    /// `invalid-field`, `invalid-object`, `failed` or `invalid-settings`.
    pub kind: String,
    /// Field path, for `invalid-field`.
    #[serde(default)]
    pub path: Option<String>,
    /// A substring of the message.
    #[serde(default)]
    pub contains: Option<String>,
}

fn empty_object() -> Value {
    json!({})
}

impl Case {
    /// Parse a case from YAML-as-JSON (the caller parses YAML) and expand `TestDaemonSet`s.
    pub fn from_value(mut v: Value) -> Result<Case, String> {
        if let Some(objs) = v.get_mut("objects").and_then(Value::as_array_mut) {
            for o in objs.iter_mut() {
                expand_test_daemonset(o);
            }
        }
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    /// Check actual results (`None` = omitted) against `expect`; `Err` describes the first
    /// mismatch with its JSON path.
    pub fn check(&self, actual: &[Option<Value>]) -> Result<(), String> {
        if self.error.is_some() {
            return Err(format!("expected an error, got {} outcomes", actual.len()));
        }
        if actual.len() != self.expect.len() {
            return Err(format!(
                "{} outcomes, {} expected",
                actual.len(),
                self.expect.len()
            ));
        }
        for (i, (got, want)) in actual.iter().zip(&self.expect).enumerate() {
            match (got, want) {
                (None, Value::String(s)) if s == "omit" => {}
                (None, _) => return Err(format!("object #{i} omitted, expected {want}")),
                (Some(_), Value::String(s)) if s == "omit" => {
                    return Err(format!("object #{i} kept, expected omit"));
                }
                (Some(g), w) => matches(g, w, &format!("[{i}]"))?,
            }
        }
        Ok(())
    }

    /// Check an actual error `(kind, path, message)` against `error`.
    pub fn check_error(&self, kind: &str, path: Option<&str>, message: &str) -> Result<(), String> {
        let Some(want) = &self.error else {
            return Err(format!("unexpected {kind} error: {message}"));
        };
        if want.kind != kind {
            return Err(format!(
                "error kind {kind} ({message}), expected {}",
                want.kind
            ));
        }
        if want.path.is_some() && want.path.as_deref() != path {
            return Err(format!("error path {path:?}, expected {:?}", want.path));
        }
        if let Some(c) = &want.contains
            && !message.contains(c.as_str())
        {
            return Err(format!("error message {message:?} lacks {c:?}"));
        }
        Ok(())
    }
}

/// Subset match of `got` against pattern `want` (see the module docs).
pub fn matches(got: &Value, want: &Value, path: &str) -> Result<(), String> {
    match (got, want) {
        (_, Value::Null) if got.is_null() => Ok(()),
        (Value::Object(g), Value::Object(w)) => {
            for (k, wv) in w {
                let gv = g.get(k).unwrap_or(&Value::Null);
                if wv.is_null() && !gv.is_null() {
                    return Err(format!("{path}.{k}: expected absent, got {gv}"));
                }
                matches(gv, wv, &format!("{path}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(g), Value::Array(w)) => {
            if g.len() != w.len() {
                return Err(format!(
                    "{path}: {} items, expected {}: got {got}",
                    g.len(),
                    w.len()
                ));
            }
            g.iter()
                .zip(w)
                .enumerate()
                .try_for_each(|(i, (a, b))| matches(a, b, &format!("{path}[{i}]")))
        }
        _ if got == want => Ok(()),
        _ => Err(format!("{path}: got {got}, expected {want}")),
    }
}

fn expand_test_daemonset(o: &mut Value) {
    if o.get("kind").and_then(Value::as_str) != Some("TestDaemonSet") {
        return;
    }
    let name = o
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("test-ds")
        .to_string();
    let mut pod = json!({"containers": o.get("containers").cloned().unwrap_or(json!([]))});
    for key in ["initContainers", "volumes", "hostPID", "runtimeClassName"] {
        if let Some(v) = o.get(key) {
            pod[key] = v.clone();
        }
    }
    *o = json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": "test-ns"},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod}
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subset_matching_rules() {
        let got = json!({"a": 1, "b": [{"x": 1, "y": 2}], "c": "s"});
        assert!(matches(&got, &json!({"b": [{"x": 1}]}), "").is_ok());
        assert!(matches(&got, &json!({"d": null}), "").is_ok());
        assert_eq!(
            matches(&got, &json!({"c": null}), "").unwrap_err(),
            ".c: expected absent, got \"s\""
        );
        assert!(
            matches(&got, &json!({"b": []}), "")
                .unwrap_err()
                .contains("1 items, expected 0")
        );
        assert_eq!(
            matches(&got, &json!({"a": 2}), "").unwrap_err(),
            ".a: got 1, expected 2"
        );
    }

    #[test]
    fn test_daemonset_expands() {
        let c = Case::from_value(json!({"name": "x", "objects": [{"kind": "TestDaemonSet",
            "containers": [{"name": "c"}]}], "expect": ["omit"]}))
        .unwrap();
        assert_eq!(c.objects[0]["metadata"]["name"], "test-ds");
        assert_eq!(
            c.objects[0]["spec"]["template"]["spec"]["containers"][0]["name"],
            "c"
        );
        assert!(c.check(&[None]).is_ok());
        assert!(c.check(&[Some(json!({}))]).is_err());
    }
}
