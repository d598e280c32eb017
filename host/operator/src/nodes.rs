//! Node labelling (upstream node-labeling controller, `gpu-operator.md` §2.3): list the nodes,
//! compute each node's minimal label patch with [`kiln_core::labels::plan_node_labels`], and send
//! it as a JSON merge patch on `metadata.labels` (never a full update). Nodes already labelled
//! get no request.

use k8s_openapi::api::core::v1::Node;
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

/// List every node (the caller also derives cluster facts from them).
///
/// # Errors
/// [`Error::Kube`] when the list fails.
pub async fn list_nodes(client: &Client) -> Result<Vec<Node>> {
    let api: Api<Node> = Api::all(client.clone());
    Ok(api
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube("list nodes", e))?
        .items)
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
