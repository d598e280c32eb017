use super::*;
use crate::spec::{DrainSpec, PodDeletionSpec, WaitForCompletionSpec};
use UpgradeState as S;

const NOW: i64 = 1_000_000;

fn driver(current: bool) -> DriverPodFacts {
    DriverPodFacts {
        namespace: "gpu-operator".into(),
        name: "nvidia-driver-daemonset-x".into(),
        orphaned: false,
        current_revision: current,
        same_digest: false,
        ready: true,
        terminating: false,
        crash_looping: false,
    }
}

fn node(name: &str, state: UpgradeState) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        state,
        skip: false,
        requested: false,
        safe_load_wait: false,
        unschedulable: false,
        ready: true,
        initially_unschedulable: false,
        wait_start: None,
        deletion_start: None,
        drain_start: None,
        validation_start: None,
        driver: Some(driver(false)),
        pods: Vec::new(),
        validator_ready: Some(true),
    }
}

fn pod(name: &str, labels: &[(&str, &str)]) -> PodFacts {
    PodFacts {
        namespace: "jobs".into(),
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        phase: Phase::Running,
        terminating: false,
        uses_gpu: false,
        daemonset: false,
        controlled: true,
        empty_dir: false,
        mirror: false,
    }
}

fn gpu_pod(name: &str) -> PodFacts {
    PodFacts {
        uses_gpu: true,
        ..pod(name, &[("app", "trainer")])
    }
}

fn policy() -> DriverUpgradePolicySpec {
    DriverUpgradePolicySpec {
        auto_upgrade: true,
        max_parallel_upgrades: 0,
        max_unavailable: IntOrString::String("100%".into()),
        ..Default::default()
    }
}

fn run(policy: &DriverUpgradePolicySpec, nodes: &[NodeFacts]) -> Plan {
    plan(
        &Inputs {
            policy,
            now: NOW,
            validation_timeout: VALIDATION_TIMEOUT_SECONDS,
        },
        nodes,
    )
}

/// The one node's state after a pass (its own if unchanged) and its non-Event actions.
fn step(policy: &DriverUpgradePolicySpec, n: &NodeFacts) -> (UpgradeState, Vec<Action>) {
    let p = run(policy, std::slice::from_ref(n));
    let acts = p.actions(&n.name);
    let state = acts
        .iter()
        .find_map(|a| match a {
            Action::SetState(s) => Some(*s),
            _ => None,
        })
        .unwrap_or(n.state);
    let other = acts
        .iter()
        .filter(|a| !matches!(a, Action::SetState(_) | Action::Event { .. }))
        .cloned()
        .collect();
    (state, other)
}

fn notes(p: &Plan, node: &str) -> Vec<String> {
    p.actions(node)
        .iter()
        .filter_map(|a| match a {
            Action::Event { note, .. } => Some(note.clone()),
            _ => None,
        })
        .collect()
}

fn warned(p: &Plan, node: &str) -> bool {
    p.actions(node)
        .iter()
        .any(|a| matches!(a, Action::Event { warning: true, .. }))
}

#[test]
fn state_labels_round_trip_and_unknown_values_are_unknown() {
    for s in UpgradeState::ALL {
        if s != S::Unknown {
            assert_eq!(UpgradeState::from_label(Some(s.label())), s);
        }
    }
    assert_eq!(UpgradeState::from_label(None), S::Unknown);
    assert_eq!(UpgradeState::from_label(Some("")), S::Unknown);
    assert_eq!(UpgradeState::from_label(Some("rebooting")), S::Unknown);
    assert_eq!(S::WaitForJobsRequired.label(), "wait-for-jobs-required");
    assert_eq!(S::Unknown.name(), "unknown");
    assert!(S::Failed.in_progress() && S::CordonRequired.in_progress());
    assert!(!S::UpgradeRequired.in_progress() && !S::Done.in_progress());
}

#[test]
fn unknown_node_with_current_driver_goes_straight_to_done() {
    let mut n = node("a", S::Unknown);
    n.driver = Some(driver(true));
    assert_eq!(step(&policy(), &n).0, S::Done);
    // Already done and current: nothing at all.
    n.state = S::Done;
    assert!(run(&policy(), &[n]).nodes.is_empty());
}

#[test]
fn stale_driver_pod_requires_an_upgrade_from_unknown_and_done() {
    for from in [S::Unknown, S::Done] {
        let n = node("a", from);
        let (to, acts) = step(&policy(), &n);
        assert_eq!(to, S::UpgradeRequired);
        assert!(acts.is_empty(), "{acts:?}");
    }
}

#[test]
fn requested_or_safe_load_upgrades_a_current_node_and_orphans_need_a_request() {
    let mut n = node("a", S::Done);
    n.driver = Some(driver(true));
    n.requested = true;
    assert_eq!(step(&policy(), &n).0, S::UpgradeRequired);
    n.requested = false;
    n.safe_load_wait = true;
    assert_eq!(step(&policy(), &n).0, S::UpgradeRequired);
    // An orphaned pod alone does not start an upgrade.
    let mut o = node("b", S::Done);
    o.driver.as_mut().unwrap().orphaned = true;
    assert_eq!(step(&policy(), &o).0, S::Done);
    o.requested = true;
    assert_eq!(step(&policy(), &o).0, S::UpgradeRequired);
}

#[test]
fn a_node_cordoned_before_the_upgrade_is_annotated_and_left_cordoned() {
    let mut n = node("a", S::Done);
    n.unschedulable = true;
    let (to, acts) = step(&policy(), &n);
    assert_eq!(to, S::UpgradeRequired);
    assert_eq!(
        acts,
        [Action::Annotate(INITIAL_UNSCHEDULABLE, Some("true".into()))]
    );
    // At the end: validation passes straight to done, the annotation goes, no uncordon.
    let mut v = node("a", S::ValidationRequired);
    v.unschedulable = true;
    v.initially_unschedulable = true;
    let (to, acts) = step(&policy(), &v);
    assert_eq!(to, S::Done);
    assert_eq!(acts, [Action::Annotate(INITIAL_UNSCHEDULABLE, None)]);
}

#[test]
fn nodes_without_a_driver_pod_wait() {
    let mut n = node("a", S::Unknown);
    n.driver = None;
    assert!(run(&policy(), std::slice::from_ref(&n)).nodes.is_empty());
    n.state = S::PodRestartRequired;
    assert!(run(&policy(), &[n]).nodes.is_empty());
}

#[test]
fn upgrade_required_moves_to_cordon_required_and_drops_the_request() {
    let mut n = node("a", S::UpgradeRequired);
    n.requested = true;
    let (to, acts) = step(&policy(), &n);
    assert_eq!(to, S::CordonRequired);
    assert_eq!(acts, [Action::Annotate(UPGRADE_REQUESTED, None)]);
}

#[test]
fn skip_label_holds_a_node_in_upgrade_required() {
    let mut n = node("a", S::UpgradeRequired);
    n.skip = true;
    n.requested = true;
    let (to, acts) = step(&policy(), &n);
    assert_eq!(to, S::UpgradeRequired);
    assert_eq!(acts, [Action::Annotate(UPGRADE_REQUESTED, None)]);
}

#[test]
fn same_digest_is_a_restart_only_upgrade() {
    let mut n = node("a", S::UpgradeRequired);
    n.driver.as_mut().unwrap().same_digest = true;
    let (to, acts) = step(&policy(), &n);
    assert_eq!(to, S::PodRestartRequired);
    assert_eq!(acts, [Action::Cordon]);
    // A requested upgrade is a full one even with the same digest.
    n.requested = true;
    assert_eq!(step(&policy(), &n).0, S::CordonRequired);
}

#[test]
fn cordon_required_cordons_once() {
    let n = node("a", S::CordonRequired);
    assert_eq!(
        step(&policy(), &n),
        (S::WaitForJobsRequired, vec![Action::Cordon])
    );
    let mut c = n.clone();
    c.unschedulable = true;
    assert_eq!(step(&policy(), &c), (S::WaitForJobsRequired, vec![]));
}

fn required(count: usize) -> Vec<NodeFacts> {
    (0..count)
        .map(|i| node(&format!("n{i:02}"), S::UpgradeRequired))
        .collect()
}

fn started(p: &Plan) -> Vec<String> {
    p.nodes
        .iter()
        .filter(|n| {
            n.actions
                .iter()
                .any(|a| matches!(a, Action::SetState(S::CordonRequired)))
        })
        .map(|n| n.node.clone())
        .collect()
}

#[test]
fn max_parallel_upgrades_limits_starts_and_zero_is_unlimited() {
    let mut pol = policy();
    pol.max_parallel_upgrades = 2;
    let nodes = required(8);
    assert_eq!(started(&run(&pol, &nodes)), ["n00", "n01"]);
    // One already in progress: one slot left.
    let mut nodes2 = nodes.clone();
    nodes2[5].state = S::PodRestartRequired;
    assert_eq!(started(&run(&pol, &nodes2)), ["n00"]);
    // A failed node holds its slot (upstream).
    nodes2[6].state = S::Failed;
    assert!(started(&run(&pol, &nodes2)).is_empty());
    pol.max_parallel_upgrades = 0;
    assert_eq!(started(&run(&pol, &nodes)).len(), 8);
}

#[test]
fn max_unavailable_count_and_percentage_count_nodes_already_unavailable() {
    let mut pol = policy();
    pol.max_parallel_upgrades = 0;
    pol.max_unavailable = IntOrString::Int(3);
    let mut nodes = required(8);
    assert_eq!(started(&run(&pol, &nodes)).len(), 3);
    // 25% of 8 = 2.
    pol.max_unavailable = IntOrString::String("25%".into());
    assert_eq!(started(&run(&pol, &nodes)).len(), 2);
    // 10% of 8 rounds up to 1.
    pol.max_unavailable = IntOrString::String("10%".into());
    assert_eq!(started(&run(&pol, &nodes)).len(), 1);
    // A NotReady done node and a node cordoned by someone else take the 2 slots.
    pol.max_unavailable = IntOrString::Int(2);
    nodes.push(node("x-notready", S::Done));
    nodes.last_mut().unwrap().ready = false;
    assert_eq!(started(&run(&pol, &nodes)).len(), 1);
    nodes[7].unschedulable = true; // n07: cordoned by an admin, required
    let p = run(&pol, &nodes);
    // No free slot, but the already-cordoned node may still go on (upstream).
    assert_eq!(started(&p), ["n07"]);
    // cordon-required counts as unavailable too.
    let mut c = required(4);
    c[0].state = S::CordonRequired;
    pol.max_unavailable = IntOrString::Int(1);
    assert!(started(&run(&pol, &c)).is_empty());
}

#[test]
fn slots_formula() {
    let mut pol = policy();
    pol.max_parallel_upgrades = 4;
    pol.max_unavailable = IntOrString::String("50%".into());
    let mut nodes = required(4);
    assert_eq!(slots(&pol, &nodes), 2);
    nodes[0].state = S::WaitForJobsRequired;
    nodes[0].unschedulable = true;
    assert_eq!(slots(&pol, &nodes), 1);
    nodes[1].unschedulable = true;
    assert_eq!(slots(&pol, &nodes), 0);
    assert_eq!(scaled(&IntOrString::String("25%".into()), 100), 25);
    assert_eq!(scaled(&IntOrString::String("1%".into()), 101), 2);
    assert_eq!(scaled(&IntOrString::Int(7), 100), 7);
    // Values the int-or-percent rule refuses take no node down (they were "all nodes").
    for bad in ["7", "lots", "150%", "", "-1"] {
        assert_eq!(scaled(&IntOrString::String(bad.into()), 9), 0, "{bad:?}");
    }
}

#[test]
fn counts_per_state() {
    let mut nodes = required(3);
    nodes[0].state = S::Done;
    nodes[1].state = S::Failed;
    let p = run(&policy(), &nodes);
    assert_eq!(p.counts.total, 3);
    assert_eq!(p.counts.done, 1);
    assert_eq!(p.counts.failed, 1);
    assert_eq!(p.counts.in_progress, 1);
    assert_eq!(p.counts.pending, 1);
    assert_eq!(
        p.counts.states,
        BTreeMap::from([
            ("upgrade-done".to_string(), 1),
            ("upgrade-failed".to_string(), 1),
            ("upgrade-required".to_string(), 1)
        ])
    );
    let st = crate::spec::DriverUpgradeStatus::from(&p.counts);
    assert_eq!((st.total_nodes, st.upgrades_failed), (3, 1));
}

fn waiting(selector: &str, timeout: u32) -> DriverUpgradePolicySpec {
    DriverUpgradePolicySpec {
        wait_for_completion: Some(WaitForCompletionSpec {
            pod_selector: selector.into(),
            timeout_seconds: timeout,
        }),
        ..policy()
    }
}

#[test]
fn wait_for_jobs_without_selector_moves_on() {
    let n = node("a", S::WaitForJobsRequired);
    assert_eq!(step(&policy(), &n), (S::PodDeletionRequired, vec![]));
}

#[test]
fn wait_for_jobs_waits_for_matching_running_pods_forever_with_timeout_zero() {
    let pol = waiting("app=trainer", 0);
    let mut n = node("a", S::WaitForJobsRequired);
    n.pods = vec![
        pod("t1", &[("app", "trainer")]),
        pod("t2", &[("app", "trainer")]),
        pod("web", &[("app", "web")]),
    ];
    // First pass: start time recorded.
    let (to, acts) = step(&pol, &n);
    assert_eq!(to, S::WaitForJobsRequired);
    assert_eq!(
        acts,
        [Action::Annotate(
            WAIT_FOR_COMPLETION_START,
            Some(NOW.to_string())
        )]
    );
    // 41 minutes later: still waiting, and the Event says why.
    n.wait_start = Some(NOW - 41 * 60);
    let p = run(&pol, std::slice::from_ref(&n));
    assert_eq!(
        notes(&p, "a"),
        ["waiting for 2 pod(s) matching app=trainer, 41m so far"]
    );
    assert!(
        p.actions("a")
            .iter()
            .all(|a| !matches!(a, Action::SetState(_)))
    );
    // A year later too (timeout 0 = forever); never deletes anything.
    n.wait_start = Some(NOW - 365 * 86_400);
    let (to, acts) = step(&pol, &n);
    assert_eq!(to, S::WaitForJobsRequired);
    assert!(acts.is_empty());
    // The pods end: on to pod deletion, the annotation removed.
    n.pods[0].phase = Phase::Finished;
    n.pods[1].phase = Phase::Finished;
    assert_eq!(
        step(&pol, &n),
        (
            S::PodDeletionRequired,
            vec![Action::Annotate(WAIT_FOR_COMPLETION_START, None)]
        )
    );
}

#[test]
fn wait_for_jobs_waits_for_a_matching_pending_pod_as_for_a_running_one() {
    // A job pod created just before the upgrade: scheduled, image still pulling.
    let pol = waiting("app=trainer", 0);
    let mut n = node("a", S::WaitForJobsRequired);
    let mut t1 = gpu_pod("t1");
    t1.phase = Phase::Pending;
    n.pods = vec![t1, pod("web", &[("app", "web")])];
    let p = run(&pol, std::slice::from_ref(&n));
    assert_eq!(
        step(&pol, &n),
        (
            S::WaitForJobsRequired,
            vec![Action::Annotate(
                WAIT_FOR_COMPLETION_START,
                Some(NOW.to_string())
            )]
        )
    );
    assert_eq!(
        notes(&p, "a"),
        ["waiting for 1 pod(s) matching app=trainer to complete (no timeout)"]
    );
    // Pending, then Running, then Pending (an unknown phase) again: it keeps waiting.
    n.wait_start = Some(NOW - 5);
    for phase in [
        Phase::Pending,
        Phase::Running,
        Phase::parse(Some("Unknown")),
    ] {
        n.pods[0].phase = phase;
        assert_eq!(
            step(&pol, &n),
            (S::WaitForJobsRequired, vec![]),
            "{phase:?}"
        );
    }
    // A matching pod that terminates still runs until it is gone.
    n.pods[0].terminating = true;
    assert_eq!(step(&pol, &n).0, S::WaitForJobsRequired);
    // It ends: on to pod deletion, the Event naming what finished.
    n.pods[0].phase = Phase::Finished;
    let p = run(&pol, std::slice::from_ref(&n));
    assert_eq!(
        step(&pol, &n),
        (
            S::PodDeletionRequired,
            vec![Action::Annotate(WAIT_FOR_COMPLETION_START, None)]
        )
    );
    assert_eq!(
        notes(&p, "a"),
        [
            "wait-for-jobs-required -> pod-deletion-required: no pod matching app=trainer \
             pending or running (1 finished: jobs/t1)"
        ]
    );
    // With a timeout, a Pending pod is waited for until it passes.
    let pol = waiting("app=trainer", 60);
    n.pods[0].phase = Phase::Pending;
    n.pods[0].terminating = false;
    n.wait_start = Some(NOW - 59);
    assert_eq!(step(&pol, &n).0, S::WaitForJobsRequired);
    n.wait_start = Some(NOW - 60);
    assert_eq!(step(&pol, &n).0, S::PodDeletionRequired);
}

#[test]
fn pod_phases_pending_and_running_hold_the_node() {
    assert_eq!(Phase::parse(Some("Pending")), Phase::Pending);
    assert_eq!(Phase::parse(None), Phase::Pending);
    assert_eq!(Phase::parse(Some("Running")), Phase::Running);
    assert_eq!(Phase::parse(Some("Succeeded")), Phase::Finished);
    assert_eq!(Phase::parse(Some("Failed")), Phase::Finished);
    assert!(Phase::Pending.holds_node() && Phase::Running.holds_node());
    assert!(!Phase::Finished.holds_node());
}

#[test]
fn wait_for_jobs_timeout_moves_on() {
    let pol = waiting("app=trainer", 600);
    let mut n = node("a", S::WaitForJobsRequired);
    n.pods = vec![pod("t1", &[("app", "trainer")])];
    n.wait_start = Some(NOW - 599);
    assert_eq!(step(&pol, &n).0, S::WaitForJobsRequired);
    n.wait_start = Some(NOW - 600);
    let p = run(&pol, std::slice::from_ref(&n));
    assert_eq!(step(&pol, &n).0, S::PodDeletionRequired);
    assert!(notes(&p, "a")[0].contains("still running after the 10m timeout"));
}

#[test]
fn wait_for_jobs_bad_selector_fails_with_the_reason() {
    let pol = waiting("app in trainer", 0);
    let mut n = node("a", S::WaitForJobsRequired);
    n.pods = vec![pod("t1", &[("app", "trainer")])];
    let p = run(&pol, std::slice::from_ref(&n));
    assert_eq!(step(&pol, &n).0, S::Failed);
    assert!(warned(&p, "a"));
    assert!(notes(&p, "a")[0].contains("waitForCompletion.podSelector"));
}

fn deleting(force: bool, timeout: u32, empty_dir: bool, drain: bool) -> DriverUpgradePolicySpec {
    DriverUpgradePolicySpec {
        pod_deletion: Some(PodDeletionSpec {
            force,
            timeout_seconds: timeout,
            delete_empty_dir: empty_dir,
        }),
        drain: Some(DrainSpec {
            enable: drain,
            ..Default::default()
        }),
        ..policy()
    }
}

#[test]
fn pod_deletion_deletes_only_gpu_pods() {
    let pol = deleting(false, 300, false, false);
    let mut n = node("a", S::PodDeletionRequired);
    let mut ds = gpu_pod("plugin");
    ds.daemonset = true;
    n.pods = vec![gpu_pod("train"), pod("web", &[]), ds];
    let (to, acts) = step(&pol, &n);
    assert_eq!(to, S::PodDeletionRequired);
    assert_eq!(
        acts,
        [
            Action::Annotate(POD_DELETION_START, Some(NOW.to_string())),
            Action::DeletePods {
                pods: vec!["jobs/train".into()],
                drain: false
            }
        ]
    );
    // Gone: on to the restart, the annotation removed.
    n.pods.remove(0);
    n.deletion_start = Some(NOW - 5);
    assert_eq!(
        step(&pol, &n),
        (
            S::PodRestartRequired,
            vec![Action::Annotate(POD_DELETION_START, None)]
        )
    );
}

#[test]
fn pod_deletion_counts_pending_gpu_pods_and_not_finished_ones() {
    let pol = deleting(false, 300, false, false);
    let mut n = node("a", S::PodDeletionRequired);
    let mut pending = gpu_pod("pending");
    pending.phase = Phase::Pending;
    let mut done = gpu_pod("done");
    done.phase = Phase::Finished;
    n.pods = vec![pending, done];
    assert_eq!(
        step(&pol, &n),
        (
            S::PodDeletionRequired,
            vec![
                Action::Annotate(POD_DELETION_START, Some(NOW.to_string())),
                Action::DeletePods {
                    pods: vec!["jobs/pending".into()],
                    drain: false
                }
            ]
        )
    );
    // A Pending bare GPU pod blocks as a Running one does (no force, no drain: failed).
    n.pods[0].controlled = false;
    assert_eq!(step(&pol, &n).0, S::Failed);
    // Only the finished one left: nothing holds a GPU.
    n.pods.remove(0);
    assert_eq!(step(&pol, &n), (S::PodRestartRequired, vec![]));
}

#[test]
fn pod_deletion_with_no_gpu_pods_moves_on() {
    let n = node("a", S::PodDeletionRequired);
    assert_eq!(step(&policy(), &n), (S::PodRestartRequired, vec![]));
}

#[test]
fn pod_deletion_needs_force_for_bare_pods_and_delete_empty_dir_for_empty_dirs() {
    let mut n = node("a", S::PodDeletionRequired);
    let mut bare = gpu_pod("bare");
    bare.controlled = false;
    n.pods = vec![bare];
    let p = run(
        &deleting(false, 300, false, false),
        std::slice::from_ref(&n),
    );
    assert_eq!(step(&deleting(false, 300, false, false), &n).0, S::Failed);
    assert!(notes(&p, "a")[0].contains("jobs/bare (not managed by a controller; needs force)"));
    assert!(warned(&p, "a"));
    // With drain on, the fallback is the drain.
    assert_eq!(
        step(&deleting(false, 300, false, true), &n).0,
        S::DrainRequired
    );
    // force deletes it.
    assert!(matches!(
        step(&deleting(true, 300, false, false), &n).1.last(),
        Some(Action::DeletePods { .. })
    ));
    let mut ed = gpu_pod("scratch");
    ed.empty_dir = true;
    n.pods = vec![ed];
    assert_eq!(step(&deleting(true, 300, false, false), &n).0, S::Failed);
    assert!(matches!(
        step(&deleting(false, 300, true, false), &n).1.last(),
        Some(Action::DeletePods { .. })
    ));
}

#[test]
fn pod_deletion_timeout_falls_back_and_zero_waits_forever() {
    let mut n = node("a", S::PodDeletionRequired);
    let mut stuck = gpu_pod("stuck");
    stuck.terminating = true;
    n.pods = vec![stuck];
    n.deletion_start = Some(NOW - 299);
    // Terminating already: nothing re-sent.
    assert_eq!(
        step(&deleting(false, 300, false, false), &n),
        (S::PodDeletionRequired, vec![])
    );
    n.deletion_start = Some(NOW - 300);
    assert_eq!(step(&deleting(false, 300, false, false), &n).0, S::Failed);
    assert_eq!(
        step(&deleting(false, 300, false, true), &n).0,
        S::DrainRequired
    );
    n.deletion_start = Some(NOW - 86_400);
    assert_eq!(
        step(&deleting(false, 0, false, false), &n).0,
        S::PodDeletionRequired
    );
}

#[test]
fn default_pod_deletion_applies_when_the_policy_has_none() {
    let mut n = node("a", S::PodDeletionRequired);
    n.pods = vec![gpu_pod("train")];
    n.deletion_start = Some(NOW - 300);
    // podDeletion omitted = the CRD defaults: 300 s timeout, then failed (drain off).
    assert_eq!(step(&policy(), &n).0, S::Failed);
}

fn draining(force: bool, selector: &str, timeout: u32, empty_dir: bool) -> DriverUpgradePolicySpec {
    DriverUpgradePolicySpec {
        drain: Some(DrainSpec {
            enable: true,
            force,
            pod_selector: selector.into(),
            timeout_seconds: timeout,
            delete_empty_dir: empty_dir,
        }),
        ..policy()
    }
}

#[test]
fn drain_disabled_goes_to_pod_restart() {
    let mut n = node("a", S::DrainRequired);
    n.pods = vec![pod("web", &[])];
    assert_eq!(step(&policy(), &n), (S::PodRestartRequired, vec![]));
}

#[test]
fn drain_evicts_selected_pods_except_daemonsets_mirrors_and_skip_labelled() {
    let pol = draining(false, "", 300, false);
    let mut n = node("a", S::DrainRequired);
    let mut ds = pod("ds", &[]);
    ds.daemonset = true;
    let mut mirror = pod("static", &[]);
    mirror.mirror = true;
    mirror.controlled = false;
    let mut done = pod("finished", &[]);
    done.phase = Phase::Finished;
    n.pods = vec![
        pod("web", &[]),
        gpu_pod("train"),
        pod("keep", &[(DRAIN_SKIP_POD_LABEL, "true")]),
        ds,
        mirror,
        done,
    ];
    let (to, acts) = step(&pol, &n);
    assert_eq!(to, S::DrainRequired);
    assert_eq!(
        acts,
        [
            Action::Annotate(DRAIN_START, Some(NOW.to_string())),
            Action::DeletePods {
                pods: vec!["jobs/web".into(), "jobs/train".into()],
                drain: true
            }
        ]
    );
    // The drain podSelector narrows it.
    let narrow = draining(false, "app=trainer", 300, false);
    assert!(matches!(
        step(&narrow, &n).1.last(),
        Some(Action::DeletePods { pods, .. }) if pods == &["jobs/train".to_string()]
    ));
    // Drained: pod restart.
    n.pods.drain(..2);
    n.drain_start = Some(NOW - 1);
    assert_eq!(
        step(&pol, &n),
        (
            S::PodRestartRequired,
            vec![Action::Annotate(DRAIN_START, None)]
        )
    );
}

#[test]
fn drain_force_empty_dir_and_timeout() {
    let mut n = node("a", S::DrainRequired);
    let mut bare = pod("bare", &[]);
    bare.controlled = false;
    n.pods = vec![bare];
    let p = run(&draining(false, "", 300, false), std::slice::from_ref(&n));
    assert_eq!(step(&draining(false, "", 300, false), &n).0, S::Failed);
    assert!(notes(&p, "a")[0].contains("cannot drain: jobs/bare (not managed by a controller"));
    assert_eq!(
        step(&draining(true, "", 300, false), &n).0,
        S::DrainRequired
    );
    let mut ed = pod("scratch", &[]);
    ed.empty_dir = true;
    n.pods = vec![ed];
    assert_eq!(step(&draining(true, "", 300, false), &n).0, S::Failed);
    assert_eq!(
        step(&draining(false, "", 300, true), &n).0,
        S::DrainRequired
    );
    n.drain_start = Some(NOW - 300);
    let p = run(&draining(false, "", 300, true), std::slice::from_ref(&n));
    assert_eq!(step(&draining(false, "", 300, true), &n).0, S::Failed);
    assert!(notes(&p, "a")[0].contains("drain timed out after 5m"));
    assert_eq!(step(&draining(false, "", 0, true), &n).0, S::DrainRequired);
}

#[test]
fn pod_restart_deletes_an_old_driver_pod_once() {
    let n = node("a", S::PodRestartRequired);
    let (to, acts) = step(&policy(), &n);
    assert_eq!(to, S::PodRestartRequired);
    assert_eq!(
        acts,
        [Action::DeleteDriverPod {
            namespace: "gpu-operator".into(),
            name: "nvidia-driver-daemonset-x".into()
        }]
    );
    let mut t = n.clone();
    t.driver.as_mut().unwrap().terminating = true;
    assert_eq!(step(&policy(), &t), (S::PodRestartRequired, vec![]));
    // Orphaned pods are replaced too.
    let mut o = n.clone();
    o.driver = Some(DriverPodFacts {
        orphaned: true,
        ..driver(true)
    });
    assert!(matches!(
        step(&policy(), &o).1[..],
        [Action::DeleteDriverPod { .. }]
    ));
}

#[test]
fn pod_restart_waits_for_ready_then_validates_and_unblocks_safe_load() {
    let mut n = node("a", S::PodRestartRequired);
    n.driver = Some(DriverPodFacts {
        ready: false,
        ..driver(true)
    });
    n.safe_load_wait = true;
    assert_eq!(
        step(&policy(), &n),
        (
            S::PodRestartRequired,
            vec![Action::Annotate(SAFE_LOAD_ANNOTATION, None)]
        )
    );
    n.safe_load_wait = false;
    n.driver.as_mut().unwrap().ready = true;
    assert_eq!(step(&policy(), &n), (S::ValidationRequired, vec![]));
}

#[test]
fn crash_looping_driver_fails_the_upgrade() {
    let mut n = node("a", S::PodRestartRequired);
    n.driver = Some(DriverPodFacts {
        ready: false,
        crash_looping: true,
        ..driver(true)
    });
    let p = run(&policy(), std::slice::from_ref(&n));
    assert_eq!(step(&policy(), &n).0, S::Failed);
    assert!(notes(&p, "a")[0].contains("restarted more than 10 times"));
}

#[test]
fn validation_waits_for_the_validator_then_times_out() {
    let mut n = node("a", S::ValidationRequired);
    assert_eq!(step(&policy(), &n), (S::UncordonRequired, vec![]));
    n.validator_ready = None;
    assert_eq!(step(&policy(), &n).0, S::UncordonRequired);
    n.validator_ready = Some(false);
    assert_eq!(
        step(&policy(), &n),
        (
            S::ValidationRequired,
            vec![Action::Annotate(VALIDATION_START, Some(NOW.to_string()))]
        )
    );
    n.validation_start = Some(NOW - 599);
    assert_eq!(step(&policy(), &n).0, S::ValidationRequired);
    n.validation_start = Some(NOW - 600);
    let p = run(&policy(), std::slice::from_ref(&n));
    assert_eq!(step(&policy(), &n).0, S::Failed);
    assert!(warned(&p, "a"));
    assert!(
        notes(&p, "a")[0].contains("validator not ready after 10m"),
        "{:?}",
        notes(&p, "a")
    );
    // A shorter validation timeout (tests) applies.
    n.validation_start = Some(NOW - 5);
    let p = plan(
        &Inputs {
            policy: &policy(),
            now: NOW,
            validation_timeout: 5,
        },
        std::slice::from_ref(&n),
    );
    assert!(p.actions("a").contains(&Action::SetState(S::Failed)));
}

#[test]
fn uncordon_required_uncordons_and_is_done() {
    let mut n = node("a", S::UncordonRequired);
    n.unschedulable = true;
    assert_eq!(step(&policy(), &n), (S::Done, vec![Action::Uncordon]));
}

#[test]
fn failed_node_recovers_only_when_driver_and_validator_are_ready() {
    let mut n = node("a", S::Failed);
    n.driver = Some(driver(true));
    n.validator_ready = Some(false);
    assert!(run(&policy(), std::slice::from_ref(&n)).nodes.is_empty());
    n.validator_ready = Some(true);
    assert_eq!(step(&policy(), &n).0, S::UncordonRequired);
    n.initially_unschedulable = true;
    assert_eq!(step(&policy(), &n).0, S::Done);
    let mut stale = node("b", S::Failed);
    stale.driver = Some(driver(false));
    assert!(run(&policy(), &[stale]).nodes.is_empty());
}

#[test]
fn disabled_removes_every_state_label() {
    let nodes = [
        node("a", S::Done),
        node("b", S::Unknown),
        node("c", S::CordonRequired),
    ];
    let plans = disabled(&nodes);
    assert_eq!(
        plans.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(),
        ["a", "c"]
    );
    assert_eq!(plans[0].actions, [Action::SetState(S::Unknown)]);
}

#[test]
fn events_name_both_states() {
    let p = run(&policy(), &[node("a", S::CordonRequired)]);
    assert_eq!(
        notes(&p, "a"),
        ["cordon-required -> wait-for-jobs-required: cordoned"]
    );
}

/// Drive a simulated fleet to the end: every node ends done, and at no pass are more nodes
/// cordoned by the upgrade than the limits allow.
#[test]
fn a_full_rolling_upgrade_respects_the_limits_and_ends_done() {
    let mut pol = policy();
    pol.max_parallel_upgrades = 2;
    pol.max_unavailable = IntOrString::String("25%".into());
    let mut nodes: Vec<NodeFacts> = (0..8).map(|i| node(&format!("n{i}"), S::Done)).collect();
    let mut max_cordoned = 0;
    let mut restarts = BTreeMap::<String, u32>::new();
    for _ in 0..200 {
        let p = run(&pol, &nodes);
        for np in &p.nodes {
            let n = nodes.iter_mut().find(|n| n.name == np.node).unwrap();
            for a in &np.actions {
                match a {
                    Action::SetState(s) => n.state = *s,
                    Action::Cordon => n.unschedulable = true,
                    Action::Uncordon => n.unschedulable = false,
                    // The DaemonSet recreates it from the current template.
                    Action::DeleteDriverPod { .. } => {
                        *restarts.entry(n.name.clone()).or_default() += 1;
                        n.driver = Some(driver(true));
                    }
                    _ => {}
                }
            }
        }
        max_cordoned = max_cordoned.max(nodes.iter().filter(|n| n.unschedulable).count());
        if nodes.iter().all(|n| n.state == S::Done && !n.unschedulable) {
            break;
        }
    }
    assert!(nodes.iter().all(|n| n.state == S::Done && !n.unschedulable));
    assert_eq!(max_cordoned, 2);
    assert_eq!(restarts.len(), 8);
    assert!(restarts.values().all(|&r| r == 1), "{restarts:?}");
}

#[test]
fn selectors() {
    let l = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let s = Selector::parse("app=trainer, tier!=web").unwrap();
    assert!(s.matches(&l(&[("app", "trainer")])));
    assert!(!s.matches(&l(&[("app", "trainer"), ("tier", "web")])));
    assert!(!s.matches(&l(&[])));
    let s = Selector::parse("env in (a, b),!legacy,gpu,x notin (1)").unwrap();
    assert!(s.matches(&l(&[("env", "b"), ("gpu", "")])));
    assert!(!s.matches(&l(&[("env", "c"), ("gpu", "")])));
    assert!(!s.matches(&l(&[("env", "a"), ("gpu", ""), ("legacy", "1")])));
    assert!(!s.matches(&l(&[("env", "a"), ("gpu", ""), ("x", "1")])));
    assert!(Selector::parse("").unwrap().matches(&l(&[])));
    assert!(
        Selector::parse("app==x")
            .unwrap()
            .matches(&l(&[("app", "x")]))
    );
    assert!(Selector::parse("a b").is_err());
    assert!(Selector::parse("env in a").is_err());
    let skip = Selector::parse("")
        .unwrap()
        .and_not(DRAIN_SKIP_POD_LABEL, "true");
    assert!(!skip.matches(&l(&[(DRAIN_SKIP_POD_LABEL, "true")])));
}

#[test]
fn human_durations() {
    assert_eq!(human_duration(41 * 60 + 7), "41m");
    assert_eq!(human_duration(3900), "1h5m");
    assert_eq!(human_duration(7200), "2h");
    assert_eq!(human_duration(30), "30s");
}

#[test]
fn facts_from_kubernetes_objects() {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "train", "namespace": "jobs", "labels": {"app": "trainer"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": true}]},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                 "volumes": [{"name": "s", "emptyDir": {}}]},
        "status": {"phase": "Running"}
    }))
    .unwrap();
    let f = PodFacts::from_pod(&p);
    assert!(f.uses_gpu && f.controlled && !f.daemonset && f.empty_dir && !f.mirror);
    assert_eq!(
        (f.phase, f.key()),
        (Phase::Running, "jobs/train".to_string())
    );
    let mig: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "m"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/mig-1g.5gb": "1"}}}]}
    }))
    .unwrap();
    assert!(PodFacts::from_pod(&mig).uses_gpu);
    let cpu: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "w"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
    }))
    .unwrap();
    assert!(!PodFacts::from_pod(&cpu).uses_gpu);

    let d: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "drv", "namespace": "gpu-operator",
            "labels": {"controller-revision-hash": "abc"}},
        "spec": {"containers": [{"name": "nvidia-driver-ctr",
            "env": [{"name": "DRIVER_CONFIG_DIGEST", "value": "123"}]}]},
        "status": {"phase": "Running", "containerStatuses": [
            {"name": "nvidia-driver-ctr", "ready": false, "restartCount": 11, "image": "i", "imageID": ""}]}
    }))
    .unwrap();
    let f = DriverPodFacts::from_pod(&d, Some(("abc", Some("123"))));
    assert!(f.current_revision && f.same_digest && !f.ready && f.crash_looping && !f.orphaned);
    let f = DriverPodFacts::from_pod(&d, Some(("def", Some("999"))));
    assert!(!f.current_revision && !f.same_digest);
    assert!(DriverPodFacts::from_pod(&d, None).orphaned);

    let n: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gpu-node-1",
            "labels": {STATE_LABEL: "wait-for-jobs-required", SKIP_LABEL: "true"},
            "annotations": {WAIT_FOR_COMPLETION_START: "1700000000", INITIAL_UNSCHEDULABLE: "true",
                UPGRADE_REQUESTED: "true"}},
        "spec": {"unschedulable": true},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]}
    }))
    .unwrap();
    let f = NodeFacts::from_node(&n);
    assert_eq!(f.state, S::WaitForJobsRequired);
    assert!(f.skip && f.unschedulable && !f.ready && f.initially_unschedulable && f.requested);
    assert_eq!(f.wait_start, Some(1_700_000_000));
}
