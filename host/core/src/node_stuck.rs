//! Stuck GPU nodes (kiln's own rule): a node whose GPU stack stopped moving, named by one of
//! [`StuckReason`]. The operator evaluates it on facts it already holds from its watches (node
//! labels, the validator pod's phase, when each was first seen), so finding a stuck node costs
//! no API request; it raises a Warning Event per new reason and sets the
//! `kiln_node_stuck{node,reason}` gauge, which the chart's PrometheusRule alerts on.
//!
//! Reasons (the gauge's `reason` label):
//! - `mig-change-failed`: `nvidia.com/mig.config.state=failed` (the MIG manager gave up);
//! - `mig-change-pending`: `nvidia.com/mig.config.state=pending`, or a `nvidia.com/gpu.deploy.*`
//!   label held at `paused-for-mig-change` (gpu-operator #2833), for longer than
//!   [`StuckLimits::mig_change`];
//! - `upgrade-stalled`: the driver-upgrade state label unchanged for longer than
//!   [`StuckLimits::upgrade_state`], in a state that should move (not unknown, done or failed:
//!   a failed upgrade has its own alert);
//! - `validator-init`: the node's validator pod still in its init containers after
//!   [`StuckLimits::validator_init`].

use std::collections::BTreeMap;

use crate::upgrade::UpgradeState;

/// The MIG manager's state label.
pub const MIG_CONFIG_STATE_LABEL: &str = "nvidia.com/mig.config.state";
/// Prefix of the per-operand deploy labels the MIG manager pauses.
pub const DEPLOY_LABEL_PREFIX: &str = "nvidia.com/gpu.deploy.";
/// The value the MIG manager sets on deploy labels while it changes the MIG layout.
pub const PAUSED_FOR_MIG_CHANGE: &str = "paused-for-mig-change";
/// The gauge the operator exports, one series per stuck node and reason (value 1).
pub const GAUGE: &str = "kiln_node_stuck";
/// The Event reason of a newly stuck node.
pub const EVENT_REASON: &str = "GPUNodeStuck";

/// Why a node is stuck.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StuckReason {
    /// The MIG manager reported a failed MIG change.
    MigChangeFailed,
    /// A MIG change has been pending past its limit.
    MigChangePending,
    /// The driver-upgrade state has not moved past its limit.
    UpgradeStalled,
    /// The validator pod has been in its init containers past its limit.
    ValidatorInit,
}

impl StuckReason {
    /// The gauge's `reason` label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MigChangeFailed => "mig-change-failed",
            Self::MigChangePending => "mig-change-pending",
            Self::UpgradeStalled => "upgrade-stalled",
            Self::ValidatorInit => "validator-init",
        }
    }
}

/// How long each state may last before the node counts as stuck, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StuckLimits {
    /// A pending MIG change (default 30 minutes: a reboot-free change takes minutes).
    pub mig_change: i64,
    /// One driver-upgrade state (default 60 minutes; drains wait on pods).
    pub upgrade_state: i64,
    /// The validator's init containers (default 30 minutes: driver build and load included).
    pub validator_init: i64,
}

impl Default for StuckLimits {
    fn default() -> Self {
        Self {
            mig_change: 30 * 60,
            upgrade_state: 60 * 60,
            validator_init: 30 * 60,
        }
    }
}

/// What the operator knows of one node; times are Unix seconds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeStuckFacts {
    /// The node's labels.
    pub labels: BTreeMap<String, String>,
    /// Since when the MIG state (the pending state label or a paused deploy label) has been
    /// seen as it is now.
    pub mig_since: Option<i64>,
    /// Since when the upgrade state label has had its current value.
    pub upgrade_state_since: Option<i64>,
    /// Since when the node's validator pod has been in its init containers; `None` when it is
    /// not (running, absent).
    pub validator_init_since: Option<i64>,
}

/// The reasons `facts` make the node stuck at `now`, sorted; empty for a healthy node.
#[must_use]
pub fn stuck_reasons(facts: &NodeStuckFacts, now: i64, limits: &StuckLimits) -> Vec<StuckReason> {
    let past =
        |since: Option<i64>, limit: i64| since.is_some_and(|s| now.saturating_sub(s) > limit);
    let mut out = Vec::new();
    let mig_state = facts.labels.get(MIG_CONFIG_STATE_LABEL).map(String::as_str);
    let paused = facts
        .labels
        .iter()
        .any(|(k, v)| k.starts_with(DEPLOY_LABEL_PREFIX) && v == PAUSED_FOR_MIG_CHANGE);
    if mig_state == Some("failed") {
        out.push(StuckReason::MigChangeFailed);
    } else if (mig_state == Some("pending") || paused) && past(facts.mig_since, limits.mig_change) {
        out.push(StuckReason::MigChangePending);
    }
    let upgrade = UpgradeState::from_label(
        facts
            .labels
            .get(crate::upgrade::STATE_LABEL)
            .map(String::as_str),
    );
    let moving = !matches!(
        upgrade,
        UpgradeState::Unknown | UpgradeState::Done | UpgradeState::Failed
    );
    if moving && past(facts.upgrade_state_since, limits.upgrade_state) {
        out.push(StuckReason::UpgradeStalled);
    }
    if past(facts.validator_init_since, limits.validator_init) {
        out.push(StuckReason::ValidatorInit);
    }
    out
}

/// The reasons in `now` that were not in `before`: each gets one Warning Event.
#[must_use]
pub fn newly_stuck(before: &[StuckReason], now: &[StuckReason]) -> Vec<StuckReason> {
    now.iter()
        .filter(|r| !before.contains(r))
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(labels: &[(&str, &str)]) -> NodeStuckFacts {
        NodeStuckFacts {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..NodeStuckFacts::default()
        }
    }

    const NOW: i64 = 1_750_000_000;

    #[test]
    fn a_failed_mig_change_is_stuck_at_once_a_pending_one_after_its_limit() {
        let l = StuckLimits::default();
        let failed = facts(&[(MIG_CONFIG_STATE_LABEL, "failed")]);
        assert_eq!(
            stuck_reasons(&failed, NOW, &l),
            [StuckReason::MigChangeFailed]
        );
        let mut pending = facts(&[(MIG_CONFIG_STATE_LABEL, "pending")]);
        pending.mig_since = Some(NOW - l.mig_change);
        assert!(
            stuck_reasons(&pending, NOW, &l).is_empty(),
            "at the limit: not yet"
        );
        pending.mig_since = Some(NOW - l.mig_change - 1);
        assert_eq!(
            stuck_reasons(&pending, NOW, &l),
            [StuckReason::MigChangePending]
        );
        // gpu-operator #2833: the deploy labels left paused after the MIG manager stopped.
        let mut paused = facts(&[
            (MIG_CONFIG_STATE_LABEL, "success"),
            ("nvidia.com/gpu.deploy.device-plugin", PAUSED_FOR_MIG_CHANGE),
        ]);
        paused.mig_since = Some(NOW - 3600);
        assert_eq!(
            stuck_reasons(&paused, NOW, &l),
            [StuckReason::MigChangePending]
        );
        let success = facts(&[(MIG_CONFIG_STATE_LABEL, "success")]);
        assert!(stuck_reasons(&success, NOW, &l).is_empty());
    }

    #[test]
    fn an_upgrade_state_that_stopped_moving_is_stuck_but_done_and_failed_are_not() {
        let l = StuckLimits::default();
        let mut f = facts(&[(crate::upgrade::STATE_LABEL, "drain-required")]);
        f.upgrade_state_since = Some(NOW - l.upgrade_state - 1);
        assert_eq!(stuck_reasons(&f, NOW, &l), [StuckReason::UpgradeStalled]);
        f.upgrade_state_since = Some(NOW - 60);
        assert!(stuck_reasons(&f, NOW, &l).is_empty());
        for settled in ["upgrade-done", "upgrade-failed", "", "bogus"] {
            let mut f = facts(&[(crate::upgrade::STATE_LABEL, settled)]);
            f.upgrade_state_since = Some(0);
            assert!(stuck_reasons(&f, NOW, &l).is_empty(), "{settled}");
        }
    }

    #[test]
    fn a_validator_in_init_past_its_limit_and_several_reasons_sorted() {
        let l = StuckLimits {
            validator_init: 600,
            ..StuckLimits::default()
        };
        let mut f = facts(&[
            (crate::upgrade::STATE_LABEL, "validation-required"),
            (MIG_CONFIG_STATE_LABEL, "failed"),
        ]);
        f.validator_init_since = Some(NOW - 601);
        f.upgrade_state_since = Some(NOW - 7200);
        let got = stuck_reasons(&f, NOW, &l);
        assert_eq!(
            got,
            [
                StuckReason::MigChangeFailed,
                StuckReason::UpgradeStalled,
                StuckReason::ValidatorInit
            ]
        );
        assert_eq!(
            got.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
            ["mig-change-failed", "upgrade-stalled", "validator-init"]
        );
        assert_eq!(
            newly_stuck(&[StuckReason::MigChangeFailed], &got),
            [StuckReason::UpgradeStalled, StuckReason::ValidatorInit]
        );
        assert!(newly_stuck(&got, &got).is_empty());
    }
}
