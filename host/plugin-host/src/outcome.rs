//! Applying a plugin's outcomes to its input objects, and checking what comes out.
//!
//! A patched object must keep its identity: the same `apiVersion`, `kind`, `metadata.name` and
//! `metadata.namespace`. An `apps/v1` DaemonSet must also still parse as one and keep its
//! `spec.selector` (it is immutable in the API server).

use k8s_openapi::api::apps::v1::DaemonSet;
use serde_json::Value;

use crate::bindings::kiln::operand::types::Outcome;
use crate::error::PluginError;

/// What a plugin decided for one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Rendered {
    /// The object, patched (unchanged when the patch was empty).
    Keep(Value),
    /// The object is left out: not rendered, deleted if present.
    Omit,
}

/// `kind/name` of an object, for messages.
pub(crate) fn describe(object: &Value) -> String {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("?");
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("?");
    format!("{kind}/{name}")
}

/// Applies `outcomes` to `objects` and validates the results.
///
/// # Errors
/// [`PluginError::WrongOutcomeCount`], [`PluginError::OutputTooLarge`] (total patch bytes over
/// `output_limit_bytes`), [`PluginError::InvalidPatch`] and [`PluginError::InvalidResult`].
pub(crate) fn apply_outcomes(
    plugin: &str,
    objects: &[Value],
    outcomes: Vec<Outcome>,
    output_limit_bytes: usize,
) -> Result<Vec<Rendered>, PluginError> {
    if outcomes.len() != objects.len() {
        return Err(PluginError::WrongOutcomeCount {
            plugin: plugin.to_string(),
            expected: objects.len(),
            actual: outcomes.len(),
        });
    }
    let total: usize = outcomes
        .iter()
        .map(|o| match o {
            Outcome::Patch(p) => p.len(),
            Outcome::Omit => 0,
        })
        .sum();
    if total > output_limit_bytes {
        return Err(PluginError::OutputTooLarge {
            plugin: plugin.to_string(),
            limit_bytes: output_limit_bytes,
            actual_bytes: total,
        });
    }
    objects
        .iter()
        .zip(outcomes)
        .enumerate()
        .map(|(index, (object, outcome))| match outcome {
            Outcome::Omit => Ok(Rendered::Omit),
            Outcome::Patch(text) => apply_patch(plugin, index, object, &text).map(Rendered::Keep),
        })
        .collect()
}

fn apply_patch(
    plugin: &str,
    index: usize,
    object: &Value,
    text: &str,
) -> Result<Value, PluginError> {
    let invalid_patch = |message: String| PluginError::InvalidPatch {
        plugin: plugin.to_string(),
        index,
        object: describe(object),
        message,
    };
    let patch: json_patch::Patch = serde_json::from_str(text)
        .map_err(|e| invalid_patch(format!("not an RFC 6902 JSON Patch: {e}")))?;
    let mut patched = object.clone();
    json_patch::patch(&mut patched, &patch).map_err(|e| invalid_patch(e.to_string()))?;
    check_result(object, &patched).map_err(|message| PluginError::InvalidResult {
        plugin: plugin.to_string(),
        index,
        object: describe(object),
        message,
    })?;
    Ok(patched)
}

/// Why `patched` is not an acceptable result for `original`, if it is not.
fn check_result(original: &Value, patched: &Value) -> Result<(), String> {
    if !patched.is_object() {
        return Err("the result is not a JSON object".into());
    }
    for pointer in [
        "/apiVersion",
        "/kind",
        "/metadata/name",
        "/metadata/namespace",
    ] {
        let (before, after) = (original.pointer(pointer), patched.pointer(pointer));
        if before != after {
            return Err(format!(
                "{pointer} changed from {} to {}",
                show(before),
                show(after)
            ));
        }
    }
    let is_daemonset = original.get("apiVersion").and_then(Value::as_str) == Some("apps/v1")
        && original.get("kind").and_then(Value::as_str) == Some("DaemonSet");
    if is_daemonset {
        <DaemonSet as serde::Deserialize>::deserialize(patched)
            .map_err(|e| format!("not a valid apps/v1 DaemonSet: {e}"))?;
        let (before, after) = (
            original.pointer("/spec/selector"),
            patched.pointer("/spec/selector"),
        );
        if before != after {
            return Err(format!(
                "/spec/selector changed from {} to {}",
                show(before),
                show(after)
            ));
        }
    }
    Ok(())
}

fn show(v: Option<&Value>) -> String {
    v.map_or_else(|| "nothing".to_string(), Value::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn daemonset() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "ds", "namespace": "ns"},
            "spec": {
                "selector": {"matchLabels": {"app": "ds"}},
                "template": {"metadata": {"labels": {"app": "ds"}}, "spec": {"containers": [{"name": "c"}]}}
            }
        })
    }

    fn run(outcomes: Vec<Outcome>) -> Result<Vec<Rendered>, PluginError> {
        apply_outcomes("p", &[daemonset()], outcomes, 1000)
    }

    #[test]
    fn applies_patches_and_omits() {
        let out = run(vec![Outcome::Patch(
            r#"[{"op":"add","path":"/metadata/labels","value":{"a":"b"}}]"#.into(),
        )])
        .unwrap();
        let Rendered::Keep(obj) = &out[0] else {
            panic!("omitted")
        };
        assert_eq!(obj.pointer("/metadata/labels/a"), Some(&json!("b")));
        assert_eq!(run(vec![Outcome::Omit]).unwrap(), vec![Rendered::Omit]);
    }

    #[test]
    fn refuses_bad_output() {
        assert!(matches!(
            run(vec![]),
            Err(PluginError::WrongOutcomeCount {
                expected: 1,
                actual: 0,
                ..
            })
        ));
        assert!(matches!(
            run(vec![Outcome::Patch("nope".into())]),
            Err(PluginError::InvalidPatch { index: 0, .. })
        ));
        let big = format!("[{}]", " ".repeat(1000));
        assert!(matches!(
            run(vec![Outcome::Patch(big)]),
            Err(PluginError::OutputTooLarge {
                actual_bytes: 1002,
                ..
            })
        ));
        let rename = r#"[{"op":"replace","path":"/metadata/name","value":"x"}]"#;
        let err = run(vec![Outcome::Patch(rename.into())]).unwrap_err();
        assert!(err.to_string().contains("/metadata/name changed"), "{err}");
        let unselect = r#"[{"op":"remove","path":"/spec/selector"}]"#;
        let err = run(vec![Outcome::Patch(unselect.into())]).unwrap_err();
        assert!(matches!(err, PluginError::InvalidResult { .. }), "{err}");
        let reselect = r#"[{"op":"replace","path":"/spec/selector/matchLabels/app","value":"x"}]"#;
        let err = run(vec![Outcome::Patch(reselect.into())]).unwrap_err();
        assert!(err.to_string().contains("/spec/selector changed"), "{err}");
    }
}
