//! GPU health on the Node (kiln's own rule): what the node agent writes on its Node when a GPU
//! has a fatal XID or is lost, and clears on recovery.
//!
//! - a condition [`CONDITION_TYPE`] (`True` while every GPU is healthy, `False` with reason
//!   [`REASON_UNHEALTHY`] and a message naming each GPU and why otherwise); its
//!   `lastTransitionTime` moves only when the status does;
//! - when the policy asks (`taint`), the taint [`TAINT_KEY`]`:NoSchedule` while a GPU is
//!   unhealthy; only that key and effect are ever added or removed — an administrator's own
//!   taints, and cordons (`spec.unschedulable`, never part of the plan), are left as they are;
//! - one Event per transition: Warning [`REASON_UNHEALTHY`] or Normal [`REASON_HEALTHY`].
//!
//! The plan is pure; the agent applies it with one status patch, one spec patch (taints, only
//! when they change) and one Event, so a healthy node at rest costs no request.

use k8s_openapi::{
    api::core::v1::{NodeCondition, Taint},
    apimachinery::pkg::apis::meta::v1::Time,
};

/// The Node condition type.
pub const CONDITION_TYPE: &str = "GPUHealthy";
/// The taint key kiln owns (effect `NoSchedule`).
pub const TAINT_KEY: &str = "nvidia.com/gpu-unhealthy";
/// The taint effect.
pub const TAINT_EFFECT: &str = "NoSchedule";
/// Condition reason and Warning Event reason while a GPU is unhealthy.
pub const REASON_UNHEALTHY: &str = "GPUUnhealthy";
/// Condition reason and Normal Event reason once every GPU is healthy.
pub const REASON_HEALTHY: &str = "GPUsHealthy";

/// Why one GPU is unhealthy.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum GpuFault {
    /// A critical XID (its number).
    FatalXid(u64),
    /// The GPU fell off the bus or needs a reset (NVML `GPU_IS_LOST`).
    Lost,
}

/// One unhealthy GPU.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct UnhealthyGpu {
    /// NVML index.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// Why.
    pub fault: GpuFault,
}

/// An Event to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthEvent {
    /// `Warning` or `Normal`.
    pub type_: &'static str,
    /// [`REASON_UNHEALTHY`] or [`REASON_HEALTHY`].
    pub reason: &'static str,
    /// What happened.
    pub message: String,
}

/// What to write on the Node.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthPlan {
    /// The condition, `None` when the Node already carries it (same status, reason, message).
    pub condition: Option<NodeCondition>,
    /// The Node's whole new taint list, `None` when it does not change.
    pub taints: Option<Vec<Taint>>,
    /// The Event of a transition, `None` without one.
    pub event: Option<HealthEvent>,
}

/// The plan for a Node whose `conditions` and `taints` are as given, with `unhealthy` GPUs
/// (empty: all healthy) at `now`; `taint` is the policy's choice.
#[must_use]
pub fn plan(
    conditions: &[NodeCondition],
    taints: &[Taint],
    unhealthy: &[UnhealthyGpu],
    taint: bool,
    now: Time,
) -> HealthPlan {
    let mut gpus = unhealthy.to_vec();
    gpus.sort();
    let healthy = gpus.is_empty();
    let (status, reason) = if healthy {
        ("True", REASON_HEALTHY)
    } else {
        ("False", REASON_UNHEALTHY)
    };
    let message = if healthy {
        "every GPU is healthy".to_owned()
    } else {
        let each: Vec<String> = gpus
            .iter()
            .map(|g| match g.fault {
                GpuFault::FatalXid(x) => format!("GPU {} ({}): XID {x}", g.index, g.uuid),
                GpuFault::Lost => format!("GPU {} ({}): lost", g.index, g.uuid),
            })
            .collect();
        format!("unhealthy: {}", each.join("; "))
    };
    let current = conditions.iter().find(|c| c.type_ == CONDITION_TYPE);
    let transition = current.is_none_or(|c| c.status != status);
    let unchanged = current.is_some_and(|c| {
        c.status == status
            && c.reason.as_deref() == Some(reason)
            && c.message.as_deref() == Some(&message)
    });
    let condition = (!unchanged).then(|| NodeCondition {
        type_: CONDITION_TYPE.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.clone()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(if transition {
            now.clone()
        } else {
            current
                .and_then(|c| c.last_transition_time.clone())
                .unwrap_or(now.clone())
        }),
    });
    let ours = |t: &Taint| t.key == TAINT_KEY && t.effect == TAINT_EFFECT;
    let has = taints.iter().any(ours);
    let want = taint && !healthy;
    let taints = match (has, want) {
        (false, true) => {
            let mut t = taints.to_vec();
            t.push(Taint {
                key: TAINT_KEY.into(),
                effect: TAINT_EFFECT.into(),
                value: Some("true".into()),
                time_added: None,
            });
            Some(t)
        }
        (true, false) => Some(taints.iter().filter(|t| !ours(t)).cloned().collect()),
        _ => None,
    };
    // The first report of a healthy node is not news; every other status change is.
    let event = (transition && !(healthy && current.is_none())).then_some(HealthEvent {
        type_: if healthy { "Normal" } else { "Warning" },
        reason,
        message,
    });
    HealthPlan {
        condition,
        taints,
        event,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn admin_taint() -> Taint {
        Taint {
            key: "dedicated".into(),
            value: Some("ml".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }
    }

    fn xid79() -> Vec<UnhealthyGpu> {
        vec![UnhealthyGpu {
            index: 1,
            uuid: "GPU-b".into(),
            fault: GpuFault::FatalXid(79),
        }]
    }

    #[test]
    fn a_fatal_xid_sets_the_condition_the_taint_and_a_warning_then_recovery_clears_them() {
        let admin = vec![admin_taint()];
        let p = plan(&[], &admin, &xid79(), true, at(100));
        let c = p.condition.clone().unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some(REASON_UNHEALTHY))
        );
        assert_eq!(
            c.message.as_deref(),
            Some("unhealthy: GPU 1 (GPU-b): XID 79")
        );
        let taints = p.taints.unwrap();
        assert_eq!(
            taints[0],
            admin_taint(),
            "the administrator's taint kept, first"
        );
        assert_eq!(
            (taints[1].key.as_str(), taints[1].effect.as_str()),
            (TAINT_KEY, "NoSchedule")
        );
        let e = p.event.unwrap();
        assert_eq!((e.type_, e.reason), ("Warning", REASON_UNHEALTHY));

        // Nothing new: no write, no Event.
        let again = plan(std::slice::from_ref(&c), &taints, &xid79(), true, at(200));
        assert_eq!(
            again,
            HealthPlan {
                condition: None,
                taints: None,
                event: None
            }
        );

        // Recovery: condition True with a new transition time, only kiln's taint removed.
        let r = plan(&[c], &taints, &[], true, at(300));
        let rc = r.condition.unwrap();
        assert_eq!(rc.status, "True");
        assert_eq!(rc.last_transition_time, Some(at(300)));
        assert_eq!(r.taints.unwrap(), admin);
        assert_eq!(r.event.unwrap().type_, "Normal");
    }

    #[test]
    fn without_the_policy_no_taint_and_others_taints_of_other_effects_are_not_ours() {
        let p = plan(&[], &[], &xid79(), false, at(1));
        assert!(p.taints.is_none());
        assert!(p.condition.is_some() && p.event.is_some());
        // A NoExecute taint with kiln's key is an administrator's: recovery leaves it.
        let theirs = Taint {
            key: TAINT_KEY.into(),
            effect: "NoExecute".into(),
            value: None,
            time_added: None,
        };
        let r = plan(&[], std::slice::from_ref(&theirs), &[], true, at(2));
        assert!(r.taints.is_none());
    }

    #[test]
    fn a_lost_gpu_and_a_new_fault_keep_the_transition_time_and_first_healthy_report_is_quiet() {
        let lost = vec![UnhealthyGpu {
            index: 0,
            uuid: "GPU-a".into(),
            fault: GpuFault::Lost,
        }];
        let first = plan(&[], &[], &xid79(), false, at(10)).condition.unwrap();
        let mut both = xid79();
        both.extend(lost);
        let p = plan(&[first], &[], &both, false, at(20));
        let c = p.condition.unwrap();
        assert_eq!(c.last_transition_time, Some(at(10)));
        assert_eq!(
            c.message.as_deref(),
            Some("unhealthy: GPU 0 (GPU-a): lost; GPU 1 (GPU-b): XID 79")
        );
        assert!(p.event.is_none(), "still unhealthy: no new Event");
        let quiet = plan(&[], &[], &[], true, at(1));
        assert_eq!(quiet.condition.unwrap().status, "True");
        assert!(quiet.event.is_none() && quiet.taints.is_none());
    }
}
