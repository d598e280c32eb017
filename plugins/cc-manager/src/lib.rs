//! Standard plugin of the `cc-manager` state: the confidential-computing manager DaemonSet
//! (upstream `TransformCCManager`, gpu-operator.md §3.11).

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::pod::apply_simple_component;
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError};

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
        let cc = &spec.cc_manager;
        let mode = cc.default_mode.as_str();
        if !mode.is_empty() && !CC_MODES.contains(&mode) {
            return Err(TransformError::field(
                "spec.ccManager.defaultMode",
                format!("{mode:?} is not one of on, off, devtools"),
            ));
        }
        let extra: &[(&str, &str)] = if mode.is_empty() {
            &[]
        } else {
            &[(DEFAULT_CC_MODE_ENV, mode)]
        };
        apply_simple_component(
            ds,
            spec,
            ctx,
            "spec.ccManager",
            "CC_MANAGER_IMAGE",
            &cc.common,
            extra,
        )
    }
}

kiln_plugin_std::export_operand!(CcManager);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<CcManager>(env!("CARGO_MANIFEST_DIR"), 3);
    }
}
