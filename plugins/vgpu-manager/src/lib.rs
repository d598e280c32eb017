//! Standard plugin of the `vgpu-manager` state: the NVIDIA vGPU host driver DaemonSet
//! (upstream `TransformVGPUManager`, gpu-operator.md §3.11).
//!
//! As in the driver plugin, the OpenShift Driver Toolkit variant is not rendered:
//! `openshift-driver-toolkit-ctr` is always removed (the context has no DTK ImageStream facts).

use kiln_plugin_std::driver_family::{
    config_map_mounts, config_map_volume, os_tag, transform_driver_manager, with_os_tag,
};
use kiln_plugin_std::env::{apply_env, set_env};
use kiln_plugin_std::image::{ImageFields, resolve_image};
use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::pod::{
    add_pull_secrets, add_volume, apply_host_network, ds_name, pod_spec, remove_container,
    require_container, set_main_image, set_resources_all,
};
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError};

/// The vGPU manager's main container.
pub const MAIN: &str = "nvidia-vgpu-manager-ctr";

/// The `vgpu-manager` operand.
pub struct VgpuManager;

impl Operand for VgpuManager {
    const NAME: &'static str = "vgpu-manager";

    /// Upstream `TransformVGPUManager`, in order: the k8s-driver-manager init container from
    /// `vgpuManager.driverManager`; `nvidia-vgpu-manager-ctr` (an error if missing): image
    /// (`vgpuManager.*`, fallback `VGPU_MANAGER_IMAGE`) + `-<osTag>`, pull policy, pull secrets,
    /// resources (all containers), args; `OPENSHIFT_VERSION` on OpenShift; `vgpuManager.env` on
    /// containers[0]; `kernelModuleConfig` per-key mounts under `/drivers`; DTK sidecar removal;
    /// `vgpuManager.hostNetwork`.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let v = &spec.vgpu_manager;
        let c = &v.common;
        let pod = pod_spec(ds);
        let path = "spec.vgpuManager.driverManager";
        transform_driver_manager(pod, &name, path, &v.driver_manager, None, None, ctx)?;
        let img = resolve_image(
            "spec.vgpuManager",
            ImageFields::from(c),
            "VGPU_MANAGER_IMAGE",
            ctx,
        )?;
        let img = with_os_tag(&img, &os_tag(ctx, "vGPU manager")?);
        let ctr = require_container(pod, &name, MAIN)?;
        set_main_image(ctr, &img, &c.image_pull_policy);
        add_pull_secrets(pod, &c.image_pull_secrets);
        set_resources_all(pod, c.resources.as_ref());
        let ctr = require_container(pod, &name, MAIN)?;
        if !c.args.is_empty() {
            ctr.args = Some(c.args.clone());
        }
        if let Some(ocp) = ctx.openshift_version.as_deref() {
            set_env(ctr, "OPENSHIFT_VERSION", ocp);
        }
        if let Some(first) = pod.containers.first_mut() {
            apply_env(first, &c.env);
        }
        let cm = &v.kernel_module_config.name;
        if !cm.is_empty() {
            let field = "spec.vgpuManager.kernelModuleConfig.name";
            let (mounts, items) = config_map_mounts(ctx, cm, "/drivers", field)?;
            let ctr = require_container(pod, &name, MAIN)?;
            ctr.volume_mounts
                .get_or_insert_with(Vec::new)
                .extend(mounts);
            add_volume(pod, config_map_volume(cm, items));
        }
        remove_container(pod, "openshift-driver-toolkit-ctr");
        apply_host_network(pod, c.host_network);
        Ok(())
    }
}

kiln_plugin_std::export_operand!(VgpuManager);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<VgpuManager>(env!("CARGO_MANIFEST_DIR"), 5);
    }
}
