//! The stuck-node signal (`kiln_operator::signals::stuck`) fed as the operator feeds it: node
//! watch events through `follow_nodes` (which keeps `nvidia.com/mig.config.state` and hands the
//! timeline each node whose marks changed) and validator pod events, into the readiness
//! timeline's task with a clock the test moves. A MIG change held at `pending` and a validator
//! left in Init past their limits raise `kiln_node_stuck{node,reason}` and one Warning Event
//! each; the MIG change moving on clears its series. No request is made but the Events.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::Method;
use k8s_openapi::api::core::v1::Node;
use kiln_core::labels::LabelPolicy;
use kiln_core::node_stuck::{EVENT_REASON, MIG_CONFIG_STATE_LABEL, StuckLimits};
use kiln_operator::events::Events;
use kiln_operator::live::Wake;
use kiln_operator::metrics::Metrics;
use kiln_operator::nodes::{NodeWatch, follow_nodes};
use kiln_operator::readiness::{RawPod, SlimPod};
use kiln_operator::signals::stuck::StuckConfig;
use kiln_operator::store::NamedWriter;
use kube::runtime::events::Reporter;
use kube::runtime::watcher;
use serde_json::json;

use crate::support::mock_api::{Server, calls, client};

static NOW: AtomicI64 = AtomicI64::new(1_800_000_000);

fn node(mig_state: &str) -> kiln_operator::node::SlimNode {
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "gpu-a", "uid": "uid-a",
        "labels": {"feature.node.kubernetes.io/pci-10de.present": "true",
            "nvidia.com/gpu.present": "true", MIG_CONFIG_STATE_LABEL: mig_state}}}))
    .unwrap();
    n.into()
}

fn validator(phase: &str) -> Arc<SlimPod> {
    let raw: RawPod = serde_json::from_value(json!({
        "metadata": {"name": "nvidia-operator-validator-x", "namespace": "gpu-operator"},
        "spec": {"nodeName": "gpu-a"},
        "status": {"phase": phase, "initContainerStatuses": [
            {"name": "driver-validation", "ready": false, "restartCount": 0,
             "state": {"running": {}}}]}
    }))
    .unwrap();
    Arc::new(raw.into())
}

/// `kiln_node_stuck` sample lines of `metrics`.
fn stuck_series(metrics: &Metrics) -> Vec<String> {
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(kiln_core::node_stuck::GAUGE))
        .map(str::to_string)
        .collect()
}

/// Waits (bounded) until `metrics` shows exactly `want`.
async fn until_series(metrics: &Metrics, want: &[&str]) {
    let wait = async {
        while stuck_series(metrics) != want {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .is_err()
    {
        panic!("{:?} != {want:?}", stuck_series(metrics));
    }
}

#[tokio::test]
async fn a_held_mig_change_and_a_validator_in_init_raise_the_gauge_and_one_event_each() {
    let server = Arc::new(Mutex::new(Server::default()));
    let metrics = Arc::new(Metrics::new());
    let recorder = Events::new(
        client(server.clone()),
        Reporter {
            controller: "kiln".into(),
            instance: None,
        },
    );
    let (timeline_tx, timeline_rx) = futures::channel::mpsc::channel(64);
    let (pods_tx, pods_rx) = futures::channel::mpsc::unbounded();
    let limits = StuckLimits {
        mig_change: 600,
        upgrade_state: 3600,
        validator_init: 1200,
    };
    let task = tokio::spawn(kiln_operator::timeline::run_with(
        metrics.clone(),
        recorder,
        timeline_rx,
        pods_rx,
        StuckConfig {
            limits,
            tick: Duration::from_millis(10),
            clock: || NOW.load(Ordering::SeqCst),
        },
    ));
    let (wake, _wakes) = Wake::channel();
    let w = NodeWatch {
        client: client(server.clone()),
        wake,
        labels: Arc::new(Mutex::new(None::<LabelPolicy>)),
        metrics: metrics.clone(),
        timeline: Some(timeline_tx),
        pools: None,
    };
    let (node_tx, node_rx) = futures::channel::mpsc::unbounded();
    let watch = tokio::spawn(follow_nodes(w, NamedWriter::default(), node_rx));
    let send = |ev| node_tx.unbounded_send(Ok(ev)).unwrap();
    send(watcher::Event::Init);
    send(watcher::Event::InitApply(node("pending")));
    send(watcher::Event::InitDone);
    for ev in [
        watcher::Event::Init,
        watcher::Event::InitApply(validator("Pending")),
        watcher::Event::InitDone,
    ] {
        pods_tx.unbounded_send(ev).unwrap();
    }
    // The tasks take the events in before the clock moves (one thread: they run while the
    // test sleeps).
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Within the limits: nothing.
    NOW.fetch_add(600, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(stuck_series(&metrics).is_empty());
    // Past the MIG limit, then past the validator's.
    NOW.fetch_add(1, Ordering::SeqCst);
    until_series(
        &metrics,
        &[r#"kiln_node_stuck{node="gpu-a",reason="mig-change-pending"} 1"#],
    )
    .await;
    NOW.fetch_add(600, Ordering::SeqCst);
    until_series(
        &metrics,
        &[
            r#"kiln_node_stuck{node="gpu-a",reason="mig-change-pending"} 1"#,
            r#"kiln_node_stuck{node="gpu-a",reason="validator-init"} 1"#,
        ],
    )
    .await;
    // The MIG change succeeds; the validator's init containers are done.
    send(watcher::Event::Apply(node("success")));
    until_series(
        &metrics,
        &[r#"kiln_node_stuck{node="gpu-a",reason="validator-init"} 1"#],
    )
    .await;
    pods_tx
        .unbounded_send(watcher::Event::Apply(validator("Running")))
        .unwrap();
    until_series(&metrics, &[]).await;

    drop(node_tx);
    drop(pods_tx);
    watch.await.unwrap();
    task.await.unwrap();
    let posted = calls(&server, &Method::POST);
    let notes: Vec<String> = posted
        .iter()
        .map(|c| {
            assert!(c.path.ends_with("/events"), "{}", c.path);
            let body = &c.body;
            assert_eq!(body["reason"], EVENT_REASON);
            assert_eq!(body["type"], "Warning");
            assert_eq!(body["regarding"]["name"], "gpu-a");
            assert_eq!(body["regarding"]["uid"], "uid-a");
            body["note"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        notes,
        [
            "node gpu-a: a MIG change has been pending (or operands paused-for-mig-change) for more than 10 minutes",
            "node gpu-a: the operator validator has been in its init containers for more than 20 minutes"
        ]
    );
    assert!(
        calls(&server, &Method::GET).is_empty() && calls(&server, &Method::PATCH).is_empty(),
        "no request but the Events"
    );
}
