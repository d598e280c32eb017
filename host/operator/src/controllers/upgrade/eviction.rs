//! Evictions the API server can check.
//!
//! The driver upgrade evicts GPU pods of a node in `pod-deletion-required` and any pod of a node
//! in `drain-required`. The operator holds `pods/eviction` `create` cluster-wide (RBAC cannot
//! scope it further), so the chart's admission policies (`deploy/helm/kiln/templates/
//! admission-policies.yaml`) decide which evictions its token may make. An eviction's admission
//! object is the `Eviction` alone (name and namespace; the pod is not shown), so the operator
//! states on it why it evicts ([`REASON_LABEL`]) and the node the pod runs on
//! ([`NODE_ANNOTATION`]); one policy checks the pod against the claim (bound to that node, and a
//! GPU pod for [`Reason::GpuPod`]), another the node (in the upgrade state of the reason). An
//! eviction without them is refused.

use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// Label of the `Eviction` naming why the operator evicts: [`Reason::label`].
pub const REASON_LABEL: &str = "kiln.dev/upgrade-eviction";
/// Annotation of the `Eviction` naming the node the pod runs on.
pub const NODE_ANNOTATION: &str = "kiln.dev/node";

/// Why the driver upgrade evicts a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A GPU pod of a node in `pod-deletion-required`.
    GpuPod,
    /// Any pod of a node in `drain-required`.
    Drain,
}

impl Reason {
    /// The [`REASON_LABEL`] value: `gpu-pod` or `drain`.
    pub fn label(self) -> &'static str {
        match self {
            Reason::GpuPod => "gpu-pod",
            Reason::Drain => "drain",
        }
    }
}

/// The `policy/v1` `Eviction` of pod `namespace/name` on `node` for `reason`.
pub fn eviction(namespace: &str, name: &str, node: &str, reason: Reason) -> Value {
    json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {REASON_LABEL: reason.label()},
            "annotations": {NODE_ANNOTATION: node},
        },
    })
}

/// Evicts pod `namespace/name`, which runs on `node`, for `reason` (POST
/// `pods/<name>/eviction` with [`eviction`]), as `kubectl drain` does: a PodDisruptionBudget
/// may refuse it (429).
///
/// # Errors
/// The API's refusal: 404 when the pod is gone, 429 from a PodDisruptionBudget, 403 from RBAC
/// or the chart's admission policies.
pub async fn evict(
    client: &Client,
    namespace: &str,
    name: &str,
    node: &str,
    reason: Reason,
) -> kube::Result<()> {
    let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    api.create_subresource::<Value, Value>(
        "eviction",
        name,
        &PostParams::default(),
        &eviction(namespace, name, node, reason),
    )
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eviction_states_its_reason_and_node() {
        let e = eviction("ns", "p", "gpu-node-1", Reason::Drain);
        assert_eq!(e["metadata"]["labels"][REASON_LABEL], "drain");
        assert_eq!(e["metadata"]["annotations"][NODE_ANNOTATION], "gpu-node-1");
        assert_eq!(e["metadata"]["name"], "p");
        assert_eq!(
            eviction("ns", "p", "n", Reason::GpuPod)["metadata"]["labels"][REASON_LABEL],
            "gpu-pod"
        );
    }
}
