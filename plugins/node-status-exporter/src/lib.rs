//! Standard plugin of the `node-status-exporter` state (upstream `TransformNodeStatusExporter`,
//! gpu-operator.md §3.10, and the §2.4 ServiceMonitor gate). The exporter is NVIDIA's
//! `nvidia-validator`, which kiln's image does not have: when the image resolves to kiln's, the
//! operator's `NODE_STATUS_EXPORTER_IMAGE` (NVIDIA's validator image) runs it instead.

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::monitoring::{kind, service_monitor_gate};
use kiln_plugin_std::pod::{
    apply_component_basics, apply_host_network, ds_name, first_container, fit_command_to_image,
    pod_spec, run_as_root,
};
use kiln_plugin_std::serde_json::Value;
use kiln_plugin_std::{
    ClusterPolicySpec, Decision, Operand, TransformContext, TransformError, env, image,
};

/// The operator's fallback image for the exporter when the validator image is kiln's.
pub const IMAGE_ENV: &str = "NODE_STATUS_EXPORTER_IMAGE";

/// The `node-status-exporter` operand.
pub struct NodeStatusExporter;

impl Operand for NodeStatusExporter {
    const NAME: &'static str = "node-status-exporter";
    const OBJECT_KINDS: &'static [&'static str] = &["ServiceMonitor"];

    /// Image (`nodeStatusExporter.*`, fallback `VALIDATOR_IMAGE`), pull policy, secrets,
    /// resources, args, env; container[0] `runAsUser: 0`; hostNetwork. No validation init
    /// container and no runtime class. The exporter runs the validator image's
    /// `nvidia-validator`; on kiln's image, which has none, the image is [`IMAGE_ENV`]'s.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let c = &spec.node_status_exporter;
        let mut img =
            image::resolve_image("spec.nodeStatusExporter", c.into(), "VALIDATOR_IMAGE", ctx)?;
        if image::is_kiln_image(&img) {
            img = ctx
                .fallback_image(IMAGE_ENV)
                .map(str::to_string)
                .ok_or_else(|| {
                    TransformError::field(
                        "spec.nodeStatusExporter",
                        format!(
                            "{img} is kiln's image, which has no nvidia-validator: set \
                         nodeStatusExporter's image or the operator's {IMAGE_ENV} (NVIDIA's \
                         validator image)"
                        ),
                    )
                })?;
        }
        let pod = pod_spec(ds);
        apply_component_basics(pod, &name, None, &img, c)?;
        let ctr = first_container(pod, &name)?;
        fit_command_to_image(ctr, Some(vec!["nvidia-validator".into()]));
        env::apply_env(ctr, &c.env);
        run_as_root(ctr);
        apply_host_network(pod, c.host_network);
        Ok(())
    }

    /// The ServiceMonitor is omitted without the ServiceMonitor CRD (the state being enabled is
    /// the host's decision); everything else is kept unchanged.
    fn object(
        obj: &mut Value,
        _spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<Decision, TransformError> {
        if kind(obj) == "ServiceMonitor" {
            return Ok(service_monitor_gate(ctx));
        }
        Ok(Decision::Keep)
    }
}

kiln_plugin_std::export_operand!(NodeStatusExporter);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<NodeStatusExporter>(env!("CARGO_MANIFEST_DIR"), 7);
    }
}
