//! Stuck GPU nodes (kiln's own signal; NVIDIA's operator has none): the `kiln_node_stuck{node,
//! reason}` gauge (value 1 per stuck node and reason) and one Warning Event `GPUNodeStuck` on
//! the Node each time a reason appears, by the pure rule [`kiln_core::node_stuck`].
//!
//! Facts, all from what the operator's watches already deliver (no request of its own, none at
//! rest): the node watch's [`NodeMarks`] (the MIG manager's `nvidia.com/mig.config.state`, a
//! deploy label held at `paused-for-mig-change`, the driver-upgrade state label), carried in the
//! readiness timeline's [`crate::signals::timeline::NodeFacts`], and the validator pod watch's
//! events ([`crate::cluster::readiness::SlimPod::in_init`]). The times a state started are the
//! times the operator saw it start: a state already in place when the operator starts (or
//! becomes leader) counts from then. [`StuckTracker`] decides, with no IO; the readiness
//! timeline's task ([`crate::signals::timeline::run_with`]) feeds it and evaluates it every
//! [`StuckConfig::tick`] (in memory) so a state that stops moving is noticed without an event.
//!
//! Memory: an entry only for a node with a MIG or upgrade mark, a validator pod in Init or a
//! reason reported; a node at rest has none.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kiln_core::node_stuck::{
    DEPLOY_LABEL_PREFIX, EVENT_REASON, MIG_CONFIG_STATE_LABEL, NodeStuckFacts,
    PAUSED_FOR_MIG_CHANGE, StuckLimits, StuckReason, newly_stuck, stuck_reasons,
};
use kube::runtime::events::{Event as KubeEvent, EventType};
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, LabelSetEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::cluster::node::{InternedLabels, Sym};
use crate::signals::events::Events;
use kiln_core::labels::LabelLookup;

/// The gauge's name below the registry's `kiln` prefix ([`kiln_core::node_stuck::GAUGE`]).
pub const GAUGE_NAME: &str = "node_stuck";

/// What [`StuckTracker`] reads of a node's labels (interned values; all `None`/`false` on a
/// node in no MIG change and no driver upgrade).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct NodeMarks {
    /// `nvidia.com/mig.config.state`.
    pub mig_state: Option<Sym>,
    /// Whether a `nvidia.com/gpu.deploy.*` label is `paused-for-mig-change`.
    pub paused: bool,
    /// The driver-upgrade state label ([`kiln_core::upgrade::STATE_LABEL`]).
    pub upgrade_state: Option<Sym>,
}

impl NodeMarks {
    /// Whether nothing is marked.
    pub fn is_empty(&self) -> bool {
        *self == NodeMarks::default()
    }

    /// The labels the rule reads, as a map.
    fn labels(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if let Some(s) = &self.mig_state {
            out.insert(MIG_CONFIG_STATE_LABEL.to_owned(), s.to_string());
        }
        if self.paused {
            out.insert(
                format!("{DEPLOY_LABEL_PREFIX}paused"),
                PAUSED_FOR_MIG_CHANGE.to_owned(),
            );
        }
        if let Some(s) = &self.upgrade_state {
            out.insert(kiln_core::upgrade::STATE_LABEL.to_owned(), s.to_string());
        }
        out
    }

    /// The MIG part: what "the MIG state as it is now" means for [`NodeStuckFacts::mig_since`].
    fn mig(&self) -> (Option<&str>, bool) {
        (self.mig_state.as_deref(), self.paused)
    }
}

/// Reads [`NodeMarks`] from a node's kept labels ([`crate::cluster::node::kept_label`] keeps
/// all three kinds).
pub fn node_marks(labels: &InternedLabels) -> NodeMarks {
    NodeMarks {
        mig_state: labels.label(MIG_CONFIG_STATE_LABEL).map(Sym::from),
        paused: labels
            .iter()
            .any(|(k, v)| k.starts_with(DEPLOY_LABEL_PREFIX) && v == PAUSED_FOR_MIG_CHANGE),
        upgrade_state: labels.label(kiln_core::upgrade::STATE_LABEL).map(Sym::from),
    }
}

/// Limits, evaluation period and clock.
#[derive(Debug, Clone, Copy)]
pub struct StuckConfig {
    /// How long each state may last ([`StuckLimits::default`]).
    pub limits: StuckLimits,
    /// How often every tracked node is evaluated again (in memory, no request).
    pub tick: Duration,
    /// Now, in Unix seconds (default: the wall clock; tests move their own).
    pub clock: fn() -> i64,
}

impl Default for StuckConfig {
    fn default() -> Self {
        StuckConfig {
            limits: StuckLimits::default(),
            tick: Duration::from_secs(30),
            clock: || k8s_openapi::jiff::Timestamp::now().as_second(),
        }
    }
}

/// What the tracker asks the IO side to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StuckUpdate {
    /// Set the node's gauge series to exactly these reasons (none: remove them).
    Gauge {
        /// Node name.
        node: Sym,
        /// The node's reasons now, sorted.
        reasons: Vec<StuckReason>,
    },
    /// Publish one Warning Event: the node became stuck for `reason`.
    Event {
        /// Node name.
        node: Sym,
        /// Node uid, for the Event's reference.
        uid: Option<String>,
        /// The new reason.
        reason: StuckReason,
    },
}

#[derive(Debug, Default)]
struct Entry {
    uid: Option<String>,
    marks: NodeMarks,
    mig_since: Option<i64>,
    upgrade_since: Option<i64>,
    /// Validator pods in Init on the node: name → since when (Unix seconds).
    validators: BTreeMap<Box<str>, i64>,
    reported: Vec<StuckReason>,
}

impl Entry {
    /// Nothing to watch: no validator in Init, nothing reported, and marks the rule would not
    /// call stuck however long they lasted (`mig.config.state=success`, `upgrade-done`: what
    /// MIG and upgraded nodes carry at rest).
    fn idle(&self, limits: &StuckLimits) -> bool {
        self.validators.is_empty() && self.reported.is_empty() && !could_stick(&self.marks, limits)
    }
}

/// Whether `marks` make a node stuck once they have lasted long enough ([`stuck_reasons`] with
/// every state as old as can be).
fn could_stick(marks: &NodeMarks, limits: &StuckLimits) -> bool {
    if marks.is_empty() {
        return false;
    }
    let facts = NodeStuckFacts {
        labels: marks.labels(),
        mig_since: Some(i64::MIN),
        upgrade_state_since: Some(i64::MIN),
        validator_init_since: None,
    };
    !stuck_reasons(&facts, i64::MAX, limits).is_empty()
}

/// The stuck-node state: one [`Entry`] per node with something to watch.
#[derive(Debug, Default)]
pub struct StuckTracker {
    limits: StuckLimits,
    nodes: HashMap<Sym, Entry>,
    /// Nodes seen by the running node relist.
    relist: Option<BTreeSet<Sym>>,
    /// Validator pods seen by the running pod relist.
    pod_relist: Option<BTreeSet<Box<str>>>,
}

impl StuckTracker {
    /// A tracker with `limits`.
    pub fn new(limits: StuckLimits) -> Self {
        StuckTracker {
            limits,
            ..StuckTracker::default()
        }
    }

    /// How many nodes it holds an entry for.
    pub fn tracked(&self) -> usize {
        self.nodes.len()
    }

    /// The node watch starts a (re)list.
    pub fn begin_list(&mut self) {
        self.relist = Some(BTreeSet::new());
    }

    /// The node watch finished a (re)list: nodes it did not list are gone.
    pub fn end_list(&mut self) -> Vec<StuckUpdate> {
        let Some(seen) = self.relist.take() else {
            return Vec::new();
        };
        let gone: Vec<Sym> = self
            .nodes
            .keys()
            .filter(|n| !seen.contains(*n))
            .cloned()
            .collect();
        gone.into_iter()
            .flat_map(|n| self.node_deleted(&n))
            .collect()
    }

    /// The validator pod watch starts a (re)list.
    pub fn begin_pod_list(&mut self) {
        self.pod_relist = Some(BTreeSet::new());
    }

    /// The validator pod watch finished a (re)list: pods it did not list are gone.
    pub fn end_pod_list(&mut self, now: i64) -> Vec<StuckUpdate> {
        let Some(seen) = self.pod_relist.take() else {
            return Vec::new();
        };
        let gone: Vec<(Box<str>, Sym)> = self
            .nodes
            .iter()
            .flat_map(|(n, e)| {
                e.validators
                    .keys()
                    .filter(|p| !seen.contains(*p))
                    .map(|p| (p.clone(), n.clone()))
            })
            .collect();
        gone.into_iter()
            .flat_map(|(p, n)| self.pod_deleted(&p, &n, now))
            .collect()
    }

    /// A node was listed or changed: its marks (and uid) at `now` (Unix seconds).
    pub fn node(
        &mut self,
        name: &Sym,
        uid: Option<&str>,
        marks: &NodeMarks,
        now: i64,
    ) -> Vec<StuckUpdate> {
        if let Some(seen) = self.relist.as_mut() {
            seen.insert(name.clone());
        }
        if !self.nodes.contains_key(name) && !could_stick(marks, &self.limits) {
            return Vec::new();
        }
        let e = self.nodes.entry(name.clone()).or_default();
        e.uid = uid.map(str::to_owned);
        if e.marks.mig() != marks.mig() {
            e.mig_since = (marks.mig_state.is_some() || marks.paused).then_some(now);
        }
        if e.marks.upgrade_state != marks.upgrade_state {
            e.upgrade_since = marks.upgrade_state.is_some().then_some(now);
        }
        e.marks = marks.clone();
        self.evaluate(name, now)
    }

    /// A node was deleted: its series go.
    pub fn node_deleted(&mut self, name: &Sym) -> Vec<StuckUpdate> {
        match self.nodes.remove(name) {
            Some(e) if !e.reported.is_empty() => vec![StuckUpdate::Gauge {
                node: name.clone(),
                reasons: Vec::new(),
            }],
            _ => Vec::new(),
        }
    }

    /// A validator pod `pod` on node `node` (empty: unscheduled, ignored) was listed or
    /// changed; `in_init`: still in its init containers.
    pub fn pod(&mut self, pod: &str, node: &str, in_init: bool, now: i64) -> Vec<StuckUpdate> {
        if let Some(seen) = self.pod_relist.as_mut() {
            seen.insert(pod.into());
        }
        if node.is_empty() {
            return Vec::new();
        }
        let name = Sym::from(node);
        if !in_init {
            return self.pod_deleted(pod, node, now);
        }
        let e = self.nodes.entry(name.clone()).or_default();
        e.validators.entry(pod.into()).or_insert(now);
        self.evaluate(&name, now)
    }

    /// A validator pod left node `node` (deleted, or out of Init).
    pub fn pod_deleted(&mut self, pod: &str, node: &str, now: i64) -> Vec<StuckUpdate> {
        let name = Sym::from(node);
        let removed = self
            .nodes
            .get_mut(&name)
            .is_some_and(|e| e.validators.remove(pod).is_some());
        if removed {
            self.evaluate(&name, now)
        } else {
            Vec::new()
        }
    }

    /// Every tracked node evaluated at `now`.
    pub fn tick(&mut self, now: i64) -> Vec<StuckUpdate> {
        let names: Vec<Sym> = self.nodes.keys().cloned().collect();
        names
            .into_iter()
            .flat_map(|n| self.evaluate(&n, now))
            .collect()
    }

    fn evaluate(&mut self, name: &Sym, now: i64) -> Vec<StuckUpdate> {
        let Some(e) = self.nodes.get_mut(name) else {
            return Vec::new();
        };
        let facts = NodeStuckFacts {
            labels: e.marks.labels(),
            mig_since: e.mig_since,
            upgrade_state_since: e.upgrade_since,
            validator_init_since: e.validators.values().min().copied(),
        };
        let reasons = stuck_reasons(&facts, now, &self.limits);
        let mut out = Vec::new();
        if reasons != e.reported {
            for reason in newly_stuck(&e.reported, &reasons) {
                out.push(StuckUpdate::Event {
                    node: name.clone(),
                    uid: e.uid.clone(),
                    reason,
                });
            }
            out.push(StuckUpdate::Gauge {
                node: name.clone(),
                reasons: reasons.clone(),
            });
            e.reported = reasons;
        }
        if e.idle(&self.limits) {
            self.nodes.remove(name);
        }
        out
    }
}

/// The `kiln_node_stuck{node,reason}` series: the stuck nodes' reasons, encoded at scrape.
#[derive(Debug, Default)]
pub struct StuckGauge(Mutex<BTreeMap<Sym, Vec<StuckReason>>>);

impl StuckGauge {
    /// Set `node`'s reasons (none: remove its series).
    pub fn set(&self, node: &Sym, reasons: &[StuckReason]) {
        let mut m = self.0.lock().expect("stuck gauge lock");
        if reasons.is_empty() {
            m.remove(node);
        } else {
            m.insert(node.clone(), reasons.to_vec());
        }
    }
}

struct NodeReason<'a>(&'a str, &'a str);

impl EncodeLabelSet for NodeReason<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> std::fmt::Result {
        [("node", self.0), ("reason", self.1)].encode(encoder)
    }
}

impl prometheus_client::collector::Collector for StuckGauge {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let nodes = self.0.lock().expect("stuck gauge lock").clone();
        let mut family = encoder.encode_descriptor(
            GAUGE_NAME,
            "1 for a GPU node stuck for reason (mig-change-failed, mig-change-pending, upgrade-stalled, validator-init).",
            None,
            MetricType::Gauge,
        )?;
        for (node, reasons) in &nodes {
            for r in reasons {
                ConstGauge::new(1i64)
                    .encode(family.encode_family(&NodeReason(node, r.as_str()))?)?;
            }
        }
        Ok(())
    }
}

/// The Event's note for `reason`.
pub fn stuck_note(node: &str, reason: StuckReason, limits: &StuckLimits) -> String {
    let min = |s: i64| s / 60;
    match reason {
        StuckReason::MigChangeFailed => format!(
            "node {node}: the MIG manager failed to apply the MIG configuration ({MIG_CONFIG_STATE_LABEL}=failed)"
        ),
        StuckReason::MigChangePending => format!(
            "node {node}: a MIG change has been pending (or operands paused-for-mig-change) for more than {} minutes",
            min(limits.mig_change)
        ),
        StuckReason::UpgradeStalled => format!(
            "node {node}: the driver-upgrade state has not changed for more than {} minutes",
            min(limits.upgrade_state)
        ),
        StuckReason::ValidatorInit => format!(
            "node {node}: the operator validator has been in its init containers for more than {} minutes",
            min(limits.validator_init)
        ),
    }
}

/// Carry out `update`: the gauge in `gauge`, the Event through `recorder`.
pub async fn apply(
    gauge: &StuckGauge,
    recorder: &Events,
    limits: &StuckLimits,
    update: StuckUpdate,
) {
    match update {
        StuckUpdate::Gauge { node, reasons } => gauge.set(&node, &reasons),
        StuckUpdate::Event { node, uid, reason } => {
            let note = stuck_note(&node, reason, limits);
            tracing::warn!(node = %node, reason = reason.as_str(), "{note}");
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.to_string()),
                uid,
                ..ObjectReference::default()
            };
            let ev = KubeEvent {
                type_: EventType::Warning,
                reason: EVENT_REASON.into(),
                note: Some(note),
                action: "Observe".into(),
                secondary: None,
            };
            if let Err(e) = recorder.publish_once(&ev, &reference).await {
                tracing::warn!(node = %node, error = %e, "could not publish the node-stuck event");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn marks(mig: Option<&str>, paused: bool, upgrade: Option<&str>) -> NodeMarks {
        NodeMarks {
            mig_state: mig.map(Sym::from),
            paused,
            upgrade_state: upgrade.map(Sym::from),
        }
    }

    fn gauges(u: &[StuckUpdate]) -> Vec<(String, Vec<&'static str>)> {
        u.iter()
            .filter_map(|u| match u {
                StuckUpdate::Gauge { node, reasons } => Some((
                    node.to_string(),
                    reasons.iter().map(|r| r.as_str()).collect(),
                )),
                StuckUpdate::Event { .. } => None,
            })
            .collect()
    }

    fn events(u: &[StuckUpdate]) -> Vec<&'static str> {
        u.iter()
            .filter_map(|u| match u {
                StuckUpdate::Event { reason, .. } => Some(reason.as_str()),
                StuckUpdate::Gauge { .. } => None,
            })
            .collect()
    }

    #[test]
    fn node_marks_read_the_three_label_kinds() {
        let labels: BTreeMap<String, String> = [
            (MIG_CONFIG_STATE_LABEL, "pending"),
            ("nvidia.com/gpu.deploy.device-plugin", PAUSED_FOR_MIG_CHANGE),
            (kiln_core::upgrade::STATE_LABEL, "drain-required"),
            ("kubernetes.io/hostname", "n1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let kept = InternedLabels::of(&labels, crate::cluster::node::kept_label);
        assert_eq!(
            node_marks(&kept),
            marks(Some("pending"), true, Some("drain-required"))
        );
        let none = InternedLabels::of(&BTreeMap::new(), crate::cluster::node::kept_label);
        assert!(node_marks(&none).is_empty());
    }

    #[test]
    fn a_held_mig_change_raises_once_and_clears_when_it_moves() {
        let l = StuckLimits::default();
        let mut t = StuckTracker::new(l);
        let n = Sym::from("n1");
        assert!(
            t.node(&n, Some("u1"), &marks(Some("pending"), false, None), NOW)
                .is_empty()
        );
        assert!(
            t.tick(NOW + l.mig_change).is_empty(),
            "at the limit: not yet"
        );
        let u = t.tick(NOW + l.mig_change + 1);
        assert_eq!(events(&u), ["mig-change-pending"]);
        assert_eq!(gauges(&u), [("n1".into(), vec!["mig-change-pending"])]);
        assert!(
            t.tick(NOW + 2 * l.mig_change).is_empty(),
            "one Event, no rewrite"
        );
        // The same label seen again (another label changed): the clock does not restart.
        assert!(
            t.node(
                &n,
                Some("u1"),
                &marks(Some("pending"), false, None),
                NOW + 5000
            )
            .is_empty()
        );
        let u = t.node(
            &n,
            Some("u1"),
            &marks(Some("success"), false, None),
            NOW + 5001,
        );
        assert_eq!(gauges(&u), [("n1".into(), vec![])]);
        assert!(events(&u).is_empty());
        // A MIG node at rest (success) or an upgraded one (upgrade-done) keeps no entry.
        assert_eq!(t.tracked(), 0);
        let done = marks(Some("success"), false, Some("upgrade-done"));
        assert!(t.node(&Sym::from("n2"), None, &done, NOW).is_empty());
        assert_eq!(t.tracked(), 0);
    }

    #[test]
    fn a_failed_mig_change_and_a_stalled_upgrade_and_a_validator_in_init() {
        let l = StuckLimits::default();
        let mut t = StuckTracker::new(l);
        let n = Sym::from("n1");
        let u = t.node(
            &n,
            None,
            &marks(Some("failed"), false, Some("drain-required")),
            NOW,
        );
        assert_eq!(events(&u), ["mig-change-failed"]);
        assert!(t.pod("v1", "n1", true, NOW).is_empty());
        let u = t.tick(NOW + l.upgrade_state + 1);
        assert_eq!(events(&u), ["upgrade-stalled", "validator-init"]);
        assert_eq!(
            gauges(&u),
            [(
                "n1".into(),
                vec!["mig-change-failed", "upgrade-stalled", "validator-init"]
            )]
        );
        // The upgrade moves on, the validator finishes its init containers.
        let later = NOW + l.upgrade_state + 2;
        t.node(
            &n,
            None,
            &marks(Some("failed"), false, Some("validation-required")),
            later,
        );
        let u = t.pod("v1", "n1", false, later);
        assert_eq!(gauges(&u), [("n1".into(), vec!["mig-change-failed"])]);
    }

    #[test]
    fn nodes_gone_from_a_relist_lose_their_series_and_quiet_nodes_cost_nothing() {
        let mut t = StuckTracker::new(StuckLimits::default());
        t.begin_list();
        assert!(
            t.node(&Sym::from("quiet"), None, &NodeMarks::default(), NOW)
                .is_empty()
        );
        t.node(
            &Sym::from("n1"),
            None,
            &marks(Some("failed"), false, None),
            NOW,
        );
        assert!(t.end_list().is_empty());
        assert_eq!(t.tracked(), 1, "only the marked node");
        t.begin_list();
        assert_eq!(gauges(&t.end_list()), [("n1".into(), vec![])]);
        assert_eq!(t.tracked(), 0);
        assert!(t.pod("v1", "", true, NOW).is_empty(), "unscheduled");
        // A validator pod deleted while the pod watch was away goes with the relist.
        t.pod("v2", "n2", true, NOW);
        assert_eq!(t.tracked(), 1);
        t.begin_pod_list();
        t.end_pod_list(NOW);
        assert_eq!(t.tracked(), 0);
    }

    #[test]
    fn the_gauge_encodes_one_series_per_node_and_reason() {
        let g = std::sync::Arc::new(StuckGauge::default());
        let mut registry = prometheus_client::registry::Registry::default();
        registry
            .sub_registry_with_prefix("kiln")
            .register_collector(Box::new(g.clone()));
        g.set(
            &Sym::from("n1"),
            &[StuckReason::MigChangeFailed, StuckReason::ValidatorInit],
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        let series: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with(kiln_core::node_stuck::GAUGE))
            .collect();
        assert_eq!(
            series,
            [
                r#"kiln_node_stuck{node="n1",reason="mig-change-failed"} 1"#,
                r#"kiln_node_stuck{node="n1",reason="validator-init"} 1"#
            ]
        );
        g.set(&Sym::from("n1"), &[]);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(!out.contains("kiln_node_stuck{"), "{out}");
    }
}
