//! A GPUCluster's status as NVIDIA v26.7.0 writes it (`controllers/gpucluster_controller.go`,
//! `internal/conditions/gpucluster.go`): `status.state` (`ready` / `notReady`),
//! `status.namespace` (the operator namespace) and two conditions, `Ready` and `Error`, of
//! which exactly one is `True`:
//!
//! | situation | state | `Ready` | `Error` |
//! | --- | --- | --- | --- |
//! | a ClusterPolicy exists | notReady | False, `Error` | True, `PrerequisiteNotMet`: `A ClusterPolicy CR "<name>" exists; …` |
//! | a state failed (render, apply, an invalid spec) | notReady | False, `Error` | True, `ReconcileFailed`: `Error syncing state <state>: <error>` |
//! | an operand is not ready | notReady | False, `Error` | True, `OperandNotReady`: `Waiting for operand pods to be ready` |
//! | every operand ready | ready | True, `Reconciled`: `All resources have been successfully reconciled` | False, `Ready` |
//!
//! Pure: [`Verdict::status`] merges a verdict into the current status with set-condition
//! semantics (a condition's `lastTransitionTime` moves only when its status flips), so an
//! unchanged verdict gives an unchanged status and no write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_core::spec::gpucluster::{GpuClusterState, GpuClusterStatus};
use kiln_core::status::{ConditionSpec, set_condition};

/// Condition reasons (upstream `internal/conditions`).
pub mod reasons {
    /// Every operand is ready (the `Ready` condition's reason).
    pub const RECONCILED: &str = "Reconciled";
    /// A ClusterPolicy exists: the GPUCluster does nothing while it does.
    pub const PREREQUISITE_NOT_MET: &str = "PrerequisiteNotMet";
    /// A state could not be rendered or applied (or the spec is invalid).
    pub const RECONCILE_FAILED: &str = "ReconcileFailed";
    /// Every state applied; an operand's pods are not ready yet.
    pub const OPERAND_NOT_READY: &str = "OperandNotReady";
    /// The `Error` condition's reason while ready, and the `Ready` condition's while not.
    pub const READY: &str = "Ready";
    /// The `Ready` condition's reason while an error holds.
    pub const ERROR: &str = "Error";
}

/// What one reconcile concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every operand is ready.
    Ready,
    /// Not ready: the `Error` condition's reason (one of [`reasons`]) and message.
    NotReady {
        /// [`reasons::PREREQUISITE_NOT_MET`], [`reasons::RECONCILE_FAILED`] or
        /// [`reasons::OPERAND_NOT_READY`].
        reason: &'static str,
        /// The condition's message.
        message: String,
    },
}

impl Verdict {
    /// A ClusterPolicy named `policy` exists (upstream `validatePrerequisites`).
    pub fn cluster_policy_exists(policy: &str) -> Self {
        Verdict::NotReady {
            reason: reasons::PREREQUISITE_NOT_MET,
            message: format!(
                "A ClusterPolicy CR {policy:?} exists; a ClusterPolicy CR and GPUCluster CR may not exist at the same time"
            ),
        }
    }

    /// State `state` failed with `error` (the first failed state, in apply order).
    pub fn state_failed(state: &str, error: &str) -> Self {
        Verdict::NotReady {
            reason: reasons::RECONCILE_FAILED,
            message: format!("Error syncing state {state}: {error}"),
        }
    }

    /// The spec cannot be reconciled at all (it fails the CRD's rules kiln checks again).
    pub fn invalid(error: &str) -> Self {
        Verdict::NotReady {
            reason: reasons::RECONCILE_FAILED,
            message: error.to_string(),
        }
    }

    /// Every state applied, an operand not ready yet.
    pub fn operand_not_ready() -> Self {
        Verdict::NotReady {
            reason: reasons::OPERAND_NOT_READY,
            message: "Waiting for operand pods to be ready".into(),
        }
    }

    /// `status.state` of this verdict.
    pub fn state(&self) -> GpuClusterState {
        match self {
            Verdict::Ready => GpuClusterState::Ready,
            Verdict::NotReady { .. } => GpuClusterState::NotReady,
        }
    }

    /// `current` with this verdict merged in: state, `namespace`, and the `Ready` and `Error`
    /// conditions per [`set_condition`] (`now` as a new transition time; no
    /// `observedGeneration`, as upstream's). Other conditions are kept.
    pub fn status(
        &self,
        current: &GpuClusterStatus,
        namespace: &str,
        now: &Time,
    ) -> GpuClusterStatus {
        let mut status = current.clone();
        status.state = self.state();
        status.namespace = Some(namespace.to_string());
        let (ready, error) = match self {
            Verdict::Ready => (
                ConditionSpec {
                    type_: "Ready",
                    status: true,
                    reason: reasons::RECONCILED,
                    message: "All resources have been successfully reconciled".into(),
                },
                ConditionSpec {
                    type_: "Error",
                    status: false,
                    reason: reasons::READY,
                    message: String::new(),
                },
            ),
            Verdict::NotReady { reason, message } => (
                ConditionSpec {
                    type_: "Ready",
                    status: false,
                    reason: reasons::ERROR,
                    message: String::new(),
                },
                ConditionSpec {
                    type_: "Error",
                    status: true,
                    reason,
                    message: message.clone(),
                },
            ),
        };
        set_condition(&mut status.conditions, &ready, now, None);
        set_condition(&mut status.conditions, &error, now, None);
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    fn line(s: &GpuClusterStatus) -> Vec<String> {
        s.conditions
            .iter()
            .map(|c| format!("{} {} {}: {}", c.type_, c.status, c.reason, c.message))
            .collect()
    }

    #[test]
    fn conditions_follow_nvidias_for_each_verdict() {
        let empty = GpuClusterStatus::default();
        let s =
            Verdict::cluster_policy_exists("cluster-policy").status(&empty, "gpu-operator", &t(1));
        assert_eq!(s.state, GpuClusterState::NotReady);
        assert_eq!(s.namespace.as_deref(), Some("gpu-operator"));
        assert_eq!(
            line(&s),
            [
                "Ready False Error: ",
                "Error True PrerequisiteNotMet: A ClusterPolicy CR \"cluster-policy\" exists; a ClusterPolicy CR and GPUCluster CR may not exist at the same time",
            ]
        );
        let s = Verdict::operand_not_ready().status(&s, "gpu-operator", &t(2));
        assert_eq!(
            line(&s),
            [
                "Ready False Error: ",
                "Error True OperandNotReady: Waiting for operand pods to be ready",
            ]
        );
        // No flip: the transition times stay.
        assert!(s.conditions.iter().all(|c| c.last_transition_time == t(1)));
        let s = Verdict::Ready.status(&s, "gpu-operator", &t(3));
        assert_eq!(s.state, GpuClusterState::Ready);
        assert_eq!(
            line(&s),
            [
                "Ready True Reconciled: All resources have been successfully reconciled",
                "Error False Ready: ",
            ]
        );
        assert!(s.conditions.iter().all(|c| c.last_transition_time == t(3)));
        // Unchanged verdict, unchanged status (no write).
        assert_eq!(Verdict::Ready.status(&s, "gpu-operator", &t(4)), s);
        assert_eq!(
            line(&Verdict::state_failed("dra-driver", "boom").status(&s, "ns", &t(5)))[1],
            "Error True ReconcileFailed: Error syncing state dra-driver: boom"
        );
    }
}
