//! Prometheus metrics and the `/metrics`, `/healthz`, `/readyz` endpoints (axum +
//! prometheus-client).
//!
//! `/healthz` and `/readyz` are open (the kubelet's probes carry no credentials). `/metrics` is,
//! with [`MetricsAuth::Kubernetes`] (the default), served only to a caller whose bearer token the
//! API server authenticates (TokenReview) and authorizes for `get` on the non-resource URL
//! `/metrics` (SubjectAccessReview) — the check controller-runtime's
//! `filters.WithAuthenticationAndAuthorization` makes; the chart's ClusterRole
//! `kiln-metrics-reader` grants it. Decisions are cached per token for [`AUTH_CACHE_TTL`].
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State as AxumState};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
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

    /// Mark the replica ready, i.e. serving (`/readyz` answers 200 from now on), whether or not
    /// it leads.
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

/// Who may read `/metrics` (`kiln operator --metrics-auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricsAuth {
    /// A bearer token the API server authenticates (TokenReview) and authorizes for `get` on
    /// the non-resource URL `/metrics` (SubjectAccessReview). Needs `create` on
    /// `tokenreviews` and `subjectaccessreviews`.
    #[default]
    Kubernetes,
    /// No check: anyone who reaches the listen address (for a loopback address).
    None,
}

impl std::str::FromStr for MetricsAuth {
    type Err = String;

    /// `kubernetes` or `none`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kubernetes" => Ok(MetricsAuth::Kubernetes),
            "none" => Ok(MetricsAuth::None),
            _ => Err(format!("expected `kubernetes` or `none`, got {s:?}")),
        }
    }
}

/// How long a decision about one token (allowed, forbidden, unauthenticated) is reused, so a
/// scraper every 15 s costs two API requests a minute, not eight.
pub const AUTH_CACHE_TTL: Duration = Duration::from_secs(60);
/// Most tokens remembered at once (the oldest decisions are dropped beyond it).
const AUTH_CACHE_MAX: usize = 256;

/// The token of an `Authorization: Bearer <token>` header value (scheme case-insensitive, as
/// RFC 6750 §2.1 and the API server's own authenticator read it); `None` for anything else.
pub fn bearer_token(authorization: Option<&str>) -> Option<&str> {
    let (scheme, token) = authorization?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The SubjectAccessReview asking whether `user` may `get` the non-resource URL `/metrics`.
pub fn metrics_access_review(user: &UserInfo) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups.clone(),
            uid: user.uid.clone(),
            extra: user.extra.clone(),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some("/metrics".into()),
                verb: Some("get".into()),
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

/// Checks callers of `/metrics` against the API server ([`MetricsAuth::Kubernetes`]).
#[derive(Clone)]
pub struct MetricsAuthorizer {
    client: kube::Client,
    cache: Arc<Mutex<HashMap<String, (Instant, StatusCode)>>>,
}

impl MetricsAuthorizer {
    /// An authorizer asking the API server behind `client`.
    pub fn new(client: kube::Client) -> Self {
        MetricsAuthorizer {
            client,
            cache: Arc::default(),
        }
    }

    /// The answer for a request with this `Authorization` header: 200 (allowed), 401 (no
    /// bearer token, or one the API server does not authenticate), 403 (authenticated but not
    /// allowed `get` on `/metrics`) or 500 (a review request failed; not cached).
    pub async fn check(&self, authorization: Option<&str>) -> StatusCode {
        let Some(token) = bearer_token(authorization) else {
            return StatusCode::UNAUTHORIZED;
        };
        let now = Instant::now();
        if let Some((at, code)) = self.cache.lock().expect("auth cache lock").get(token)
            && now.duration_since(*at) < AUTH_CACHE_TTL
        {
            return *code;
        }
        let code = match self.review(token).await {
            Ok(code) => code,
            Err(e) => {
                tracing::warn!(error = %e, "cannot review a /metrics caller");
                return StatusCode::INTERNAL_SERVER_ERROR;
            }
        };
        let mut cache = self.cache.lock().expect("auth cache lock");
        if cache.len() >= AUTH_CACHE_MAX {
            cache.retain(|_, (at, _)| now.duration_since(*at) < AUTH_CACHE_TTL);
            if cache.len() >= AUTH_CACHE_MAX {
                cache.clear();
            }
        }
        cache.insert(token.to_string(), (now, code));
        code
    }

    async fn review(&self, token: &str) -> kube::Result<StatusCode> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?
            .status
            .unwrap_or_default();
        let user = match reviewed.user {
            Some(user) if reviewed.authenticated == Some(true) => user,
            _ => return Ok(StatusCode::UNAUTHORIZED),
        };
        let allowed = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &metrics_access_review(&user))
            .await?
            .status
            .is_some_and(|s| s.allowed);
        if !allowed {
            tracing::debug!(user = ?user.username, "denied /metrics");
        }
        Ok(if allowed {
            StatusCode::OK
        } else {
            StatusCode::FORBIDDEN
        })
    }
}

async fn require_metrics_access(
    AxumState(auth): AxumState<MetricsAuthorizer>,
    request: Request,
    next: Next,
) -> Response {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match auth.check(header).await {
        StatusCode::OK => next.run(request).await,
        StatusCode::UNAUTHORIZED => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))],
            "Unauthorized",
        )
            .into_response(),
        code => (code, code.canonical_reason().unwrap_or_default()).into_response(),
    }
}

/// The router serving `/metrics`, `/healthz` (always 200) and `/readyz` (200 once the
/// replica serves — leader or standby alike, so `helm install --wait` of 2 replicas finishes —
/// else 503; who leads is the `kiln_leader` gauge). With `auth`, `/metrics` answers only callers it allows
/// ([`MetricsAuthorizer::check`]: else 401, 403 or 500); the health endpoints stay open.
pub fn router(metrics: Arc<Metrics>, auth: Option<MetricsAuthorizer>) -> Router {
    let mut scrape = Router::new().route(
        "/metrics",
        get(|AxumState(m): AxumState<Arc<Metrics>>| async move { m.encode() }),
    );
    if let Some(auth) = auth {
        scrape = scrape.layer(from_fn_with_state(auth, require_metrics_access));
    }
    Router::new()
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
        .merge(scrape)
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
        let r = router(m.clone(), None);
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

    /// A kube client over a fake API server: the token `good` is user `scraper` (allowed
    /// `get /metrics`), `other` is user `nobody` (not allowed), anything else unauthenticated.
    /// Counts the review requests it answers.
    fn fake_api() -> (kube::Client, Arc<std::sync::atomic::AtomicUsize>) {
        use http_body_util::Full;
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = calls.clone();
        let service = tower::service_fn(move |req: axum::http::Request<kube::client::Body>| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                let path = req.uri().path().to_string();
                let body: serde_json::Value =
                    serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap())
                        .unwrap();
                let answer = if path == "/apis/authentication.k8s.io/v1/tokenreviews" {
                    let user = match body["spec"]["token"].as_str() {
                        Some("good") => Some("scraper"),
                        Some("other") => Some("nobody"),
                        _ => None,
                    };
                    let mut review = body.clone();
                    review["status"] = match user {
                        Some(u) => serde_json::json!({"authenticated": true,
                            "user": {"username": u, "groups": ["system:authenticated"]}}),
                        None => serde_json::json!({"authenticated": false}),
                    };
                    review
                } else {
                    assert_eq!(path, "/apis/authorization.k8s.io/v1/subjectaccessreviews");
                    assert_eq!(
                        body["spec"]["nonResourceAttributes"],
                        serde_json::json!({"path": "/metrics", "verb": "get"})
                    );
                    let mut review = body.clone();
                    review["status"] =
                        serde_json::json!({"allowed": body["spec"]["user"] == "scraper"});
                    review
                };
                Ok::<_, std::convert::Infallible>(
                    axum::http::Response::builder()
                        .header("content-type", "application/json")
                        .body(Full::new(axum::body::Bytes::from(answer.to_string())))
                        .unwrap(),
                )
            }
        });
        (kube::Client::new(service, "default"), calls)
    }

    async fn get_with(router: Router, path: &str, auth: Option<&str>) -> StatusCode {
        let mut req = Request::get(path);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        router
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap()
            .status()
    }

    #[tokio::test]
    async fn metrics_need_an_authorized_token_health_does_not() {
        let (client, calls) = fake_api();
        let m = Arc::new(Metrics::new());
        m.set_ready();
        let r = router(m, Some(MetricsAuthorizer::new(client)));
        assert_eq!(get_with(r.clone(), "/healthz", None).await, StatusCode::OK);
        assert_eq!(get_with(r.clone(), "/readyz", None).await, StatusCode::OK);
        assert_eq!(calls.load(Ordering::SeqCst), 0, "health asks nobody");
        assert_eq!(
            get_with(r.clone(), "/metrics", None).await,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            get_with(r.clone(), "/metrics", Some("Basic Zm9vOmJhcg==")).await,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0, "no token, no review");
        assert_eq!(
            get_with(r.clone(), "/metrics", Some("Bearer forged")).await,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            get_with(r.clone(), "/metrics", Some("Bearer other")).await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            get_with(r.clone(), "/metrics", Some("bearer good")).await,
            StatusCode::OK
        );
        // forged: 1 review; other and good: TokenReview + SubjectAccessReview each.
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        assert_eq!(
            get_with(r.clone(), "/metrics", Some("Bearer good")).await,
            StatusCode::OK
        );
        assert_eq!(
            get_with(r, "/metrics", Some("Bearer other")).await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(calls.load(Ordering::SeqCst), 5, "decisions are cached");
    }

    #[test]
    fn bearer_tokens_and_the_review_asked() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bEaReR  abc ")), Some("abc"));
        assert_eq!(bearer_token(Some("Bearer ")), None);
        assert_eq!(bearer_token(Some("Basic abc")), None);
        assert_eq!(bearer_token(None), None);
        assert_eq!("none".parse(), Ok(MetricsAuth::None));
        assert_eq!("kubernetes".parse(), Ok(MetricsAuth::Kubernetes));
        assert!("open".parse::<MetricsAuth>().is_err());
        let user = UserInfo {
            username: Some("system:serviceaccount:monitoring:prometheus".into()),
            groups: Some(vec!["system:serviceaccounts".into()]),
            uid: Some("u-1".into()),
            extra: None,
        };
        assert_eq!(
            serde_json::to_value(metrics_access_review(&user).spec).unwrap(),
            serde_json::json!({
                "user": "system:serviceaccount:monitoring:prometheus",
                "groups": ["system:serviceaccounts"], "uid": "u-1",
                "nonResourceAttributes": {"path": "/metrics", "verb": "get"}})
        );
    }
}
