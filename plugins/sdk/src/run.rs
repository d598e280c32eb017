//! The plugin entry point: parse inputs, run the edits, answer with patches.

use k8s_openapi::api::apps::v1::DaemonSet;
use kiln_core::context::TransformContext;
use kiln_core::spec::ClusterPolicySpec;
use serde::Deserialize;
use serde_json::Value;

use crate::TransformError;
use crate::common::{apply_common_config, apply_common_metadata, apply_host_paths};

/// What a plugin decides for one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Keep the (possibly edited) object.
    Keep,
    /// Leave the object out of the state (the operator deletes it if it exists).
    Omit,
}

/// The answer for one object, as sent to the host (WIT `outcome`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An RFC 6902 JSON Patch, serialized.
    Patch(String),
    /// Omit the object.
    Omit,
}

/// A standard operand transform. The SDK runs, for each DaemonSet of the state: common config
/// and host-path rewrites, then [`Operand::daemonset`], then common metadata (upstream
/// `preProcessDaemonSet` order); every other object goes to [`Operand::object`].
pub trait Operand {
    /// Plugin name; a standard plugin carries its state's name.
    const NAME: &'static str;

    /// Edit one DaemonSet of the state.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError>;

    /// Edit (or omit) one non-DaemonSet object. Default: keep unchanged.
    fn object(
        obj: &mut Value,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<Decision, TransformError> {
        let _ = (obj, spec, ctx);
        Ok(Decision::Keep)
    }
}

/// Parse the spec and objects, call `edit` on each object, and answer with one patch (or omit)
/// per object. This is the building block for site plugins that do not want the standard
/// common config.
///
/// # Errors
/// A spec or object that does not parse (`InvalidField` naming the field / `InvalidObject`), or
/// whatever `edit` returns.
pub fn transform_each<F>(
    objects: &[String],
    spec_json: &str,
    ctx: &TransformContext,
    mut edit: F,
) -> Result<Vec<Outcome>, TransformError>
where
    F: FnMut(&mut Value, &ClusterPolicySpec, &TransformContext) -> Result<Decision, TransformError>,
{
    answer_each(objects, spec_json, |original, spec| {
        let mut edited = original.clone();
        match edit(&mut edited, spec, ctx)? {
            Decision::Omit => Ok(Outcome::Omit),
            Decision::Keep => patch_text(original, &edited),
        }
    })
}

/// Run a standard [`Operand`] over a state's objects.
///
/// A DaemonSet is parsed once into a `Value` (kept as the diff base) and deserialized from it
/// by reference; the edited DaemonSet is serialized back and diffed against that base, so no
/// copy of the input is made.
pub fn run_operand<O: Operand>(
    objects: &[String],
    spec_json: &str,
    ctx: &TransformContext,
) -> Result<Vec<Outcome>, TransformError> {
    answer_each(objects, spec_json, |original, spec| {
        let edited = if original.get("kind").and_then(Value::as_str) == Some("DaemonSet") {
            let mut ds = DaemonSet::deserialize(original)
                .map_err(|e| TransformError::InvalidObject(format!("not a DaemonSet: {e}")))?;
            apply_common_config(&mut ds, spec)?;
            apply_host_paths(&mut ds, spec);
            O::daemonset(&mut ds, spec, ctx)?;
            apply_common_metadata(&mut ds, spec);
            serde_json::to_value(&ds).map_err(|e| TransformError::Failed(e.to_string()))?
        } else {
            let mut obj = original.clone();
            match O::object(&mut obj, spec, ctx)? {
                Decision::Omit => return Ok(Outcome::Omit),
                Decision::Keep => obj,
            }
        };
        patch_text(original, &edited)
    })
}

/// Parses the spec once and each object in turn, and collects `answer` for each object.
fn answer_each<F>(
    objects: &[String],
    spec_json: &str,
    mut answer: F,
) -> Result<Vec<Outcome>, TransformError>
where
    F: FnMut(&Value, &ClusterPolicySpec) -> Result<Outcome, TransformError>,
{
    let spec = ClusterPolicySpec::from_json_str(spec_json)
        .map_err(|e| TransformError::field(e.path, e.message))?;
    objects
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let original: Value = serde_json::from_str(text).map_err(|e| {
                TransformError::InvalidObject(format!("object #{i} is not JSON: {e}"))
            })?;
            answer(&original, &spec)
        })
        .collect()
}

/// The RFC 6902 patch from `original` to `edited`, serialized.
fn patch_text(original: &Value, edited: &Value) -> Result<Outcome, TransformError> {
    serde_json::to_string(&json_patch::diff(original, edited))
        .map(Outcome::Patch)
        .map_err(|e| TransformError::Failed(format!("cannot serialize patch: {e}")))
}

/// Native test helper: run `O` over typed objects and return the edited objects (omitted ones
/// as `None`), applying the patches exactly as the host would.
pub fn apply_native<O: Operand>(
    objects: &[Value],
    spec: &Value,
    ctx: &TransformContext,
) -> Result<Vec<Option<Value>>, TransformError> {
    let texts: Vec<String> = objects.iter().map(Value::to_string).collect();
    let outcomes = run_operand::<O>(&texts, &spec.to_string(), ctx)?;
    Ok(outcomes
        .into_iter()
        .zip(objects)
        .map(|(o, obj)| match o {
            Outcome::Omit => None,
            Outcome::Patch(p) => {
                let patch: json_patch::Patch = serde_json::from_str(&p).expect("SDK patches parse");
                let mut doc = obj.clone();
                json_patch::patch(&mut doc, &patch).expect("SDK patches apply");
                Some(doc)
            }
        })
        .collect())
}
