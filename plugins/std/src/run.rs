//! The standard operand transform: upstream's common DaemonSet edits around each plugin's own,
//! run through the SDK's typed edits ([`kiln_plugin_sdk::transform_typed`]).

use k8s_openapi::api::apps::v1::DaemonSet;
use kiln_core::context::TransformContext;
use kiln_core::spec::ClusterPolicySpec;
use kiln_plugin_sdk::{Decision, Outcome, TransformError, apply_outcomes, transform_typed};
use serde_json::Value;

use crate::common::{apply_common_config, apply_common_metadata, apply_host_paths};

/// A standard operand transform. For each DaemonSet of the state it runs: common config and
/// host-path rewrites, then [`Operand::daemonset`], then common metadata (upstream
/// `preProcessDaemonSet` order); objects of the kinds in [`Operand::OBJECT_KINDS`] go to
/// [`Operand::object`]; every other object is kept unchanged without being parsed.
pub trait Operand {
    /// Plugin name; a standard plugin carries its state's name.
    const NAME: &'static str;

    /// Kinds (other than `DaemonSet`) that [`Operand::object`] edits or omits, e.g.
    /// `&["ServiceMonitor"]`. Objects of other kinds pass through unchanged and unparsed, which
    /// spares every call the parse and diff of the state's RBAC objects. Default: none. Native
    /// debug builds (the tests) check that `object` leaves unlisted kinds alone.
    const OBJECT_KINDS: &'static [&'static str] = &[];

    /// Edit one DaemonSet of the state.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError>;

    /// Edit (or omit) one object of a kind in [`Operand::OBJECT_KINDS`]. Default: keep
    /// unchanged.
    fn object(
        obj: &mut Value,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<Decision, TransformError> {
        let _ = (obj, spec, ctx);
        Ok(Decision::Keep)
    }
}

/// Run a standard [`Operand`] over a state's objects (section patches for DaemonSets, see
/// [`kiln_plugin_sdk::transform_typed`]).
///
/// # Errors
/// An unparsable spec (`InvalidField` naming the field), an object that is not a JSON object
/// or a DaemonSet that does not parse (`InvalidObject`), or whatever the operand returns.
pub fn run_operand<O: Operand>(
    objects: &[String],
    spec_json: &str,
    ctx: &TransformContext,
) -> Result<Vec<Outcome>, TransformError> {
    let spec = ClusterPolicySpec::from_json_str(spec_json)
        .map_err(|e| TransformError::field(e.path, e.message))?;
    transform_typed(
        objects,
        O::OBJECT_KINDS,
        |ds| {
            apply_common_config(ds, &spec)?;
            apply_host_paths(ds, &spec);
            O::daemonset(ds, &spec, ctx)?;
            apply_common_metadata(ds, &spec);
            Ok(())
        },
        |obj| O::object(obj, &spec, ctx),
    )
}

/// Native test helper: run `O` over typed objects and return the edited objects (omitted ones
/// as `None`), applying the patches exactly as the host would.
///
/// # Errors
/// Whatever [`run_operand`] returns.
pub fn apply_native<O: Operand>(
    objects: &[Value],
    spec: &Value,
    ctx: &TransformContext,
) -> Result<Vec<Option<Value>>, TransformError> {
    let texts: Vec<String> = objects.iter().map(Value::to_string).collect();
    let outcomes = run_operand::<O>(&texts, &spec.to_string(), ctx)?;
    apply_outcomes(objects, outcomes)
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
