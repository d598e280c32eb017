//! Standard plugin of the `driver` state: the NVIDIA driver DaemonSet
//! (upstream `TransformDriver`, gpu-operator.md §3.1).
//!
//! `DRIVER_CONFIG_DIGEST` is upstream's value for the same final pod spec ([`digest`]).
//!
//! Deliberate differences from upstream:
//! - The OpenShift Driver Toolkit variant is not rendered: `openshift-driver-toolkit-ctr` is
//!   always removed (the context carries no DTK ImageStream facts). An NVIDIADriver's pools get
//!   it host-side, from the cluster facts the host is given
//!   (`kiln_render::nvidiadriver::finish_openshift`).
//! - Precompiled drivers: the plugin sets the per-kernel image, the `nvidia.com/precompiled`
//!   labels and the kernel nodeSelector; the per-kernel DaemonSet *name* is the host's (plugins
//!   may not rename objects; [`image::sanitize_kernel`] gives upstream's suffix).
//! - The OpenShift cluster proxy env and trusted-CA mount are not applied (not in the context;
//!   for an NVIDIADriver the host applies them with the Driver Toolkit).

use kiln_plugin_std::driver_family::{DRIVER_MANAGER, transform_driver_manager};
use kiln_plugin_std::env::set_env;
use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::pod::{
    apply_host_network, ds_name, init_container, pod_spec, template_labels,
};
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError};

pub mod container;
pub mod digest;
pub mod image;
pub mod sidecars;
pub mod volumes;

/// Node label selecting the nodes of one kernel (precompiled drivers).
pub const KERNEL_LABEL: &str = "feature.node.kubernetes.io/kernel-version.full";
/// Label marking precompiled driver DaemonSets and pods.
pub const PRECOMPILED_LABEL: &str = "nvidia.com/precompiled";

/// The `driver` operand.
pub struct Driver;

impl Operand for Driver {
    const NAME: &'static str = "driver";

    /// Upstream `TransformDriver`, in order: k8s-driver-manager; nvidia-driver-ctr; peermem,
    /// nvidia-fs and gdrcopy sidecars; DTK removal; precompiled labels and nodeSelector;
    /// `DRIVER_CONFIG_DIGEST` on k8s-driver-manager and nvidia-driver-ctr; `driver.hostNetwork`.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let d = &spec.driver;
        let driver_image = image::driver_image(spec, ctx)?;
        let pod = pod_spec(ds);
        transform_driver_manager(
            pod,
            &name,
            "spec.driver.manager",
            &d.manager,
            Some(&d.rdma),
            d.common.resources.as_ref(),
            ctx,
        )?;
        container::transform(pod, &name, &driver_image, spec, ctx)?;
        sidecars::peermem(pod, &driver_image, spec, ctx)?;
        let gds = sidecars::ModuleSidecar {
            prefix: "nvidia-fs",
            path: "spec.gds",
            fallback_env: "GDS_IMAGE",
            spec: &spec.gds,
        };
        sidecars::module_sidecar(pod, &gds, spec, ctx)?;
        let gdrcopy = sidecars::ModuleSidecar {
            prefix: "nvidia-gdrcopy",
            path: "spec.gdrcopy",
            fallback_env: "GDRCOPY_IMAGE",
            spec: &spec.gdrcopy,
        };
        sidecars::module_sidecar(pod, &gdrcopy, spec, ctx)?;
        sidecars::remove_dtk(pod);
        if image::precompiled(spec) {
            let kernel = image::kernel(ctx)?.to_string();
            pod.node_selector
                .get_or_insert_with(Default::default)
                .insert(KERNEL_LABEL.into(), kernel);
            template_labels(ds).insert(PRECOMPILED_LABEL.into(), "true".into());
            ds.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(PRECOMPILED_LABEL.into(), "true".into());
        }
        let pod = pod_spec(ds);
        let value = digest::digest(pod);
        if let Some(m) = init_container(pod, DRIVER_MANAGER) {
            set_env(m, digest::ENV, value.clone());
        }
        for c in pod
            .containers
            .iter_mut()
            .filter(|c| c.name == container::MAIN || c.name == sidecars::DTK)
        {
            set_env(c, digest::ENV, value.clone());
        }
        apply_host_network(pod, d.common.host_network);
        Ok(())
    }
}

kiln_plugin_std::export_operand!(Driver);

#[cfg(test)]
mod tests;
