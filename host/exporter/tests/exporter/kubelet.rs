//! The kubelet misbehaving: socket missing, kubelet restarting, and scrape storms.

use std::time::{Duration, Instant};

use crate::{Harness, parse, standin::StandIn};

fn counter(body: &str, name: &str) -> f64 {
    let scrape = parse(body);
    match scrape
        .samples
        .iter()
        .find(|s| s.metric == name)
        .map(|s| &s.value)
    {
        Some(prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v)) => *v,
        other => panic!("{name}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_socket_still_serves_without_pod_labels_and_counts_errors() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start(
        &dir.path().join("absent.sock"),
        Duration::from_millis(10),
        false,
    );
    let body = h
        .wait_for("errors", |b| {
            counter(b, "kiln_exporter_pod_resources_errors_total") >= 3.0
        })
        .await;
    assert!(body.contains("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\""));
    assert!(!body.contains("pod=\""), "no pod labels without a kubelet");
    assert!(!body.contains("kiln_gpu_pod_info"));
    let (status, ct, om) = h
        .scrape_with(Some("application/openmetrics-text; version=1.0.0"))
        .await;
    assert_eq!(
        (status, ct.as_str()),
        (
            200,
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        )
    );
    assert!(om.ends_with("# EOF\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_drops_then_restores_pod_labels_on_the_kept_channel() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = StandIn::start(&dir.path().join("kubelet.sock")).await;
    let h = Harness::start(&kubelet.path, Duration::from_millis(20), false);
    h.wait_for("pod labels", |b| b.contains("pod=\"trainer-a\""))
        .await;
    kubelet.stop().await;
    let errors_at_stop = counter(
        &h.scrape().await,
        "kiln_exporter_pod_resources_errors_total",
    );
    let body = h
        .wait_for("labels dropped", |b| !b.contains("pod=\""))
        .await;
    assert!(counter(&body, "kiln_exporter_pod_resources_errors_total") > errors_at_stop);
    assert!(
        body.contains("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\""),
        "metrics still served"
    );
    kubelet.restart().await;
    h.wait_for("pod labels back", |b| b.contains("pod=\"trainer-a\""))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_scrapes_per_second_cause_at_most_one_list_per_interval() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = StandIn::start(&dir.path().join("kubelet.sock")).await;
    let interval = Duration::from_millis(250);
    let h = Harness::start(&kubelet.path, interval, false);
    h.wait_for("pod labels", |b| b.contains("pod=\"")).await;
    let (start, calls_before) = (Instant::now(), kubelet.calls());
    for _ in 0..100 {
        let _ = h.scrape().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = start.elapsed();
    let calls = kubelet.calls() - calls_before;
    let allowed = (elapsed.as_millis() / interval.as_millis()) as u64 + 1;
    assert!(
        calls <= allowed,
        "{calls} List calls in {elapsed:?} (allowed {allowed})"
    );
    assert!(calls >= 1, "the refresher kept listing");
}
