//! Standard plugin of the `cc-manager` state: the confidential-computing manager DaemonSet
//! (upstream `TransformCCManager`, gpu-operator.md §3.11).

use kiln_plugin_sdk::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_sdk::pod::{
    apply_component_basics, apply_host_network, ds_name, first_container, pod_spec,
};
use kiln_plugin_sdk::{ClusterPolicySpec, Operand, TransformContext, TransformError, env, image};

/// Env carrying the default CC mode.
pub const DEFAULT_CC_MODE_ENV: &str = "DEFAULT_CC_MODE";
/// The CRD's `ccManager.defaultMode` enum.
pub const CC_MODES: [&str; 3] = ["on", "off", "devtools"];

/// The `cc-manager` operand.
pub struct CcManager;

impl Operand for CcManager {
    const NAME: &'static str = "cc-manager";

    /// Image (`ccManager.*`, fallback `CC_MANAGER_IMAGE`), pull policy, secrets, resources,
    /// args; `DEFAULT_CC_MODE=<ccManager.defaultMode>` when set; env; hostNetwork. No validation
    /// init container and no runtime class.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let cc = &spec.cc_manager;
        let c = &cc.common;
        let mode = cc.default_mode.as_str();
        if !mode.is_empty() && !CC_MODES.contains(&mode) {
            return Err(TransformError::field(
                "spec.ccManager.defaultMode",
                format!("{mode:?} is not one of on, off, devtools"),
            ));
        }
        let img = image::resolve_image("spec.ccManager", c.into(), "CC_MANAGER_IMAGE", ctx)?;
        let pod = pod_spec(ds);
        apply_component_basics(pod, &name, None, &img, c)?;
        let ctr = first_container(pod, &name)?;
        if !mode.is_empty() {
            env::set_env(ctr, DEFAULT_CC_MODE_ENV, mode);
        }
        env::apply_env(ctr, &c.env);
        apply_host_network(pod, c.host_network);
        Ok(())
    }
}

kiln_plugin_sdk::export_operand!(CcManager);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cases");
        let files = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(
            kiln_plugin_sdk::testing::run_cases::<CcManager>(&dir),
            files
        );
        assert!(files >= 3);
    }
}
