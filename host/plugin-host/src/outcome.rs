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
/// As [`apply_outcomes_in_place`].
#[cfg(test)]
pub(crate) fn apply_outcomes(
    plugin: &str,
    objects: &[Value],
    outcomes: Vec<Outcome>,
    output_limit_bytes: usize,
) -> Result<Vec<Rendered>, PluginError> {
    let mut patched = objects.to_vec();
    let kept = apply_outcomes_in_place(plugin, &mut patched, outcomes, output_limit_bytes)?;
    Ok(rendered(patched, kept))
}

/// Pairs patched objects with whether each is kept (see [`apply_outcomes_in_place`]).
pub(crate) fn rendered(objects: Vec<Value>, kept: Vec<bool>) -> Vec<Rendered> {
    objects
        .into_iter()
        .zip(kept)
        .map(|(o, keep)| {
            if keep {
                Rendered::Keep(o)
            } else {
                Rendered::Omit
            }
        })
        .collect()
}

/// Applies `outcomes` to `objects` in place (no copy of an object is made) and validates the
/// results; returns, per object, whether it is kept (`false`: omitted, left unpatched). On an
/// error the objects are left part-patched: callers discard them.
///
/// # Errors
/// [`PluginError::WrongOutcomeCount`], [`PluginError::OutputTooLarge`] (total patch bytes over
/// `output_limit_bytes`), [`PluginError::InvalidPatch`] and [`PluginError::InvalidResult`].
pub(crate) fn apply_outcomes_in_place(
    plugin: &str,
    objects: &mut [Value],
    outcomes: Vec<Outcome>,
    output_limit_bytes: usize,
) -> Result<Vec<bool>, PluginError> {
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
        .iter_mut()
        .zip(outcomes)
        .enumerate()
        .map(|(index, (object, outcome))| match outcome {
            Outcome::Omit => Ok(false),
            Outcome::Patch(text) => apply_patch(plugin, index, object, &text).map(|()| true),
        })
        .collect()
}

/// The members of an object a patch must not change (see the module docs), copied before the
/// patch is applied.
struct Identity {
    members: [Option<Value>; 4],
    daemonset_selector: Option<Option<Value>>,
    describe: String,
}

/// Pointers of the members every patched object keeps.
const IDENTITY: [&str; 4] = [
    "/apiVersion",
    "/kind",
    "/metadata/name",
    "/metadata/namespace",
];

impl Identity {
    fn of(object: &Value) -> Self {
        let is_daemonset = object.get("apiVersion").and_then(Value::as_str) == Some("apps/v1")
            && object.get("kind").and_then(Value::as_str) == Some("DaemonSet");
        Identity {
            members: IDENTITY.map(|p| object.pointer(p).cloned()),
            daemonset_selector: is_daemonset.then(|| object.pointer("/spec/selector").cloned()),
            describe: describe(object),
        }
    }

    /// Why `patched` is not an acceptable result for the object this identity was taken
    /// from, if it is not.
    fn check(&self, patched: &Value) -> Result<(), String> {
        if !patched.is_object() {
            return Err("the result is not a JSON object".into());
        }
        for (pointer, before) in IDENTITY.iter().zip(&self.members) {
            let after = patched.pointer(pointer);
            if before.as_ref() != after {
                return Err(format!(
                    "{pointer} changed from {} to {}",
                    show(before.as_ref()),
                    show(after)
                ));
            }
        }
        if let Some(before) = &self.daemonset_selector {
            <DaemonSet as serde::Deserialize>::deserialize(patched)
                .map_err(|e| format!("not a valid apps/v1 DaemonSet: {e}"))?;
            let after = patched.pointer("/spec/selector");
            if before.as_ref() != after {
                return Err(format!(
                    "/spec/selector changed from {} to {}",
                    show(before.as_ref()),
                    show(after)
                ));
            }
        }
        Ok(())
    }
}

fn apply_patch(
    plugin: &str,
    index: usize,
    object: &mut Value,
    text: &str,
) -> Result<(), PluginError> {
    let identity = Identity::of(object);
    let invalid_patch = |message: String| PluginError::InvalidPatch {
        plugin: plugin.to_string(),
        index,
        object: identity.describe.clone(),
        message,
    };
    let patch: json_patch::Patch = serde_json::from_str(text)
        .map_err(|e| invalid_patch(format!("not an RFC 6902 JSON Patch: {e}")))?;
    if patch.is_empty() {
        return Ok(());
    }
    json_patch::patch(object, &patch).map_err(|e| invalid_patch(e.to_string()))?;
    identity
        .check(object)
        .map_err(|message| PluginError::InvalidResult {
            plugin: plugin.to_string(),
            index,
            object: identity.describe.clone(),
            message,
        })
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
