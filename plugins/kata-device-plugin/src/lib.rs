//! Standard plugin of the `kata-device-plugin` state: the Kata sandbox device plugin (upstream `TransformKataDevicePlugin`, gpu-operator.md §3.11).

use kiln_plugin_sdk::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_sdk::pod::{
    apply_component_basics, apply_host_network, ds_name, first_container, pod_spec,
    transform_validation_init_containers,
};
use kiln_plugin_sdk::{ClusterPolicySpec, Operand, TransformContext, TransformError, env, image};

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
        let name = ds_name(ds);
        let c = &spec.kata_sandbox_device_plugin;
        let img = image::resolve_image(
            "spec.kataSandboxDevicePlugin",
            c.into(),
            "KATA_SANDBOX_DEVICE_PLUGIN_IMAGE",
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

kiln_plugin_sdk::export_operand!(KataDevicePlugin);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cases");
        let files = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(
            kiln_plugin_sdk::testing::run_cases::<KataDevicePlugin>(&dir),
            files
        );
        assert!(files >= 3);
    }
}
