//! The stuck-node signal on a real API server: the operator's node watch (`watch_nodes`) feeds
//! the readiness timeline's task (`timeline::run_with`, with a clock the test moves); a node
//! whose `nvidia.com/mig.config.state=pending` label is held past the limit gets
//! `kiln_node_stuck{reason="mig-change-pending"}` and a Warning `GPUNodeStuck` Event, and loses
//! the series when the label moves on.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use kiln_core::labels::LabelPolicy;
use kiln_core::node_stuck::{EVENT_REASON, MIG_CONFIG_STATE_LABEL, StuckLimits};
use kiln_operator::events::Events;
use kiln_operator::live::Wake;
use kiln_operator::metrics::Metrics;
use kiln_operator::nodes::{NodeWatch, watch_nodes};
use kiln_operator::signals::stuck::StuckConfig;
use kiln_operator::store::NamedWriter;
use kiln_testcluster::Options;
use kube::api::{Api, ListParams};
use kube::runtime::events::Reporter;

static NOW: AtomicI64 = AtomicI64::new(1_800_000_000);

fn series(metrics: &Metrics) -> Vec<String> {
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(kiln_core::node_stuck::GAUGE))
        .map(str::to_string)
        .collect()
}

async fn until(what: &str, mut ok: impl FnMut() -> bool) -> anyhow::Result<()> {
    let started = Instant::now();
    while !ok() {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_mig_change_label_raises_the_gauge_and_an_event() -> anyhow::Result<()> {
    let turn = crate::support::cluster::start(Options::default()).await?;
    let cluster = turn.cluster();
    let client = cluster.client().await?;
    let node = "gpu-stuck-1";
    cluster.add_node(node, 1)?;
    cluster.label_node(node, &[(MIG_CONFIG_STATE_LABEL, Some("pending"))])?;

    let metrics = Arc::new(Metrics::new());
    let recorder = Events::new(
        client.clone(),
        Reporter {
            controller: "kiln".into(),
            instance: None,
        },
    );
    let (timeline_tx, timeline_rx) = futures::channel::mpsc::channel(64);
    let (_pods_tx, pods_rx) = futures::channel::mpsc::unbounded();
    let limit = 600;
    tokio::spawn(kiln_operator::timeline::run_with(
        metrics.clone(),
        recorder,
        timeline_rx,
        pods_rx,
        StuckConfig {
            limits: StuckLimits {
                mig_change: limit,
                ..StuckLimits::default()
            },
            tick: Duration::from_millis(20),
            clock: || NOW.load(Ordering::SeqCst),
        },
    ));
    let (wake, _wakes) = Wake::channel();
    tokio::spawn(watch_nodes(
        NodeWatch {
            client: client.clone(),
            wake,
            labels: Arc::new(Mutex::new(None::<LabelPolicy>)),
            metrics: metrics.clone(),
            timeline: Some(timeline_tx),
            pools: None,
        },
        NamedWriter::default(),
    ));
    // The watch has listed the node (nothing stuck yet), then the label is held past the limit.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(series(&metrics).is_empty());
    NOW.fetch_add(limit + 1, Ordering::SeqCst);
    let want = format!("kiln_node_stuck{{node=\"{node}\",reason=\"mig-change-pending\"}} 1");
    until("the gauge", || series(&metrics) == [want.clone()]).await?;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let started = Instant::now();
    loop {
        let found = events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .any(|e| {
                e.reason.as_deref() == Some(EVENT_REASON)
                    && e.type_.as_deref() == Some("Warning")
                    && e.regarding.and_then(|r| r.name).as_deref() == Some(node)
            });
        if found {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "no GPUNodeStuck Event"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The MIG manager finishes: the series goes.
    cluster.label_node(node, &[(MIG_CONFIG_STATE_LABEL, Some("success"))])?;
    until("the series to go", || series(&metrics).is_empty()).await?;
    Ok(())
}
