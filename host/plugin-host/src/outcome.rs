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

/// A chain step's objects: the chain's input (borrowed, copied only as far as a patch needs)
/// or the previous step's results (owned, patched in place).
pub(crate) enum StepObjects<'a> {
    /// The chain's input objects.
    Input(&'a [Value]),
    /// Results of the previous step.
    Owned(Vec<Value>),
}

impl StepObjects<'_> {
    pub(crate) fn as_slice(&self) -> &[Value] {
        match self {
            StepObjects::Input(o) => o,
            StepObjects::Owned(o) => o,
        }
    }
}

/// Applies `outcomes` to `objects` and validates the results.
///
/// # Errors
/// As [`apply_outcomes_to`].
#[cfg(test)]
pub(crate) fn apply_outcomes(
    plugin: &str,
    objects: &[Value],
    outcomes: Vec<Outcome>,
    output_limit_bytes: usize,
) -> Result<Vec<Rendered>, PluginError> {
    let out = apply_outcomes_to(
        plugin,
        StepObjects::Input(objects),
        outcomes,
        output_limit_bytes,
    )?;
    Ok(rendered(out))
}

/// `Keep`/`Omit` for each result of [`apply_outcomes_to`].
pub(crate) fn rendered(results: Vec<Option<Value>>) -> Vec<Rendered> {
    results
        .into_iter()
        .map(|o| o.map_or(Rendered::Omit, Rendered::Keep))
        .collect()
}

/// Applies `outcomes` to `objects` and validates the results: per object, the patched object,
/// or `None` when the plugin omitted it.
///
/// # Errors
/// [`PluginError::WrongOutcomeCount`], [`PluginError::OutputTooLarge`] (total patch bytes over
/// `output_limit_bytes`), [`PluginError::InvalidPatch`] and [`PluginError::InvalidResult`].
pub(crate) fn apply_outcomes_to(
    plugin: &str,
    objects: StepObjects<'_>,
    outcomes: Vec<Outcome>,
    output_limit_bytes: usize,
) -> Result<Vec<Option<Value>>, PluginError> {
    let expected = objects.as_slice().len();
    if outcomes.len() != expected {
        return Err(PluginError::WrongOutcomeCount {
            plugin: plugin.to_string(),
            expected,
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
    let patch_one = |index: usize, object: Target<'_>, outcome: Outcome| match outcome {
        Outcome::Omit => Ok(None),
        Outcome::Patch(text) => apply_patch(plugin, index, object, &text).map(Some),
    };
    match objects {
        StepObjects::Input(objects) => objects
            .iter()
            .zip(outcomes)
            .enumerate()
            .map(|(i, (o, outcome))| patch_one(i, Target::Copy(o), outcome))
            .collect(),
        StepObjects::Owned(objects) => objects
            .into_iter()
            .zip(outcomes)
            .enumerate()
            .map(|(i, (o, outcome))| patch_one(i, Target::InPlace(o), outcome))
            .collect(),
    }
}

/// The object a patch applies to.
enum Target<'a> {
    /// Patch a copy; the original stays.
    Copy(&'a Value),
    /// Patch this object.
    InPlace(Value),
}

/// The copy of `original` that `patch` is applied to. When every operation is an `add`,
/// `replace` or `remove` of a top-level member (what the standard plugins answer), members that
/// an `add` or `replace` overwrites are not copied: they get a `null` placeholder, which those
/// operations replace without reading it, so the result equals patching a full copy. Any other
/// patch gets a full copy.
fn copy_for_patch(original: &Value, patch: &json_patch::Patch) -> Value {
    use json_patch::PatchOperation as Op;
    let Value::Object(members) = original else {
        return original.clone();
    };
    let mut overwritten = Vec::with_capacity(patch.len());
    for op in patch.iter() {
        let (path, overwrites) = match op {
            Op::Add(a) => (&a.path, true),
            Op::Replace(r) => (&r.path, true),
            Op::Remove(r) => (&r.path, false),
            _ => return original.clone(),
        };
        let mut tokens = path.tokens();
        let (Some(token), None) = (tokens.next(), tokens.next()) else {
            return original.clone();
        };
        if overwrites {
            overwritten.push(token.decoded().into_owned());
        }
    }
    Value::Object(
        members
            .iter()
            .map(|(k, v)| {
                let placeholder = overwritten.iter().any(|o| o == k);
                (k.clone(), if placeholder { Value::Null } else { v.clone() })
            })
            .collect(),
    )
}

/// The members of an object a patch must not change (see the module docs), copied before the
/// patch is applied.
struct Identity {
    members: [Option<Value>; 4],
    daemonset_selector: Option<Option<Value>>,
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
        }
    }

    /// `kind/name` of the object, as [`describe`] gives it.
    fn describe(&self) -> String {
        let text = |v: &Option<Value>| {
            v.as_ref()
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string()
        };
        format!("{}/{}", text(&self.members[1]), text(&self.members[2]))
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
    target: Target<'_>,
    text: &str,
) -> Result<Value, PluginError> {
    let original = match &target {
        Target::Copy(o) => *o,
        Target::InPlace(o) => o,
    };
    let invalid_patch = |object: String, message: String| PluginError::InvalidPatch {
        plugin: plugin.to_string(),
        index,
        object,
        message,
    };
    let patch = crate::patch::parse_patch(text).map_err(|e| {
        invalid_patch(
            describe(original),
            format!("not an RFC 6902 JSON Patch: {e}"),
        )
    })?;
    if patch.is_empty() {
        // Most objects of a state: no identity to check, nothing to copy but the result.
        return Ok(match target {
            Target::Copy(o) => o.clone(),
            Target::InPlace(o) => o,
        });
    }
    let identity = Identity::of(original);
    let mut object = match target {
        Target::Copy(o) => copy_for_patch(o, &patch),
        Target::InPlace(o) => o,
    };
    json_patch::patch(&mut object, &patch)
        .map_err(|e| invalid_patch(identity.describe(), e.to_string()))?;
    identity
        .check(&object)
        .map_err(|message| PluginError::InvalidResult {
            plugin: plugin.to_string(),
            index,
            object: identity.describe(),
            message,
        })?;
    Ok(object)
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

    /// Patching the partial copy gives what patching a full copy gives, for patches the
    /// shortcut takes and for those it does not.
    #[test]
    fn partial_copy_patches_like_a_full_copy() {
        let original = daemonset();
        for text in [
            r#"[{"op":"add","path":"/spec","value":{"selector":{"matchLabels":{"app":"ds"}},"template":{}}},{"op":"add","path":"/metadata","value":{"name":"ds","namespace":"ns","labels":{"x":"y"}}}]"#,
            r#"[{"op":"replace","path":"/metadata","value":{"name":"ds"}},{"op":"remove","path":"/spec"},{"op":"add","path":"/spec","value":7}]"#,
            r#"[{"op":"add","path":"/spec/x","value":1}]"#,
            r#"[{"op":"copy","from":"/spec","path":"/status"},{"op":"add","path":"/spec","value":{}}]"#,
        ] {
            let patch = crate::patch::parse_patch(text).unwrap();
            let mut full = original.clone();
            json_patch::patch(&mut full, &patch).unwrap();
            let mut partial = copy_for_patch(&original, &patch);
            json_patch::patch(&mut partial, &patch).unwrap();
            assert_eq!(partial, full, "{text}");
        }
        let top = crate::patch::parse_patch(r#"[{"op":"add","path":"/spec","value":1}]"#).unwrap();
        assert_eq!(
            copy_for_patch(&original, &top)["spec"],
            Value::Null,
            "not copied"
        );
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
