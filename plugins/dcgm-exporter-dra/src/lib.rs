//! Standard plugin of the `dcgm-exporter-dra` state of a GPUCluster: the metrics exporter
//! DaemonSet, which takes every GPU of its node through an admin-access ResourceClaimTemplate
//! and maps GPUs to pods through ResourceClaims (`KUBERNETES_ENABLE_DRA`), and its Service
//! (NVIDIA v26.7.0's GPUCluster `dcgm-exporter` state).
//!
//! From the GPUCluster's `dcgmExporter`: image (fallback `DCGM_EXPORTER_IMAGE`), pull policy,
//! secrets, resources, args, env, pod annotations, `hostPID`, `hostNetwork`, the pod-metadata
//! switches (`enablePodLabels`, `enablePodUID`, `podLabelAllowlistRegex`) and the Service's
//! `type` / `internalTrafficPolicy`; with the standalone host engine on (`dcgm.enabled`) the
//! exporter connects to its Service instead of running its own. `config` (a custom metrics
//! ConfigMap), `hpcJobMapping` and `serviceMonitor` are not rendered for a GPUCluster (NVIDIA's
//! goldens of this state show none of them).

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::k8s_openapi::api::core::v1::Container;
use kiln_plugin_std::pod::{
    apply_component_basics, apply_host_network, ds_name, first_container, pod_spec,
    template_annotations,
};
use kiln_plugin_std::serde_json::{Value, json};
use kiln_plugin_std::{
    ClusterPolicySpec, Decision, Operand, TransformContext, TransformError, env, image,
};

/// The standalone host engine of a GPUCluster (`dcgm-dra` state's Service, port 5555).
pub const REMOTE_HOSTENGINE: &str = "nvidia-dcgm-dra:5555";
/// Env naming the host engine the exporter connects to.
pub const REMOTE_HOSTENGINE_ENV: &str = "DCGM_REMOTE_HOSTENGINE_INFO";
/// The exporter's switch for GPU-to-pod mapping through ResourceClaims.
pub const ENABLE_DRA_ENV: &str = "KUBERNETES_ENABLE_DRA";

/// The `dcgm-exporter-dra` operand.
pub struct DcgmExporterDra;

/// Set `name=value` just before `KUBERNETES_ENABLE_DRA` (NVIDIA's env order), or append.
fn set_env_before_dra(ctr: &mut Container, name: &str, value: &str) {
    env::set_env(ctr, name, value);
    let list = ctr.env.get_or_insert_with(Vec::new);
    if let (Some(dra), Some(at)) = (
        list.iter().position(|e| e.name == ENABLE_DRA_ENV),
        list.iter().position(|e| e.name == name),
    ) && at > dra
    {
        let item = list.remove(at);
        list.insert(dra, item);
    }
}

impl Operand for DcgmExporterDra {
    const NAME: &'static str = "dcgm-exporter-dra";
    const OBJECT_KINDS: &'static [&'static str] = &["Service"];

    /// Image and component settings of `dcgmExporter`; the remote host engine with `dcgm`
    /// on; the pod-metadata env; user env last; annotations, `hostPID`, `hostNetwork`.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let e = &spec.dcgm_exporter;
        let c = &e.common;
        let img = image::resolve_image("spec.dcgmExporter", c.into(), "DCGM_EXPORTER_IMAGE", ctx)?;
        if !e.annotations.is_empty() {
            template_annotations(ds).extend(e.annotations.clone());
        }
        let pod = pod_spec(ds);
        apply_component_basics(pod, &name, None, &img, c)?;
        let ctr = first_container(pod, &name)?;
        if spec.dcgm.common.enabled == Some(true) {
            set_env_before_dra(ctr, REMOTE_HOSTENGINE_ENV, REMOTE_HOSTENGINE);
        }
        if e.enable_pod_labels == Some(true) {
            env::set_env(ctr, "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS", "true");
        }
        if e.enable_pod_uid == Some(true) {
            env::set_env(ctr, "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID", "true");
        }
        if !e.pod_label_allowlist_regex.is_empty() {
            env::set_env(
                ctr,
                "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX",
                e.pod_label_allowlist_regex.join(","),
            );
        }
        env::apply_env(ctr, &c.env);
        if e.host_pid == Some(true) {
            pod.host_pid = Some(true);
        }
        apply_host_network(pod, c.host_network);
        Ok(())
    }

    /// The Service's `type` and `internalTrafficPolicy` from `dcgmExporter.service`.
    fn object(
        obj: &mut Value,
        spec: &ClusterPolicySpec,
        _ctx: &TransformContext,
    ) -> Result<Decision, TransformError> {
        let s = &spec.dcgm_exporter.service;
        if !s.type_.is_empty() {
            obj["spec"]["type"] = json!(s.type_);
        }
        if !s.internal_traffic_policy.is_empty() {
            obj["spec"]["internalTrafficPolicy"] = json!(s.internal_traffic_policy);
        }
        Ok(Decision::Keep)
    }
}

kiln_plugin_std::export_operand!(DcgmExporterDra);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<DcgmExporterDra>(env!("CARGO_MANIFEST_DIR"), 2);
    }
}
