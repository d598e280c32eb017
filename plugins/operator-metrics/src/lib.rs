//! Standard plugin of the `operator-metrics` state: the operator's own metrics Service and
//! ServiceMonitor (upstream §2.4 ServiceMonitor control). The state has no DaemonSet.

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::monitoring::{apply_service_monitor_spec, kind, service_monitor_gate};
use kiln_plugin_std::serde_json::Value;
use kiln_plugin_std::{
    ClusterPolicySpec, Decision, Operand, TransformContext, TransformError, log_warn,
};

/// The `operator-metrics` operand.
pub struct OperatorMetrics;

impl Operand for OperatorMetrics {
    const NAME: &'static str = "operator-metrics";
    const OBJECT_KINDS: &'static [&'static str] = &["ServiceMonitor"];

    /// No DaemonSet belongs to this state; any is left as the common processing made it.
    fn daemonset(
        _ds: &mut DaemonSet,
        _spec: &ClusterPolicySpec,
        _ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        Ok(())
    }

    /// The Service `gpu-operator` is kept unchanged. The ServiceMonitor is omitted without the
    /// ServiceMonitor CRD; otherwise it is always kept (upstream: `enabled: false` only logs)
    /// and gets `operator.metrics.serviceMonitor`'s additional labels, interval, scrape
    /// timeout, honorLabels and relabelings.
    fn object(
        obj: &mut Value,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<Decision, TransformError> {
        if kind(obj) != "ServiceMonitor" {
            return Ok(Decision::Keep);
        }
        if service_monitor_gate(ctx) == Decision::Omit {
            return Ok(Decision::Omit);
        }
        let sm = &spec.operator.metrics.service_monitor;
        if sm.enabled == Some(false) {
            log_warn(
                "operator.metrics.serviceMonitor.enabled=false is ignored: the operator's ServiceMonitor is always created",
            );
        }
        apply_service_monitor_spec(obj, sm);
        Ok(Decision::Keep)
    }
}

kiln_plugin_std::export_operand!(OperatorMetrics);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<OperatorMetrics>(env!("CARGO_MANIFEST_DIR"), 4);
    }
}
