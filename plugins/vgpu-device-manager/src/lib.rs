//! Standard plugin of the `vgpu-device-manager` state: the vGPU device manager DaemonSet
//! `nvidia-vgpu-device-manager` (upstream `TransformVGPUDeviceManager`, gpu-operator.md §3.11)
//! and its default ConfigMap (§2.4).

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::monitoring::default_config_map_gate;
use kiln_plugin_std::pod::{
    apply_component_basics, apply_host_network, ds_name, first_container, pod_spec,
    transform_validation_init_containers,
};
use kiln_plugin_std::serde_json::Value;
use kiln_plugin_std::{
    ClusterPolicySpec, Decision, Operand, TransformContext, TransformError, env, image,
};

/// The vGPU devices ConfigMap shipped with the state (upstream `VgpuDMDefaultConfigMapName`).
pub const DEFAULT_CONFIG_MAP: &str = "default-vgpu-devices-config";

/// The default vGPU config name (upstream `VgpuDMDefaultConfigName`).
pub const DEFAULT_CONFIG: &str = "default";

/// The `vgpu-device-manager` operand.
pub struct VgpuDeviceManager;

impl Operand for VgpuDeviceManager {
    const NAME: &'static str = "vgpu-device-manager";
    const OBJECT_KINDS: &'static [&'static str] = &["ConfigMap"];

    /// Upstream order, on container[0]: validation init containers; image
    /// (`vgpuDeviceManager.*`, fallback `VGPU_DEVICE_MANAGER_IMAGE`), pull policy, secrets,
    /// resources, args, env; the volume named like `vgpu-config` → ConfigMap `config.name` or
    /// `default-vgpu-devices-config`; `DEFAULT_VGPU_CONFIG=<config.default or "default">`;
    /// hostNetwork. No runtime class.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let vdm = &spec.vgpu_device_manager;
        let pod = pod_spec(ds);
        transform_validation_init_containers(pod, spec, ctx)?;
        let img = image::resolve_image(
            "spec.vgpuDeviceManager",
            (&vdm.common).into(),
            "VGPU_DEVICE_MANAGER_IMAGE",
            ctx,
        )?;
        apply_component_basics(pod, &name, None, &img, &vdm.common)?;
        env::apply_env(first_container(pod, &name)?, &vdm.common.env);
        let cm_name = non_empty(&vdm.config.name).unwrap_or(DEFAULT_CONFIG_MAP);
        if let Some(vol) = pod
            .volumes
            .iter_mut()
            .flatten()
            .find(|v| v.name.contains("vgpu-config"))
        {
            vol.config_map.get_or_insert_with(Default::default).name = cm_name.to_string();
        }
        let default = non_empty(&vdm.config.default).unwrap_or(DEFAULT_CONFIG);
        env::set_env(first_container(pod, &name)?, "DEFAULT_VGPU_CONFIG", default);
        apply_host_network(pod, vdm.common.host_network);
        Ok(())
    }

    /// §2.4: `default-vgpu-devices-config` is omitted when `vgpuDeviceManager.config.name`
    /// names a different ConfigMap.
    fn object(
        obj: &mut Value,
        spec: &ClusterPolicySpec,
        _ctx: &TransformContext,
    ) -> Result<Decision, TransformError> {
        Ok(default_config_map_gate(
            obj,
            DEFAULT_CONFIG_MAP,
            &spec.vgpu_device_manager.config.name,
        ))
    }
}

fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

kiln_plugin_std::export_operand!(VgpuDeviceManager);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<VgpuDeviceManager>(env!("CARGO_MANIFEST_DIR"), 4);
    }
}
