//! Rolling driver upgrades: the per-node state machine of NVIDIA's upgrade controller
//! (`k8s-operator-libs/pkg/upgrade`, in-place mode; `gpu-operator.md` §6), as a pure function.
//!
//! ```text
//! NodeFacts (labels, annotations, cordon, driver pod, pods on the node, validator) ─┐
//! DriverUpgradePolicySpec + now ───────────────────────────────────────────────────┴─► plan() ─► Plan
//!   Plan = per node: set the state label, annotate, cordon/uncordon, delete pods, delete the
//!          driver pod, Events; plus the counts per state (status and metrics)
//! ```
//!
//! Every decision is taken from what the cluster shows (the state label, the annotations below,
//! the pods), so an operator that restarts resumes where the last one stopped; each call moves a
//! node at most one state on (as upstream, whose passes bucket the nodes once), and every action
//! is idempotent (cordoning a cordoned node, deleting a pod already gone).
//!
//! States and transitions (upstream's names, the label `nvidia.com/gpu-driver-upgrade-state`):
//!
//! | from | when | to |
//! |---|---|---|
//! | unknown (no label) | driver pod out of date, safe-load wait, or upgrade requested | `upgrade-required` (a cordoned node is annotated `…node-initial-state.unschedulable`) |
//! | unknown | otherwise (the driver pod runs the current template) | `upgrade-done` |
//! | `upgrade-done` | as unknown | `upgrade-required` |
//! | `upgrade-required` | skip label, or no slot and not cordoned | stays |
//! | `upgrade-required` | same `DRIVER_CONFIG_DIGEST` as the DaemonSet (restart only) | cordon, `pod-restart-required` |
//! | `upgrade-required` | otherwise | `cordon-required` |
//! | `cordon-required` | – | cordon, `wait-for-jobs-required` |
//! | `wait-for-jobs-required` | matching pods Pending or Running (timeout not passed) | stays |
//! | `wait-for-jobs-required` | no selector, no matching pod Pending or Running, or the timeout passed | `pod-deletion-required` |
//! | `pod-deletion-required` | no Pending or Running GPU pod left (DaemonSet and mirror pods aside) | `pod-restart-required` |
//! | `pod-deletion-required` | a GPU pod cannot be deleted, or deletion timed out | `drain-required` (drain on) / `upgrade-failed` |
//! | `drain-required` | drain off, or drained | `pod-restart-required` |
//! | `drain-required` | a pod cannot be drained, or the drain timed out | `upgrade-failed` |
//! | `pod-restart-required` | driver pod out of date | delete it (stays) |
//! | `pod-restart-required` | driver pod current and ready | `validation-required` |
//! | `pod-restart-required` | a driver container restarted more than 10 times | `upgrade-failed` |
//! | `validation-required` | validator ready on the node (or none there) | `uncordon-required` (`upgrade-done` when initially cordoned) |
//! | `validation-required` | not ready after the validation timeout (600 s) | `upgrade-failed` |
//! | `uncordon-required` | – | uncordon, `upgrade-done` |
//! | `upgrade-failed` | driver pod current and ready and the validator ready | `uncordon-required` (`upgrade-done` when initially cordoned) |
//!
//! Slots (`maxParallelUpgrades`, `maxUnavailable`, [`slots`]): upstream's formula — nodes past
//! `upgrade-required` (failed ones included) are in progress; cordoned or NotReady nodes and
//! nodes in `cordon-required` are unavailable, whoever made them so.
//!
//! kiln's choices where upstream is silent or loose, each on purpose:
//! - a node leaves `upgrade-failed` only when its validator is ready too (upstream looks at the
//!   driver pod only, so a validation failure bounced straight back to `uncordon-required`);
//! - pod deletion and drain keep their start time in annotations ([`POD_DELETION_START`],
//!   [`DRAIN_START`]), so their timeouts survive a restart (upstream's drain helper blocks one
//!   goroutine instead);
//! - a node with no validator pod has nothing to validate and passes;
//! - nodes mid-upgrade whose driver pod is momentarily gone (being recreated) still count.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::intstr::IntOrPercent;
use crate::labels::LabelLookup;
use crate::spec::{DrainSpec, DriverUpgradePolicySpec, PodDeletionSpec};

/// Node label holding the upgrade state (upstream `nvidia.com/%s-driver-upgrade-state`, driver `gpu`).
pub const STATE_LABEL: &str = "nvidia.com/gpu-driver-upgrade-state";
/// Node label: `"true"` keeps the node out of upgrades (it stays `upgrade-required`).
pub const SKIP_LABEL: &str = "nvidia.com/gpu-driver-upgrade.skip";
/// Pod label: `"true"` keeps the pod out of a drain (always added to `drain.podSelector` as `!=true`).
pub const DRAIN_SKIP_POD_LABEL: &str = "nvidia.com/gpu-driver-upgrade-drain.skip";
/// Node annotation set by the driver container while it waits for workloads to leave before
/// loading (safe driver load); any value counts, removing it unblocks the load.
pub const SAFE_LOAD_ANNOTATION: &str = "nvidia.com/gpu-driver-upgrade.driver-wait-for-safe-load";
/// Node annotation `"true"`: the node was cordoned before its upgrade began, so it is not uncordoned after.
pub const INITIAL_UNSCHEDULABLE: &str =
    "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable";
/// Node annotation: unix seconds when waiting for `waitForCompletion` pods began.
pub const WAIT_FOR_COMPLETION_START: &str =
    "nvidia.com/gpu-driver-upgrade-wait-for-pod-completion-start-time";
/// Node annotation: unix seconds when `validation-required` began.
pub const VALIDATION_START: &str = "nvidia.com/gpu-driver-upgrade-validation-start-time";
/// Node annotation `"true"`: upgrade this node although its driver pod is current (or orphaned).
pub const UPGRADE_REQUESTED: &str = "nvidia.com/gpu-driver-upgrade-requested";
/// Node annotation (kiln): unix seconds when GPU pod deletion began (its timeout survives restarts).
pub const POD_DELETION_START: &str = "nvidia.com/gpu-driver-upgrade-pod-deletion-start-time";
/// Node annotation (kiln): unix seconds when the drain began.
pub const DRAIN_START: &str = "nvidia.com/gpu-driver-upgrade-drain-start-time";
/// Reason of every upgrade Event (upstream `GPUDriverUpgrade`).
pub const EVENT_REASON: &str = "GPUDriverUpgrade";
/// Seconds `validation-required` waits for the validator before `upgrade-failed` (upstream 600).
pub const VALIDATION_TIMEOUT_SECONDS: i64 = 600;
/// A driver container not ready with more restarts than this fails the upgrade (upstream 10).
pub const MAX_DRIVER_RESTARTS: i32 = 10;
/// Validator pods (upstream `app=nvidia-operator-validator`).
pub const VALIDATOR_SELECTOR: &str = "app=nvidia-operator-validator";
/// Resource name prefixes that make a pod a GPU pod (`nvidia.com/gpu`, `nvidia.com/gpu.shared`,
/// MIG profiles `nvidia.com/mig-1g.5gb`).
pub const GPU_RESOURCE_PREFIXES: [&str; 2] = ["nvidia.com/gpu", "nvidia.com/mig-"];
/// Pod label the DaemonSet controller sets to the pod's template revision (one constant, kept
/// in [`crate::readiness`]).
pub use crate::readiness::REVISION_HASH_LABEL;

/// A node's upgrade state (the label value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UpgradeState {
    /// No label (or one kiln does not know): not processed yet.
    Unknown,
    /// `upgrade-required`.
    UpgradeRequired,
    /// `cordon-required`.
    CordonRequired,
    /// `wait-for-jobs-required`.
    WaitForJobsRequired,
    /// `pod-deletion-required`.
    PodDeletionRequired,
    /// `drain-required`.
    DrainRequired,
    /// `pod-restart-required`.
    PodRestartRequired,
    /// `validation-required`.
    ValidationRequired,
    /// `uncordon-required`.
    UncordonRequired,
    /// `upgrade-done`.
    Done,
    /// `upgrade-failed`.
    Failed,
}

impl UpgradeState {
    /// Every state, in upgrade order (unknown first, failed last).
    pub const ALL: [UpgradeState; 11] = [
        UpgradeState::Unknown,
        UpgradeState::UpgradeRequired,
        UpgradeState::CordonRequired,
        UpgradeState::WaitForJobsRequired,
        UpgradeState::PodDeletionRequired,
        UpgradeState::DrainRequired,
        UpgradeState::PodRestartRequired,
        UpgradeState::ValidationRequired,
        UpgradeState::UncordonRequired,
        UpgradeState::Done,
        UpgradeState::Failed,
    ];

    /// The label value (`""` for unknown).
    pub fn label(self) -> &'static str {
        match self {
            UpgradeState::Unknown => "",
            UpgradeState::UpgradeRequired => "upgrade-required",
            UpgradeState::CordonRequired => "cordon-required",
            UpgradeState::WaitForJobsRequired => "wait-for-jobs-required",
            UpgradeState::PodDeletionRequired => "pod-deletion-required",
            UpgradeState::DrainRequired => "drain-required",
            UpgradeState::PodRestartRequired => "pod-restart-required",
            UpgradeState::ValidationRequired => "validation-required",
            UpgradeState::UncordonRequired => "uncordon-required",
            UpgradeState::Done => "upgrade-done",
            UpgradeState::Failed => "upgrade-failed",
        }
    }

    /// The state a label value names; unknown for none or an unrecognised one.
    pub fn from_label(value: Option<&str>) -> UpgradeState {
        UpgradeState::ALL
            .into_iter()
            .find(|s| Some(s.label()) == value && !s.label().is_empty())
            .unwrap_or(UpgradeState::Unknown)
    }

    /// Past `upgrade-required` and not done: holds an upgrade slot (failed included, as upstream).
    pub fn in_progress(self) -> bool {
        !matches!(
            self,
            UpgradeState::Unknown | UpgradeState::UpgradeRequired | UpgradeState::Done
        )
    }

    /// The name used in status and Events (`unknown` for no label).
    pub fn name(self) -> &'static str {
        match self {
            UpgradeState::Unknown => "unknown",
            s => s.label(),
        }
    }
}

impl std::fmt::Display for UpgradeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A pod's phase, as far as the upgrade cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `Pending` (or no phase yet).
    Pending,
    /// `Running`.
    Running,
    /// `Succeeded` or `Failed`: holds no GPU, blocks nothing.
    Finished,
}

impl Phase {
    /// From `status.phase`. The API server sets `Pending` on create, so a missing phase is
    /// `Pending`; so is `Unknown` (the kubelet lost, the pod may still run: kiln keeps waiting
    /// where upstream's `IsPodRunningOrPending` would not).
    pub fn parse(phase: Option<&str>) -> Phase {
        match phase {
            Some("Running") => Phase::Running,
            Some("Succeeded" | "Failed") => Phase::Finished,
            _ => Phase::Pending,
        }
    }

    /// Pending or Running: the pod holds (or is about to hold) its node and its GPUs, so
    /// `waitForCompletion` waits for it and pod deletion and drain count it (upstream
    /// k8s-operator-libs `IsPodRunningOrPending`, and gpu-operator's GPU pod filter, which
    /// keeps Running and Pending pods).
    pub fn holds_node(self) -> bool {
        self != Phase::Finished
    }
}

/// What the upgrade needs to know about one (non-driver) pod bound to a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Labels (for `waitForCompletion.podSelector` and `drain.podSelector`).
    pub labels: BTreeMap<String, String>,
    /// Phase.
    pub phase: Phase,
    /// Has a deletion timestamp.
    pub terminating: bool,
    /// A container or init container requests or limits an `nvidia.com/gpu*` or
    /// `nvidia.com/mig-*` resource ([`GPU_RESOURCE_PREFIXES`]).
    pub uses_gpu: bool,
    /// Controlled by a DaemonSet (never deleted or drained: it would come back).
    pub daemonset: bool,
    /// Has a controller owner (a bare pod is deleted only with `force`).
    pub controlled: bool,
    /// Mounts an emptyDir (deleted only with `deleteEmptyDir`, its data is lost).
    pub empty_dir: bool,
    /// A static pod's mirror (the kubelet owns it; never deleted).
    pub mirror: bool,
}

impl PodFacts {
    /// Read from a pod.
    pub fn from_pod(pod: &Pod) -> PodFacts {
        let meta = &pod.metadata;
        let owners = meta.owner_references.as_deref().unwrap_or_default();
        let controller = owners.iter().find(|o| o.controller == Some(true));
        let spec = pod.spec.as_ref();
        PodFacts {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            labels: meta.labels.clone().unwrap_or_default(),
            phase: Phase::parse(pod.status.as_ref().and_then(|s| s.phase.as_deref())),
            terminating: meta.deletion_timestamp.is_some(),
            uses_gpu: spec.is_some_and(uses_gpu),
            daemonset: controller.is_some_and(|o| o.kind == "DaemonSet"),
            controlled: controller.is_some(),
            empty_dir: spec
                .is_some_and(|s| s.volumes.iter().flatten().any(|v| v.empty_dir.is_some())),
            mirror: meta
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror")),
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Not finished and not already going away.
    fn live(&self) -> bool {
        self.phase.holds_node() && !self.terminating
    }
}

/// Whether a pod spec requests or limits a GPU resource ([`GPU_RESOURCE_PREFIXES`]).
pub fn uses_gpu(spec: &PodSpec) -> bool {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| {
            r.requests
                .iter()
                .chain(r.limits.iter())
                .flat_map(|m| m.keys())
        })
        .any(|k| GPU_RESOURCE_PREFIXES.iter().any(|p| k.starts_with(p)))
}

/// The `DRIVER_CONFIG_DIGEST` a driver pod spec carries (on the driver or driver-manager
/// container), if any.
pub fn config_digest(spec: &PodSpec) -> Option<&str> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == crate::driver_digest::ENV)
        .and_then(|e| e.value.as_deref())
}

/// What the upgrade needs to know about the driver pod on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverPodFacts {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Not owned by a DaemonSet (left behind, e.g. after `useNvidiaDriverCRD` was switched on).
    pub orphaned: bool,
    /// Its `controller-revision-hash` is the DaemonSet's current revision.
    pub current_revision: bool,
    /// Its `DRIVER_CONFIG_DIGEST` equals the DaemonSet template's (a template change that only
    /// needs a restart, not a reinstall).
    pub same_digest: bool,
    /// Running with every container ready.
    pub ready: bool,
    /// Has a deletion timestamp.
    pub terminating: bool,
    /// Some (init) container is not ready and restarted more than [`MAX_DRIVER_RESTARTS`] times.
    pub crash_looping: bool,
}

impl DriverPodFacts {
    /// Read from a driver pod (a k8s-openapi [`Pod`] or a caller's compact copy, [`DriverPod`]),
    /// given its DaemonSet's current revision hash and template digest (`None` for an
    /// orphaned pod).
    pub fn from_pod(pod: &impl DriverPod, desired: Option<(&str, Option<&str>)>) -> DriverPodFacts {
        let hash = pod.label(REVISION_HASH_LABEL);
        let digest = pod.config_digest();
        let mut containers = pod.containers().peekable();
        let has_containers = containers.peek().is_some();
        let mut all_ready = true;
        let mut crash_looping = false;
        for (ready, restarts) in containers {
            all_ready &= ready;
            crash_looping |= !ready && restarts > MAX_DRIVER_RESTARTS;
        }
        crash_looping |= pod
            .init_containers()
            .any(|(ready, restarts)| !ready && restarts > MAX_DRIVER_RESTARTS);
        DriverPodFacts {
            namespace: pod.namespace().unwrap_or_default().to_string(),
            name: pod.name().to_string(),
            orphaned: desired.is_none(),
            current_revision: desired.is_some_and(|(h, _)| hash == Some(h)),
            same_digest: desired.is_some_and(|(_, d)| d.is_some() && digest == d),
            ready: pod.phase() == Some("Running") && has_containers && all_ready,
            terminating: pod.terminating(),
            crash_looping,
        }
    }
}

/// What [`DriverPodFacts::from_pod`] reads of a driver pod: implemented by k8s-openapi's
/// [`Pod`] and by a caller's compact copy of one (the operator's pod store), so no full `Pod`
/// is built to judge a node. Labels are read through [`LabelLookup`].
pub trait DriverPod: LabelLookup {
    /// `metadata.name` (empty when it has none).
    fn name(&self) -> &str;
    /// `metadata.namespace`.
    fn namespace(&self) -> Option<&str>;
    /// Whether it has a `metadata.deletionTimestamp`.
    fn terminating(&self) -> bool;
    /// `status.phase` (`Running`, …).
    fn phase(&self) -> Option<&str>;
    /// The `DRIVER_CONFIG_DIGEST` its spec carries ([`config_digest`]).
    fn config_digest(&self) -> Option<&str>;
    /// `(ready, restartCount)` of each `status.containerStatuses` entry.
    fn containers(&self) -> impl Iterator<Item = (bool, i32)>;
    /// `(ready, restartCount)` of each `status.initContainerStatuses` entry.
    fn init_containers(&self) -> impl Iterator<Item = (bool, i32)>;
}

impl LabelLookup for Pod {
    fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }
}

impl DriverPod for Pod {
    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    fn namespace(&self) -> Option<&str> {
        self.metadata.namespace.as_deref()
    }
    fn terminating(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
    fn phase(&self) -> Option<&str> {
        self.status.as_ref()?.phase.as_deref()
    }
    fn config_digest(&self) -> Option<&str> {
        self.spec.as_ref().and_then(config_digest)
    }
    fn containers(&self) -> impl Iterator<Item = (bool, i32)> {
        let s = self.status.as_ref();
        s.and_then(|s| s.container_statuses.as_deref())
            .unwrap_or_default()
            .iter()
            .map(|c| (c.ready, c.restart_count))
    }
    fn init_containers(&self) -> impl Iterator<Item = (bool, i32)> {
        let s = self.status.as_ref();
        s.and_then(|s| s.init_container_statuses.as_deref())
            .unwrap_or_default()
            .iter()
            .map(|c| (c.ready, c.restart_count))
    }
}

/// What [`NodeFacts::from_node`] reads of a node: implemented by k8s-openapi's [`Node`] and by
/// a caller's compact copy of one (the operator's node store), so no full `Node` is built on
/// an upgrade pass. Labels are read through [`LabelLookup`].
pub trait UpgradeNode: LabelLookup {
    /// `metadata.name` (empty when it has none).
    fn name(&self) -> &str;
    /// The value of annotation `key` (the driver upgrade's annotations are all it reads).
    fn annotation(&self, key: &str) -> Option<&str>;
    /// `spec.unschedulable` (absent: `false`).
    fn unschedulable(&self) -> bool;
    /// Every `Ready` condition has status `True` (upstream: a node without one counts as
    /// ready).
    fn ready(&self) -> bool;
}

impl LabelLookup for Node {
    fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }
}

impl UpgradeNode for Node {
    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }
    fn unschedulable(&self) -> bool {
        self.spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
    }
    fn ready(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| c.type_ == "Ready")
            .all(|c| c.status == "True")
    }
}

/// Everything the state machine reads about one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// Node name.
    pub name: String,
    /// The state label.
    pub state: UpgradeState,
    /// The skip label is `"true"`.
    pub skip: bool,
    /// The upgrade-requested annotation is `"true"`.
    pub requested: bool,
    /// The driver waits for a safe load (annotation present).
    pub safe_load_wait: bool,
    /// `spec.unschedulable` (cordoned, by anyone).
    pub unschedulable: bool,
    /// The `Ready` condition is not `False`/`Unknown` (upstream: absent counts as ready).
    pub ready: bool,
    /// The initial-unschedulable annotation is present.
    pub initially_unschedulable: bool,
    /// Unix seconds in the wait-for-completion start annotation.
    pub wait_start: Option<i64>,
    /// Unix seconds in the pod-deletion start annotation.
    pub deletion_start: Option<i64>,
    /// Unix seconds in the drain start annotation.
    pub drain_start: Option<i64>,
    /// Unix seconds in the validation start annotation.
    pub validation_start: Option<i64>,
    /// The driver pod on the node (none while it is being recreated).
    pub driver: Option<DriverPodFacts>,
    /// The other pods bound to the node (validator and DaemonSet pods included).
    pub pods: Vec<PodFacts>,
    /// The validator pod on the node: `Some(ready)`, `None` when there is none.
    pub validator_ready: Option<bool>,
}

impl NodeFacts {
    /// Read the node's own part (labels, annotations, cordon, Ready) from a k8s-openapi
    /// [`Node`] or a caller's compact copy ([`UpgradeNode`]); the driver, pods and validator
    /// are the caller's to fill in.
    pub fn from_node(node: &impl UpgradeNode) -> NodeFacts {
        let secs = |k: &str| {
            node.annotation(k)
                .and_then(|v| v.trim().parse::<i64>().ok())
        };
        NodeFacts {
            name: node.name().to_string(),
            state: UpgradeState::from_label(node.label(STATE_LABEL)),
            skip: node.label(SKIP_LABEL) == Some("true"),
            requested: node.annotation(UPGRADE_REQUESTED) == Some("true"),
            safe_load_wait: node.annotation(SAFE_LOAD_ANNOTATION).is_some(),
            unschedulable: node.unschedulable(),
            ready: node.ready(),
            initially_unschedulable: node.annotation(INITIAL_UNSCHEDULABLE).is_some(),
            wait_start: secs(WAIT_FOR_COMPLETION_START),
            deletion_start: secs(POD_DELETION_START),
            drain_start: secs(DRAIN_START),
            validation_start: secs(VALIDATION_START),
            driver: None,
            pods: Vec::new(),
            validator_ready: None,
        }
    }

    /// Needs an upgrade: driver pod out of date (and owned), a safe-load wait, or a request.
    fn upgrade_wanted(&self) -> bool {
        let stale = self
            .driver
            .as_ref()
            .is_some_and(|d| !d.orphaned && !d.current_revision);
        stale || self.safe_load_wait || self.requested
    }

    /// The driver pod runs the current revision and is ready.
    fn driver_current_and_ready(&self) -> bool {
        self.driver
            .as_ref()
            .is_some_and(|d| !d.orphaned && d.current_revision && d.ready)
    }
}

/// A label selector in its string form (`app=trainer,tier!=web,env in (a,b),!legacy,gpu`), as
/// `kubectl -l` and upstream's `podSelector` take it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector(Vec<Requirement>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl Selector {
    /// Parse; the empty string selects everything.
    ///
    /// # Errors
    /// A message naming the part that is not a requirement.
    pub fn parse(s: &str) -> Result<Selector, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let bad = || format!("bad label selector requirement {part:?}");
            let req = if let Some(k) = part.strip_prefix('!') {
                Requirement::NotExists(key(k).ok_or_else(bad)?)
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEq(key(k).ok_or_else(bad)?, v.trim().to_string())
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Requirement::Eq(key(k).ok_or_else(bad)?, v.trim().to_string())
            } else if let Some((k, vs)) = set_op(part, " notin ") {
                Requirement::NotIn(key(k).ok_or_else(bad)?, values(vs).ok_or_else(bad)?)
            } else if let Some((k, vs)) = set_op(part, " in ") {
                Requirement::In(key(k).ok_or_else(bad)?, values(vs).ok_or_else(bad)?)
            } else {
                Requirement::Exists(key(part).ok_or_else(bad)?)
            };
            reqs.push(req);
        }
        Ok(Selector(reqs))
    }

    /// Add `key!=value` (upstream appends the drain-skip exemption this way).
    pub fn and_not(mut self, key: &str, value: &str) -> Selector {
        self.0.push(Requirement::NotEq(key.into(), value.into()));
        self
    }

    /// Whether `labels` (the API's map or any [`LabelLookup`]) satisfy every requirement.
    pub fn matches(&self, labels: &impl LabelLookup) -> bool {
        let has = |vs: &[String], x: &str| vs.iter().any(|v| v == x);
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => labels.label(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => labels.label(k) != Some(v.as_str()),
            Requirement::In(k, vs) => labels.label(k).is_some_and(|x| has(vs, x)),
            Requirement::NotIn(k, vs) => labels.label(k).is_none_or(|x| !has(vs, x)),
            Requirement::Exists(k) => labels.label(k).is_some(),
            Requirement::NotExists(k) => labels.label(k).is_none(),
        })
    }
}

/// Split at commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0_i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn key(k: &str) -> Option<String> {
    let k = k.trim();
    let ok = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    ok.then(|| k.to_string())
}

fn set_op<'a>(part: &'a str, op: &str) -> Option<(&'a str, &'a str)> {
    part.find(op).map(|i| (&part[..i], &part[i + op.len()..]))
}

fn values(vs: &str) -> Option<Vec<String>> {
    let inner = vs.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

/// `5` or `25%` of `total`, percentages rounded up (Kubernetes' `GetScaledValueFromIntOrPercent`
/// with round-up), by the one int-or-percent rule ([`IntOrPercent`]). A value that rule refuses
/// (`"many"`, `"150%"`, `""`) gives 0: no node is taken down. A policy carrying one is refused
/// before any upgrade runs ([`crate::spec::ClusterPolicySpec::validate`] names the field).
pub fn scaled(value: &IntOrString, total: usize) -> usize {
    IntOrPercent::parse(value).map_or(0, |v| v.scaled(total))
}

/// Upgrade slots free now (upstream `GetUpgradesAvailable`): `maxParallelUpgrades` minus the
/// nodes in progress (every `upgrade-required` node when it is 0), at most `maxUnavailable`,
/// and reduced so that the unavailable nodes (cordoned or NotReady, plus `cordon-required`)
/// plus the new ones stay within `maxUnavailable`.
pub fn slots(policy: &DriverUpgradePolicySpec, nodes: &[NodeFacts]) -> usize {
    let total = nodes.len();
    let in_progress = nodes.iter().filter(|n| n.state.in_progress()).count();
    let required = nodes
        .iter()
        .filter(|n| n.state == UpgradeState::UpgradeRequired)
        .count();
    let max_unavailable = scaled(&policy.max_unavailable, total);
    let mut available = if policy.max_parallel_upgrades == 0 {
        required
    } else {
        (policy.max_parallel_upgrades as usize).saturating_sub(in_progress)
    };
    available = available.min(max_unavailable);
    let unavailable = nodes
        .iter()
        .filter(|n| n.unschedulable || !n.ready || n.state == UpgradeState::CordonRequired)
        .count();
    if unavailable >= max_unavailable {
        0
    } else if max_unavailable < total && unavailable + available > max_unavailable {
        max_unavailable - unavailable
    } else {
        available
    }
}

/// One thing to do to a node (or for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Set the state label (`Unknown` removes it).
    SetState(UpgradeState),
    /// Set (`Some`) or remove (`None`) a node annotation.
    Annotate(&'static str, Option<String>),
    /// Mark the node unschedulable.
    Cordon,
    /// Mark the node schedulable.
    Uncordon,
    /// Evict these pods (`namespace/name`); `drain` tells which step asks (for the write's name).
    DeletePods {
        /// `namespace/name` of each pod.
        pods: Vec<String>,
        /// The drain step (all drainable pods) rather than GPU pod deletion.
        drain: bool,
    },
    /// Delete the driver pod so its DaemonSet recreates it from the current template.
    DeleteDriverPod {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// Publish an Event on the node (and the policy).
    Event {
        /// `Warning` rather than `Normal`.
        warning: bool,
        /// A note that repeats while a wait lasts (the IO layer may thin it out).
        progress: bool,
        /// What happened, with the reason (`waiting for 2 pods matching app=trainer, 41m so far`).
        note: String,
    },
}

/// The actions for one node, in the order to apply them (annotations and cordon before the
/// state label, so a restart between them repeats the step rather than skipping it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlan {
    /// Node name.
    pub node: String,
    /// What to do.
    pub actions: Vec<Action>,
}

/// Counts over the managed nodes, as upstream's gauges and kiln's status report them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Nodes with a driver pod (or mid-upgrade).
    pub total: usize,
    /// In `upgrade-required`.
    pub pending: usize,
    /// Past `upgrade-required`, not done (failed included).
    pub in_progress: usize,
    /// In `upgrade-done`.
    pub done: usize,
    /// In `upgrade-failed`.
    pub failed: usize,
    /// Slots free at the start of the pass.
    pub available: usize,
    /// Nodes per state name ([`UpgradeState::name`]), states with none left out.
    pub states: BTreeMap<String, usize>,
}

impl Counts {
    /// Count `nodes` (before the pass) with `available` slots.
    pub fn of(nodes: &[NodeFacts], available: usize) -> Counts {
        let n = |s: UpgradeState| nodes.iter().filter(|x| x.state == s).count();
        let mut states = BTreeMap::new();
        for s in UpgradeState::ALL {
            let c = n(s);
            if c > 0 {
                states.insert(s.name().to_string(), c);
            }
        }
        Counts {
            total: nodes.len(),
            pending: n(UpgradeState::UpgradeRequired),
            in_progress: nodes.iter().filter(|x| x.state.in_progress()).count(),
            done: n(UpgradeState::Done),
            failed: n(UpgradeState::Failed),
            available,
            states,
        }
    }
}

impl From<&Counts> for crate::spec::DriverUpgradeStatus {
    fn from(c: &Counts) -> Self {
        let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        crate::spec::DriverUpgradeStatus {
            total_nodes: n(c.total),
            upgrades_pending: n(c.pending),
            upgrades_in_progress: n(c.in_progress),
            upgrades_done: n(c.done),
            upgrades_failed: n(c.failed),
            upgrades_available: n(c.available),
            nodes: c.states.iter().map(|(k, v)| (k.clone(), n(*v))).collect(),
        }
    }
}

/// The outcome of one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Per node with something to do, by node name.
    pub nodes: Vec<NodePlan>,
    /// The counts before the pass.
    pub counts: Counts,
}

impl Plan {
    /// The actions for `node` (empty when none).
    pub fn actions(&self, node: &str) -> &[Action] {
        self.nodes
            .iter()
            .find(|p| p.node == node)
            .map_or(&[], |p| &p.actions)
    }
}

/// `41m`, `1h5m`, `30s`.
pub fn human_duration(secs: i64) -> String {
    let secs = secs.max(0);
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m"),
        (h, 0) => format!("{h}h"),
        (h, m) => format!("{h}h{m}m"),
    }
}

/// The inputs of a pass besides the nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Inputs<'a> {
    /// The policy (`autoUpgrade` is the caller's gate: see [`disabled`]).
    pub policy: &'a DriverUpgradePolicySpec,
    /// Now, unix seconds.
    pub now: i64,
    /// Seconds `validation-required` waits ([`VALIDATION_TIMEOUT_SECONDS`] upstream).
    pub validation_timeout: i64,
}

/// Auto upgrade off (or no policy): remove the state label from every node that has one
/// (upstream does the same and leaves the rest as it is).
pub fn disabled(nodes: &[NodeFacts]) -> Vec<NodePlan> {
    nodes
        .iter()
        .filter(|n| n.state != UpgradeState::Unknown)
        .map(|n| NodePlan {
            node: n.name.clone(),
            actions: vec![Action::SetState(UpgradeState::Unknown)],
        })
        .collect()
}

/// One pass over `nodes` (the driver's managed nodes): at most one state change per node.
/// Nodes are visited by name, so slots go to the same nodes on every replica.
pub fn plan(inputs: &Inputs<'_>, nodes: &[NodeFacts]) -> Plan {
    let mut available = slots(inputs.policy, nodes);
    let counts = Counts::of(nodes, available);
    let mut order: Vec<&NodeFacts> = nodes.iter().collect();
    order.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = Vec::new();
    for node in order {
        let mut step = Step {
            node,
            inputs,
            actions: Vec::new(),
        };
        step.run(&mut available);
        if !step.actions.is_empty() {
            out.push(NodePlan {
                node: node.name.clone(),
                actions: step.actions,
            });
        }
    }
    Plan { nodes: out, counts }
}

struct Step<'a> {
    node: &'a NodeFacts,
    inputs: &'a Inputs<'a>,
    actions: Vec<Action>,
}

impl Step<'_> {
    fn to(&mut self, state: UpgradeState, why: &str) {
        self.actions.push(Action::SetState(state));
        let from = self.node.state;
        let note = if why.is_empty() {
            format!("{from} -> {state}")
        } else {
            format!("{from} -> {state}: {why}")
        };
        self.actions.push(Action::Event {
            warning: state == UpgradeState::Failed,
            progress: false,
            note,
        });
    }

    fn annotate(&mut self, key: &'static str, value: Option<String>) {
        self.actions.push(Action::Annotate(key, value));
    }

    /// Remove `key` when the node has it (`present`).
    fn clear(&mut self, key: &'static str, present: bool) {
        if present {
            self.annotate(key, None);
        }
    }

    fn event(&mut self, warning: bool, progress: bool, note: String) {
        self.actions.push(Action::Event {
            warning,
            progress,
            note,
        });
    }

    fn run(&mut self, available: &mut usize) {
        let n = self.node;
        let now = self.inputs.now;
        let policy = self.inputs.policy;
        match n.state {
            UpgradeState::Unknown | UpgradeState::Done => {
                if n.driver.is_none() {
                    return;
                }
                if n.upgrade_wanted() {
                    if n.unschedulable && !n.initially_unschedulable {
                        self.annotate(INITIAL_UNSCHEDULABLE, Some("true".into()));
                    }
                    let why = if n.requested {
                        "upgrade requested"
                    } else if n.safe_load_wait {
                        "driver waits for a safe load"
                    } else {
                        "driver pod runs an old template"
                    };
                    self.to(UpgradeState::UpgradeRequired, why);
                } else if n.state == UpgradeState::Unknown {
                    self.to(UpgradeState::Done, "driver pod is current");
                }
            }
            UpgradeState::UpgradeRequired => {
                self.clear(UPGRADE_REQUESTED, n.requested);
                if n.skip {
                    return;
                }
                if *available == 0 && !n.unschedulable {
                    return;
                }
                *available = available.saturating_sub(1);
                let restart_only = n.driver.as_ref().is_some_and(|d| {
                    !d.orphaned && d.same_digest && !n.requested && !n.safe_load_wait
                });
                if restart_only {
                    if !n.unschedulable {
                        self.actions.push(Action::Cordon);
                    }
                    self.to(
                        UpgradeState::PodRestartRequired,
                        "same DRIVER_CONFIG_DIGEST: restart only",
                    );
                } else {
                    self.to(UpgradeState::CordonRequired, "");
                }
            }
            UpgradeState::CordonRequired => {
                if !n.unschedulable {
                    self.actions.push(Action::Cordon);
                }
                self.to(UpgradeState::WaitForJobsRequired, "cordoned");
            }
            UpgradeState::WaitForJobsRequired => self.wait_for_jobs(now),
            UpgradeState::PodDeletionRequired => {
                let spec = policy.pod_deletion.clone().unwrap_or_default();
                self.pod_deletion(&spec, now);
            }
            UpgradeState::DrainRequired => {
                let spec = policy.drain.clone().unwrap_or_default();
                self.drain(&spec, now);
            }
            UpgradeState::PodRestartRequired => self.pod_restart(),
            UpgradeState::ValidationRequired => self.validation(now),
            UpgradeState::UncordonRequired => {
                if n.unschedulable {
                    self.actions.push(Action::Uncordon);
                }
                self.to(UpgradeState::Done, "uncordoned");
            }
            UpgradeState::Failed => {
                if n.driver_current_and_ready() && n.validator_ready != Some(false) {
                    self.uncordon_or_done("driver pod and validator ready again");
                }
            }
        }
    }

    fn wait_for_jobs(&mut self, now: i64) {
        let n = self.node;
        let wait = self
            .inputs
            .policy
            .wait_for_completion
            .clone()
            .unwrap_or_default();
        let next = UpgradeState::PodDeletionRequired;
        if wait.pod_selector.trim().is_empty() {
            self.clear(WAIT_FOR_COMPLETION_START, n.wait_start.is_some());
            self.to(next, "");
            return;
        }
        let selector = match Selector::parse(&wait.pod_selector) {
            Ok(s) => s,
            Err(e) => {
                self.clear(WAIT_FOR_COMPLETION_START, n.wait_start.is_some());
                self.to(
                    UpgradeState::Failed,
                    &format!("waitForCompletion.podSelector: {e}"),
                );
                return;
            }
        };
        let (running, finished): (Vec<&PodFacts>, Vec<&PodFacts>) = n
            .pods
            .iter()
            .filter(|p| selector.matches(&p.labels))
            .partition(|p| p.phase.holds_node());
        if running.is_empty() {
            self.clear(WAIT_FOR_COMPLETION_START, n.wait_start.is_some());
            let ended = if finished.is_empty() {
                String::new()
            } else {
                format!(" ({} finished: {})", finished.len(), keys(&finished))
            };
            self.to(
                next,
                &format!(
                    "no pod matching {} pending or running{ended}",
                    wait.pod_selector
                ),
            );
            return;
        }
        let Some(start) = n.wait_start else {
            self.annotate(WAIT_FOR_COMPLETION_START, Some(now.to_string()));
            self.event(
                false,
                false,
                format!(
                    "waiting for {} pod(s) matching {} to complete ({})",
                    running.len(),
                    wait.pod_selector,
                    limit(wait.timeout_seconds)
                ),
            );
            return;
        };
        let elapsed = now - start;
        if wait.timeout_seconds > 0 && elapsed >= i64::from(wait.timeout_seconds) {
            self.annotate(WAIT_FOR_COMPLETION_START, None);
            self.to(
                next,
                &format!(
                    "{} pod(s) matching {} still running after the {} timeout",
                    running.len(),
                    wait.pod_selector,
                    human_duration(i64::from(wait.timeout_seconds))
                ),
            );
            return;
        }
        self.event(
            false,
            true,
            format!(
                "waiting for {} pod(s) matching {}, {} so far",
                running.len(),
                wait.pod_selector,
                human_duration(elapsed)
            ),
        );
    }

    /// Delete the GPU pods; on a pod that may not be deleted or a timeout, drain (when on) or fail.
    fn pod_deletion(&mut self, spec: &PodDeletionSpec, now: i64) {
        let n = self.node;
        let gpu: Vec<&PodFacts> = n
            .pods
            .iter()
            .filter(|p| p.uses_gpu && !p.mirror && !p.daemonset && p.phase.holds_node())
            .collect();
        let drain_on = self.inputs.policy.drain.as_ref().is_some_and(|d| d.enable);
        let fallback = if drain_on {
            UpgradeState::DrainRequired
        } else {
            UpgradeState::Failed
        };
        if gpu.is_empty() {
            self.clear(POD_DELETION_START, n.deletion_start.is_some());
            self.to(UpgradeState::PodRestartRequired, "no GPU pods on the node");
            return;
        }
        let blocked = blockers(&gpu, spec.force, spec.delete_empty_dir);
        if !blocked.is_empty() {
            self.clear(POD_DELETION_START, n.deletion_start.is_some());
            self.to(
                fallback,
                &format!("cannot delete GPU pods: {}", blocked.join(", ")),
            );
            return;
        }
        let start = n.deletion_start.unwrap_or(now);
        if n.deletion_start.is_none() {
            self.annotate(POD_DELETION_START, Some(now.to_string()));
        }
        let elapsed = now - start;
        if spec.timeout_seconds > 0 && elapsed >= i64::from(spec.timeout_seconds) {
            self.annotate(POD_DELETION_START, None);
            self.to(
                fallback,
                &format!(
                    "{} GPU pod(s) still present after the {} timeout: {}",
                    gpu.len(),
                    human_duration(i64::from(spec.timeout_seconds)),
                    keys(&gpu)
                ),
            );
            return;
        }
        let pending: Vec<String> = gpu.iter().filter(|p| p.live()).map(|p| p.key()).collect();
        if !pending.is_empty() {
            self.event(
                false,
                n.deletion_start.is_some(),
                format!(
                    "deleting {} GPU pod(s): {}",
                    pending.len(),
                    pending.join(", ")
                ),
            );
            self.actions.push(Action::DeletePods {
                pods: pending,
                drain: false,
            });
        }
    }

    fn drain(&mut self, spec: &DrainSpec, now: i64) {
        let n = self.node;
        if !spec.enable {
            self.clear(DRAIN_START, n.drain_start.is_some());
            self.to(UpgradeState::PodRestartRequired, "drain disabled");
            return;
        }
        let selector = match Selector::parse(&spec.pod_selector) {
            Ok(s) => s.and_not(DRAIN_SKIP_POD_LABEL, "true"),
            Err(e) => {
                self.clear(DRAIN_START, n.drain_start.is_some());
                self.to(UpgradeState::Failed, &format!("drain.podSelector: {e}"));
                return;
            }
        };
        let targets: Vec<&PodFacts> = n
            .pods
            .iter()
            .filter(|p| !p.mirror && !p.daemonset && p.phase.holds_node())
            .filter(|p| selector.matches(&p.labels))
            .collect();
        if targets.is_empty() {
            self.clear(DRAIN_START, n.drain_start.is_some());
            self.to(UpgradeState::PodRestartRequired, "drained");
            return;
        }
        let blocked = blockers(&targets, spec.force, spec.delete_empty_dir);
        if !blocked.is_empty() {
            self.clear(DRAIN_START, n.drain_start.is_some());
            self.to(
                UpgradeState::Failed,
                &format!("cannot drain: {}", blocked.join(", ")),
            );
            return;
        }
        let start = n.drain_start.unwrap_or(now);
        if n.drain_start.is_none() {
            self.annotate(DRAIN_START, Some(now.to_string()));
        }
        let elapsed = now - start;
        if spec.timeout_seconds > 0 && elapsed >= i64::from(spec.timeout_seconds) {
            self.annotate(DRAIN_START, None);
            self.to(
                UpgradeState::Failed,
                &format!(
                    "drain timed out after {}: {} pod(s) left: {}",
                    human_duration(i64::from(spec.timeout_seconds)),
                    targets.len(),
                    keys(&targets)
                ),
            );
            return;
        }
        let pending: Vec<String> = targets
            .iter()
            .filter(|p| p.live())
            .map(|p| p.key())
            .collect();
        if !pending.is_empty() {
            self.event(
                false,
                n.drain_start.is_some(),
                format!("draining {} pod(s): {}", pending.len(), pending.join(", ")),
            );
            self.actions.push(Action::DeletePods {
                pods: pending,
                drain: true,
            });
        }
    }

    fn pod_restart(&mut self) {
        let n = self.node;
        let Some(d) = &n.driver else { return };
        if d.orphaned || !d.current_revision {
            if !d.terminating {
                self.actions.push(Action::DeleteDriverPod {
                    namespace: d.namespace.clone(),
                    name: d.name.clone(),
                });
                self.event(false, false, format!("restarting driver pod {}", d.name));
            }
            return;
        }
        self.clear(SAFE_LOAD_ANNOTATION, n.safe_load_wait);
        if d.ready {
            self.to(UpgradeState::ValidationRequired, "driver pod ready");
        } else if d.crash_looping {
            self.to(
                UpgradeState::Failed,
                &format!(
                    "driver pod {} restarted more than {MAX_DRIVER_RESTARTS} times",
                    d.name
                ),
            );
        }
    }

    fn validation(&mut self, now: i64) {
        let n = self.node;
        self.clear(SAFE_LOAD_ANNOTATION, n.safe_load_wait);
        if n.validator_ready != Some(false) {
            self.clear(VALIDATION_START, n.validation_start.is_some());
            let why = if n.validator_ready.is_some() {
                "validator ready"
            } else {
                "no validator on the node"
            };
            self.uncordon_or_done(why);
            return;
        }
        let Some(start) = n.validation_start else {
            self.annotate(VALIDATION_START, Some(now.to_string()));
            return;
        };
        let elapsed = now - start;
        if elapsed >= self.inputs.validation_timeout {
            self.annotate(VALIDATION_START, None);
            self.to(
                UpgradeState::Failed,
                &format!(
                    "validator not ready after {}",
                    human_duration(self.inputs.validation_timeout)
                ),
            );
        } else {
            self.event(
                false,
                true,
                format!(
                    "waiting for the validator, {} so far",
                    human_duration(elapsed)
                ),
            );
        }
    }

    /// `uncordon-required`, or `upgrade-done` (dropping the annotation) for a node that was
    /// cordoned before its upgrade.
    fn uncordon_or_done(&mut self, why: &str) {
        if self.node.initially_unschedulable {
            self.annotate(INITIAL_UNSCHEDULABLE, None);
            self.to(
                UpgradeState::Done,
                &format!("{why}; left cordoned as found"),
            );
        } else {
            self.to(UpgradeState::UncordonRequired, why);
        }
    }
}

fn limit(timeout: u32) -> String {
    if timeout == 0 {
        "no timeout".into()
    } else {
        format!("timeout {}", human_duration(i64::from(timeout)))
    }
}

fn keys(pods: &[&PodFacts]) -> String {
    pods.iter().map(|p| p.key()).collect::<Vec<_>>().join(", ")
}

/// The pods that may not be deleted: bare ones without `force`, emptyDir ones without
/// `deleteEmptyDir` (kubectl drain's rules), each with why.
fn blockers(pods: &[&PodFacts], force: bool, delete_empty_dir: bool) -> Vec<String> {
    pods.iter()
        .filter_map(|p| {
            if !p.controlled && !force {
                Some(format!(
                    "{} (not managed by a controller; needs force)",
                    p.key()
                ))
            } else if p.empty_dir && !delete_empty_dir {
                Some(format!("{} (uses emptyDir; needs deleteEmptyDir)", p.key()))
            } else {
                None
            }
        })
        .collect()
}

#[cfg(test)]
#[path = "upgrade_tests.rs"]
mod tests;
