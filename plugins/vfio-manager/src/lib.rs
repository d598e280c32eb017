//! Standard plugin of the `vfio-manager` state: binds GPUs to vfio-pci for VM passthrough
//! (upstream `TransformVFIOManager`, gpu-operator.md §3.11).

use kiln_plugin_std::driver_family::transform_driver_manager;
use kiln_plugin_std::env::apply_env;
use kiln_plugin_std::image::{ImageFields, resolve_image};
use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::pod::{
    apply_component_basics, apply_host_network, ds_name, first_container, pod_spec,
};
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError};

/// The `vfio-manager` operand.
pub struct VfioManager;

impl Operand for VfioManager {
    const NAME: &'static str = "vfio-manager";

    /// Upstream `TransformVFIOManager`, in order: the k8s-driver-manager init container from
    /// `vfioManager.driverManager` (resources = `vfioManager.resources`, 26.7); image
    /// (`vfioManager.*`, fallback `VFIO_MANAGER_IMAGE`), pull policy, pull secrets, resources
    /// (all containers), args and env on containers[0]; `vfioManager.hostNetwork`.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let v = &spec.vfio_manager;
        let c = &v.common;
        let pod = pod_spec(ds);
        let path = "spec.vfioManager.driverManager";
        let res = c.resources.as_ref();
        transform_driver_manager(pod, &name, path, &v.driver_manager, None, res, ctx)?;
        let img = resolve_image(
            "spec.vfioManager",
            ImageFields::from(c),
            "VFIO_MANAGER_IMAGE",
            ctx,
        )?;
        apply_component_basics(pod, &name, None, &img, c)?;
        apply_env(first_container(pod, &name)?, &c.env);
        apply_host_network(pod, c.host_network);
        Ok(())
    }
}

kiln_plugin_std::export_operand!(VfioManager);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<VfioManager>(env!("CARGO_MANIFEST_DIR"), 4);
    }
}
