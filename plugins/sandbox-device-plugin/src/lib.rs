//! Standard plugin of the `sandbox-device-plugin` state: the KubeVirt GPU device plugin (upstream `TransformSandboxDevicePlugin`, gpu-operator.md §3.11).

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::pod::apply_simple_component;
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError};

/// The `sandbox-device-plugin` operand.
pub struct SandboxDevicePlugin;

impl Operand for SandboxDevicePlugin {
    const NAME: &'static str = "sandbox-device-plugin";

    /// Validation init containers; image (`sandboxDevicePlugin.*`, fallback `SANDBOX_DEVICE_PLUGIN_IMAGE`), pull policy, secrets
    /// (de-duplicated with the validator's), resources, args and env on container[0];
    /// hostNetwork. Sandbox operands never get a runtime class.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let c = &spec.sandbox_device_plugin;
        let fallback = "SANDBOX_DEVICE_PLUGIN_IMAGE";
        apply_simple_component(ds, spec, ctx, "spec.sandboxDevicePlugin", fallback, c, &[])
    }
}

kiln_plugin_std::export_operand!(SandboxDevicePlugin);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<SandboxDevicePlugin>(
            env!("CARGO_MANIFEST_DIR"),
            3,
        );
    }
}
