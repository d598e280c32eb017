//! Standard plugin of the `sandbox-validation` state: the sandbox validator DaemonSet
//! `nvidia-sandbox-validator` (upstream `TransformSandboxValidator`, gpu-operator.md §3.9).

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::pod::{apply_host_network, ds_name, pod_spec};
use kiln_plugin_std::validator::{
    SANDBOX_COMPONENTS, apply_validator_shared, transform_validator_component,
};
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError, log_warn};

/// The `sandbox-validation` operand.
pub struct SandboxValidation;

impl Operand for SandboxValidation {
    const NAME: &'static str = "sandbox-validation";

    /// Upstream order: the shared validator edits on container[0] (an unresolvable image is an
    /// error); the components cc-manager (removed when `ccManager` is disabled), vfio-pci,
    /// vgpu-manager, vgpu-devices (`DEFAULT_GPU_WORKLOAD_CONFIG` from the context's default
    /// workload, then `validator.<x>.env`); `validator.hostNetwork`. No runtime class. Component
    /// errors are only logged.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let pod = pod_spec(ds);
        apply_validator_shared(pod, &name, spec, ctx)?;
        for component in SANDBOX_COMPONENTS {
            if let Err(e) = transform_validator_component(pod, spec, ctx, component) {
                log_warn(&format!("sandbox validator component {component}: {e}"));
            }
        }
        apply_host_network(pod, spec.validator.common.host_network);
        Ok(())
    }
}

kiln_plugin_std::export_operand!(SandboxValidation);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<SandboxValidation>(env!("CARGO_MANIFEST_DIR"), 7);
    }
}
