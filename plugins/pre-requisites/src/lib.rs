//! Standard plugin of the `pre-requisites` state: the NVIDIA RuntimeClasses (upstream §1
//! placeholder rule and the §2.4 RuntimeClass control). The state has no DaemonSet.

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::monitoring::{kind, name};
use kiln_plugin_std::serde_json::{Value, json};
use kiln_plugin_std::{ClusterPolicySpec, Decision, Operand, TransformContext, TransformError};

/// The assets' placeholder for the operator-chosen RuntimeClass name and handler.
pub const PLACEHOLDER: &str = "FILLED_BY_OPERATOR";
/// RuntimeClasses that exist only with CDI enabled.
pub const CDI_ONLY: [&str; 2] = ["nvidia-legacy", "nvidia-cdi"];

/// The `pre-requisites` operand.
pub struct PreRequisites;

impl Operand for PreRequisites {
    const NAME: &'static str = "pre-requisites";
    const OBJECT_KINDS: &'static [&'static str] = &["RuntimeClass"];

    /// No DaemonSet belongs to this state; any is left as the common processing made it.
    fn daemonset(
        _ds: &mut DaemonSet,
        _spec: &ClusterPolicySpec,
        _ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        Ok(())
    }

    /// RuntimeClasses:
    /// - the placeholder one (name `FILLED_BY_OPERATOR`, or already named after
    ///   `operator.runtimeClass` when the host filled it) gets name and handler =
    ///   `operator.runtimeClass` (default `nvidia`);
    /// - `nvidia-legacy` and `nvidia-cdi` are omitted when `cdi.enabled` is false (upstream
    ///   deletes them).
    fn object(
        obj: &mut Value,
        spec: &ClusterPolicySpec,
        _ctx: &TransformContext,
    ) -> Result<Decision, TransformError> {
        if kind(obj) != "RuntimeClass" {
            return Ok(Decision::Keep);
        }
        let rc = spec.runtime_class().to_string();
        let n = name(obj).to_string();
        if n == PLACEHOLDER || (n == rc && !CDI_ONLY.contains(&n.as_str())) {
            if n == PLACEHOLDER {
                obj["metadata"]["name"] = json!(rc);
            }
            obj["handler"] = json!(rc);
            return Ok(Decision::Keep);
        }
        if CDI_ONLY.contains(&n.as_str()) && !spec.cdi.enabled() {
            return Ok(Decision::Omit);
        }
        Ok(Decision::Keep)
    }
}

kiln_plugin_std::export_operand!(PreRequisites);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<PreRequisites>(env!("CARGO_MANIFEST_DIR"), 4);
    }

    #[test]
    fn filled_name_is_not_renamed() {
        let mut rc = json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"}, "handler": "FILLED_BY_OPERATOR"});
        let d = PreRequisites::object(
            &mut rc,
            &ClusterPolicySpec::default(),
            &TransformContext::default(),
        )
        .unwrap();
        assert_eq!(d, Decision::Keep);
        assert_eq!(rc["metadata"]["name"], "nvidia");
        assert_eq!(rc["handler"], "nvidia");
    }
}
