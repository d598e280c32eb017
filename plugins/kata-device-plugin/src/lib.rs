//! Standard plugin of the `kata-device-plugin` state: the Kata sandbox device plugin (upstream `TransformKataDevicePlugin`, gpu-operator.md §3.11).

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::pod::apply_simple_component;
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError};

/// The `kata-device-plugin` operand.
pub struct KataDevicePlugin;

impl Operand for KataDevicePlugin {
    const NAME: &'static str = "kata-device-plugin";

    /// Validation init containers; image (`kataSandboxDevicePlugin.*`, fallback `KATA_SANDBOX_DEVICE_PLUGIN_IMAGE`), pull policy, secrets
    /// (de-duplicated with the validator's), resources, args and env on container[0];
    /// hostNetwork. Sandbox operands never get a runtime class.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let c = &spec.kata_sandbox_device_plugin;
        let fallback = "KATA_SANDBOX_DEVICE_PLUGIN_IMAGE";
        apply_simple_component(
            ds,
            spec,
            ctx,
            "spec.kataSandboxDevicePlugin",
            fallback,
            c,
            &[],
        )
    }
}

kiln_plugin_std::export_operand!(KataDevicePlugin);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<KataDevicePlugin>(env!("CARGO_MANIFEST_DIR"), 3);
    }
}
