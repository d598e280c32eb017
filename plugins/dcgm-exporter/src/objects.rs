//! Non-DaemonSet objects of the `dcgm-exporter` state (upstream §2.4 control functions).

use kiln_plugin_std::monitoring::{
    apply_service_monitor_spec, ensure_object, kind, name, service_monitor_gate,
};
use kiln_plugin_std::serde_json::{Value, json};
use kiln_plugin_std::{ClusterPolicySpec, Decision, TransformContext, TransformError};

use crate::needs_api_access;

/// The gated ClusterRole and ClusterRoleBinding.
pub const READ_PODS: &str = "nvidia-dcgm-exporter-read-pods";

/// - ClusterRole / ClusterRoleBinding `nvidia-dcgm-exporter-read-pods`: omitted unless pod-label
///   or pod-UID enrichment is on (spec flags or user env; `DCGM_EXPORTER_CONFIGMAP_DATA` does not
///   count);
/// - Service: `dcgmExporter.service.type` and `.internalTrafficPolicy` when set;
/// - ServiceMonitor: omitted unless `dcgmExporter.serviceMonitor.enabled` (nil = false) and the
///   ServiceMonitor CRD exists; kept ones get the tunables.
pub fn edit(
    obj: &mut Value,
    spec: &ClusterPolicySpec,
    ctx: &TransformContext,
) -> Result<Decision, TransformError> {
    let e = &spec.dcgm_exporter;
    match kind(obj) {
        "ClusterRole" | "ClusterRoleBinding" if name(obj) == READ_PODS => {
            if needs_api_access(e, false) {
                Ok(Decision::Keep)
            } else {
                Ok(Decision::Omit)
            }
        }
        "Service" => {
            let svc = &e.service;
            if !svc.type_.is_empty() {
                ensure_object(obj, "spec").insert("type".into(), json!(svc.type_));
            }
            if !svc.internal_traffic_policy.is_empty() {
                ensure_object(obj, "spec").insert(
                    "internalTrafficPolicy".into(),
                    json!(svc.internal_traffic_policy),
                );
            }
            Ok(Decision::Keep)
        }
        "ServiceMonitor" => {
            let sm = &e.service_monitor;
            if sm.enabled != Some(true) || service_monitor_gate(ctx) == Decision::Omit {
                return Ok(Decision::Omit);
            }
            apply_service_monitor_spec(obj, sm);
            Ok(Decision::Keep)
        }
        _ => Ok(Decision::Keep),
    }
}
