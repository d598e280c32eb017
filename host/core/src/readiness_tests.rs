//! DaemonSet readiness: the N1 and N2 cases plus the §2.5 edges.

use super::*;
use serde_json::json;

fn ds(v: serde_json::Value) -> DaemonSet {
    serde_json::from_value(v).unwrap()
}

/// N1 row `{generation, observedGeneration, desired, updated, available}`.
fn rolling(g: i64, o: i64, d: i32, u: i32, a: i32) -> DaemonSet {
    ds(json!({
        "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "gpu-operator", "generation": g},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": {},
                 "updateStrategy": {"type": "RollingUpdate"}},
        "status": {"currentNumberScheduled": d, "desiredNumberScheduled": d, "numberMisscheduled": 0,
                   "numberReady": a, "observedGeneration": o, "updatedNumberScheduled": u,
                   "numberAvailable": a}
    }))
}

#[test]
fn n1_rolling_update_rows() {
    assert_eq!(
        daemonset_readiness(Some(&rolling(2, 2, 3, 3, 3)), &[], &[]),
        Readiness::Ready
    );
    for (o, u, a) in [(1, 3, 3), (2, 2, 3), (2, 3, 2)] {
        let got = daemonset_readiness(Some(&rolling(2, o, 3, u, a)), &[], &[]);
        assert_eq!(
            got,
            Readiness::NotReady(NotReady::Rollout {
                generation: 2,
                observed: o,
                desired: 3,
                updated: u,
                available: a
            })
        );
    }
}

#[test]
fn n1_missing_daemonset_is_not_ready() {
    let got = daemonset_readiness(None, &[], &[]);
    assert_eq!(got, Readiness::NotReady(NotReady::Missing));
    if let Readiness::NotReady(r) = got {
        assert_eq!(r.to_string(), "DaemonSet not found");
    }
}

#[test]
fn desired_zero_is_ready_and_unavailable_is_not() {
    assert_eq!(
        daemonset_readiness(Some(&rolling(5, 5, 0, 0, 0)), &[], &[]),
        Readiness::Ready
    );
    // A fresh DaemonSet the controller has not observed yet is not ready, even at desired 0.
    assert_eq!(
        daemonset_readiness(Some(&rolling(2, 1, 0, 0, 0)), &[], &[]),
        Readiness::NotReady(NotReady::NotObserved)
    );
    let mut fresh = rolling(1, 1, 0, 0, 0);
    fresh.status = None;
    assert_eq!(
        daemonset_readiness(Some(&fresh), &[], &[]),
        Readiness::NotReady(NotReady::NotObserved)
    );
    let mut d = rolling(2, 2, 3, 3, 3);
    d.status.as_mut().unwrap().number_unavailable = Some(2);
    let got = daemonset_readiness(Some(&d), &[], &[]);
    assert_eq!(got, Readiness::NotReady(NotReady::Unavailable(2)));
}

const DS_UID: &str = "11111111-2222";

fn driver_ds() -> DaemonSet {
    ds(json!({
        "metadata": {"name": "nvidia-driver-daemonset", "namespace": "gpu-operator", "uid": DS_UID, "generation": 1},
        "spec": {"selector": {"matchLabels": {"app": "nvidia-driver-daemonset"}},
                 "template": {"metadata": {"labels": {"app": "nvidia-driver-daemonset", "helm.sh/chart": "gpu-operator-v26.7.0"}}},
                 "updateStrategy": {"type": "OnDelete"}},
        "status": {"currentNumberScheduled": 2, "desiredNumberScheduled": 2, "numberMisscheduled": 0,
                   "numberReady": 2, "numberAvailable": 2, "observedGeneration": 1}
    }))
}

/// A Running pod selected by `app=nvidia-driver-daemonset` (no chart label) on revision `hash`.
fn driver_pod(name: &str, hash: &str, ready: bool) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "gpu-operator",
                     "labels": {"app": "nvidia-driver-daemonset", "controller-revision-hash": hash},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                          "name": "nvidia-driver-daemonset", "uid": DS_UID}]},
        "status": {"phase": "Running",
                   "containerStatuses": [{"name": "nvidia-driver-ctr", "ready": ready, "restartCount": 0,
                                          "image": "i", "imageID": ""}]}
    }))
    .unwrap()
}

fn revision(hash: &str, rev: i64) -> ControllerRevision {
    serde_json::from_value(json!({
        "metadata": {"name": format!("nvidia-driver-daemonset-{hash}"), "namespace": "gpu-operator",
                     "labels": {"app": "nvidia-driver-daemonset"}},
        "revision": rev
    }))
    .unwrap()
}

#[test]
fn n2_on_delete_with_a_stale_pod_is_not_ready() {
    let pods = [
        driver_pod("driver-a", "old", true),
        driver_pod("driver-b", "new", true),
    ];
    let revs = [revision("old", 1), revision("new", 2)];
    let got = daemonset_readiness(Some(&driver_ds()), &pods, &revs);
    assert_eq!(
        got,
        Readiness::NotReady(NotReady::StaleRevision {
            pod: "driver-a".into(),
            want: "new".into()
        })
    );
}

#[test]
fn on_delete_all_current_running_ready_is_ready() {
    let pods = [
        driver_pod("driver-a", "new", true),
        driver_pod("driver-b", "new", true),
    ];
    let revs = [revision("new", 2), revision("old", 1)];
    assert_eq!(
        daemonset_readiness(Some(&driver_ds()), &pods, &revs),
        Readiness::Ready
    );
}

#[test]
fn on_delete_edges() {
    let d = driver_ds();
    let revs = [revision("new", 2)];
    assert_eq!(
        daemonset_readiness(Some(&d), &[], &revs),
        Readiness::NotReady(NotReady::NoPods)
    );
    // A pod whose first owner is someone else does not count.
    let mut foreign = driver_pod("other", "new", true);
    foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "zzz".into();
    assert_eq!(
        daemonset_readiness(Some(&d), &[foreign], &revs),
        Readiness::NotReady(NotReady::NoPods)
    );
    let pods = [driver_pod("driver-a", "new", false)];
    assert_eq!(
        daemonset_readiness(Some(&d), &pods, &revs),
        Readiness::NotReady(NotReady::ContainerNotReady {
            pod: "driver-a".into()
        })
    );
    assert_eq!(
        daemonset_readiness(Some(&d), &pods, &[]),
        Readiness::NotReady(NotReady::NoRevision)
    );
    let mut pending = driver_pod("driver-a", "new", true);
    pending.status.as_mut().unwrap().phase = Some("Pending".into());
    assert_eq!(
        daemonset_readiness(Some(&d), &[pending], &revs),
        Readiness::NotReady(NotReady::NotRunning {
            pod: "driver-a".into(),
            phase: "Pending".into()
        })
    );
}
