//! DaemonSet readiness: the N1 and N2 cases plus the §2.5 edges.

use super::*;
use serde_json::json;

const NO_PODS: &[Pod] = &[];
const NO_REVS: &[ControllerRevision] = &[];

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
        daemonset_readiness(Some(&rolling(2, 2, 3, 3, 3)), NO_PODS, NO_REVS),
        Readiness::Ready
    );
    for (o, u, a) in [(1, 3, 3), (2, 2, 3), (2, 3, 2)] {
        let got = daemonset_readiness(Some(&rolling(2, o, 3, u, a)), NO_PODS, NO_REVS);
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
    let got = daemonset_readiness(None, NO_PODS, NO_REVS);
    assert_eq!(got, Readiness::NotReady(NotReady::Missing));
    if let Readiness::NotReady(r) = got {
        assert_eq!(r.to_string(), "DaemonSet not found");
    }
}

#[test]
fn desired_zero_is_ready_and_unavailable_is_not() {
    assert_eq!(
        daemonset_readiness(Some(&rolling(5, 5, 0, 0, 0)), NO_PODS, NO_REVS),
        Readiness::Ready
    );
    // A fresh DaemonSet the controller has not observed yet is not ready, even at desired 0.
    assert_eq!(
        daemonset_readiness(Some(&rolling(2, 1, 0, 0, 0)), NO_PODS, NO_REVS),
        Readiness::NotReady(NotReady::NotObserved)
    );
    let mut fresh = rolling(1, 1, 0, 0, 0);
    fresh.status = None;
    assert_eq!(
        daemonset_readiness(Some(&fresh), NO_PODS, NO_REVS),
        Readiness::NotReady(NotReady::NotObserved)
    );
    let mut d = rolling(2, 2, 3, 3, 3);
    d.status.as_mut().unwrap().number_unavailable = Some(2);
    let got = daemonset_readiness(Some(&d), NO_PODS, NO_REVS);
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
        daemonset_readiness(Some(&d), NO_PODS, &revs),
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
        daemonset_readiness(Some(&d), &pods, NO_REVS),
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

/// A revision of `nvidia-driver-daemonset` as the upgrade's watch holds it: owned by `owner`,
/// no namespace or selector labels, the hash label only when given.
fn owned_revision(hash: &str, rev: i64, owner: &str, label: Option<&str>) -> ControllerRevision {
    let mut labels = json!({});
    if let Some(h) = label {
        labels[REVISION_HASH_LABEL] = json!(h);
    }
    serde_json::from_value(json!({
        "metadata": {"name": format!("nvidia-driver-daemonset-{hash}"), "labels": labels,
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                          "name": "nvidia-driver-daemonset", "uid": owner}]},
        "revision": rev
    }))
    .unwrap()
}

#[test]
fn the_current_revision_is_the_newest_the_daemonset_owns() {
    let d = driver_ds();
    let revisions = [
        owned_revision("aaa", 1, DS_UID, Some("aaa")),
        owned_revision("bbb", 2, DS_UID, Some("bbb")),
        // Newer, but another DaemonSet's (a replaced one of the same name).
        owned_revision("zzz", 3, "other", Some("zzz")),
    ];
    assert_eq!(current_revision(&d, &revisions).as_deref(), Some("bbb"));
    // No hash label: the name's suffix.
    let unlabelled = [owned_revision("ccc", 4, DS_UID, None)];
    assert_eq!(current_revision(&d, &unlabelled).as_deref(), Some("ccc"));
    // The label wins over the name (a truncated name).
    let truncated = [owned_revision("cut", 1, DS_UID, Some("full"))];
    assert_eq!(current_revision(&d, &truncated).as_deref(), Some("full"));
    // Arcs, as a watch store hands them out.
    let arcs: Vec<std::sync::Arc<ControllerRevision>> =
        revisions.iter().cloned().map(std::sync::Arc::new).collect();
    assert_eq!(current_revision(&d, &arcs).as_deref(), Some("bbb"));
    assert_eq!(current_revision::<ControllerRevision>(&d, &[]), None);
    // Only another DaemonSet's revisions: none.
    let foreign = [owned_revision("zzz", 3, "other", Some("zzz"))];
    assert_eq!(current_revision(&d, &foreign), None);
}

#[test]
fn an_unowned_revision_counts_by_upstreams_test() {
    let d = driver_ds();
    // Namespace, selector and name prefix all match: the highest `.revision` wins, in any order.
    let revs = [revision("new", 2), revision("old", 1)];
    assert_eq!(current_revision(&d, &revs).as_deref(), Some("new"));
    let mut elsewhere = revision("ns", 3);
    elsewhere.metadata.namespace = Some("default".into());
    let mut unselected = revision("sel", 4);
    unselected.metadata.labels = Some([("app".to_string(), "other".to_string())].into());
    let mut unprefixed = revision("x", 5);
    unprefixed.metadata.name = Some("nvidia-device-plugin-daemonset-x".into());
    let revs = [revision("new", 2), elsewhere, unselected, unprefixed];
    assert_eq!(current_revision(&d, &revs).as_deref(), Some("new"));
    // Owned and unowned revisions together: the highest of both.
    let mixed = [revision("old", 1), owned_revision("bbb", 2, DS_UID, None)];
    assert_eq!(current_revision(&d, &mixed).as_deref(), Some("bbb"));
}

#[test]
fn on_delete_ignores_a_newer_revision_of_a_replaced_daemonset() {
    let pods = [driver_pod("driver-a", "new", true)];
    let revs = [
        owned_revision("new", 2, DS_UID, Some("new")),
        owned_revision("gone", 7, "replaced", Some("gone")),
    ];
    assert_eq!(
        daemonset_readiness(Some(&driver_ds()), &pods, &revs),
        Readiness::Ready
    );
}
