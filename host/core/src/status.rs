//! ClusterPolicy status: from the per-state results of one reconcile, compute `status.state`
//! and the `Ready`/`Error` conditions (upstream GPU Operator v26.7, `gpu-operator.md` §2.2 step 7
//! and §2.6), merge them with set-condition semantics, and decide whether a write is needed.
//!
//! ```text
//! [(State, StateResult)] + GPU-node count + NFD presence ──judge──► Verdict
//! Verdict + current status ──make_status──► new status ──needs_write──► write or not
//! ```
//!
//! Differences from upstream, on purpose: a non-active policy gets `ignored` *persisted* with a
//! condition naming the active one; a state whose plugin failed does not abort the reconcile,
//! it is reported (`ReconcileFailed`, naming the plugin) next to the states not ready.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::spec::{ClusterPolicyStatus, PolicyState};
use crate::state::State;

/// Condition type `Ready`.
pub const CONDITION_READY: &str = "Ready";
/// Condition type `Error`.
pub const CONDITION_ERROR: &str = "Error";

/// Condition reasons (upstream `internal/conditions`, plus `Ignored`).
pub mod reasons {
    /// Ready: every state ready and GPU nodes present.
    pub const RECONCILED: &str = "Reconciled";
    /// Ready: every state ready, no GPU node yet.
    pub const NO_GPU_NODES: &str = "NoGPUNodes";
    /// Ready: every state ready, but no node carries an NFD label.
    pub const NFD_LABELS_MISSING: &str = "NFDLabelsMissing";
    /// Error: some state's objects are not ready.
    pub const OPERAND_NOT_READY: &str = "OperandNotReady";
    /// Error: the policy is invalid or a state could not be rendered/applied.
    pub const RECONCILE_FAILED: &str = "ReconcileFailed";
    /// Not the active ClusterPolicy.
    pub const IGNORED: &str = "Ignored";
    /// `Error=False` on the ready path.
    pub const READY: &str = "Ready";
    /// `Ready=False` on the error path.
    pub const ERROR: &str = "Error";
}

/// The outcome of one state in one reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateResult {
    /// Applied and every DaemonSet ready.
    Ready,
    /// Applied, not ready yet; the text says why (e.g. `nvidia-driver-daemonset: 2 pod(s) unavailable`).
    NotReady(String),
    /// Disabled by the policy; its objects are deleted. Does not affect readiness.
    Disabled,
    /// Could not be rendered or applied; the text is the error (a plugin error names the plugin).
    Failed(String),
}

/// What one reconcile observed.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// Every state's result, in apply order.
    pub states: &'a [(State, StateResult)],
    /// Number of nodes with `nvidia.com/gpu.present=true`.
    pub gpu_nodes: usize,
    /// Whether any node carries an NFD (`feature.node.kubernetes.io/`) label.
    pub nfd_present: bool,
}

/// One desired condition (before set-condition semantics add the transition time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionSpec {
    /// `Ready` or `Error`.
    pub type_: &'static str,
    /// `True` when set.
    pub status: bool,
    /// CamelCase reason, see [`reasons`].
    pub reason: &'static str,
    /// Human message.
    pub message: String,
}

/// The judged status: `status.state` plus the `Ready` and `Error` conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `status.state`.
    pub state: PolicyState,
    /// `[Ready, Error]`.
    pub conditions: [ConditionSpec; 2],
}

fn cond(type_: &'static str, status: bool, reason: &'static str, msg: &str) -> ConditionSpec {
    ConditionSpec {
        type_,
        status,
        reason,
        message: msg.to_string(),
    }
}

impl Verdict {
    fn ready(reason: &'static str, message: &str) -> Self {
        Verdict {
            state: PolicyState::Ready,
            conditions: [
                cond(CONDITION_READY, true, reason, message),
                cond(CONDITION_ERROR, false, reasons::READY, ""),
            ],
        }
    }

    fn error(reason: &'static str, message: &str) -> Self {
        Verdict {
            state: PolicyState::NotReady,
            conditions: [
                cond(CONDITION_READY, false, reasons::ERROR, ""),
                cond(CONDITION_ERROR, true, reason, message),
            ],
        }
    }

    /// The verdict for a policy that is not the active one: `ignored`, `Ready=False` with reason
    /// `Ignored` and a message naming `active`.
    pub fn ignored(active: &str) -> Self {
        let msg = format!("ClusterPolicy {active:?} is the active policy; this one is ignored");
        Verdict {
            state: PolicyState::Ignored,
            conditions: [
                cond(CONDITION_READY, false, reasons::IGNORED, &msg),
                cond(CONDITION_ERROR, false, reasons::IGNORED, ""),
            ],
        }
    }

    /// The verdict for a policy that cannot be reconciled at all (invalid spec, API failure):
    /// `notReady`, `Error=True` reason `ReconcileFailed` with `message` (e.g.
    /// `spec.mig.strategy: unknown variant ...`).
    pub fn failed(message: &str) -> Self {
        Verdict::error(reasons::RECONCILE_FAILED, message)
    }

    /// The `Error`/`Ready` reason that carries the outcome (the reason of the `True` condition,
    /// or `Ignored`).
    pub fn reason(&self) -> &'static str {
        self.conditions
            .iter()
            .find(|c| c.status)
            .unwrap_or(&self.conditions[0])
            .reason
    }

    /// The message of the condition that carries the outcome.
    pub fn message(&self) -> &str {
        &self
            .conditions
            .iter()
            .find(|c| c.status)
            .unwrap_or(&self.conditions[0])
            .message
    }
}

/// The `NFDLabelsMissing` message: upstream's words, then what is missing and the two ways to
/// provide it (the chart's discovery under NVIDIA's `nfd.enabled`, or NFD itself).
pub const NFD_LABELS_MISSING_MESSAGE: &str = "No NFD labels found: no node carries a \
    feature.node.kubernetes.io/ label, so no GPU node can be found; install the chart with \
    nfd.enabled=true (kiln's node discovery) or run Node Feature Discovery";

/// The `NoGPUNodes` message: upstream's words, then the label that makes a GPU node.
pub const NO_GPU_NODES_MESSAGE: &str = "No GPU node found, watching for new nodes to join the \
    cluster (a GPU node is labelled feature.node.kubernetes.io/pci-10de.present=true).";

/// Judge one reconcile (upstream outcome rules, §2.2 step 7):
/// - any state `NotReady`/`Failed` → `notReady`, `Error=True` with reason `ReconcileFailed` when
///   some state failed, else `OperandNotReady`; the message lists those states and why;
/// - else no NFD label anywhere → `ready`, reason `NFDLabelsMissing`;
/// - else no GPU node → `ready`, reason `NoGPUNodes`;
/// - else `ready`, reason `Reconciled`. `Disabled` states never count against readiness.
pub fn judge(obs: Observation<'_>) -> Verdict {
    let bad: Vec<(State, &StateResult)> = obs
        .states
        .iter()
        .filter(|(_, r)| matches!(r, StateResult::NotReady(_) | StateResult::Failed(_)))
        .map(|(s, r)| (*s, r))
        .collect();
    if !bad.is_empty() {
        let names: Vec<&str> = bad.iter().map(|(s, _)| s.name()).collect();
        let details: Vec<String> = bad
            .iter()
            .map(|(s, r)| match r {
                StateResult::Failed(e) => format!("{s}: failed: {e}"),
                StateResult::NotReady(why) => format!("{s}: {why}"),
                _ => unreachable!("filtered above"),
            })
            .collect();
        let message = format!(
            "ClusterPolicy is not ready; states not ready: [{}]; {}",
            names.join(" "),
            details.join("; ")
        );
        let failed = bad.iter().any(|(_, r)| matches!(r, StateResult::Failed(_)));
        let reason = if failed {
            reasons::RECONCILE_FAILED
        } else {
            reasons::OPERAND_NOT_READY
        };
        return Verdict::error(reason, &message);
    }
    if !obs.nfd_present {
        return Verdict::ready(reasons::NFD_LABELS_MISSING, NFD_LABELS_MISSING_MESSAGE);
    }
    if obs.gpu_nodes == 0 {
        return Verdict::ready(reasons::NO_GPU_NODES, NO_GPU_NODES_MESSAGE);
    }
    Verdict::ready(
        reasons::RECONCILED,
        "ClusterPolicy is ready as all resources have been successfully reconciled",
    )
}

/// When to reconcile again without an event: never when ready (watches on nodes and owned
/// objects drive it); 45 s when NFD labels are missing (upstream); 30 s as a safety net while
/// not ready or failed (owned DaemonSet status changes normally arrive first).
pub fn requeue_after(verdict: &Verdict) -> Option<Duration> {
    match (verdict.state, verdict.reason()) {
        (PolicyState::Ready, reasons::NFD_LABELS_MISSING) => Some(Duration::from_secs(45)),
        (PolicyState::NotReady, _) => Some(Duration::from_secs(30)),
        _ => None,
    }
}

/// Set `spec` into `conditions` with set-condition semantics: an existing condition of the same
/// type keeps its `lastTransitionTime` unless its status flips; reason, message and
/// `observedGeneration` are updated in place.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    spec: &ConditionSpec,
    now: &Time,
    generation: Option<i64>,
) {
    let status = if spec.status { "True" } else { "False" }.to_string();
    let new = |t: Time| Condition {
        type_: spec.type_.to_string(),
        status: status.clone(),
        reason: spec.reason.to_string(),
        message: spec.message.clone(),
        last_transition_time: t,
        observed_generation: generation,
    };
    match conditions.iter_mut().find(|c| c.type_ == spec.type_) {
        Some(c) if c.status == status => *c = new(c.last_transition_time.clone()),
        Some(c) => *c = new(now.clone()),
        None => conditions.push(new(now.clone())),
    }
}

/// The status to hold after this reconcile: `current` (if any) with `verdict` merged in,
/// `namespace` set, conditions per [`set_condition`] with `now` as a new transition time and
/// `generation` (the policy's `metadata.generation`) as `observedGeneration`.
pub fn make_status(
    current: Option<&ClusterPolicyStatus>,
    verdict: &Verdict,
    namespace: &str,
    now: &Time,
    generation: Option<i64>,
) -> ClusterPolicyStatus {
    let mut status = current.cloned().unwrap_or_default();
    status.state = Some(verdict.state);
    status.namespace = Some(namespace.to_string());
    for spec in &verdict.conditions {
        set_condition(&mut status.conditions, spec, now, generation);
    }
    status
}

/// Whether `new` differs from what is stored: `false` at steady state, so no write happens.
pub fn needs_write(current: Option<&ClusterPolicyStatus>, new: &ClusterPolicyStatus) -> bool {
    current != Some(new)
}

/// A transition worth a Kubernetes Event: `state` or the outcome reason changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// `Normal` (ready, ignored) or `Warning` (notReady, or ready without a GPU node:
    /// `NoGPUNodes`, `NFDLabelsMissing`, so that `kubectl get events --field-selector
    /// type=Warning` shows a policy that serves no GPU).
    pub type_: &'static str,
    /// The verdict's reason.
    pub reason: &'static str,
    /// The verdict's message.
    pub note: String,
}

/// The Event to emit for moving from `current` to `verdict`, if the state or reason changed.
pub fn transition(current: Option<&ClusterPolicyStatus>, verdict: &Verdict) -> Option<Transition> {
    let old_state = current.and_then(|s| s.state);
    let old_reason = current.and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.status == "True")
            .or_else(|| s.conditions.iter().find(|c| c.type_ == CONDITION_READY))
            .map(|c| c.reason.as_str())
    });
    if old_state == Some(verdict.state) && old_reason == Some(verdict.reason()) {
        return None;
    }
    let type_ = match (verdict.state, verdict.reason()) {
        (PolicyState::NotReady, _) | (_, reasons::NO_GPU_NODES | reasons::NFD_LABELS_MISSING) => {
            "Warning"
        }
        _ => "Normal",
    };
    Some(Transition {
        type_,
        reason: verdict.reason(),
        note: verdict.message().to_string(),
    })
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
