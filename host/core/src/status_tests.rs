//! Status judgement and set-condition semantics (§2.2 step 7, §2.6).

use super::*;

fn t(s: &str) -> Time {
    Time(s.parse().unwrap())
}

fn obs(states: &[(State, StateResult)], gpu_nodes: usize, nfd: bool) -> Verdict {
    judge(Observation {
        states,
        gpu_nodes,
        nfd_present: nfd,
    })
}

fn all_ready() -> Vec<(State, StateResult)> {
    vec![
        (State::Driver, StateResult::Ready),
        (State::DcgmExporter, StateResult::Ready),
        (State::NodeStatusExporter, StateResult::Disabled),
    ]
}

#[test]
fn all_ready_with_gpu_nodes_is_reconciled() {
    let v = obs(&all_ready(), 5, true);
    assert_eq!(v.state, PolicyState::Ready);
    assert_eq!(
        v.conditions[0],
        ConditionSpec {
            type_: "Ready",
            status: true,
            reason: "Reconciled",
            message: "ClusterPolicy is ready as all resources have been successfully reconciled"
                .into()
        }
    );
    assert_eq!(
        v.conditions[1],
        ConditionSpec {
            type_: "Error",
            status: false,
            reason: "Ready",
            message: String::new()
        }
    );
    assert_eq!(requeue_after(&v), None);
}

#[test]
fn no_gpu_nodes_and_missing_nfd() {
    let v = obs(&all_ready(), 0, true);
    assert_eq!(v.state, PolicyState::Ready);
    assert_eq!(v.reason(), "NoGPUNodes");
    assert!(
        v.message()
            .starts_with("No GPU node found, watching for new nodes to join the cluster"),
        "{}",
        v.message()
    );
    assert_eq!(transition(None, &v).unwrap().type_, "Warning");
    let v = obs(&all_ready(), 0, false);
    assert_eq!(
        (v.state, v.reason()),
        (PolicyState::Ready, "NFDLabelsMissing")
    );
    assert!(v.message().starts_with("No NFD labels found"));
    assert!(v.message().contains("nfd.enabled=true"), "{}", v.message());
    assert_eq!(transition(None, &v).unwrap().type_, "Warning");
    assert_eq!(requeue_after(&v), Some(Duration::from_secs(45)));
}

#[test]
fn not_ready_states_are_listed_with_why() {
    let states = vec![
        (
            State::Driver,
            StateResult::NotReady("nvidia-driver-daemonset: 2 pod(s) unavailable".into()),
        ),
        (State::ContainerToolkit, StateResult::Ready),
        (
            State::DcgmExporter,
            StateResult::NotReady("nvidia-dcgm-exporter: DaemonSet not found".into()),
        ),
    ];
    let v = obs(&states, 5, true);
    assert_eq!(v.state, PolicyState::NotReady);
    assert_eq!(v.reason(), "OperandNotReady");
    assert_eq!(
        v.message(),
        "ClusterPolicy is not ready; states not ready: [driver dcgm-exporter]; \
         driver: nvidia-driver-daemonset: 2 pod(s) unavailable; \
         dcgm-exporter: nvidia-dcgm-exporter: DaemonSet not found"
    );
    assert_eq!(
        (v.conditions[0].status, v.conditions[0].reason),
        (false, "Error")
    );
    assert_eq!(requeue_after(&v), Some(Duration::from_secs(30)));
}

#[test]
fn a_failing_plugin_is_named_and_only_its_state_is_listed() {
    let states = vec![
        (State::Driver, StateResult::Ready),
        (
            State::DcgmExporter,
            StateResult::Failed("plugin `dcgm-exporter`: trapped: unreachable".into()),
        ),
        (State::GpuFeatureDiscovery, StateResult::Ready),
    ];
    let v = obs(&states, 5, true);
    assert_eq!(v.state, PolicyState::NotReady);
    assert_eq!(v.reason(), "ReconcileFailed");
    assert_eq!(
        v.message(),
        "ClusterPolicy is not ready; states not ready: [dcgm-exporter]; \
         dcgm-exporter: failed: plugin `dcgm-exporter`: trapped: unreachable"
    );
}

#[test]
fn ignored_names_the_active_policy() {
    let v = Verdict::ignored("older");
    assert_eq!(v.state, PolicyState::Ignored);
    assert_eq!(v.reason(), "Ignored");
    assert_eq!(
        v.message(),
        "ClusterPolicy \"older\" is the active policy; this one is ignored"
    );
    let f = Verdict::failed("spec.mig.strategy: unknown variant `double`");
    assert_eq!(
        (f.state, f.reason()),
        (PolicyState::NotReady, "ReconcileFailed")
    );
}

#[test]
fn transition_time_changes_only_when_status_flips() {
    let t0 = t("2026-01-01T00:00:00Z");
    let t1 = t("2026-01-01T00:01:00Z");
    let ready = obs(&all_ready(), 5, true);
    let s0 = make_status(None, &ready, "gpu-operator", &t0, Some(1));
    assert_eq!(s0.state, Some(PolicyState::Ready));
    assert_eq!(s0.namespace.as_deref(), Some("gpu-operator"));
    assert_eq!(s0.conditions.len(), 2);
    assert!(s0.conditions.iter().all(|c| c.last_transition_time == t0));
    assert_eq!(s0.conditions[0].observed_generation, Some(1));

    // Same verdict later: identical status, no write.
    let s1 = make_status(Some(&s0), &ready, "gpu-operator", &t1, Some(1));
    assert_eq!(s1, s0);
    assert!(!needs_write(Some(&s0), &s1));
    assert!(needs_write(None, &s1));

    // NoGPUNodes → Reconciled: reason/message change, status stays True, time kept.
    let no_gpu = obs(&all_ready(), 0, true);
    let s2 = make_status(Some(&s0), &no_gpu, "gpu-operator", &t1, Some(1));
    assert_eq!(s2.conditions[0].reason, "NoGPUNodes");
    assert_eq!(s2.conditions[0].last_transition_time, t0);
    assert!(needs_write(Some(&s0), &s2));

    // Flip to notReady: both conditions flip, both times move.
    let bad = obs(
        &[(State::Driver, StateResult::NotReady("x".into()))],
        5,
        true,
    );
    let s3 = make_status(Some(&s0), &bad, "gpu-operator", &t1, Some(1));
    assert_eq!(s3.state, Some(PolicyState::NotReady));
    assert_eq!(
        s3.conditions
            .iter()
            .map(|c| (
                c.type_.as_str(),
                c.status.as_str(),
                c.last_transition_time.clone()
            ))
            .collect::<Vec<_>>(),
        vec![
            ("Ready", "False", t1.clone()),
            ("Error", "True", t1.clone())
        ]
    );
}

#[test]
fn events_on_transitions_only() {
    let t0 = t("2026-01-01T00:00:00Z");
    let ready = obs(&all_ready(), 5, true);
    let first = transition(None, &ready).unwrap();
    assert_eq!((first.type_, first.reason), ("Normal", "Reconciled"));
    let s0 = make_status(None, &ready, "ns", &t0, None);
    assert_eq!(transition(Some(&s0), &ready), None);
    let bad = obs(
        &[(State::Driver, StateResult::Failed("boom".into()))],
        5,
        true,
    );
    let ev = transition(Some(&s0), &bad).unwrap();
    assert_eq!((ev.type_, ev.reason), ("Warning", "ReconcileFailed"));
    let s1 = make_status(Some(&s0), &bad, "ns", &t0, None);
    assert_eq!(transition(Some(&s1), &bad), None);
    let ignored = Verdict::ignored("a");
    let s2 = make_status(None, &ignored, "ns", &t0, None);
    assert_eq!(transition(Some(&s2), &ignored), None);
}
