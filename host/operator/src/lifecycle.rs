//! What the Helm chart's hook Jobs run on kiln's image, so that `helm upgrade` and
//! `helm uninstall` leave the cluster as NVIDIA's chart does:
//!
//! - [`apply_crds`] (`kiln operator apply-crds`, pre-upgrade hook when `operator.upgradeCRD`):
//!   Helm installs `crds/` once and never upgrades it, so the hook server-side applies the CRD
//!   built into this binary ([`crate::crd::crd`]);
//! - [`cleanup`] (`kiln operator cleanup`, post-delete hook): waits until the operator's pods
//!   are gone (so no reconcile re-labels a node), removes the node labels the operator wrote —
//!   `nvidia.com/gpu.present` and every deploy label of [`kiln_core::labels::known_deploy_keys`]
//!   (`nvidia.com/gpu.deploy.operands`, the user's opt-out, stays) — and with `--delete-crd`
//!   (`operator.cleanupCRD`) deletes both CRDs ([`CRDS`]: ClusterPolicy, then NVIDIADriver,
//!   each when present), which deletes every ClusterPolicy and NVIDIADriver, whose operands
//!   the garbage collector then removes.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kiln_core::labels::{GPU_PRESENT, known_deploy_keys};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Map, Value};

use crate::{Error, Result};

/// Name of the ClusterPolicy CRD.
pub const CRD_NAME: &str = "clusterpolicies.nvidia.com";
/// The NVIDIADriver CRD's name, also applied by [`apply_crds`].
pub const NVIDIA_DRIVER_CRD_NAME: &str = "nvidiadrivers.nvidia.com";
/// The GPUCluster CRD's name, also applied by [`apply_crds`].
pub const GPU_CLUSTER_CRD_NAME: &str = "gpuclusters.nvidia.com";
/// The CRDs this binary serves, in the order `cleanup --delete-crd` deletes them.
pub const CRDS: [&str; 2] = [CRD_NAME, NVIDIA_DRIVER_CRD_NAME];

/// Label selector of the operator's pods (the chart's Deployment template label).
pub const OPERATOR_POD_SELECTOR: &str = "app.kubernetes.io/name=kiln-operator";

/// Field manager of the CRD apply.
pub const FIELD_MANAGER: &str = "kiln";

/// How often the waits below look again.
const POLL: Duration = Duration::from_secs(1);

/// The keys of `labels` that [`cleanup`] removes: `nvidia.com/gpu.present` and the deploy
/// labels the operator manages, sorted.
pub fn labels_to_remove(labels: &BTreeMap<String, String>) -> Vec<String> {
    let mut keys: Vec<String> = known_deploy_keys()
        .into_iter()
        .chain([GPU_PRESENT.to_string()])
        .filter(|k| labels.contains_key(k))
        .collect();
    keys.sort();
    keys
}

/// The merge patch removing `keys` from a node's labels.
fn removal_patch(keys: &[String]) -> Value {
    let labels: Map<String, Value> = keys.iter().map(|k| (k.clone(), Value::Null)).collect();
    serde_json::json!({"metadata": {"labels": labels}})
}

/// Server-side apply the CRDs of this binary — ClusterPolicy ([`CRD_NAME`]), NVIDIADriver
/// ([`NVIDIA_DRIVER_CRD_NAME`]) and GPUCluster ([`GPU_CLUSTER_CRD_NAME`]) — with field manager `kiln`, forced, so they take over the
/// fields Helm's install wrote (Helm installs `crds/` once and never upgrades them). Returns
/// the ClusterPolicy CRD's `metadata.generation`.
///
/// # Errors
/// [`Error::Kube`] when an apply is refused.
pub async fn apply_crds(client: &Client) -> Result<i64> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut generation = 0;
    for (name, crd) in [
        (CRD_NAME, crate::crd::crd()),
        (NVIDIA_DRIVER_CRD_NAME, crate::crd::nvidia_driver_crd()),
        (GPU_CLUSTER_CRD_NAME, kiln_core::spec::gpucluster::crd()),
    ] {
        let applied = api
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&crd),
            )
            .await
            .map_err(|e| Error::kube(format!("apply CustomResourceDefinition {name}"), e))?;
        if name == CRD_NAME {
            generation = applied.metadata.generation.unwrap_or_default();
        }
    }
    Ok(generation)
}

/// What [`cleanup`] does.
#[derive(Debug, Clone)]
pub struct CleanupOptions {
    /// Namespace of the operator's pods.
    pub namespace: String,
    /// Their label selector ([`OPERATOR_POD_SELECTOR`]).
    pub operator_selector: String,
    /// Delete the CRDs ([`CRDS`]; and with them every ClusterPolicy and NVIDIADriver).
    pub delete_crd: bool,
    /// How long to wait for the operator's pods, and for each CRD, to be gone.
    pub timeout: Duration,
}

impl CleanupOptions {
    /// Defaults for `namespace`: the chart's selector, keep the CRDs, wait 120 s.
    pub fn new(namespace: &str) -> Self {
        CleanupOptions {
            namespace: namespace.into(),
            operator_selector: OPERATOR_POD_SELECTOR.into(),
            delete_crd: false,
            timeout: Duration::from_secs(120),
        }
    }
}

/// What [`cleanup`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Nodes whose labels were changed.
    pub nodes_relabelled: usize,
    /// The CRDs deleted, in [`CRDS`] order (none when kept; an absent one is left out).
    pub crds_deleted: Vec<String>,
}

/// Undo what the operator wrote outside its operands (see the module docs).
///
/// # Errors
/// [`Error::Kube`] on a refused request; [`Error::Timeout`] when the operator's pods or the
/// CRDs are still there after `opts.timeout` (each CRD gets its own `opts.timeout`).
pub async fn cleanup(client: &Client, opts: &CleanupOptions) -> Result<CleanupReport> {
    wait_for_no_operator(client, opts).await?;
    let nodes_relabelled = remove_node_labels(client).await?;
    let mut crds_deleted = Vec::new();
    if opts.delete_crd {
        for name in CRDS {
            if delete_crd(client, name, opts.timeout).await? {
                crds_deleted.push(name.to_string());
            }
        }
    }
    Ok(CleanupReport {
        nodes_relabelled,
        crds_deleted,
    })
}

async fn wait_for_no_operator(client: &Client, opts: &CleanupOptions) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &opts.namespace);
    let lp = ListParams::default().labels(&opts.operator_selector);
    let deadline = tokio::time::Instant::now() + opts.timeout;
    loop {
        let left = pods
            .list_metadata(&lp)
            .await
            .map_err(|e| Error::kube(format!("list operator pods in {}", opts.namespace), e))?
            .items
            .len();
        if left == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout(format!(
                "{left} operator pod(s) ({}) still in {}",
                opts.operator_selector, opts.namespace
            )));
        }
        tracing::info!(left, "waiting for the operator's pods to stop");
        tokio::time::sleep(POLL).await;
    }
}

/// Remove [`labels_to_remove`] from every node; returns how many nodes changed.
///
/// # Errors
/// [`Error::Kube`] when nodes cannot be listed or patched.
pub async fn remove_node_labels(client: &Client) -> Result<usize> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes
        .list_metadata(&ListParams::default())
        .await
        .map_err(|e| Error::kube("list nodes", e))?;
    let mut changed = 0;
    for node in list.items {
        let name = node.metadata.name.unwrap_or_default();
        let keys = labels_to_remove(&node.metadata.labels.unwrap_or_default());
        if keys.is_empty() {
            continue;
        }
        nodes
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(removal_patch(&keys)),
            )
            .await
            .map_err(|e| Error::kube(format!("remove labels of node {name}"), e))?;
        tracing::info!(node = %name, ?keys, "labels removed");
        changed += 1;
    }
    Ok(changed)
}

/// Delete the CRD `name` (one of [`CRDS`]) and wait until it is gone; `Ok(false)` when it
/// was absent.
///
/// # Errors
/// [`Error::Kube`] on a refused request; [`Error::Timeout`] when it is still there after
/// `timeout` (a finalizer on one of its objects, say).
pub async fn delete_crd(client: &Client, name: &str, timeout: Duration) -> Result<bool> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(e) if crate::is_not_found(&e) => return Ok(false),
        Err(e) => return Err(Error::kube(format!("delete CRD {name}"), e)),
    }
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = api
            .get_metadata_opt(name)
            .await
            .map_err(|e| Error::kube(format!("get CRD {name}"), e))?;
        if left.is_none() {
            tracing::info!(crd = name, "deleted");
            return Ok(true);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout(format!("CRD {name} still present")));
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_operators_labels_are_removed() {
        let labels: BTreeMap<String, String> = [
            ("nvidia.com/gpu.present", "true"),
            ("nvidia.com/gpu.deploy.driver", "true"),
            ("nvidia.com/gpu.deploy.device-plugin", "true"),
            ("nvidia.com/gpu.deploy.mig-manager", "true"),
            ("nvidia.com/gpu.deploy.operands", "false"),
            ("nvidia.com/gpu.product", "H100"),
            ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            labels_to_remove(&labels),
            [
                "nvidia.com/gpu.deploy.device-plugin",
                "nvidia.com/gpu.deploy.driver",
                "nvidia.com/gpu.deploy.mig-manager",
                "nvidia.com/gpu.present",
            ]
        );
        assert_eq!(
            removal_patch(&labels_to_remove(&labels))["metadata"]["labels"]["nvidia.com/gpu.present"],
            Value::Null
        );
        assert!(labels_to_remove(&BTreeMap::new()).is_empty());
    }

    #[test]
    fn the_crds_deleted_are_the_crds_served() {
        let served = [crate::crd::crd(), crate::crd::nvidia_driver_crd()];
        let names: Vec<Option<&str>> = served.iter().map(|c| c.metadata.name.as_deref()).collect();
        assert_eq!(
            names,
            [
                Some("clusterpolicies.nvidia.com"),
                Some("nvidiadrivers.nvidia.com")
            ]
        );
        assert_eq!(
            CRDS.map(Some).to_vec(),
            names,
            "cleanup --delete-crd deletes what apply-crds applies"
        );
    }
}
