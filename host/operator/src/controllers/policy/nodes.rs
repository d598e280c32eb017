//! Node labelling (upstream node-labeling controller, `gpu-operator.md` §2.3): the nodes come
//! from the node store ([`watch_nodes`], each node decoded as a [`SlimNode`]: name, the
//! labels kiln may read, the container runtime, what the driver upgrade reads); a full reconcile computes each node's minimal label patch with
//! [`kiln_core::labels::plan_node_labels`], and a node event labels only that node. Patches are
//! JSON merge patches on `metadata.labels` (never a full update); nodes already labelled get no
//! request.
//!
//! ```text
//! node watch ─► SlimNode ─► NamedStore<SlimNode>
//!     └─ relevant labels/runtime changed? ─ no ─► nothing (GFD's gfd.timestamp, heartbeats)
//!                                           yes ─► label that node ─► Wake::reconcile
//!                                                  (readiness; full only when NodeFacts change)
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Node;
use kiln_core::labels::{LabelPatch, LabelPolicy, apply_patch, plan_node_labels};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Map, Value};

use crate::cluster::live::Wake;
pub use crate::cluster::node::SlimNode;
use crate::cluster::node::{Sym, is_upgrade_key, reads_label};
use crate::cluster::store::NamedWriter;
use crate::cluster::wakes::{self, NodeDigest, Wakes};
use crate::signals::metrics::Metrics;
use crate::{Error, Result};

/// GPU node count and NFD presence of `nodes` (for status), nothing patched.
pub fn summary(nodes: &[&SlimNode]) -> NodeSummary {
    let mut s = NodeSummary::default();
    for n in nodes {
        s.gpu_nodes += usize::from(n.is_gpu());
        s.nfd_present |= n.has_nfd();
    }
    s
}

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

/// A hash of what the driver upgrade reads of a node: its upgrade labels and annotations
/// ([`is_upgrade_key`]), `spec.unschedulable` and the `Ready` condition's status.
pub fn upgrade_hash(node: &SlimNode) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    node.labels()
        .iter()
        .filter(|(k, _)| is_upgrade_key(k))
        .for_each(|kv| kv.hash(&mut h));
    0xffu8.hash(&mut h);
    node.upgrade_annotations().for_each(|kv| kv.hash(&mut h));
    0xffu8.hash(&mut h);
    node.unschedulable().hash(&mut h);
    node.ready().hash(&mut h);
    h.finish()
}

/// Label one node per `policy` when it needs it. Returns whether a patch was sent.
///
/// # Errors
/// [`Error::Kube`] naming the node when the patch fails.
pub async fn label_node(client: &Client, node: &SlimNode, policy: &LabelPolicy) -> Result<bool> {
    let patch = plan_node_labels(&node.labels().to_map(), policy);
    if patch.is_empty() {
        return Ok(false);
    }
    patch_labels(&Api::all(client.clone()), node.name(), &patch).await?;
    Ok(true)
}

/// Send `patch` to node `name`'s labels (a JSON merge patch) and log it.
///
/// # Errors
/// [`Error::Kube`] naming the node when the patch fails.
async fn patch_labels(api: &Api<Node>, name: &str, patch: &LabelPatch) -> Result<()> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(merge_patch_body(patch)),
    )
    .await
    .map_err(|e| Error::kube(format!("patch labels of node {name}"), e))?;
    tracing::info!(node = %name, changes = ?patch, "labelled node");
    Ok(())
}

/// What node events need: the client (to label), the wake, the active policy's labelling
/// rules (`None` until a full reconcile set them) and the metrics.
pub struct NodeWatch {
    /// API client.
    pub client: Client,
    /// Wakes the controller after a relevant change.
    pub wake: Wake,
    /// The labelling rules of the active policy.
    pub labels: Arc<Mutex<Option<LabelPolicy>>>,
    /// Counts label writes.
    pub metrics: Arc<Metrics>,
    /// Where each node's readiness-timeline facts go when they change
    /// ([`crate::signals::timeline::run`]); `None`: nowhere.
    pub timeline: Option<futures::channel::mpsc::Sender<TimelineEvent>>,
    /// Told when the nodes' pools may have changed (the NVIDIADriver controller,
    /// [`crate::controllers::driver::run`]): a node added or deleted, or any label the store keeps
    /// ([`crate::cluster::node::kept_label`]) changed; `None`: nobody.
    pub pools: Option<futures::channel::mpsc::UnboundedSender<()>>,
}

/// A node watch event as the readiness timeline reads it.
pub type TimelineEvent = kube::runtime::watcher::Event<crate::signals::timeline::NodeFacts>;

/// A hash of what kiln reads of a node: the labels [`reads_label`] keeps and the container
/// runtime (a change of anything else, GFD's timestamp or a heartbeat, wakes nothing).
pub fn relevant_hash(node: &SlimNode) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    node.labels()
        .iter()
        .filter(|(k, _)| reads_label(k))
        .for_each(|kv| kv.hash(&mut h));
    node.runtime().hash(&mut h);
    h.finish()
}

/// A hash of `v` (to remember what was last seen of a node without keeping a copy).
fn hash_of(v: &impl std::hash::Hash) -> u64 {
    use std::hash::{DefaultHasher, Hasher};
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// Keep `writer`'s store of nodes ([`SlimNode`]) in step with the cluster, and on each
/// relevant change ([`relevant_hash`]) of one node label that node alone (the rules of the
/// last full reconcile) and wake the controller; a deleted node wakes it too. Runs until the
/// watch stream ends (never, with the default backoff).
pub async fn watch_nodes(w: NodeWatch, writer: NamedWriter<SlimNode>) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let stream = watcher(
        Api::<crate::cluster::node::WatchedNode>::all(w.client.clone()),
        crate::cluster::watch::config(),
    )
    .default_backoff()
    .map(|ev| ev.map(|ev| crate::cluster::store::map_event(ev, |w| w.object)));
    follow_nodes(w, writer, stream).await;
}

/// [`watch_nodes`] over the node watch events `stream` (tests feed their own).
pub async fn follow_nodes<S>(w: NodeWatch, mut writer: NamedWriter<SlimNode>, stream: S)
where
    S: futures::Stream<
            Item = Result<kube::runtime::watcher::Event<SlimNode>, kube::runtime::watcher::Error>,
        >,
{
    use futures::StreamExt;
    use kube::runtime::watcher;
    // Per node, what the wake-ups compare ([`wakes::node`]). Keys interned: the node store's
    // hostname label and the timeline share them.
    let mut seen: HashMap<Sym, NodeDigest> = HashMap::new();
    let pools = || {
        if let Some(tx) = &w.pools {
            // Closed: the NVIDIADriver controller is not running.
            let _ = tx.unbounded_send(());
        }
    };
    let timeline = |ev: TimelineEvent| {
        let tx = w.timeline.clone();
        async move {
            if let Some(mut tx) = tx {
                use futures::SinkExt;
                // Closed: the timeline has stopped; nothing else reads these.
                let _ = tx.send(ev).await;
            }
        }
    };
    let mut events = std::pin::pin!(stream.map(|ev| {
        ev.map(|ev| {
            let ev = crate::cluster::store::map_event(ev, Arc::new);
            writer.apply(&ev);
            ev
        })
    }));
    while let Some(ev) = events.next().await {
        let (to_label, wakes) = match ev {
            Err(e) => {
                tracing::warn!(error = %e, "node watch");
                continue;
            }
            Ok(watcher::Event::Init) => {
                timeline(watcher::Event::Init).await;
                seen.clear();
                continue;
            }
            Ok(watcher::Event::InitApply(n)) => {
                let facts = crate::signals::timeline::node_facts(&n);
                seen.insert(facts.name.clone(), digest(&n, &facts));
                timeline(watcher::Event::InitApply(facts)).await;
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                timeline(watcher::Event::InitDone).await;
                (None, Wakes::ALL)
            }
            Ok(watcher::Event::Delete(n)) => {
                let facts = crate::signals::timeline::node_facts(&n);
                let old = seen.remove(&facts.name);
                timeline(watcher::Event::Delete(facts)).await;
                (None, wakes::node(old.as_ref(), None))
            }
            Ok(watcher::Event::Apply(n)) => {
                // One interning of the name a node event: the timeline's facts carry it.
                let facts = crate::signals::timeline::node_facts(&n);
                let new = digest(&n, &facts);
                let old = seen.insert(facts.name.clone(), new);
                let wakes = wakes::node(old.as_ref(), Some(&new));
                if wakes.timeline {
                    timeline(watcher::Event::Apply(facts)).await;
                }
                (wakes.label.then_some(n), wakes)
            }
        };
        if wakes.upgrade {
            w.wake.upgrade();
        }
        if wakes.pools {
            pools();
        }
        if let Some(n) = to_label {
            let rules = w.labels.lock().expect("labels lock").clone();
            if let Some(rules) = rules {
                match label_node(&w.client, &n, &rules).await {
                    Ok(patched) => w.metrics.writes("label", u64::from(patched)),
                    Err(e) => tracing::warn!(node = %n.name(), error = %e, "labelling"),
                }
            }
        }
        if wakes.reconcile {
            w.wake.reconcile();
        }
    }
}

/// What the wake-ups compare of node `n` whose timeline facts are `facts`.
fn digest(n: &SlimNode, facts: &crate::signals::timeline::NodeFacts) -> NodeDigest {
    NodeDigest {
        read: relevant_hash(n),
        upgrade: upgrade_hash(n),
        timeline: hash_of(facts),
        labels: hash_of(n.labels()),
    }
}

/// Node label patches in flight at once in [`label_nodes`] (a first reconcile of a
/// 5,000-node cluster labels every node; one at a time that took minutes).
pub const LABEL_CONCURRENCY: usize = 16;

/// Label every node per `policy` ([`LABEL_CONCURRENCY`] patches at a time); each node that was
/// patched is replaced in `nodes` by a copy with the labels it now carries (the others stay the
/// store's own: no node is copied that did not change, so a full reconcile of 5,000 nodes at rest
/// copies none).
///
/// # Errors
/// [`Error::Kube`] naming the node when a patch fails (the other patches already sent stand).
pub async fn label_nodes(
    client: &Client,
    nodes: &mut [Arc<SlimNode>],
    policy: &LabelPolicy,
) -> Result<NodeSummary> {
    use futures::{StreamExt, TryStreamExt};
    let api: Api<Node> = Api::all(client.clone());
    let mut summary = NodeSummary::default();
    let patches: Vec<(usize, String, LabelPatch)> = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, node)| {
            let patch = plan_node_labels(&node.labels().to_map(), policy);
            (!patch.is_empty()).then(|| (i, node.name().to_string(), patch))
        })
        .collect();
    let done: Vec<(usize, LabelPatch)> = futures::stream::iter(patches)
        .map(|(i, name, patch)| {
            let api = &api;
            async move {
                patch_labels(api, &name, &patch).await?;
                Ok::<_, Error>((i, patch))
            }
        })
        .buffer_unordered(LABEL_CONCURRENCY)
        .try_collect()
        .await?;
    for (i, patch) in done {
        let node = &mut nodes[i];
        *node = Arc::new(node.with_labels(&apply_patch(&node.labels().to_map(), &patch)));
        summary.patched += 1;
    }
    for node in nodes.iter() {
        summary.gpu_nodes += usize::from(node.is_gpu());
        summary.nfd_present |= node.has_nfd();
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_labels_it_decides_by_not_gfds() {
        assert!(reads_label(
            "feature.node.kubernetes.io/kernel-version.full"
        ));
        assert!(reads_label("nvidia.com/gpu.deploy.operands"));
        assert!(reads_label("nvidia.com/mig.capable"));
        assert!(!reads_label("nvidia.com/gfd.timestamp"));
        assert!(!reads_label("nvidia.com/cuda.driver.major"));
        assert!(!reads_label("nvidia.com/gpu.memory"));
    }

    #[test]
    fn slim_keeps_what_labelling_and_the_driver_upgrade_read() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "gpu-node-1",
                "resourceVersion": "42",
                "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gfd.timestamp": "9",
                    "nvidia.com/gpu-driver-upgrade-state": "upgrade-done"},
                "annotations": {"a": "b",
                    "nvidia.com/gpu-driver-upgrade-validation-start-time": "1700000000"},
                "managedFields": [{"manager": "kwok", "operation": "Update"}],
            },
            "spec": {"podCIDR": "10.0.0.0/24", "unschedulable": true},
            "status": {
                "nodeInfo": {"containerRuntimeVersion": "containerd://1.7.0", "kernelVersion": "6.8.0",
                    "architecture": "amd64", "bootID": "", "kubeProxyVersion": "", "kubeletVersion": "",
                    "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""},
                "capacity": {"nvidia.com/gpu": "1"},
                "conditions": [{"type": "MemoryPressure", "status": "False"},
                    {"type": "Ready", "status": "True"}],
            },
        }))
        .unwrap();
        let from_json: SlimNode =
            serde_json::from_value(serde_json::to_value(&node).unwrap()).unwrap();
        let slim = SlimNode::from(node);
        assert_eq!(upgrade_hash(&slim), upgrade_hash(&from_json));
        assert_eq!(
            upgrade_hash(&SlimNode::from(slim.to_node())),
            upgrade_hash(&slim)
        );
        let slim = serde_json::to_value(slim.to_node()).unwrap();
        assert_eq!(
            slim["metadata"],
            serde_json::json!({
            "name": "gpu-node-1", "resourceVersion": "42",
            "labels": {"nvidia.com/gpu.present": "true",
                "nvidia.com/gpu-driver-upgrade-state": "upgrade-done"},
            "annotations": {"nvidia.com/gpu-driver-upgrade-validation-start-time": "1700000000"}})
        );
        assert_eq!(slim["spec"], serde_json::json!({"unschedulable": true}));
        assert_eq!(slim["status"].as_object().unwrap().len(), 2);
        assert_eq!(
            slim["status"]["conditions"],
            serde_json::json!([{"type": "Ready", "status": "True"}])
        );
        assert_eq!(
            slim["status"]["nodeInfo"]["containerRuntimeVersion"],
            "containerd://1.7.0"
        );
        assert_eq!(slim["status"]["nodeInfo"]["kernelVersion"], "");
    }

    #[test]
    fn the_upgrade_hash_ignores_what_the_upgrade_does_not_read() {
        let n = |labels: serde_json::Value, unschedulable: bool| -> SlimNode {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n", "labels": labels},
                "spec": {"unschedulable": unschedulable}}))
            .unwrap()
        };
        let base = upgrade_hash(&n(serde_json::json!({"a": "1"}), false));
        assert_eq!(
            base,
            upgrade_hash(&n(
                serde_json::json!({"a": "2", "nvidia.com/gfd.timestamp": "9"}),
                false
            ))
        );
        assert_ne!(base, upgrade_hash(&n(serde_json::json!({"a": "1"}), true)));
        assert_ne!(
            base,
            upgrade_hash(&n(
                serde_json::json!({"a": "1", "nvidia.com/gpu-driver-upgrade.skip": "true"}),
                false
            ))
        );
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
