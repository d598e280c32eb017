//! Node labelling (upstream node-labeling controller, `gpu-operator.md` §2.3): list the nodes
//! (in pages, each node slimmed to name, labels and container runtime),
//! compute each node's minimal label patch with [`kiln_core::labels::plan_node_labels`], and send
//! it as a JSON merge patch on `metadata.labels` (never a full update). Nodes already labelled
//! get no request.

use k8s_openapi::api::core::v1::{Node, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kiln_core::labels::{
    LabelPatch, LabelPolicy, apply_patch, has_nfd_labels, is_gpu_node, plan_node_labels,
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

#[cfg(test)]
mod tests {
    use super::*;

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
