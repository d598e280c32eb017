//! Stable attribution: three pods share GPU 0 and the stand-in lists them in a new order on
//! every call; the labels on GPU 0's series must never change.

use std::time::Duration;

use crate::{Harness, parse, pod_labels, standin::StandIn};

fn owner_of_gpu0() -> Vec<(String, String, String)> {
    // The rule: lowest (namespace, pod, container) among ml/trainer-a, ml/trainer-b, research/notebook.
    vec![("ml".into(), "trainer-a".into(), "main".into())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_scrapes_give_one_identical_pod_label_set_per_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = StandIn::start(&dir.path().join("kubelet.sock")).await;
    let h = Harness::start(&kubelet.path, Duration::from_millis(5), false);
    h.wait_for("pod labels", |b| b.contains("pod=\"")).await;
    let lists_before = kubelet.calls();
    for i in 0..100 {
        let scrape = parse(&h.scrape().await);
        for metric in [
            "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_FB_USED",
        ] {
            assert_eq!(
                pod_labels(&scrape, metric, "0"),
                owner_of_gpu0(),
                "scrape {i}, {metric}"
            );
            assert_eq!(
                pod_labels(&scrape, metric, "1"),
                [("batch".into(), "render".into(), "worker".into())],
                "scrape {i}, {metric}"
            );
        }
        let info = pod_labels(&scrape, "kiln_gpu_pod_info", "0");
        let pods: Vec<&str> = info.iter().map(|(_, p, _)| p.as_str()).collect();
        assert_eq!(pods, ["trainer-a", "trainer-b", "notebook"], "scrape {i}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The kubelet really was asked many times, in many orders, during those scrapes.
    assert!(
        kubelet.calls() - lists_before >= 10,
        "only {} List calls",
        kubelet.calls() - lists_before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtual_gpu_mode_emits_one_series_per_pod() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = StandIn::start(&dir.path().join("kubelet.sock")).await;
    let h = Harness::start(&kubelet.path, Duration::from_millis(20), true);
    let body = h.wait_for("pod labels", |b| b.contains("pod=\"")).await;
    let scrape = parse(&body);
    let per_pod = pod_labels(&scrape, "DCGM_FI_DEV_GPU_TEMP", "0");
    assert_eq!(
        per_pod,
        [
            ("ml".into(), "trainer-a".into(), "main".into()),
            ("ml".into(), "trainer-b".into(), "main".into()),
            ("research".into(), "notebook".into(), "jupyter".into()),
        ]
    );
    let temps: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "DCGM_FI_DEV_GPU_TEMP")
        .collect();
    assert_eq!(temps.len(), 4);
}
