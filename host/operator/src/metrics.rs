//! Prometheus metrics and the `/metrics`, `/healthz`, `/readyz` endpoints (axum +
//! prometheus-client).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `kiln_reconciles_total` | counter | – |
//! | `kiln_reconcile_duration_seconds` | histogram | – |
//! | `kiln_reconcile_errors_total` | counter | `state` (or `reconcile` for whole-pass failures); each starts at 0 |
//! | `kiln_state_duration_seconds` | histogram | `state` |
//! | `kiln_plugin_call_duration_seconds` | histogram | `state` (time of the state's plugin chain) |
//! | `kiln_writes_total` | counter | `kind` (`apply`, `delete`, `label`, `status`) |
//! | `kiln_leader` | gauge | – (1 while this replica leads; always 1 without leader election) |

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State as AxumState;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;
type HistFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn seconds_histogram() -> Histogram {
    // 1 ms … ~33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

fn label(key: &str, value: &str) -> Labels {
    vec![(key.to_string(), value.to_string())]
}

/// The operator's metrics plus the readiness flag behind `/readyz`.
pub struct Metrics {
    registry: Registry,
    reconciles: Counter,
    reconcile_duration: Histogram,
    errors: Family<Labels, Counter>,
    state_duration: HistFamily,
    plugin_duration: HistFamily,
    writes: Family<Labels, Counter>,
    leader: Gauge,
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every kiln metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kiln");
        let reconciles = Counter::default();
        let reconcile_duration = seconds_histogram();
        let errors = Family::<Labels, Counter>::default();
        let state_duration: HistFamily = Family::new_with_constructor(seconds_histogram);
        let plugin_duration: HistFamily = Family::new_with_constructor(seconds_histogram);
        let writes = Family::<Labels, Counter>::default();
        let leader = Gauge::default();
        registry.register("reconciles", "ClusterPolicy reconciles", reconciles.clone());
        registry.register(
            "reconcile_duration_seconds",
            "Duration of one reconcile",
            reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconcile errors by state",
            errors.clone(),
        );
        registry.register(
            "state_duration_seconds",
            "Duration of one state's render, apply and readiness check",
            state_duration.clone(),
        );
        registry.register(
            "plugin_call_duration_seconds",
            "Duration of one state's plugin chain",
            plugin_duration.clone(),
        );
        registry.register("writes", "API writes by kind", writes.clone());
        registry.register(
            "leader",
            "1 while this replica is the leader",
            leader.clone(),
        );
        // Every error series exists from the start at 0, so `rate()` and alerts see them
        // before the first error.
        for state in kiln_core::State::ALL
            .iter()
            .map(|s| s.name())
            .chain(["reconcile"])
        {
            let _ = errors.get_or_create(&label("state", state));
        }
        Metrics {
            registry,
            reconciles,
            reconcile_duration,
            errors,
            state_duration,
            plugin_duration,
            writes,
            leader,
            ready: AtomicBool::new(false),
        }
    }

    /// Count one reconcile that took `took`.
    pub fn reconciled(&self, took: Duration) {
        self.reconciles.inc();
        self.reconcile_duration.observe(took.as_secs_f64());
    }

    /// Count an error of `state` (`reconcile` for a whole-pass failure).
    pub fn error(&self, state: &str) {
        self.errors.get_or_create(&label("state", state)).inc();
    }

    /// Record one state's total time and its plugin chain time.
    pub fn state_timing(&self, state: &str, total: Duration, plugins: Duration) {
        let l = label("state", state);
        self.state_duration
            .get_or_create(&l)
            .observe(total.as_secs_f64());
        self.plugin_duration
            .get_or_create(&l)
            .observe(plugins.as_secs_f64());
    }

    /// Count `n` writes of `kind` (`apply`, `delete`, `label`, `status`).
    pub fn writes(&self, kind: &str, n: u64) {
        if n > 0 {
            self.writes.get_or_create(&label("kind", kind)).inc_by(n);
        }
    }

    /// Set the leader gauge.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Mark the operator ready (`/readyz` answers 200 from now on).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// The router serving `/metrics`, `/healthz` (always 200) and `/readyz` (200 once the
/// controller runs, else 503).
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|AxumState(m): AxumState<Arc<Metrics>>| async move { m.encode() }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|AxumState(m): AxumState<Arc<Metrics>>| async move {
                if m.ready.load(Ordering::SeqCst) {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting")
                }
            }),
        )
        .with_state(metrics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get(router: Router, path: &str) -> (StatusCode, String) {
        let resp = router
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn endpoints_serve_metrics_and_health() {
        let m = Arc::new(Metrics::new());
        m.reconciled(Duration::from_millis(20));
        m.error("dcgm-exporter");
        m.writes("apply", 3);
        m.state_timing("driver", Duration::from_millis(5), Duration::from_millis(2));
        let r = router(m.clone());
        assert_eq!(
            get(r.clone(), "/healthz").await,
            (StatusCode::OK, "ok".into())
        );
        assert_eq!(
            get(r.clone(), "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        m.set_ready();
        assert_eq!(get(r.clone(), "/readyz").await.0, StatusCode::OK);
        let (code, text) = get(r, "/metrics").await;
        assert_eq!(code, StatusCode::OK);
        assert!(text.contains("kiln_reconciles_total 1"), "{text}");
        assert!(
            text.contains("kiln_reconcile_errors_total{state=\"dcgm-exporter\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kiln_reconcile_errors_total{state=\"driver\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("kiln_reconcile_errors_total{state=\"reconcile\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("kiln_writes_total{kind=\"apply\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("kiln_plugin_call_duration_seconds_count{state=\"driver\"} 1"),
            "{text}"
        );
    }
}
