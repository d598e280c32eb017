//! Standard plugin of the `gpu-feature-discovery` state: the GFD DaemonSet
//! `gpu-feature-discovery` (upstream `TransformGPUDiscoveryPlugin`, gpu-operator.md §3.5).

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::pod::{
    apply_component_basics, apply_host_network, apply_mig_env, ds_name, first_container,
    fit_command_to_image, handle_device_plugin_config, pod_spec, set_nri_annotation,
    set_runtime_class, transform_validation_init_containers,
};
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError, env, image};

/// Entrypoint of NVIDIA's GFD image, used when `gfd.*` does not resolve to kiln's image.
pub const UPSTREAM_ENTRYPOINT: &str = "gpu-feature-discovery";

/// The `gpu-feature-discovery` operand. Its RBAC objects stay as the assets have them,
/// NVIDIA's on every image: `kiln gfd` publishes labels as NVIDIA's GFD does (a NodeFeature
/// object, or the features.d file), never by patching the Node, so the ClusterRole only reads
/// nodes.
pub struct GpuFeatureDiscovery;

impl Operand for GpuFeatureDiscovery {
    const NAME: &'static str = "gpu-feature-discovery";

    /// Upstream order, on container[0]: validation init containers; image (`gfd.*`, fallback
    /// `GFD_IMAGE`), pull policy, secrets, resources, `gfd.args`; `USE_NODE_FEATURE_API=false`
    /// on OpenShift; `gfd.env`; device-plugin config (`devicePlugin.config`, device-plugin image
    /// for config-manager); runtime class; NRI annotation; MIG env (after the user env);
    /// `gfd.hostNetwork`.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let gfd = &spec.gfd;
        let pod = pod_spec(ds);
        transform_validation_init_containers(pod, spec, ctx)?;
        let img = image::resolve_image("spec.gfd", gfd.into(), "GFD_IMAGE", ctx)?;
        apply_component_basics(pod, &name, None, &img, gfd)?;
        let main = first_container(pod, &name)?;
        if ctx.openshift_version.is_some() {
            env::set_env(main, "USE_NODE_FEATURE_API", "false");
        }
        env::apply_env(main, &gfd.env);
        fit_command_to_image(main, Some(vec![UPSTREAM_ENTRYPOINT.into()]));
        let main_name = main.name.clone();
        handle_device_plugin_config(pod, spec, ctx)?;
        set_runtime_class(pod, spec, ctx);
        set_nri_annotation(ds, spec, &main_name);
        let pod = pod_spec(ds);
        let main = first_container(pod, &name)?;
        apply_mig_env(main, spec);
        if image::is_kiln_image(&img) {
            // NVIDIA's image carries these in its own environment; kiln's does not.
            env::set_env(main, "NVIDIA_VISIBLE_DEVICES", "all");
            env::set_env(main, "NVIDIA_DRIVER_CAPABILITIES", "compute,utility");
        }
        apply_host_network(pod, gfd.host_network);
        Ok(())
    }
}

kiln_plugin_std::export_operand!(GpuFeatureDiscovery);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<GpuFeatureDiscovery>(
            env!("CARGO_MANIFEST_DIR"),
            9,
        );
    }
}
