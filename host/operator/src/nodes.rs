//! Node labelling (upstream node-labeling controller, `gpu-operator.md` §2.3): list the nodes
//! (in pages, each node slimmed to name, labels and container runtime),
//! compute each node's minimal label patch with [`kiln_core::labels::plan_node_labels`], and send
//! it as a JSON merge patch on `metadata.labels` (never a full update). Nodes already labelled
//! get no request.

use k8s_openapi::api::core::v1::{Node, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kiln_core::labels::{
    DEPLOY_PREFIX, GPU_PRESENT, GPU_PRODUCT, LabelPatch, LabelPolicy, MIG_CAPABLE, MIG_CONFIG,
    NFD_PREFIX, VGPU_HOST_DRIVER_VERSION, WORKLOAD_CONFIG, apply_patch, has_nfd_labels,
    is_gpu_node, plan_node_labels,
};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Map, Value};

use crate::facts::node_labels;
use crate::{Error, Result};

/// What labelling saw, for status and the transform context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSummary {
    /// Nodes with `nvidia.com/gpu.present=true` after this pass.
    pub gpu_nodes: usize,
    /// Whether any node carries an NFD label.
    pub nfd_present: bool,
    /// Nodes whose labels were patched.
    pub patched: usize,
}

/// The merge-patch body for `patch`: `{"metadata":{"labels":{k: v | null}}}`.
pub fn merge_patch_body(patch: &LabelPatch) -> Value {
    let labels: Map<String, Value> = patch
        .iter()
        .map(|(k, v)| (k.clone(), v.clone().map_or(Value::Null, Value::String)))
        .collect();
    serde_json::json!({"metadata": {"labels": labels}})
}

/// Nodes per list request: bounds the size of one response body (and so the process's peak
/// heap) however large the cluster is.
pub const NODE_PAGE: u32 = 100;

/// List every node, [`NODE_PAGE`] at a time, keeping of each only what the operator reads
/// ([`slim`]); the caller labels them and derives cluster facts from them.
///
/// # Errors
/// [`Error::Kube`] when a page fails.
pub async fn list_nodes(client: &Client) -> Result<Vec<Node>> {
    let api: Api<Node> = Api::all(client.clone());
    let mut nodes = Vec::new();
    let mut params = ListParams::default().limit(NODE_PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| Error::kube("list nodes", e))?;
        nodes.extend(page.items.into_iter().map(slim));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(nodes),
        }
    }
}

/// A node reduced to what labelling and [`crate::facts`] read: name, labels and
/// `status.nodeInfo.containerRuntimeVersion`. Everything else (managed fields, annotations,
/// conditions, images, capacity) is dropped, so a 500-node list costs a fraction of the memory.
pub fn slim(node: Node) -> Node {
    let runtime = node
        .status
        .and_then(|s| s.node_info)
        .map(|i| i.container_runtime_version);
    Node {
        metadata: ObjectMeta {
            name: node.metadata.name,
            labels: node.metadata.labels,
            ..ObjectMeta::default()
        },
        spec: None,
        status: runtime.map(|v| NodeStatus {
            node_info: Some(NodeSystemInfo {
                container_runtime_version: v,
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        }),
    }
}

/// Label every node per `policy`; `nodes` are updated in place to what they now carry.
///
/// # Errors
/// [`Error::Kube`] naming the node when a patch fails.
pub async fn label_nodes(
    client: &Client,
    nodes: &mut [Node],
    policy: &LabelPolicy,
) -> Result<NodeSummary> {
    let api: Api<Node> = Api::all(client.clone());
    let mut summary = NodeSummary::default();
    for node in nodes.iter_mut() {
        let labels = node_labels(node);
        let patch = plan_node_labels(&labels, policy);
        let name = node.metadata.name.clone().unwrap_or_default();
        if !patch.is_empty() {
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(merge_patch_body(&patch)),
            )
            .await
            .map_err(|e| Error::kube(format!("patch labels of node {name}"), e))?;
            tracing::info!(node = %name, changes = ?patch, "labelled node");
            node.metadata.labels = Some(apply_patch(&labels, &patch));
            summary.patched += 1;
        }
        let now = node_labels(node);
        summary.gpu_nodes += usize::from(is_gpu_node(&now));
        summary.nfd_present |= has_nfd_labels(&now);
    }
    Ok(summary)
}

/// Whether the operator reads node label `key`: NFD labels (GPU PCI presence, OS and kernel
/// facts), `nvidia.com/gpu.present`, the deploy/opt-out labels, the workload config, MIG
/// capability and config, the GPU product and the vGPU host driver version. Everything else —
/// GFD's `nvidia.com/gfd.timestamp` (rewritten every minute), its counts, memory and CUDA
/// labels — changes nothing the operator decides.
pub fn reads_label(key: &str) -> bool {
    key.starts_with(NFD_PREFIX)
        || key.starts_with(DEPLOY_PREFIX)
        || [
            GPU_PRESENT,
            WORKLOAD_CONFIG,
            MIG_CAPABLE,
            MIG_CONFIG,
            GPU_PRODUCT,
            VGPU_HOST_DRIVER_VERSION,
        ]
        .contains(&key)
}

/// The node-watch predicate: a hash of the labels [`reads_label`] keeps, so a node event
/// wakes the reconciler only when one of them changed (used with kube-runtime's
/// `WatchStreamExt::predicate_filter`).
pub fn relevant_labels_hash<K: kube::Resource>(node: &K) -> Option<u64> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    node.meta()
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| reads_label(k))
        .for_each(|kv| kv.hash(&mut h));
    Some(h.finish())
}

/// The node events that should wake the reconciler: applied nodes whose
/// [`relevant_labels_hash`] changed (a new node counts as changed).
pub fn node_triggers<K, S>(events: S) -> impl futures::Stream<Item = ()>
where
    K: kube::Resource + Send + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send,
    S: futures::Stream<
            Item = Result<kube::runtime::watcher::Event<K>, kube::runtime::watcher::Error>,
        > + Send,
{
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    events
        .applied_objects()
        .predicate_filter(relevant_labels_hash, Default::default())
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta_node(labels: serde_json::Value) -> kube::core::PartialObjectMeta<Node> {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": "gpu-node-1", "uid": "u1", "labels": labels}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn gfd_churn_wakes_nothing_deploy_labels_do() {
        use futures::StreamExt;
        use kube::runtime::watcher::Event;
        let base = serde_json::json!({"nvidia.com/gpu.present": "true",
            "nvidia.com/gfd.timestamp": "1", "nvidia.com/gpu.count": "1"});
        let mut churned = base.clone();
        churned["nvidia.com/gfd.timestamp"] = "2".into();
        churned["nvidia.com/gpu.memory"] = "81920".into();
        let mut opted_out = churned.clone();
        opted_out["nvidia.com/gpu.deploy.operands"] = "false".into();
        let events = [base.clone(), churned.clone(), churned, opted_out]
            .into_iter()
            .map(|l| Ok(Event::Apply(meta_node(l))));
        let woke = node_triggers(futures::stream::iter(events)).count().await;
        assert_eq!(woke, 2, "the first sight of the node, then the opt-out");
        assert!(reads_label(
            "feature.node.kubernetes.io/kernel-version.full"
        ));
        assert!(reads_label("nvidia.com/mig.capable"));
        assert!(!reads_label("nvidia.com/gfd.timestamp"));
        assert!(!reads_label("nvidia.com/cuda.driver.major"));
    }

    #[test]
    fn slim_keeps_name_labels_and_runtime_only() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "gpu-node-1",
                "labels": {"nvidia.com/gpu.present": "true"},
                "annotations": {"a": "b"},
                "managedFields": [{"manager": "kwok", "operation": "Update"}],
            },
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {
                "nodeInfo": {"containerRuntimeVersion": "containerd://1.7.0", "kernelVersion": "6.8.0",
                    "architecture": "amd64", "bootID": "", "kubeProxyVersion": "", "kubeletVersion": "",
                    "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""},
                "capacity": {"nvidia.com/gpu": "1"},
            },
        }))
        .unwrap();
        let slim = serde_json::to_value(slim(node)).unwrap();
        assert_eq!(
            slim["metadata"],
            serde_json::json!({
            "name": "gpu-node-1", "labels": {"nvidia.com/gpu.present": "true"}})
        );
        assert_eq!(slim.get("spec"), None);
        assert_eq!(slim["status"].as_object().unwrap().len(), 1);
        assert_eq!(
            slim["status"]["nodeInfo"]["containerRuntimeVersion"],
            "containerd://1.7.0"
        );
        assert_eq!(slim["status"]["nodeInfo"]["kernelVersion"], "");
    }

    #[test]
    fn merge_patch_sets_and_removes() {
        let patch: LabelPatch = [
            (
                "nvidia.com/gpu.present".to_string(),
                Some("true".to_string()),
            ),
            ("nvidia.com/gpu.deploy.driver".to_string(), None),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            merge_patch_body(&patch),
            serde_json::json!({"metadata": {"labels": {
                "nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.driver": null}}})
        );
    }
}
