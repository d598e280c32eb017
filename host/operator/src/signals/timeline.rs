//! Per-node readiness timeline and allocatable-below-hardware gauges (kiln's own signals; NVIDIA's
//! operator has neither).
//!
//! For each GPU node (NFD's NVIDIA PCI label or `nvidia.com/gpu.present=true`), the time from the
//! node's `creationTimestamp` to five [`Stage`]s goes into the histogram
//! `kiln_node_ready_seconds{stage}`, and one Event (`GPUNodeReady`, on the Node) is published
//! when the last stage is reached:
//!
//! | stage | reached when | time taken from |
//! |---|---|---|
//! | `labelled` | the node carries `nvidia.com/gpu.present=true` | when the operator saw it |
//! | `driver_ready` | the node's validator pod finished init container `driver-validation` (exit 0) | its `finishedAt` |
//! | `toolkit_ready` | … `toolkit-validation` | its `finishedAt` |
//! | `validated` | the validator pod is Ready (every check passed) | the `Ready` condition's `lastTransitionTime` |
//! | `gpu_allocatable` | the node's allocatable GPUs ([`crate::cluster::node::allocatable_gpus`]) are above 0 | when the operator saw it |
//!
//! A stage is measured once per node (the first time it is reached), so a validator restart or
//! a driver upgrade does not add samples; a node that stops being a GPU node and becomes one
//! again is measured anew. Nodes already present when the operator starts (or
//! becomes leader) keep the stages they have reached unmeasured — a previous replica measured
//! them, or they predate kiln — and the stages they reach later are measured; nodes that join
//! later are measured in full. A node fully ready at startup gets no Event.
//!
//! Per node with a GPU count label, `kiln_node_gpus_expected` ([`crate::cluster::node::expected_gpus`]) and
//! `kiln_node_gpus_allocatable` ([`crate::cluster::node::allocatable_gpus`]) are exported; the chart's PrometheusRule
//! alerts when the second stays below the first.
//!
//! IO: the node watch's events ([`crate::controllers::policy::nodes::follow_nodes`] hands on each node's
//! [`NodeFacts`] when they change) and the events of the driver upgrade's watch of the
//! validator pods of the operator namespace ([`VALIDATOR_SELECTOR`],
//! [`crate::cluster::readiness::PodWatches::tap_matching`]), of which only [`ValidatorFacts`] are kept,
//! and only while the pod's node is still reaching its stages: no watch of its own. At rest,
//! with every GPU node ready, the timeline holds each node's interned name in two sets and
//! nothing else (its size: `cargo bench -p kiln-operator --bench node_memory`; figures in
//! `deploy/operator/README.md`, Memory).
//! The decisions are [`Tracker`]'s, with no IO.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event as KubeEvent, EventType};

use crate::signals::events::Events;
use kube::runtime::watcher;

use crate::cluster::node::{SlimNode, Sym};
use crate::cluster::readiness::{PodEvent, SlimPod};
use crate::memory::shrink_if_sparse;
use crate::signals::metrics::Metrics;
pub use crate::signals::metrics::Stage;

/// Label selector of the validator pods (`state-operator-validation`'s DaemonSet template).
pub use kiln_core::upgrade::VALIDATOR_SELECTOR;
/// The validator's init container whose success means the driver is ready.
pub const DRIVER_VALIDATION: &str = "driver-validation";
/// The validator's init container whose success means the container toolkit is ready.
pub const TOOLKIT_VALIDATION: &str = "toolkit-validation";
/// Reason of the Event published when a node reached every stage.
pub const READY_REASON: &str = "GPUNodeReady";

/// What the timeline keeps of a Node.
#[derive(Debug, Clone, PartialEq, Hash)]
pub struct NodeFacts {
    /// `metadata.name`, interned (one copy a node: the node store's hostname label, the
    /// gauges' label sets and the validator pods' node names share it).
    pub name: Sym,
    /// `metadata.uid` (for the Event's reference).
    pub uid: Option<String>,
    /// `metadata.creationTimestamp`.
    pub created: Option<Timestamp>,
    /// Whether it is (or will be) a GPU node: NFD's NVIDIA PCI label or `gpu.present=true`.
    pub gpu: bool,
    /// Whether it carries `nvidia.com/gpu.present=true`.
    pub labelled: bool,
    /// [`crate::cluster::node::expected_gpus`] of its labels.
    pub expected: Option<i64>,
    /// [`crate::cluster::node::allocatable_gpus`] of its status.
    pub allocatable: i64,
    /// What the stuck-node signal reads of its labels ([`crate::signals::stuck`]).
    pub stuck: crate::signals::stuck::NodeMarks,
}

/// Reads [`NodeFacts`] from the node store's copy of a Node.
pub fn node_facts(node: &SlimNode) -> NodeFacts {
    NodeFacts {
        name: Sym::from(node.name()),
        uid: node.uid().map(String::from),
        created: node.created().map(|t| t.0),
        gpu: node.has_gpu_pci() || node.is_gpu(),
        labelled: node.is_gpu(),
        expected: node.expected_gpus(),
        allocatable: node.allocatable_gpus(),
        stuck: crate::signals::stuck::node_marks(node.labels()),
    }
}

/// What the timeline keeps of a validator pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ValidatorFacts {
    /// `spec.nodeName` (empty while unscheduled).
    pub node: Sym,
    /// When `driver-validation` finished with exit code 0.
    pub driver: Option<Timestamp>,
    /// When `toolkit-validation` finished with exit code 0.
    pub toolkit: Option<Timestamp>,
    /// When the pod became Ready.
    pub validated: Option<Timestamp>,
}

/// Reads [`ValidatorFacts`] from a validator pod; `now` stands in for a missing timestamp.
pub fn validator_facts(pod: &SlimPod, now: Timestamp) -> ValidatorFacts {
    let finished = |name: &str| {
        pod.init_terminated(name)
            .filter(|(code, _)| *code == 0)
            .map(|(_, at)| at.map_or(now, |f| f.0))
    };
    let validated = pod.ready_since().map(|at| at.map_or(now, |t| t.0));
    ValidatorFacts {
        node: pod.node_name().unwrap_or_default().into(),
        // A Ready pod has passed every init container, even when their statuses are gone.
        driver: finished(DRIVER_VALIDATION).or(validated),
        toolkit: finished(TOOLKIT_VALIDATION).or(validated),
        validated,
    }
}

/// What the [`Tracker`] asks the IO side to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// Observe `seconds` into `kiln_node_ready_seconds{stage}`.
    Stage {
        /// Node name.
        node: String,
        /// The stage reached.
        stage: Stage,
        /// Seconds from the node's creation.
        seconds: f64,
    },
    /// The node reached every stage: publish one Event.
    Ready {
        /// Node name.
        node: String,
        /// Node uid.
        uid: Option<String>,
        /// Seconds from creation to each stage, in [`Stage::ALL`] order.
        seconds: [f64; 5],
    },
    /// Set the node's GPU gauges.
    Gpus {
        /// Node name.
        node: Sym,
        /// [`crate::cluster::node::expected_gpus`].
        expected: i64,
        /// [`crate::cluster::node::allocatable_gpus`].
        allocatable: i64,
    },
    /// Remove the node's GPU gauges.
    ForgetGpus {
        /// Node name.
        node: Sym,
    },
}

/// One GPU node still reaching its stages.
#[derive(Debug, Clone)]
struct Track {
    facts: NodeFacts,
    /// Each stage, in [`Stage::ALL`] order.
    reached: [Reached; 5],
}

/// One validator pod's facts, kept while its node is pending.
#[derive(Debug, Clone)]
struct PodTimes {
    name: Box<str>,
    facts: ValidatorFacts,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Reached {
    No,
    /// Reached before the tracker went live: not measured.
    Known,
    /// Reached and measured: seconds from the node's creation.
    At(f64),
}

/// Which watch a relist belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The Node watch.
    Nodes,
    /// The validator pod watch.
    Pods,
}

/// The timeline's state: tracked GPU nodes and validator pods, and whether both watches have
/// listed once (before that, nothing is measured: see the module docs).
///
/// Only a node still reaching its stages (`pending`) keeps its facts and the facts of the
/// validator pods on it; a node that reached every stage is only a name in `done`, and the
/// facts of validator pods on it are dropped (a stage is measured once per node, so none of
/// them can measure anything). At rest, with every GPU node ready, the tracker holds one
/// interned name a node (its `done` and `gauged` entries).
#[derive(Debug, Default)]
pub struct Tracker {
    /// GPU nodes not yet announced.
    pending: HashMap<Sym, Track>,
    /// GPU nodes that reached every stage (announced, or ready before measuring started).
    done: HashSet<Sym>,
    /// Validator pods on nodes not in `done`, by node.
    pods: HashMap<Sym, Vec<PodTimes>>,
    listed: BTreeSet<&'static str>,
    live: bool,
    /// Names seen in the running relist of each source.
    relist: HashMap<&'static str, BTreeSet<String>>,
    /// Nodes with GPU gauges set.
    gauged: HashSet<Sym>,
}

fn source_key(s: Source) -> &'static str {
    match s {
        Source::Nodes => "nodes",
        Source::Pods => "pods",
    }
}

fn seconds_between(from: Timestamp, to: Timestamp) -> f64 {
    let ms = to.as_millisecond() - from.as_millisecond();
    (ms.max(0) as f64) / 1000.0
}

impl Tracker {
    /// Whether measuring has started (both watches listed once).
    pub fn is_live(&self) -> bool {
        self.live
    }

    /// A watch starts a (re)list.
    pub fn begin_list(&mut self, source: Source) {
        self.relist.insert(source_key(source), BTreeSet::new());
    }

    /// A watch finished a (re)list: objects it did not list are gone. The first time both
    /// watches have listed, the tracker goes live: stages reached so far stay unmeasured and
    /// nodes fully ready by now get no Event.
    pub fn end_list(&mut self, source: Source, now: Timestamp) -> Vec<Update> {
        let key = source_key(source);
        let seen = self.relist.remove(key).unwrap_or_default();
        let mut out = Vec::new();
        match source {
            Source::Nodes => {
                let gone: BTreeSet<String> = self
                    .pending
                    .keys()
                    .chain(self.done.iter())
                    .chain(self.gauged.iter())
                    .filter(|n| !seen.contains(&***n))
                    .map(|n| n.to_string())
                    .collect();
                for name in gone {
                    out.extend(self.node_deleted(&name));
                }
            }
            Source::Pods => {
                self.pods.retain(|_, pods| {
                    pods.retain(|p| seen.contains(&*p.name));
                    !pods.is_empty()
                });
            }
        }
        self.listed.insert(key);
        if !self.live && self.listed.len() == 2 {
            // Still not live: whatever is reached now becomes Known, not measured.
            let names: Vec<Sym> = self.pending.keys().cloned().collect();
            for name in names {
                self.evaluate(&name, now, &mut Vec::new());
                if self.pending[&name]
                    .reached
                    .iter()
                    .all(|r| *r != Reached::No)
                {
                    self.finish(name);
                }
            }
            self.live = true;
        }
        out
    }

    /// A Node was listed or changed.
    pub fn node(&mut self, facts: NodeFacts, now: Timestamp) -> Vec<Update> {
        let name = facts.name.clone();
        if let Some(seen) = self.relist.get_mut(source_key(Source::Nodes)) {
            seen.insert(name.to_string());
        }
        let mut out = Vec::new();
        match facts.expected {
            Some(expected) => {
                self.gauged.insert(name.clone());
                out.push(Update::Gpus {
                    node: name.clone(),
                    expected,
                    allocatable: facts.allocatable,
                });
            }
            None => {
                if self.gauged.remove(&name) {
                    out.push(Update::ForgetGpus { node: name.clone() });
                }
            }
        }
        if !facts.gpu || facts.created.is_none() {
            self.pending.remove(&name);
            self.done.remove(&name);
            return out;
        }
        if self.done.contains(&name) {
            return out;
        }
        match self.pending.get_mut(&name) {
            Some(t) => t.facts = facts,
            None => {
                self.pending.insert(
                    name.clone(),
                    Track {
                        facts,
                        reached: [Reached::No; 5],
                    },
                );
            }
        }
        self.evaluate(&name, now, &mut out);
        out
    }

    /// A Node was deleted.
    pub fn node_deleted(&mut self, name: &str) -> Vec<Update> {
        let name = Sym::from(name);
        self.pending.remove(&name);
        self.done.remove(&name);
        self.pods.remove(&name);
        if self.gauged.remove(&name) {
            vec![Update::ForgetGpus { node: name }]
        } else {
            Vec::new()
        }
    }

    /// A validator pod was listed or changed.
    pub fn pod(&mut self, name: &str, facts: ValidatorFacts, now: Timestamp) -> Vec<Update> {
        let node = facts.node.clone();
        self.pod_on(name, &node, || facts, now)
    }

    /// A validator pod on `node` (`spec.nodeName`, empty while unscheduled) was listed or
    /// changed; `facts` reads its [`ValidatorFacts`], and is called only when they can still
    /// measure something (the node is not ready yet), so the watch's pod is not converted for
    /// nothing.
    pub fn pod_on(
        &mut self,
        name: &str,
        node: &str,
        facts: impl FnOnce() -> ValidatorFacts,
        now: Timestamp,
    ) -> Vec<Update> {
        if let Some(seen) = self.relist.get_mut(source_key(Source::Pods)) {
            seen.insert(name.to_string());
        }
        let node = Sym::from(node);
        // Unscheduled (no `spec.nodeName` yet): no stage to show, and its node is not known.
        if node.is_empty() || self.done.contains(&node) {
            return Vec::new();
        }
        let facts = facts();
        let pods = self.pods.entry(node.clone()).or_default();
        match pods.iter_mut().find(|p| &*p.name == name) {
            Some(p) => p.facts = facts,
            None => pods.push(PodTimes {
                name: name.into(),
                facts,
            }),
        }
        let mut out = Vec::new();
        self.evaluate(&node, now, &mut out);
        out
    }

    /// Validator pod `name` on `node` (`spec.nodeName`) was deleted (stages it showed stay
    /// reached).
    pub fn pod_deleted(&mut self, name: &str, node: &str) {
        let node = Sym::from(node);
        if let Some(pods) = self.pods.get_mut(&node) {
            pods.retain(|p| &*p.name != name);
            if pods.is_empty() {
                self.pods.remove(&node);
            }
        }
    }

    /// `node` reached every stage: keep only its name.
    fn finish(&mut self, node: Sym) {
        self.pending.remove(&node);
        self.pods.remove(&node);
        self.done.insert(node);
        shrink_if_sparse(&mut self.pending);
        shrink_if_sparse(&mut self.pods);
    }

    /// When each stage is reached for `node` by what is known now (`None`: not reached).
    fn stage_times(&self, track: &Track, now: Timestamp) -> [Option<Timestamp>; 5] {
        let pods = self
            .pods
            .get(&track.facts.name)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let earliest = |f: fn(&ValidatorFacts) -> Option<Timestamp>| {
            pods.iter().filter_map(|p| f(&p.facts)).min()
        };
        [
            track.facts.labelled.then_some(now),
            earliest(|p| p.driver),
            earliest(|p| p.toolkit),
            earliest(|p| p.validated),
            (track.facts.allocatable > 0).then_some(now),
        ]
    }

    fn evaluate(&mut self, node: &Sym, now: Timestamp, out: &mut Vec<Update>) {
        let Some(track) = self.pending.get(node) else {
            return;
        };
        let Some(created) = track.facts.created else {
            return;
        };
        let times = self.stage_times(track, now);
        let live = self.live;
        let track = self.pending.get_mut(node).expect("looked up above");
        for stage in Stage::ALL {
            let i = stage.index();
            if track.reached[i] != Reached::No {
                continue;
            }
            let Some(at) = times[i] else { continue };
            if live {
                let seconds = seconds_between(created, at);
                track.reached[i] = Reached::At(seconds);
                out.push(Update::Stage {
                    node: node.to_string(),
                    stage,
                    seconds,
                });
            } else {
                track.reached[i] = Reached::Known;
            }
        }
        if live && track.reached.iter().all(|r| *r != Reached::No) {
            // Only a node measured in full is announced with its timeline; one that reached
            // some stages before the operator started is announced without the unknown ones.
            let seconds = track.reached.map(|r| match r {
                Reached::At(s) => s,
                _ => f64::NAN,
            });
            out.push(Update::Ready {
                node: node.to_string(),
                uid: track.facts.uid.clone(),
                seconds,
            });
            self.finish(node.clone());
        }
    }
}

/// The note of the `GPUNodeReady` Event: total time and each measured stage.
pub fn ready_note(node: &str, seconds: &[f64; 5]) -> String {
    let known: Vec<String> = Stage::ALL
        .iter()
        .zip(seconds)
        .filter(|(_, s)| s.is_finite())
        .map(|(stage, s)| format!("{} {s:.0}s", stage.name()))
        .collect();
    let total = seconds
        .iter()
        .copied()
        .filter(|s| s.is_finite())
        .fold(f64::NAN, f64::max);
    if total.is_finite() {
        format!(
            "node {node} is ready for GPU workloads {total:.0}s after joining the cluster ({})",
            known.join(", ")
        )
    } else {
        format!("node {node} is ready for GPU workloads")
    }
}

/// One input: a node watch event's facts, a validator pod watch event, or the stuck-node
/// signal's evaluation tick.
enum Input {
    Node(watcher::Event<NodeFacts>),
    Pod(PodEvent),
    Tick,
}

/// Room for node events between the node watch and the timeline ([`run`]'s `nodes`).
pub const NODE_EVENTS: usize = 1024;

/// Keep the timeline metrics and Events (see the module docs) from `nodes` (the node watch's
/// events, [`crate::controllers::policy::nodes::NodeWatch::timeline`]) and `pods` (the validator pod watch's events,
/// [`crate::cluster::readiness::PodWatches::tap_matching`]; that watch retries on errors with
/// kube-runtime's default backoff). Runs until both end; run it as a task while this replica
/// leads.
pub async fn run(
    metrics: Arc<Metrics>,
    recorder: Events,
    nodes: futures::channel::mpsc::Receiver<watcher::Event<NodeFacts>>,
    pods: futures::channel::mpsc::UnboundedReceiver<PodEvent>,
) {
    run_with(
        metrics,
        recorder,
        nodes,
        pods,
        crate::signals::stuck::StuckConfig::default(),
    )
    .await;
}

/// [`run`], with the stuck-node signal ([`crate::signals::stuck`]) fed from the same events
/// and evaluated every `stuck.tick`, under `stuck.limits`. Ends when both inputs end.
pub async fn run_with(
    metrics: Arc<Metrics>,
    recorder: Events,
    nodes: futures::channel::mpsc::Receiver<watcher::Event<NodeFacts>>,
    pods: futures::channel::mpsc::UnboundedReceiver<PodEvent>,
    stuck: crate::signals::stuck::StuckConfig,
) {
    let nodes = nodes.map(Input::Node);
    let pods = pods.map(Input::Pod);
    let mut inputs = std::pin::pin!(futures::stream::select(nodes, pods));
    let mut ticks = tokio::time::interval(stuck.tick);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tracker = Tracker::default();
    let mut stuck_tracker = crate::signals::stuck::StuckTracker::new(stuck.limits);
    loop {
        let input = tokio::select! {
            i = inputs.next() => match i {
                Some(i) => i,
                None => break,
            },
            _ = ticks.tick() => Input::Tick,
        };
        let now = Timestamp::now();
        let stuck_updates = feed_stuck(&mut stuck_tracker, &input, (stuck.clock)());
        for u in stuck_updates {
            crate::signals::stuck::apply(metrics.node_stuck(), &recorder, &stuck.limits, u).await;
        }
        let updates = match input {
            Input::Tick => Vec::new(),
            Input::Node(ev) => match ev {
                watcher::Event::Init => {
                    tracker.begin_list(Source::Nodes);
                    Vec::new()
                }
                watcher::Event::InitApply(f) | watcher::Event::Apply(f) => tracker.node(f, now),
                watcher::Event::InitDone => tracker.end_list(Source::Nodes, now),
                watcher::Event::Delete(f) => tracker.node_deleted(&f.name),
            },
            Input::Pod(ev) => match ev {
                watcher::Event::Init => {
                    tracker.begin_list(Source::Pods);
                    Vec::new()
                }
                watcher::Event::InitApply(p) | watcher::Event::Apply(p) => tracker.pod_on(
                    p.name(),
                    p.node_name().unwrap_or_default(),
                    || validator_facts(&p, now),
                    now,
                ),
                watcher::Event::InitDone => tracker.end_list(Source::Pods, now),
                watcher::Event::Delete(p) => {
                    tracker.pod_deleted(p.name(), p.node_name().unwrap_or_default());
                    Vec::new()
                }
            },
        };
        for update in updates {
            apply(&metrics, &recorder, update).await;
        }
    }
}

/// Hands `input` to the stuck-node signal ([`crate::signals::stuck`]) at `now` (Unix seconds).
fn feed_stuck(
    t: &mut crate::signals::stuck::StuckTracker,
    input: &Input,
    now: i64,
) -> Vec<crate::signals::stuck::StuckUpdate> {
    match input {
        Input::Tick => t.tick(now),
        Input::Node(watcher::Event::Init) => {
            t.begin_list();
            Vec::new()
        }
        Input::Node(watcher::Event::InitDone) => t.end_list(),
        Input::Node(watcher::Event::InitApply(f) | watcher::Event::Apply(f)) => {
            t.node(&f.name, f.uid.as_deref(), &f.stuck, now)
        }
        Input::Node(watcher::Event::Delete(f)) => t.node_deleted(&f.name),
        Input::Pod(watcher::Event::Init) => {
            t.begin_pod_list();
            Vec::new()
        }
        Input::Pod(watcher::Event::InitDone) => t.end_pod_list(now),
        Input::Pod(watcher::Event::InitApply(p) | watcher::Event::Apply(p)) => t.pod(
            p.name(),
            p.node_name().unwrap_or_default(),
            p.in_init(),
            now,
        ),
        Input::Pod(watcher::Event::Delete(p)) => {
            t.pod_deleted(p.name(), p.node_name().unwrap_or_default(), now)
        }
    }
}

async fn apply(metrics: &Metrics, recorder: &Events, update: Update) {
    match update {
        Update::Stage {
            node,
            stage,
            seconds,
        } => {
            tracing::debug!(%node, stage = stage.name(), seconds, "node readiness stage");
            metrics.node_stage(stage.name(), seconds);
        }
        Update::Gpus {
            node,
            expected,
            allocatable,
        } => metrics.node_gpus(&node, expected, allocatable),
        Update::ForgetGpus { node } => metrics.forget_node_gpus(&node),
        Update::Ready { node, uid, seconds } => {
            let note = ready_note(&node, &seconds);
            tracing::info!(%node, "{note}");
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.clone()),
                uid,
                ..ObjectReference::default()
            };
            let ev = KubeEvent {
                type_: EventType::Normal,
                reason: READY_REASON.into(),
                note: Some(note),
                action: "Observe".into(),
                secondary: None,
            };
            if let Err(e) = recorder.publish_once(&ev, &reference).await {
                tracing::warn!(%node, error = %e, "could not publish the node-ready event");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn facts(name: &str, labelled: bool, allocatable: i64) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            uid: Some(format!("uid-{name}")),
            created: Some(ts(0)),
            gpu: true,
            labelled,
            expected: None,
            allocatable,
            stuck: crate::signals::stuck::NodeMarks::default(),
        }
    }

    fn pod(
        node: &str,
        driver: Option<i64>,
        toolkit: Option<i64>,
        ready: Option<i64>,
    ) -> ValidatorFacts {
        ValidatorFacts {
            node: node.into(),
            driver: driver.map(ts),
            toolkit: toolkit.map(ts),
            validated: ready.map(ts),
        }
    }

    fn stages(updates: &[Update]) -> Vec<(Stage, f64)> {
        updates
            .iter()
            .filter_map(|u| match u {
                Update::Stage { stage, seconds, .. } => Some((*stage, *seconds)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn node_facts_read_labels_status_and_creation() {
        let node: SlimNode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpu-node-1", "uid": "u1",
                "creationTimestamp": "2027-01-15T08:00:00Z",
                "labels": {"feature.node.kubernetes.io/pci-10de.present": "true",
                    "nvidia.com/gpu.count": "2"}},
            "status": {"allocatable": {"nvidia.com/gpu": "1", "cpu": "4"}}
        }))
        .unwrap();
        let f = node_facts(&node);
        assert_eq!(f.name, "gpu-node-1");
        assert!(f.gpu && !f.labelled);
        assert_eq!((f.expected, f.allocatable), (Some(2), 1));
        assert_eq!(f.created, Some("2027-01-15T08:00:00Z".parse().unwrap()));
        let cpu: SlimNode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cpu-node-1", "labels": {"kubernetes.io/os": "linux"}}
        }))
        .unwrap();
        assert!(!node_facts(&cpu).gpu);
    }

    #[test]
    fn validator_facts_read_init_containers_and_ready() {
        let json = serde_json::json!({
            "metadata": {"name": "nvidia-operator-validator-x"},
            "spec": {"nodeName": "gpu-node-1", "containers": []},
            "status": {
                "conditions": [{"type": "Ready", "status": "False",
                    "lastTransitionTime": "2027-01-15T08:00:05Z"}],
                "initContainerStatuses": [
                    {"name": "driver-validation", "ready": true, "restartCount": 0, "image": "", "imageID": "",
                     "state": {"terminated": {"exitCode": 0, "finishedAt": "2027-01-15T08:00:40Z"}}},
                    {"name": "toolkit-validation", "ready": false, "restartCount": 1, "image": "", "imageID": "",
                     "state": {"terminated": {"exitCode": 1, "finishedAt": "2027-01-15T08:00:45Z"}}}
                ]}
        });
        // As the shared validator pod watch holds it.
        let pod: SlimPod = serde_json::from_value(json.clone()).unwrap();
        let now: Timestamp = "2027-01-15T08:01:00Z".parse().unwrap();
        let f = validator_facts(&pod, now);
        assert_eq!(f.node, "gpu-node-1");
        assert_eq!(f.driver, Some("2027-01-15T08:00:40Z".parse().unwrap()));
        assert_eq!(f.toolkit, None, "a failed validation is not ready");
        assert_eq!(f.validated, None);
        // A Ready pod has passed every validation.
        let mut ready = json;
        ready["status"]["conditions"][0]["status"] = "True".into();
        ready["status"]["initContainerStatuses"] = serde_json::Value::Null;
        let f = validator_facts(&serde_json::from_value(ready).unwrap(), now);
        let at = Some("2027-01-15T08:00:05Z".parse().unwrap());
        assert_eq!((f.driver, f.toolkit, f.validated), (at, at, at));
    }

    #[test]
    fn a_node_joining_later_is_measured_in_full_and_announced_once() {
        let mut t = Tracker::default();
        t.begin_list(Source::Nodes);
        t.begin_list(Source::Pods);
        assert!(t.end_list(Source::Nodes, ts(1)).is_empty());
        assert!(!t.is_live());
        t.end_list(Source::Pods, ts(1));
        assert!(t.is_live());

        // Joins at 0, seen at 3 with allocatable GPUs but not yet labelled.
        let u = t.node(facts("n1", false, 1), ts(3));
        assert_eq!(stages(&u), [(Stage::GpuAllocatable, 3.0)]);
        let u = t.node(facts("n1", true, 1), ts(5));
        assert_eq!(stages(&u), [(Stage::Labelled, 5.0)]);
        // The validator reports its own timestamps.
        let u = t.pod("v1", pod("n1", Some(40), None, None), ts(41));
        assert_eq!(stages(&u), [(Stage::DriverReady, 40.0)]);
        let u = t.pod("v1", pod("n1", Some(40), Some(45), Some(70)), ts(71));
        assert_eq!(
            stages(&u),
            [(Stage::ToolkitReady, 45.0), (Stage::Validated, 70.0)]
        );
        let ready: Vec<_> = u
            .iter()
            .filter(|u| matches!(u, Update::Ready { .. }))
            .collect();
        assert_eq!(
            ready,
            [&Update::Ready {
                node: "n1".into(),
                uid: Some("uid-n1".into()),
                seconds: [5.0, 40.0, 45.0, 70.0, 3.0]
            }]
        );
        // A validator restart (new pod, later times) measures nothing again.
        t.pod_deleted("v1", "n1");
        let u = t.pod("v2", pod("n1", Some(500), Some(510), Some(520)), ts(521));
        assert!(u.is_empty(), "{u:?}");
        assert_eq!(
            ready_note("n1", &[5.0, 40.0, 45.0, 70.0, 3.0]),
            "node n1 is ready for GPU workloads 70s after joining the cluster (labelled 5s, \
             driver_ready 40s, toolkit_ready 45s, validated 70s, gpu_allocatable 3s)"
        );
    }

    #[test]
    fn stages_reached_before_the_first_list_are_not_measured() {
        let mut t = Tracker::default();
        t.begin_list(Source::Nodes);
        t.begin_list(Source::Pods);
        // n1 is fully ready at startup; n2 is labelled with allocatable GPUs, not validated.
        assert!(stages(&t.node(facts("n1", true, 1), ts(100))).is_empty());
        assert!(stages(&t.node(facts("n2", true, 1), ts(100))).is_empty());
        t.end_list(Source::Nodes, ts(100));
        assert!(stages(&t.pod("v1", pod("n1", Some(10), Some(11), Some(12)), ts(100))).is_empty());
        t.end_list(Source::Pods, ts(100));
        // Later changes of n1 measure and announce nothing.
        assert!(t.node(facts("n1", true, 1), ts(200)).is_empty());
        // n2's validation finishes after startup: measured, and n2 is announced without the
        // stages it had reached before.
        let u = t.pod("v2", pod("n2", Some(150), Some(160), Some(170)), ts(171));
        assert_eq!(
            stages(&u),
            [
                (Stage::DriverReady, 150.0),
                (Stage::ToolkitReady, 160.0),
                (Stage::Validated, 170.0)
            ]
        );
        let Some(Update::Ready { seconds, .. }) = u.last() else {
            panic!("{u:?}")
        };
        assert_eq!(
            ready_note("n2", seconds),
            "node n2 is ready for GPU workloads 170s after joining the cluster (driver_ready \
             150s, toolkit_ready 160s, validated 170s)"
        );
    }

    #[test]
    fn a_ready_node_keeps_only_its_name_and_pods_before_their_node_count() {
        let mut t = Tracker::default();
        for source in [Source::Nodes, Source::Pods] {
            t.begin_list(source);
            t.end_list(source, ts(1));
        }
        // Unscheduled (no node yet): nothing kept.
        assert!(t.pod("v1", pod("", None, None, None), ts(2)).is_empty());
        assert!(t.pods.is_empty());
        // The validator pod's events come before its node's: kept, then read for the node.
        assert!(
            t.pod("v1", pod("n1", Some(40), Some(45), None), ts(46))
                .is_empty()
        );
        let u = t.node(facts("n1", true, 1), ts(50));
        assert_eq!(
            stages(&u),
            [
                (Stage::Labelled, 50.0),
                (Stage::DriverReady, 40.0),
                (Stage::ToolkitReady, 45.0),
                (Stage::GpuAllocatable, 50.0)
            ]
        );
        assert_eq!(t.pods[&Sym::from("n1")].len(), 1);
        let u = t.pod("v1", pod("n1", Some(40), Some(45), Some(60)), ts(61));
        assert!(matches!(u.last(), Some(Update::Ready { .. })), "{u:?}");
        // Ready: only the name is left, and later pods on it are not kept.
        assert!(t.pending.is_empty() && t.pods.is_empty());
        assert!(t.done.contains(&Sym::from("n1")));
        assert!(
            t.pod("v2", pod("n1", Some(90), None, None), ts(91))
                .is_empty()
        );
        assert!(t.pods.is_empty());
        // Its pods (and unscheduled ones) are not even read.
        let unread = || -> ValidatorFacts { panic!("facts read for nothing") };
        assert!(t.pod_on("v2", "n1", unread, ts(92)).is_empty());
        assert!(t.pod_on("v9", "", unread, ts(92)).is_empty());
        // No longer a GPU node, then one again: measured again from its creation.
        let mut cpu = facts("n1", false, 0);
        cpu.gpu = false;
        t.node(cpu, ts(100));
        assert!(t.done.is_empty());
        let u = t.node(facts("n1", true, 0), ts(110));
        assert_eq!(stages(&u), [(Stage::Labelled, 110.0)]);
        let u = t.pod("v3", pod("n1", Some(120), None, None), ts(121));
        assert_eq!(stages(&u), [(Stage::DriverReady, 120.0)]);
        // A deleted pod's facts go; the stage it showed stays reached.
        t.pod_deleted("v3", "n1");
        assert!(t.pods.is_empty());
        assert!(
            t.pod("v4", pod("n1", Some(130), None, None), ts(131))
                .is_empty()
        );
    }

    #[test]
    fn gpu_gauges_follow_the_count_label_and_the_node() {
        let mut t = Tracker::default();
        let mut f = facts("n1", true, 1);
        f.expected = Some(2);
        let u = t.node(f.clone(), ts(1));
        assert!(u.contains(&Update::Gpus {
            node: "n1".into(),
            expected: 2,
            allocatable: 1
        }));
        f.expected = None;
        assert!(
            t.node(f.clone(), ts(2))
                .contains(&Update::ForgetGpus { node: "n1".into() })
        );
        f.expected = Some(1);
        t.node(f, ts(3));
        // A relist that no longer has n1: its gauges go.
        t.begin_list(Source::Nodes);
        assert_eq!(
            t.end_list(Source::Nodes, ts(4)),
            [Update::ForgetGpus { node: "n1".into() }]
        );
        // A CPU node is neither tracked nor gauged.
        let mut cpu = facts("cpu", false, 0);
        cpu.gpu = false;
        assert!(t.node(cpu, ts(5)).is_empty());
    }

    #[test]
    fn selector_and_container_names_match_the_validator_asset() {
        let objects = kiln_render::assets::load_state(kiln_core::State::OperatorValidation, false)
            .expect("assets load");
        let ds = objects
            .iter()
            .map(|a| &a.object)
            .find(|o| o["kind"] == "DaemonSet")
            .expect("a DaemonSet");
        let (key, value) = VALIDATOR_SELECTOR.split_once('=').unwrap();
        assert_eq!(ds["spec"]["template"]["metadata"]["labels"][key], value);
        let inits: Vec<&str> = ds["spec"]["template"]["spec"]["initContainers"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert!(inits.contains(&DRIVER_VALIDATION) && inits.contains(&TOOLKIT_VALIDATION));
    }
}
