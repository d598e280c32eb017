//! Standard plugin of the `operator-validation` state: the operator validator DaemonSet
//! `nvidia-operator-validator` (upstream `TransformValidator`, gpu-operator.md §3.9).

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::pod::{ds_name, pod_spec, set_nri_annotation, set_runtime_class};
use kiln_plugin_std::validator::{
    OPERATOR_COMPONENTS, apply_validator_shared, transform_validator_component,
};
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError, log_warn};

/// The `operator-validation` operand.
pub struct OperatorValidation;

impl Operand for OperatorValidation {
    const NAME: &'static str = "operator-validation";

    /// Upstream order: the shared validator edits on container[0] (an unresolvable image is an
    /// error); runtime class; NRI annotation on `toolkit-validation`; then the components
    /// driver, nvidia-fs, gdrcopy, toolkit, cuda, plugin (the cuda and plugin validators read the
    /// runtime class set just before). Component errors are only logged, as upstream.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let pod = pod_spec(ds);
        apply_validator_shared(pod, &name, spec, ctx)?;
        set_runtime_class(pod, spec, ctx);
        set_nri_annotation(ds, spec, "toolkit-validation");
        let pod = pod_spec(ds);
        for component in OPERATOR_COMPONENTS {
            if let Err(e) = transform_validator_component(pod, spec, ctx, component) {
                log_warn(&format!("validator component {component}: {e}"));
            }
        }
        Ok(())
    }
}

kiln_plugin_std::export_operand!(OperatorValidation);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<OperatorValidation>(
            env!("CARGO_MANIFEST_DIR"),
            12,
        );
    }
}
