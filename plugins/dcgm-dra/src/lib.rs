//! Standard plugin of the `dcgm-dra` state of a GPUCluster: the standalone DCGM host engine
//! DaemonSet, which takes every GPU of its node through an admin-access ResourceClaimTemplate
//! instead of `nvidia.com/gpu` (NVIDIA v26.7.0's GPUCluster `dcgm` state).
//!
//! Image, pull policy, secrets, resources, args and env from the GPUCluster's `dcgm` (fallback
//! `DCGM_IMAGE`) and `dcgm.hostNetwork`; no runtime class (DRA hands the GPUs over through
//! CDI); the SDK has already applied `daemonsets.*`.

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::pod::{
    apply_component_basics, apply_host_network, ds_name, first_container, pod_spec,
};
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError, env, image};

/// The `dcgm-dra` operand.
pub struct DcgmDra;

impl Operand for DcgmDra {
    const NAME: &'static str = "dcgm-dra";

    /// Image and the component settings of `dcgm`, then its env; `hostNetwork`.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let c = &spec.dcgm.common;
        let img = image::resolve_image("spec.dcgm", c.into(), "DCGM_IMAGE", ctx)?;
        let pod = pod_spec(ds);
        apply_component_basics(pod, &name, None, &img, c)?;
        env::apply_env(first_container(pod, &name)?, &c.env);
        apply_host_network(pod, c.host_network);
        Ok(())
    }
}

kiln_plugin_std::export_operand!(DcgmDra);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<DcgmDra>(env!("CARGO_MANIFEST_DIR"), 2);
    }
}
