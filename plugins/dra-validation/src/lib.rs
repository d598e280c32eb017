//! Standard plugin of the `dra-validation` state of a GPUCluster: the DRA validator DaemonSet,
//! whose `gpu-validation` init container runs `nvidia-smi -L` on one GPU allocated through its
//! admin-access ResourceClaimTemplate (so the pod is ready only when DRA hands out GPUs), then
//! holds (NVIDIA v26.7.0's GPUCluster `dra-validation` state).
//!
//! Every container runs the validator image (`VALIDATOR_IMAGE`: a GPUCluster has no validator
//! block), pulled `IfNotPresent`, with `draDriver.imagePullSecrets`; the SDK has already applied
//! `daemonsets.*`.

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::pod::{add_pull_secrets, pod_spec, set_main_image};
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError};

/// The `dra-validation` operand.
pub struct DraValidation;

impl Operand for DraValidation {
    const NAME: &'static str = "dra-validation";

    /// The validator image on every container and init container; the DRA driver's pull
    /// secrets.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let image = ctx.fallback_image("VALIDATOR_IMAGE").ok_or_else(|| {
            TransformError::Failed("no validator image: the operator's VALIDATOR_IMAGE".into())
        })?;
        let pod = pod_spec(ds);
        for ctr in pod
            .containers
            .iter_mut()
            .chain(pod.init_containers.iter_mut().flatten())
        {
            set_main_image(ctr, image, "");
        }
        if let Some(d) = &spec.dra_driver {
            add_pull_secrets(pod, &d.image_pull_secrets);
        }
        Ok(())
    }
}

kiln_plugin_std::export_operand!(DraValidation);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<DraValidation>(env!("CARGO_MANIFEST_DIR"), 2);
    }
}
