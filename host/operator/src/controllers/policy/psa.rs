//! `psa.enabled`: label the operator namespace for Pod Security Admission, as NVIDIA's operator
//! does on every reconcile (`gpu-operator.md` §2.2 init): `pod-security.kubernetes.io/enforce`,
//! `audit` and `warn` set to `privileged`, since the operands run privileged. Other labels
//! (`enforce-version`, anything else) are left as they are; with `psa.enabled` false or unset
//! the namespace is not touched (labels set earlier stay). On OpenShift NVIDIA does it only
//! in its suggested namespace `nvidia-gpu-operator`; kiln follows.
//!
//! IO: one GET of the namespace per full reconcile with `psa.enabled`, and a merge patch of the
//! missing labels only. RBAC: `get` and `patch` on `namespaces`, granted by the operator's Role
//! in its own namespace (so on no other namespace).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Map, Value, json};

/// The Pod Security modes labelled.
pub const MODES: [&str; 3] = ["enforce", "audit", "warn"];
/// Prefix of the Pod Security Admission labels.
pub const LABEL_PREFIX: &str = "pod-security.kubernetes.io/";
/// The level every mode is set to.
pub const LEVEL: &str = "privileged";
/// The only namespace labelled on OpenShift (NVIDIA's suggested namespace there).
pub const OPENSHIFT_NAMESPACE: &str = "nvidia-gpu-operator";

/// Whether the namespace `namespace` is labelled at all: `psa.enabled`, and on OpenShift only
/// [`OPENSHIFT_NAMESPACE`].
pub fn applies(psa_enabled: bool, openshift: bool, namespace: &str) -> bool {
    psa_enabled && (!openshift || namespace == OPENSHIFT_NAMESPACE)
}

/// The merge patch that brings `labels` to `privileged` for every mode of [`MODES`], or `None`
/// when they already are.
pub fn patch(labels: &BTreeMap<String, String>) -> Option<Value> {
    let missing: Map<String, Value> = MODES
        .iter()
        .map(|m| format!("{LABEL_PREFIX}{m}"))
        .filter(|k| labels.get(k).map(String::as_str) != Some(LEVEL))
        .map(|k| (k, Value::String(LEVEL.into())))
        .collect();
    (!missing.is_empty()).then(|| json!({"metadata": {"labels": missing}}))
}

/// Label `namespace` when [`applies`]. Returns whether a patch was sent.
///
/// # Errors
/// The GET or PATCH error (the caller logs it: a missing grant must not stop the reconcile).
pub async fn ensure(
    client: &Client,
    namespace: &str,
    psa_enabled: bool,
    openshift: bool,
) -> kube::Result<bool> {
    if !applies(psa_enabled, openshift, namespace) {
        return Ok(false);
    }
    let api: Api<Namespace> = Api::all(client.clone());
    let labels = api
        .get(namespace)
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    let Some(body) = patch(&labels) else {
        return Ok(false);
    };
    api.patch(namespace, &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    tracing::info!(%namespace, "labelled the namespace for Pod Security Admission (privileged)");
    Ok(true)
}

/// The reconcile's hook: [`ensure`] for the policy's `psa.enabled`, with a failure logged (a
/// missing grant must not stop the operands); and the OpenShift Driver Toolkit gauge (NVIDIA
/// requests the toolkit on OpenShift unless `operator.use_ocp_driver_toolkit` is false; kiln
/// never uses it).
pub async fn reconcile_hook(
    ctx: &crate::Context,
    spec: &kiln_core::spec::ClusterPolicySpec,
    openshift: bool,
) {
    let enabled = spec.psa.as_ref().and_then(|p| p.enabled) == Some(true);
    let ns = &ctx.config.namespace;
    match ensure(&ctx.client, ns, enabled, openshift).await {
        Ok(wrote) => ctx.metrics.writes("label", u64::from(wrote)),
        Err(e) => {
            tracing::warn!(namespace = %ns, error = %e, "cannot label the namespace for Pod Security Admission")
        }
    }
    ctx.metrics
        .driver_toolkit_requested(openshift && spec.operator.use_ocp_driver_toolkit != Some(false));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_missing_or_wrong_modes_are_patched() {
        let l = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            patch(&l(&[("kubernetes.io/metadata.name", "gpu-operator")])),
            Some(json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "privileged",
                "pod-security.kubernetes.io/audit": "privileged",
                "pod-security.kubernetes.io/warn": "privileged"}}}))
        );
        assert_eq!(
            patch(&l(&[
                ("pod-security.kubernetes.io/enforce", "baseline"),
                ("pod-security.kubernetes.io/audit", "privileged"),
                ("pod-security.kubernetes.io/warn", "privileged"),
                ("pod-security.kubernetes.io/enforce-version", "v1.31"),
            ])),
            Some(json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "privileged"}}}))
        );
        assert_eq!(
            patch(&l(&[
                ("pod-security.kubernetes.io/enforce", "privileged"),
                ("pod-security.kubernetes.io/audit", "privileged"),
                ("pod-security.kubernetes.io/warn", "privileged"),
            ])),
            None
        );
        assert!(applies(true, false, "gpu-operator"));
        assert!(!applies(false, false, "gpu-operator"));
        assert!(!applies(true, true, "gpu-operator"));
        assert!(applies(true, true, "nvidia-gpu-operator"));
    }
}
