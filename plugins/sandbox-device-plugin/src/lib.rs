//! Standard plugin of the `sandbox-device-plugin` state: the KubeVirt GPU device plugin (upstream `TransformSandboxDevicePlugin`, gpu-operator.md §3.11).

use kiln_plugin_sdk::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_sdk::pod::{
    apply_component_basics, apply_host_network, ds_name, first_container, pod_spec,
    transform_validation_init_containers,
};
use kiln_plugin_sdk::{ClusterPolicySpec, Operand, TransformContext, TransformError, env, image};

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
        let name = ds_name(ds);
        let c = &spec.sandbox_device_plugin;
        let img = image::resolve_image(
            "spec.sandboxDevicePlugin",
            c.into(),
            "SANDBOX_DEVICE_PLUGIN_IMAGE",
            ctx,
        )?;
        let pod = pod_spec(ds);
        transform_validation_init_containers(pod, spec, ctx)?;
        apply_component_basics(pod, &name, None, &img, c)?;
        env::apply_env(first_container(pod, &name)?, &c.env);
        apply_host_network(pod, c.host_network);
        Ok(())
    }
}

kiln_plugin_sdk::export_operand!(SandboxDevicePlugin);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cases");
        let files = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(
            kiln_plugin_sdk::testing::run_cases::<SandboxDevicePlugin>(&dir),
            files
        );
        assert!(files >= 3);
    }
}
