//! Standard plugin of the `kata-manager` state. Upstream deprecated the Kata manager: the state
//! is never enabled (v26.7) and `nvidia-kata-manager` has no registered transform there. This
//! plugin keeps the state renderable with the v26.3 `TransformKataManager` basics, for clusters
//! that still carry the objects.

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::pod::apply_simple_component;
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError};

/// The `kata-manager` operand.
pub struct KataManager;

impl Operand for KataManager {
    const NAME: &'static str = "kata-manager";

    /// Image (`kataManager.*`, fallback `KATA_MANAGER_IMAGE`), pull policy, secrets,
    /// resources, args and env on container[0]; hostNetwork.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let c = &spec.kata_manager.common;
        apply_simple_component(
            ds,
            spec,
            ctx,
            "spec.kataManager",
            "KATA_MANAGER_IMAGE",
            c,
            &[],
        )
    }
}

kiln_plugin_std::export_operand!(KataManager);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<KataManager>(env!("CARGO_MANIFEST_DIR"), 1);
    }
}
