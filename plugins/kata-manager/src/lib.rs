//! Standard plugin of the `kata-manager` state. Upstream deprecated the Kata manager: the state
//! is never enabled (v26.7) and `nvidia-kata-manager` has no registered transform there. This
//! plugin keeps the state renderable with the v26.3 `TransformKataManager` basics, for clusters
//! that still carry the objects.

use kiln_plugin_sdk::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_sdk::pod::{
    apply_component_basics, apply_host_network, ds_name, first_container, pod_spec,
};
use kiln_plugin_sdk::{ClusterPolicySpec, Operand, TransformContext, TransformError, env, image};

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
        let name = ds_name(ds);
        let c = &spec.kata_manager;
        let img = image::resolve_image("spec.kataManager", c.into(), "KATA_MANAGER_IMAGE", ctx)?;
        let pod = pod_spec(ds);
        apply_component_basics(pod, &name, None, &img, c)?;
        env::apply_env(first_container(pod, &name)?, &c.env);
        apply_host_network(pod, c.host_network);
        Ok(())
    }
}

kiln_plugin_sdk::export_operand!(KataManager);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cases");
        let files = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(
            kiln_plugin_sdk::testing::run_cases::<KataManager>(&dir),
            files
        );
        assert!(files >= 1);
    }
}
