//! The operator's copy of a Node ([`SlimNode`], the node store's type,
//! [`crate::cluster::store::NamedStore`]): decoded straight from the API server's JSON into what the
//! operator reads ([`WatchedNode`] is the watch's type), with label keys and values interned
//! and each distinct label set held once ([`InternedLabels`]: the nodes of a pool share one).
//! Its size a node: `cargo bench -p kiln-operator --bench node_memory` (figures in
//! `deploy/operator/README.md`, Memory).
//!
//! What is kept, and why:
//!
//! | kept | read by |
//! |---|---|
//! | name, uid, `resourceVersion`, `creationTimestamp` | everything; the driver upgrade's read-your-writes; the readiness timeline ([`crate::signals::timeline`]) |
//! | the GPUs GFD's labels promise, the allocatable GPUs (two numbers) | the timeline's gauges |
//! | labels, except `nvidia.com/*` labels kiln does not read ([`kept_label`]) | labelling, readiness coverage (a DaemonSet's `nodeSelector` may name any non-NVIDIA label), the driver upgrade |
//! | `nvidia.com/gpu-driver-upgrade*` annotations | the driver upgrade |
//! | `spec.unschedulable`, the `Ready` condition's status | the driver upgrade |
//! | `status.nodeInfo.containerRuntimeVersion` | the transform context's runtime |
//!
//! Managed fields, other annotations, conditions, images, capacity and GFD's own labels (its
//! counts, memory, CUDA versions and the `gfd.timestamp` it rewrites every minute) are never
//! decoded into memory.

use std::collections::BTreeMap;
use std::sync::Arc;

use internment::ArcIntern;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kiln_core::labels::{LabelLookup, Labels, has_gpu_pci_labels, has_nfd_labels, is_gpu_node};
use serde::Deserialize;

use kiln_core::labels::{
    DEPLOY_PREFIX, GPU_PRESENT, GPU_PRODUCT, MIG_CAPABLE, MIG_CONFIG, NFD_PREFIX,
    VGPU_HOST_DRIVER_VERSION, WORKLOAD_CONFIG,
};

/// An interned string: one allocation per distinct text, shared by every node holding it
/// (freed when the last holder drops it).
pub type Sym = ArcIntern<str>;

/// `s` interned (the decoders' optional texts).
pub fn sym(s: Option<String>) -> Option<Sym> {
    s.map(|s| Sym::from(s.as_str()))
}

/// Whether the node store keeps label `key`: every label kiln reads ([`reads_label`]), the
/// driver-upgrade labels ([`is_upgrade_key`]), and every label outside `nvidia.com/` (a
/// DaemonSet's `nodeSelector` may name any of them; readiness counts the nodes it matches).
pub fn kept_label(key: &str) -> bool {
    reads_label(key)
        || is_upgrade_key(key)
        || !key.starts_with("nvidia.com/")
        // The MIG manager's state, for the stuck-node signal (crate::signals::stuck).
        || key == kiln_core::node_stuck::MIG_CONFIG_STATE_LABEL
}

/// A driver-upgrade label or annotation (`nvidia.com/gpu-driver-upgrade*`: the state, skip,
/// requested, start times; [`kiln_core::upgrade`]), kept by [`SlimNode`] for the upgrade loop.
pub fn is_upgrade_key(key: &str) -> bool {
    key.starts_with("nvidia.com/gpu-driver-upgrade")
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

/// GFD's label: physical GPUs of the node's model (MIG devices with the `single` strategy).
pub const GPU_COUNT_LABEL: &str = "nvidia.com/gpu.count";
/// GFD's label: replicas per GPU (1 without sharing, 0 for MIG-enabled GPUs).
pub const GPU_REPLICAS_LABEL: &str = "nvidia.com/gpu.replicas";

/// The GPUs a node should offer by its GFD labels: `nvidia.com/gpu.count` ×
/// `nvidia.com/gpu.replicas` (replicas default 1), plus for each MIG profile of the `mixed`
/// strategy `nvidia.com/mig-<profile>.count` × `nvidia.com/mig-<profile>.replicas`. `None` when
/// the node has none of these count labels (GFD has not labelled it), or a count is not a
/// number. Time-slicing and MPS replicas multiply (each replica is one allocatable unit).
pub fn expected_gpus(labels: &BTreeMap<String, String>) -> Option<i64> {
    let num = |key: &str| labels.get(key).map(|v| v.trim().parse::<i64>().ok());
    let mut total: Option<i64> = None;
    let mut add = |count: Option<Option<i64>>, replicas: Option<Option<i64>>| -> Option<()> {
        let Some(count) = count else { return Some(()) };
        let replicas = replicas.unwrap_or(Some(1))?;
        *total.get_or_insert(0) += count?.max(0) * replicas.max(0);
        Some(())
    };
    add(num(GPU_COUNT_LABEL), num(GPU_REPLICAS_LABEL))?;
    for key in labels.keys() {
        if let Some(profile) = key
            .strip_prefix("nvidia.com/mig-")
            .and_then(|k| k.strip_suffix(".count"))
        {
            let replicas = num(&format!("nvidia.com/mig-{profile}.replicas"));
            add(num(key), replicas)?;
        }
    }
    total
}

/// Allocatable GPU units of a node: the sum of `nvidia.com/gpu`, `nvidia.com/gpu.shared` (the
/// renamed time-sliced resource) and every `nvidia.com/mig-*` resource. Values that are not
/// plain integers count 0.
pub fn allocatable_gpus(allocatable: &BTreeMap<String, Quantity>) -> i64 {
    allocatable
        .iter()
        .filter(|(k, _)| {
            *k == "nvidia.com/gpu"
                || *k == "nvidia.com/gpu.shared"
                || k.starts_with("nvidia.com/mig-")
        })
        .filter_map(|(_, q)| q.0.trim().parse::<i64>().ok())
        .sum()
}

/// The label every node carries with a value of its own (its name, mostly): kept beside a
/// node's shared label set ([`InternedLabels`]), not in it.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Labels as the operator's stores keep them. The set, sorted by key with keys and values
/// interned, is itself interned: every node of a pool (every pod of a DaemonSet revision)
/// holds one pointer to one copy. `kubernetes.io/hostname`, different on every node, is kept
/// per node outside the shared set (lookups and iteration see it among the others). 16 bytes
/// an object, whatever its number of labels.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InternedLabels {
    /// Every label but [`HOSTNAME_LABEL`], sorted by key.
    shared: ArcIntern<Box<[(Sym, Sym)]>>,
    /// The value of [`HOSTNAME_LABEL`].
    hostname: Option<Sym>,
}

impl Default for InternedLabels {
    fn default() -> Self {
        InternedLabels {
            shared: ArcIntern::new(Box::default()),
            hostname: None,
        }
    }
}

impl InternedLabels {
    /// The labels of `map` whose key `keep` accepts (nodes: [`kept_label`]; pods: all).
    pub fn of<'a>(
        map: impl IntoIterator<Item = (&'a String, &'a String)>,
        keep: impl Fn(&str) -> bool,
    ) -> Self {
        let mut hostname = None;
        let mut v: Vec<(Sym, Sym)> = Vec::new();
        for (k, val) in map.into_iter().filter(|(k, _)| keep(k)) {
            if k == HOSTNAME_LABEL {
                hostname = Some(Sym::from(val.as_str()));
            } else {
                v.push((Sym::from(k.as_str()), Sym::from(val.as_str())));
            }
        }
        v.sort_by(|a, b| a.0.cmp(&b.0));
        InternedLabels {
            shared: ArcIntern::new(v.into_boxed_slice()),
            hostname,
        }
    }

    /// `(key, value)` pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        let split = self.shared.partition_point(|(k, _)| &**k < HOSTNAME_LABEL);
        let (before, after) = self.shared.split_at(split);
        before
            .iter()
            .map(label_pair)
            .chain(self.hostname.iter().map(|h| (HOSTNAME_LABEL, &**h)))
            .chain(after.iter().map(label_pair))
    }

    /// How many labels are kept.
    pub fn len(&self) -> usize {
        self.shared.len() + usize::from(self.hostname.is_some())
    }

    /// Whether no label is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The labels as the API's map (a copy), for rules that take [`Labels`].
    pub fn to_map(&self) -> Labels {
        self.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

fn label_pair((k, v): &(Sym, Sym)) -> (&str, &str) {
    (k, v)
}

impl LabelLookup for InternedLabels {
    fn label(&self, key: &str) -> Option<&str> {
        if key == HOSTNAME_LABEL {
            return self.hostname.as_deref();
        }
        self.shared
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.shared[i].1)
    }
}

/// A node as the operator keeps it (see the module docs). Decoded from a Node's JSON (the
/// watch and list responses) or converted from a k8s-openapi [`Node`] ([`SlimNode::from`]).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(from = "WireNode")]
pub struct SlimNode {
    /// `metadata.name` (also its key in the node store, [`crate::cluster::store::NamedStore`]).
    name: Arc<str>,
    uid: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    created: Option<Time>,
    /// The driver-upgrade annotations ([`is_upgrade_key`]; `None` when it has none).
    upgrade_annotations: Option<BTreeMap<String, String>>,
    labels: InternedLabels,
    /// [`expected_gpus`] of all its labels (GFD's counts are not kept).
    expected_gpus: Option<i64>,
    /// [`allocatable_gpus`] of `status.allocatable`.
    allocatable_gpus: i64,
    runtime: Option<Sym>,
    unschedulable: Option<bool>,
    /// The `Ready` condition's status (`True`, `False`, `Unknown`).
    ready: Option<Sym>,
    gpu: bool,
    pci_gpu: bool,
    nfd: bool,
}

impl SlimNode {
    /// The node's name (empty if it has none).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its uid.
    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    /// Its `creationTimestamp`.
    pub fn created(&self) -> Option<&Time> {
        self.created.as_ref()
    }

    /// The GPUs its GFD labels promise ([`expected_gpus`]).
    pub fn expected_gpus(&self) -> Option<i64> {
        self.expected_gpus
    }

    /// Its allocatable GPU units ([`allocatable_gpus`]).
    pub fn allocatable_gpus(&self) -> i64 {
        self.allocatable_gpus
    }

    /// Whether NFD reports an NVIDIA PCI device on it ([`has_gpu_pci_labels`]).
    pub fn has_gpu_pci(&self) -> bool {
        self.pci_gpu
    }

    /// Its `resourceVersion`.
    pub fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// Its kept labels.
    pub fn labels(&self) -> &InternedLabels {
        &self.labels
    }

    /// Its driver-upgrade annotations ([`is_upgrade_key`]).
    pub fn upgrade_annotations(&self) -> impl Iterator<Item = (&String, &String)> {
        self.upgrade_annotations.iter().flatten()
    }

    /// `status.nodeInfo.containerRuntimeVersion`, e.g. `containerd://2.1.4`.
    pub fn runtime(&self) -> Option<&str> {
        self.runtime.as_deref()
    }

    /// `spec.unschedulable`.
    pub fn unschedulable(&self) -> Option<bool> {
        self.unschedulable
    }

    /// The status of the `Ready` condition.
    pub fn ready(&self) -> Option<&str> {
        self.ready.as_deref()
    }

    /// Whether it is a GPU node ([`is_gpu_node`]).
    pub fn is_gpu(&self) -> bool {
        self.gpu
    }

    /// Whether it carries an NFD label ([`has_nfd_labels`]).
    pub fn has_nfd(&self) -> bool {
        self.nfd
    }

    /// The same node with `labels` (as the API's map; filtered by [`kept_label`]), e.g. after
    /// a label patch was accepted.
    #[must_use]
    pub fn with_labels(&self, labels: &Labels) -> SlimNode {
        SlimNode {
            labels: InternedLabels::of(labels, kept_label),
            gpu: is_gpu_node(labels),
            pci_gpu: has_gpu_pci_labels(labels),
            nfd: has_nfd_labels(labels),
            ..self.clone()
        }
    }

    /// The node as a k8s-openapi [`Node`] holding just what this one keeps (what it would
    /// send back: [`SlimNode::from`] of it is this node again). No rule needs it: the driver
    /// upgrade reads a `SlimNode` through [`kiln_core::upgrade::UpgradeNode`].
    pub fn to_node(&self) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(self.name.to_string()),
                uid: self.uid.as_ref().map(|u| u.to_string()),
                resource_version: self.resource_version.as_ref().map(|r| r.to_string()),
                creation_timestamp: self.created.clone(),
                annotations: self.upgrade_annotations.clone(),
                labels: Some(self.labels.to_map()),
                ..ObjectMeta::default()
            },
            spec: self.unschedulable.map(|u| NodeSpec {
                unschedulable: Some(u),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                node_info: self.runtime.as_ref().map(|r| NodeSystemInfo {
                    container_runtime_version: r.to_string(),
                    ..NodeSystemInfo::default()
                }),
                conditions: self.ready.as_ref().map(|s| {
                    vec![NodeCondition {
                        type_: "Ready".into(),
                        status: s.to_string(),
                        ..NodeCondition::default()
                    }]
                }),
                ..NodeStatus::default()
            }),
        }
    }
}

/// The driver upgrade reads the store's copy as it is ([`kiln_core::upgrade::NodeFacts::from_node`]).
impl LabelLookup for SlimNode {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.label(key)
    }
}

/// What the driver upgrade reads of a node, from the store's copy (no `Node` is built).
impl kiln_core::upgrade::UpgradeNode for SlimNode {
    fn name(&self) -> &str {
        &self.name
    }
    fn annotation(&self, key: &str) -> Option<&str> {
        self.upgrade_annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }
    fn unschedulable(&self) -> bool {
        self.unschedulable.unwrap_or(false)
    }
    fn ready(&self) -> bool {
        self.ready.as_deref().is_none_or(|s| s == "True")
    }
}

impl From<Node> for SlimNode {
    fn from(node: Node) -> Self {
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone());
        let allocatable = node.status.as_ref().and_then(|s| s.allocatable.clone());
        WireNode {
            metadata: WireMeta {
                name: node.metadata.name,
                uid: node.metadata.uid,
                resource_version: node.metadata.resource_version,
                creation_timestamp: node.metadata.creation_timestamp,
                labels: node.metadata.labels,
                annotations: node.metadata.annotations,
            },
            spec: WireSpec {
                unschedulable: node.spec.and_then(|s| s.unschedulable),
            },
            status: WireStatus {
                allocatable,
                node_info: node.status.and_then(|s| s.node_info).map(|i| WireNodeInfo {
                    container_runtime_version: Some(i.container_runtime_version),
                }),
                conditions: ready.map(|status| {
                    vec![WireCondition {
                        type_: "Ready".into(),
                        status,
                    }]
                }),
            },
        }
        .into()
    }
}

/// A Node as the node watch decodes it ([`crate::cluster::store::Watched`]).
pub type WatchedNode = crate::cluster::store::Watched<SlimNode>;

impl crate::cluster::store::WatchedKind for SlimNode {
    type Raw = WireNode;
    type Scope = k8s_openapi::ClusterResourceScope;
    const KIND: &'static str = "Node";
    const PLURAL: &'static str = "nodes";

    fn split(w: WireNode) -> (crate::cluster::store::Identity, SlimNode) {
        let id = crate::cluster::store::Identity {
            name: w.metadata.name.clone(),
            namespace: None,
            resource_version: w.metadata.resource_version.clone(),
        };
        (id, w.into())
    }
}

impl crate::cluster::store::Keyed for SlimNode {
    fn key(&self) -> Arc<str> {
        self.name.clone()
    }
}

/// What is decoded of a Node's JSON (everything else is skipped unread).
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct WireNode {
    metadata: WireMeta,
    spec: WireSpec,
    status: WireStatus,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireMeta {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    creation_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireSpec {
    unschedulable: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireStatus {
    allocatable: Option<BTreeMap<String, Quantity>>,
    node_info: Option<WireNodeInfo>,
    conditions: Option<Vec<WireCondition>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireNodeInfo {
    container_runtime_version: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
}

impl From<WireNode> for SlimNode {
    fn from(w: WireNode) -> Self {
        let labels = w.metadata.labels.unwrap_or_default();
        let annotations: BTreeMap<String, String> = w
            .metadata
            .annotations
            .into_iter()
            .flatten()
            .filter(|(k, _)| is_upgrade_key(k))
            .collect();
        SlimNode {
            name: w.metadata.name.unwrap_or_default().into(),
            uid: w.metadata.uid.map(String::into_boxed_str),
            resource_version: w.metadata.resource_version.map(String::into_boxed_str),
            created: w.metadata.creation_timestamp,
            upgrade_annotations: (!annotations.is_empty()).then_some(annotations),
            expected_gpus: expected_gpus(&labels),
            allocatable_gpus: w.status.allocatable.as_ref().map_or(0, allocatable_gpus),
            gpu: is_gpu_node(&labels),
            pci_gpu: has_gpu_pci_labels(&labels),
            nfd: has_nfd_labels(&labels),
            labels: InternedLabels::of(&labels, kept_label),
            runtime: sym(w.status.node_info.and_then(|i| i.container_runtime_version)),
            unschedulable: w.spec.unschedulable,
            ready: w
                .status
                .conditions
                .into_iter()
                .flatten()
                .find(|c| c.type_ == "Ready")
                .map(|c| Sym::from(c.status.as_str())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn expected_gpus_from_gfd_labels() {
        assert_eq!(expected_gpus(&labels(&[])), None);
        assert_eq!(expected_gpus(&labels(&[(GPU_COUNT_LABEL, "8")])), Some(8));
        // Time-slicing: 4 GPUs × 10 replicas = 40 allocatable units.
        assert_eq!(
            expected_gpus(&labels(&[
                (GPU_COUNT_LABEL, "4"),
                (GPU_REPLICAS_LABEL, "10")
            ])),
            Some(40)
        );
        // MIG-enabled GPUs in the full-GPU labeler: replicas 0.
        assert_eq!(
            expected_gpus(&labels(&[
                (GPU_COUNT_LABEL, "2"),
                (GPU_REPLICAS_LABEL, "0")
            ])),
            Some(0)
        );
        // mixed: full GPUs plus each profile's devices.
        assert_eq!(
            expected_gpus(&labels(&[
                (GPU_COUNT_LABEL, "1"),
                ("nvidia.com/mig-1g.10gb.count", "7"),
                ("nvidia.com/mig-3g.40gb.count", "2"),
                ("nvidia.com/mig-3g.40gb.replicas", "2"),
                ("nvidia.com/mig-1g.10gb.memory", "9856"),
            ])),
            Some(1 + 7 + 4)
        );
        assert_eq!(expected_gpus(&labels(&[(GPU_COUNT_LABEL, "many")])), None);
    }

    #[test]
    fn allocatable_sums_gpu_shared_and_mig() {
        let q = |v: &str| Quantity(v.into());
        let a: BTreeMap<String, Quantity> = [
            ("cpu", q("32")),
            ("nvidia.com/gpu", q("2")),
            ("nvidia.com/gpu.shared", q("8")),
            ("nvidia.com/mig-1g.10gb", q("7")),
            ("nvidia.com/gpu.memory", q("100")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(allocatable_gpus(&a), 17);
        assert_eq!(allocatable_gpus(&BTreeMap::new()), 0);
    }

    use serde_json::json;

    fn wire() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gpu-1", "uid": "u1", "resourceVersion": "42",
                "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gfd.timestamp": "1",
                           "nvidia.com/gpu.count": "8", "pool": "a",
                           "nvidia.com/gpu.deploy.driver": "true",
                           "nvidia.com/gpu-driver-upgrade-state": "upgrade-done",
                           "feature.node.kubernetes.io/system-os_release.ID": "ubuntu"},
                "annotations": {"kwok.x-k8s.io/node": "fake",
                                "nvidia.com/gpu-driver-upgrade-requested": "true"},
                "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]},
            "spec": {"unschedulable": true, "podCIDR": "10.0.0.0/24"},
            "status": {"nodeInfo": {"containerRuntimeVersion": "containerd://2.1.4",
                                    "kernelVersion": "6.8"},
                       "conditions": [{"type": "MemoryPressure", "status": "False"},
                                      {"type": "Ready", "status": "True"}],
                       "capacity": {"nvidia.com/gpu": "8"},
                       "allocatable": {"nvidia.com/gpu": "8", "cpu": "4"}}
        })
    }

    #[test]
    fn keeps_what_the_operator_reads() {
        let n: SlimNode = serde_json::from_value(wire()).unwrap();
        assert_eq!(n.name(), "gpu-1");
        assert_eq!(n.resource_version(), Some("42"));
        let labels: Vec<(&str, &str)> = n.labels().iter().collect();
        assert_eq!(
            labels,
            [
                ("feature.node.kubernetes.io/system-os_release.ID", "ubuntu"),
                ("nvidia.com/gpu-driver-upgrade-state", "upgrade-done"),
                ("nvidia.com/gpu.deploy.driver", "true"),
                ("nvidia.com/gpu.present", "true"),
                ("pool", "a"),
            ]
        );
        assert_eq!(n.labels().label("pool"), Some("a"));
        assert_eq!(n.labels().label("nvidia.com/gpu.count"), None);
        assert_eq!(
            n.upgrade_annotations().collect::<Vec<_>>(),
            [(
                &"nvidia.com/gpu-driver-upgrade-requested".to_string(),
                &"true".to_string()
            )]
        );
        assert_eq!(n.runtime(), Some("containerd://2.1.4"));
        assert_eq!(n.unschedulable(), Some(true));
        assert_eq!(n.ready(), Some("True"));
        assert!(n.is_gpu());
        assert!(n.has_nfd());
        assert!(!n.has_gpu_pci());
        assert_eq!((n.expected_gpus(), n.allocatable_gpus()), (Some(8), 8));
        assert_eq!(n.uid(), Some("u1"));
    }

    /// Decoding the JSON and converting the k8s-openapi Node give the same node, and
    /// `to_node` gives back what it keeps.
    #[test]
    fn json_node_and_back_agree() {
        let from_json: SlimNode = serde_json::from_value(wire()).unwrap();
        let full: Node = serde_json::from_value(wire()).unwrap();
        let from_node = SlimNode::from(full);
        assert_eq!(from_json, from_node);
        assert_eq!(from_json.labels, from_node.labels);
        assert_eq!(
            (
                from_json.runtime(),
                from_json.ready(),
                from_json.unschedulable()
            ),
            (
                from_node.runtime(),
                from_node.ready(),
                from_node.unschedulable()
            )
        );
        let back = SlimNode::from(from_json.to_node());
        assert_eq!(back.labels, from_json.labels);
        // Its metadata (the GPU counts are kept as numbers, not as a Node's fields).
        let meta = |n: &SlimNode| {
            (
                n.name().to_string(),
                n.uid().map(String::from),
                n.resource_version().map(String::from),
                n.created().cloned(),
                n.upgrade_annotations
                    .clone()
                    .map(|a| a.into_iter().collect::<Vec<_>>()),
            )
        };
        assert_eq!(meta(&back), meta(&from_json));
        assert_eq!(back.upgrade_annotations().count(), 1);
        assert_eq!(back.ready(), Some("True"));
        assert_eq!(back.runtime(), Some("containerd://2.1.4"));
        assert!(back.is_gpu() && back.has_nfd());
    }

    /// `wire()` named `name`, with its hostname label.
    fn wire_named(name: &str) -> serde_json::Value {
        let mut v = wire();
        v["metadata"]["name"] = json!(name);
        v["metadata"]["labels"][HOSTNAME_LABEL] = json!(name);
        v
    }

    #[test]
    fn nodes_of_a_pool_share_one_label_set_and_keep_their_hostnames() {
        let a: SlimNode = serde_json::from_value(wire_named("gpu-1")).unwrap();
        let b: SlimNode = serde_json::from_value(wire_named("gpu-2")).unwrap();
        assert!(
            std::ptr::eq(&**a.labels.shared, &**b.labels.shared),
            "one copy of the set"
        );
        assert_eq!(a.labels().label(HOSTNAME_LABEL), Some("gpu-1"));
        assert_eq!(b.labels().label(HOSTNAME_LABEL), Some("gpu-2"));
        assert_ne!(a.labels(), b.labels());
        // The hostname is listed in key order among the shared labels.
        let keys: Vec<&str> = b.labels().iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "feature.node.kubernetes.io/system-os_release.ID",
                HOSTNAME_LABEL,
                "nvidia.com/gpu-driver-upgrade-state",
                "nvidia.com/gpu.deploy.driver",
                "nvidia.com/gpu.present",
                "pool"
            ]
        );
        assert_eq!(b.labels().len(), 6);
        assert_eq!(b.labels().to_map()[HOSTNAME_LABEL], "gpu-2");
        // A node without one: the same set, no hostname.
        let c: SlimNode = serde_json::from_value(wire()).unwrap();
        assert!(std::ptr::eq(&**a.labels.shared, &**c.labels.shared));
        assert_eq!(c.labels().label(HOSTNAME_LABEL), None);
        assert_eq!(c.labels().len(), 5);
    }

    #[test]
    fn relabelled_copy_recomputes_gpu_presence() {
        let n: SlimNode = serde_json::from_value(wire()).unwrap();
        let mut labels = n.labels().to_map();
        labels.insert("nvidia.com/gpu.present".into(), "false".into());
        labels.insert("nvidia.com/gpu.memory".into(), "1".into());
        let m = n.with_labels(&labels);
        assert!(!m.is_gpu());
        assert_eq!(m.labels().label("nvidia.com/gpu.present"), Some("false"));
        assert_eq!(m.labels().label("nvidia.com/gpu.memory"), None);
        assert_eq!(m.name(), "gpu-1");
    }
}
