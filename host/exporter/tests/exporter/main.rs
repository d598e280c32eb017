//! Integration tests of kiln-exporter: one binary (see the house rules), modules by topic.
//!
//! Every test wires the real pieces — fake GPUs from `tests/data/gpus.yaml`, the poller, the
//! pod-resources refresher on a kept channel, and the axum router called in-process — against a
//! pod-resources stand-in on a Unix socket in a tempdir.

mod attribution;
mod dcgm_csv;
mod exposition;
mod kubelet;
mod mig;
mod mig_virtual_gpus;
mod server;
mod standin;
mod virtual_gpus;

use std::{path::Path, sync::Arc, time::Duration};

use axum::{body::Body, http::Request};
use http_body_util::BodyExt;
use kiln_exporter::{
    catalogue::Catalogue,
    podresources::{PodResourcesClient, refresh_forever},
    poller::Poller,
    render::RenderOptions,
    server::router,
    state::Shared,
};
use kiln_gpu::FakeBackend;
use tower::ServiceExt;

/// The fake GPUs' fixture file.
pub fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpus.yaml")
}

/// The exporter wired as `run` wires it, minus the TCP listener.
pub struct Harness {
    /// The state scrapes read.
    pub shared: Arc<Shared>,
    _poller: Poller,
    refresher: tokio::task::JoinHandle<()>,
}

impl Harness {
    /// Starts poller and refresher (List every `pod_interval`) against `socket`.
    pub fn start(socket: &Path, pod_interval: Duration, per_pod: bool) -> Self {
        let inv = Arc::new(FakeBackend::from_file(&fixture()).unwrap());
        let opts = RenderOptions {
            hostname: Some("node-a".into()),
            per_pod,
            ..Default::default()
        };
        let shared = Arc::new(Shared::new(Catalogue::default_list(), opts, Vec::new()));
        let poller = Poller::start(inv, shared.clone(), Duration::from_millis(50), None).unwrap();
        let client = PodResourcesClient::new(socket, Duration::from_secs(2)).unwrap();
        let refresher = tokio::spawn(refresh_forever(
            client,
            shared.clone(),
            pod_interval,
            Vec::new(),
        ));
        Self {
            shared,
            _poller: poller,
            refresher,
        }
    }

    /// GET /metrics with an optional Accept header; returns (status, content type, body).
    pub async fn scrape_with(&self, accept: Option<&str>) -> (u16, String, String) {
        let mut req = Request::get("/metrics");
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        let resp = router(self.shared.clone())
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let ct = resp
            .headers()
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, ct, String::from_utf8(body.to_vec()).unwrap())
    }

    /// GET /metrics in the text format; asserts 200.
    pub async fn scrape(&self) -> String {
        let (status, _, body) = self.scrape_with(None).await;
        assert_eq!(status, 200);
        body
    }

    /// Scrapes until `pred` holds on the body, or fails after 10 s.
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        for _ in 0..1000 {
            let body = self.scrape().await;
            if pred(&body) {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting for {what}");
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.refresher.abort();
    }
}

/// Parses a text-format body with the `prometheus-parse` crate and checks it kept every sample
/// line (that parser skips lines it cannot read instead of failing).
pub fn parse(body: &str) -> prometheus_parse::Scrape {
    let scrape =
        prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("parses");
    let sample_lines = body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    assert_eq!(
        scrape.samples.len(),
        sample_lines,
        "every sample line parsed"
    );
    scrape
}

/// `(namespace, pod, container)` of every sample of `metric` on GPU `gpu`.
pub fn pod_labels(
    scrape: &prometheus_parse::Scrape,
    metric: &str,
    gpu: &str,
) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && s.labels.get("gpu") == Some(gpu))
        .map(|s| {
            let l = |k| s.labels.get(k).unwrap_or("").to_owned();
            (l("namespace"), l("pod"), l("container"))
        })
        .collect();
    v.sort();
    v
}
