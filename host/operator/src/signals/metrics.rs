//! Prometheus metrics and the `/metrics`, `/healthz`, `/readyz` endpoints (axum +
//! prometheus-client).
//!
//! `/healthz` and `/readyz` are open (the kubelet's probes carry no credentials). `/metrics` is,
//! with [`MetricsAuth::Kubernetes`] (the default), served only to a caller whose bearer token the
//! API server authenticates (TokenReview) and authorizes for `get` on the non-resource URL
//! `/metrics` (SubjectAccessReview) — the check controller-runtime's
//! `filters.WithAuthenticationAndAuthorization` makes; the chart's ClusterRole
//! `kiln-metrics-reader` grants it. Decisions are cached by the token's SHA-256 (never the
//! token) for [`AUTH_CACHE_TTL`], in two bounded maps ([`AUTH_CACHE_MAX`] each): tokens the API
//! server authenticated, and tokens it did not, so random tokens cannot push a scraper's
//! decision out. At most [`MAX_CONCURRENT_REVIEWS`] reviews run at once and
//! [`MAX_WAITING_REVIEWS`] more callers wait for one; others are answered 503 with
//! `Retry-After`. The server in front ([`kiln_httpd`]) answers a request head over 16 KiB with
//! 431 before this check runs.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `kiln_reconciles_total` | counter | – |
//! | `kiln_reconcile_duration_seconds` | histogram | – |
//! | `kiln_reconcile_errors_total` | counter | `state` (or `reconcile` for whole-pass failures); each starts at 0 |
//! | `kiln_state_duration_seconds` | histogram | `state` |
//! | `kiln_plugin_call_duration_seconds` | histogram | `state` (time of the state's plugin chain) |
//! | `kiln_writes_total` | counter | `kind` (`apply`, `delete`, `drift`, `label`, `status`) |
//! | `kiln_leader` | gauge | – (1 while this replica leads; always 1 without leader election) |
//! | `kiln_node_ready_seconds` | histogram | `stage` ([`Stage`]): seconds from a GPU node's `creationTimestamp` to the stage |
//! | `kiln_node_gpus_expected` | gauge | `node`: `nvidia.com/gpu.count` × `nvidia.com/gpu.replicas` (+ MIG profiles), [`crate::cluster::node::expected_gpus`] |
//! | `kiln_node_gpus_allocatable` | gauge | `node`: allocatable `nvidia.com/gpu`, `nvidia.com/gpu.shared`, `nvidia.com/mig-*` |
//!
//! NVIDIA's operator metrics (`controllers/operator_metrics.go`, v26.7), same names, types and
//! meanings, so dashboards and alerts written for NVIDIA's operator keep working:
//!
//! | metric | type | kiln's value |
//! |---|---|---|
//! | `gpu_operator_gpu_nodes_total` | gauge | nodes with `nvidia.com/gpu.present=true` after labelling |
//! | `gpu_operator_reconciliation_status` | gauge | [`ReconcileStatus`]: 1 ready, 0 operands not ready, -1 policy invalid, -2 API error |
//! | `gpu_operator_reconciliation_total` | counter | reconciles of the active policy |
//! | `gpu_operator_reconciliation_failed_total` | counter | of those, the ones not ready or failed (upstream counts "not ready" as failed) |
//! | `gpu_operator_reconciliation_last_success_ts_seconds` | gauge | Unix time of the last ready reconcile |
//! | `gpu_operator_reconciliation_has_nfd_labels` | gauge | 1 when any node carries an NFD label |
//! | `gpu_operator_driver_auto_upgrade_enabled` | gauge | 1 when the driver's upgrade policy enables auto upgrade |
//! | `gpu_operator_nodes_upgrades_{in_progress,done,failed,available,pending}` | gauge | driver-upgrade census ([`UpgradeCensus`]) |
//! | `gpu_operator_openshift_driver_toolkit_*` | gauge | kiln does not build drivers with OpenShift's Driver Toolkit: `_enabled` is -1 when requested on OpenShift ("requested but not possible"), else 0; the other four are 0 |
//!
//! `/metrics` writes OpenMetrics 1.0 (`# EOF`, counters as `<name>_total`) and says so:
//! `Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8`
//! ([`OPENMETRICS_CONTENT_TYPE`]); Prometheus offers that format in every scrape's `Accept`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
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
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, LabelSetEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use crate::cluster::node::Sym;

type Labels = Vec<(String, String)>;
type HistFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// One step of a GPU node's way to running GPU workloads (the `stage` label of
/// `kiln_node_ready_seconds`; measured by [`crate::signals::timeline`]), in the order they usually happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// `nvidia.com/gpu.present=true`.
    Labelled,
    /// Driver validation passed.
    DriverReady,
    /// Container toolkit validation passed.
    ToolkitReady,
    /// Every validation passed (validator pod Ready).
    Validated,
    /// Allocatable `nvidia.com/gpu*` above 0.
    GpuAllocatable,
}

impl Stage {
    /// Every stage, in order.
    pub const ALL: [Stage; 5] = [
        Stage::Labelled,
        Stage::DriverReady,
        Stage::ToolkitReady,
        Stage::Validated,
        Stage::GpuAllocatable,
    ];

    /// The `stage` label value.
    pub const fn name(self) -> &'static str {
        match self {
            Stage::Labelled => "labelled",
            Stage::DriverReady => "driver_ready",
            Stage::ToolkitReady => "toolkit_ready",
            Stage::Validated => "validated",
            Stage::GpuAllocatable => "gpu_allocatable",
        }
    }

    /// Its position in [`Stage::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// The label set of the per-node GPU gauges, `node="<name>"`.
struct NodeLabel<'a>(&'a str);

impl EncodeLabelSet for NodeLabel<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> std::fmt::Result {
        [("node", self.0)].encode(encoder)
    }
}

/// `kiln_node_gpus_expected` and `kiln_node_gpus_allocatable`: one series each a GPU node,
/// kept as one map of interned node name (shared with the node store and the readiness
/// timeline) to the two values, and encoded at scrape (two gauge [`Family`]s would cost a map
/// entry and an allocated gauge a series).
#[derive(Debug, Default)]
struct NodeGpus(Mutex<HashMap<Sym, (i64, i64)>>);

/// The two [`NodeGpus`] series: name, help text (with the full stop `Registry::register` adds
/// to every other metric's help) and which of a node's two values it reports.
type NodeGpuSeries = (&'static str, &'static str, fn(&(i64, i64)) -> i64);
const NODE_GPUS: [NodeGpuSeries; 2] = [
    (
        "node_gpus_expected",
        "GPUs a node should offer: nvidia.com/gpu.count times nvidia.com/gpu.replicas (plus MIG profiles).",
        |v| v.0,
    ),
    (
        "node_gpus_allocatable",
        "Allocatable nvidia.com/gpu, nvidia.com/gpu.shared and nvidia.com/mig-* of a node.",
        |v| v.1,
    ),
];

impl Collector for NodeGpus {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        // A sorted copy, so the lock is not held while encoding and the series keep one order.
        let mut nodes: Vec<(Sym, (i64, i64))> = self
            .0
            .lock()
            .expect("node gpus lock")
            .iter()
            .map(|(n, v)| (n.clone(), *v))
            .collect();
        nodes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (name, help, value) in NODE_GPUS {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (node, values) in &nodes {
                ConstGauge::new(value(values)).encode(family.encode_family(&NodeLabel(node))?)?;
            }
        }
        Ok(())
    }
}

fn seconds_histogram() -> Histogram {
    // 1 ms … ~33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

fn label(key: &str, value: &str) -> Labels {
    vec![(key.to_string(), value.to_string())]
}

/// The `Content-Type` of `/metrics`: the OpenMetrics text format `prometheus-client` writes.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds (seconds) of `kiln_node_ready_seconds`: from a node joining to a stage takes
/// seconds (labels) to tens of minutes (a driver compiled on the node).
pub const NODE_READY_BUCKETS: [f64; 14] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0,
];

/// `gpu_operator_reconciliation_status`, with upstream's codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileStatus {
    /// 1: every enabled state is ready.
    Ready,
    /// 0: some operand is not ready (or its state failed).
    NotReady,
    /// -1: the ClusterPolicy cannot be used (invalid).
    PolicyUnavailable,
    /// -2: the operator failed (an API request of the reconcile itself).
    OperatorError,
}

impl ReconcileStatus {
    /// The gauge value.
    pub const fn code(self) -> i64 {
        match self {
            ReconcileStatus::Ready => 1,
            ReconcileStatus::NotReady => 0,
            ReconcileStatus::PolicyUnavailable => -1,
            ReconcileStatus::OperatorError => -2,
        }
    }
}

/// The driver-upgrade census behind `gpu_operator_nodes_upgrades_*` (node counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UpgradeCensus {
    /// Nodes whose driver pod is being upgraded.
    pub in_progress: i64,
    /// Nodes upgraded successfully.
    pub done: i64,
    /// Nodes whose upgrade failed.
    pub failed: i64,
    /// Nodes on which an upgrade can start now.
    pub available: i64,
    /// Nodes waiting for an upgrade.
    pub pending: i64,
}

/// NVIDIA's `gpu_operator_*` series.
struct Nvidia {
    gpu_nodes: Gauge,
    status: Gauge,
    total: Counter,
    failed: Counter,
    last_success: Gauge<f64, AtomicU64>,
    has_nfd: Gauge,
    auto_upgrade: Gauge,
    upgrades: [Gauge; 5],
    dtk_enabled: Gauge,
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
    node_ready: HistFamily,
    node_gpus: Arc<NodeGpus>,
    node_stuck: Arc<crate::signals::stuck::StuckGauge>,
    nvidia: Nvidia,
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
        let mut root = Registry::default();
        let nvidia = Nvidia::register(root.sub_registry_with_prefix("gpu_operator"));
        let registry = root.sub_registry_with_prefix("kiln");
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
        let node_ready: HistFamily =
            Family::new_with_constructor(|| Histogram::new(NODE_READY_BUCKETS.iter().copied()));
        let node_gpus = Arc::new(NodeGpus::default());
        registry.register(
            "node_ready_seconds",
            "Seconds from a GPU node joining the cluster to each readiness stage",
            node_ready.clone(),
        );
        registry.register_collector(Box::new(node_gpus.clone()));
        let node_stuck = Arc::new(crate::signals::stuck::StuckGauge::default());
        registry.register_collector(Box::new(node_stuck.clone()));
        // Every stage's series exists from the start (count 0).
        for stage in Stage::ALL {
            let _ = node_ready.get_or_create(&label("stage", stage.name()));
        }
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
            registry: root,
            reconciles,
            reconcile_duration,
            errors,
            state_duration,
            plugin_duration,
            writes,
            leader,
            node_ready,
            node_gpus,
            node_stuck,
            nvidia,
            ready: AtomicBool::new(false),
        }
    }

    /// Record the outcome of one reconcile of the active policy in NVIDIA's series: the status
    /// gauge; the reconcile and failure counters (upstream counts a not-ready pass as failed;
    /// an invalid policy counts neither, as upstream's init failure); the last-success time.
    pub fn reconcile_status(&self, status: ReconcileStatus) {
        let n = &self.nvidia;
        n.status.set(status.code());
        if status != ReconcileStatus::PolicyUnavailable {
            n.total.inc();
        }
        match status {
            ReconcileStatus::Ready => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                n.last_success.set(now.as_secs() as f64);
            }
            ReconcileStatus::NotReady | ReconcileStatus::OperatorError => {
                n.failed.inc();
            }
            ReconcileStatus::PolicyUnavailable => {}
        }
    }

    /// Record a judged reconcile of the active policy: [`Metrics::reconcile_status`] from the
    /// verdict's state (an `ignored` verdict changes nothing, as upstream) and
    /// [`Metrics::gpu_nodes`].
    pub fn verdict(
        &self,
        verdict: &kiln_core::status::Verdict,
        gpu_nodes: usize,
        nfd_present: bool,
    ) {
        use kiln_core::spec::PolicyState;
        match verdict.state {
            PolicyState::Ready => self.reconcile_status(ReconcileStatus::Ready),
            PolicyState::NotReady => self.reconcile_status(ReconcileStatus::NotReady),
            PolicyState::Ignored => return,
        }
        self.gpu_nodes(gpu_nodes, nfd_present);
    }

    /// What node labelling saw: GPU nodes (`gpu_operator_gpu_nodes_total`) and whether any
    /// node has NFD labels (`gpu_operator_reconciliation_has_nfd_labels`).
    pub fn gpu_nodes(&self, gpu_nodes: usize, nfd_present: bool) {
        self.nvidia
            .gpu_nodes
            .set(i64::try_from(gpu_nodes).unwrap_or(i64::MAX));
        self.nvidia.has_nfd.set(i64::from(nfd_present));
    }

    /// `gpu_operator_openshift_driver_toolkit_enabled`: -1 when the policy requests the Driver
    /// Toolkit on OpenShift (kiln does not use it), else 0.
    pub fn driver_toolkit_requested(&self, requested_on_openshift: bool) {
        self.nvidia
            .dtk_enabled
            .set(if requested_on_openshift { -1 } else { 0 });
    }

    /// `gpu_operator_driver_auto_upgrade_enabled`.
    pub fn set_driver_auto_upgrade(&self, enabled: bool) {
        self.nvidia.auto_upgrade.set(i64::from(enabled));
    }

    /// `gpu_operator_nodes_upgrades_*`.
    pub fn set_upgrade_census(&self, census: UpgradeCensus) {
        let values = [
            census.in_progress,
            census.done,
            census.failed,
            census.available,
            census.pending,
        ];
        for (gauge, v) in self.nvidia.upgrades.iter().zip(values) {
            gauge.set(v);
        }
    }

    /// Observe that a node reached `stage` `seconds` after it joined the cluster.
    pub fn node_stage(&self, stage: &str, seconds: f64) {
        self.node_ready
            .get_or_create(&label("stage", stage))
            .observe(seconds);
    }

    /// Set a node's expected and allocatable GPU gauges.
    pub fn node_gpus(&self, node: &Sym, expected: i64, allocatable: i64) {
        let mut nodes = self.node_gpus.0.lock().expect("node gpus lock");
        nodes.insert(node.clone(), (expected, allocatable));
    }

    /// `kiln_node_stuck{node,reason}` ([`crate::signals::stuck`]).
    pub fn node_stuck(&self) -> &crate::signals::stuck::StuckGauge {
        &self.node_stuck
    }

    /// Drop a node's GPU gauges (the node is gone, or no longer says how many GPUs it has).
    pub fn forget_node_gpus(&self, node: &Sym) {
        let mut nodes = self.node_gpus.0.lock().expect("node gpus lock");
        nodes.remove(node);
        crate::memory::shrink_if_sparse(&mut nodes);
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

    /// Count `n` writes of `kind` (`apply`, `delete`, `drift` (a drift removal), `label`,
    /// `status`).
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

impl Nvidia {
    /// Register NVIDIA's series in `r` (prefix `gpu_operator`); help texts in kiln's words.
    fn register(r: &mut Registry) -> Self {
        let n = Nvidia {
            gpu_nodes: Gauge::default(),
            status: Gauge::default(),
            total: Counter::default(),
            failed: Counter::default(),
            last_success: Gauge::default(),
            has_nfd: Gauge::default(),
            auto_upgrade: Gauge::default(),
            upgrades: Default::default(),
            dtk_enabled: Gauge::default(),
        };
        r.register(
            "gpu_nodes_total",
            "Nodes labelled nvidia.com/gpu.present=true",
            n.gpu_nodes.clone(),
        );
        r.register(
            "reconciliation_status",
            "1 when the last reconcile found every operand ready, 0 when some were not, -1 when the ClusterPolicy is invalid, -2 when the operator failed",
            n.status.clone(),
        );
        r.register(
            "reconciliation",
            "Reconciles of the active ClusterPolicy",
            n.total.clone(),
        );
        r.register(
            "reconciliation_failed",
            "Reconciles of the active ClusterPolicy that did not end ready",
            n.failed.clone(),
        );
        r.register(
            "reconciliation_last_success_ts_seconds",
            "Unix time of the last reconcile that ended ready",
            n.last_success.clone(),
        );
        r.register(
            "reconciliation_has_nfd_labels",
            "1 when some node carries Node Feature Discovery labels",
            n.has_nfd.clone(),
        );
        r.register(
            "driver_auto_upgrade_enabled",
            "1 when the driver upgrade policy enables automatic upgrades",
            n.auto_upgrade.clone(),
        );
        let upgrades = [
            (
                "nodes_upgrades_in_progress",
                "Nodes whose driver is being upgraded",
            ),
            ("nodes_upgrades_done", "Nodes whose driver upgrade finished"),
            ("nodes_upgrades_failed", "Nodes whose driver upgrade failed"),
            (
                "nodes_upgrades_available",
                "Nodes on which a driver upgrade can start",
            ),
            (
                "nodes_upgrades_pending",
                "Nodes waiting for a driver upgrade",
            ),
        ];
        for ((name, help), gauge) in upgrades.into_iter().zip(&n.upgrades) {
            r.register(name, help, gauge.clone());
        }
        r.register(
            "openshift_driver_toolkit_enabled",
            "-1 when the OpenShift Driver Toolkit is requested (kiln does not use it), 0 otherwise",
            n.dtk_enabled.clone(),
        );
        for (name, help) in [
            (
                "openshift_driver_toolkit_nfd_too_old",
                "Always 0: kiln does not use the OpenShift Driver Toolkit",
            ),
            (
                "openshift_driver_toolkit_imagestream_missing",
                "Always 0: kiln does not use the OpenShift Driver Toolkit",
            ),
            (
                "openshift_driver_toolkit_rhcos_tags_missing",
                "Always 0: kiln does not use the OpenShift Driver Toolkit",
            ),
            (
                "openshift_driver_toolkit_imagestream_broken",
                "Always 0: kiln does not use the OpenShift Driver Toolkit",
            ),
        ] {
            r.register(name, help, Gauge::<i64>::default());
        }
        n
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
/// Most decisions remembered for tokens the API server authenticated (allowed or forbidden),
/// and as many again for tokens it did not: beyond it, expired decisions are dropped, then the
/// oldest. 32 bytes of hash, an instant and a status each.
pub const AUTH_CACHE_MAX: usize = 256;
/// Most reviews of unseen tokens (a TokenReview, then a SubjectAccessReview) in flight at once.
pub const MAX_CONCURRENT_REVIEWS: usize = 4;
/// Most callers waiting for a review slot; a caller beyond them is answered 503 at once.
pub const MAX_WAITING_REVIEWS: usize = 16;

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

/// The SHA-256 of a bearer token: what the decision cache keeps instead of the token.
type TokenHash = [u8; 32];

/// Decisions by token hash, at most [`AUTH_CACHE_MAX`], each for [`AUTH_CACHE_TTL`].
#[derive(Default)]
struct Decisions(HashMap<TokenHash, (Instant, StatusCode)>);

impl Decisions {
    fn get(&self, key: &TokenHash, now: Instant) -> Option<StatusCode> {
        self.0
            .get(key)
            .filter(|(at, _)| now.duration_since(*at) < AUTH_CACHE_TTL)
            .map(|(_, code)| *code)
    }

    fn insert(&mut self, key: TokenHash, now: Instant, code: StatusCode) {
        if self.0.len() >= AUTH_CACHE_MAX && !self.0.contains_key(&key) {
            self.0
                .retain(|_, (at, _)| now.duration_since(*at) < AUTH_CACHE_TTL);
            if self.0.len() >= AUTH_CACHE_MAX
                && let Some(oldest) = self
                    .0
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(k, _)| *k)
            {
                self.0.remove(&oldest);
            }
        }
        self.0.insert(key, (now, code));
    }
}

/// Decisions about authenticated tokens (200, 403) apart from unauthenticated ones (401).
#[derive(Default)]
struct AuthCache {
    authenticated: Decisions,
    unauthenticated: Decisions,
}

impl AuthCache {
    fn get(&self, key: &TokenHash, now: Instant) -> Option<StatusCode> {
        self.authenticated
            .get(key, now)
            .or_else(|| self.unauthenticated.get(key, now))
    }

    fn insert(&mut self, key: TokenHash, now: Instant, code: StatusCode) {
        if code == StatusCode::UNAUTHORIZED {
            self.unauthenticated.insert(key, now, code);
        } else {
            self.authenticated.insert(key, now, code);
        }
    }
}

/// Checks callers of `/metrics` against the API server ([`MetricsAuth::Kubernetes`]).
#[derive(Clone)]
pub struct MetricsAuthorizer {
    client: kube::Client,
    cache: Arc<Mutex<AuthCache>>,
    /// [`MAX_CONCURRENT_REVIEWS`] permits: one per review in flight.
    reviews: Arc<Semaphore>,
    /// [`MAX_CONCURRENT_REVIEWS`] + [`MAX_WAITING_REVIEWS`] permits: one per caller reviewing
    /// or waiting to.
    admitted: Arc<Semaphore>,
}

impl MetricsAuthorizer {
    /// An authorizer asking the API server behind `client`.
    pub fn new(client: kube::Client) -> Self {
        MetricsAuthorizer {
            client,
            cache: Arc::default(),
            reviews: Arc::new(Semaphore::new(MAX_CONCURRENT_REVIEWS)),
            admitted: Arc::new(Semaphore::new(MAX_CONCURRENT_REVIEWS + MAX_WAITING_REVIEWS)),
        }
    }

    fn cached(&self, key: &TokenHash) -> Option<StatusCode> {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key, Instant::now())
    }

    /// The answer for a request with this `Authorization` header: 200 (allowed), 401 (no
    /// bearer token, or one the API server does not authenticate), 403 (authenticated but not
    /// allowed `get` on `/metrics`), 503 (an unseen token while [`MAX_CONCURRENT_REVIEWS`]
    /// reviews run and [`MAX_WAITING_REVIEWS`] callers wait; not cached) or 500 (a review
    /// request failed; not cached).
    pub async fn check(&self, authorization: Option<&str>) -> StatusCode {
        let Some(token) = bearer_token(authorization) else {
            return StatusCode::UNAUTHORIZED;
        };
        let key: TokenHash = Sha256::digest(token.as_bytes()).into();
        if let Some(code) = self.cached(&key) {
            return code;
        }
        let Ok(_admitted) = self.admitted.try_acquire() else {
            return StatusCode::SERVICE_UNAVAILABLE;
        };
        let Ok(_slot) = self.reviews.acquire().await else {
            return StatusCode::SERVICE_UNAVAILABLE;
        };
        // Reviewed by another caller while this one waited.
        if let Some(code) = self.cached(&key) {
            return code;
        }
        let code = match self.review(token).await {
            Ok(code) => code,
            Err(e) => {
                tracing::warn!(error = %e, "cannot review a /metrics caller");
                return StatusCode::INTERNAL_SERVER_ERROR;
            }
        };
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, Instant::now(), code);
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
        StatusCode::SERVICE_UNAVAILABLE => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, HeaderValue::from_static("1"))],
            "Too many callers to review",
        )
            .into_response(),
        code => (code, code.canonical_reason().unwrap_or_default()).into_response(),
    }
}

/// The router serving `/metrics`, `/healthz` (always 200) and `/readyz` (200 once the
/// replica serves — leader or standby alike, so `helm install --wait` of 2 replicas finishes —
/// else 503; who leads is the `kiln_leader` gauge). With `auth`, `/metrics` answers only callers it allows
/// ([`MetricsAuthorizer::check`]: else 401, 403, 503 or 500); the health endpoints stay open.
/// Serve it with [`kiln_httpd::serve`] (header cap, timeouts, connection cap).
pub fn router(metrics: Arc<Metrics>, auth: Option<MetricsAuthorizer>) -> Router {
    let mut scrape = Router::new().route(
        "/metrics",
        get(|AxumState(m): AxumState<Arc<Metrics>>| async move {
            (
                [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
                m.encode(),
            )
        }),
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

    #[tokio::test]
    async fn nvidias_series_and_the_openmetrics_content_type() {
        let m = Arc::new(Metrics::new());
        let resp = router(m.clone(), None)
            .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(
            resp.headers()[header::CONTENT_TYPE],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        let text = m.encode();
        assert!(text.ends_with("# EOF\n"));
        // Every sample name of NVIDIA's controllers/operator_metrics.go (v26.7) exists from the
        // start, so alerts on them never see "no data".
        for name in [
            "gpu_operator_gpu_nodes_total",
            "gpu_operator_reconciliation_last_success_ts_seconds",
            "gpu_operator_reconciliation_status",
            "gpu_operator_reconciliation_total",
            "gpu_operator_reconciliation_failed_total",
            "gpu_operator_reconciliation_has_nfd_labels",
            "gpu_operator_openshift_driver_toolkit_enabled",
            "gpu_operator_openshift_driver_toolkit_nfd_too_old",
            "gpu_operator_openshift_driver_toolkit_imagestream_missing",
            "gpu_operator_openshift_driver_toolkit_rhcos_tags_missing",
            "gpu_operator_openshift_driver_toolkit_imagestream_broken",
            "gpu_operator_driver_auto_upgrade_enabled",
            "gpu_operator_nodes_upgrades_in_progress",
            "gpu_operator_nodes_upgrades_done",
            "gpu_operator_nodes_upgrades_failed",
            "gpu_operator_nodes_upgrades_available",
            "gpu_operator_nodes_upgrades_pending",
        ] {
            assert!(
                text.contains(&format!("\n{name} ")),
                "{name} missing:\n{text}"
            );
        }
        assert!(text.contains("kiln_node_ready_seconds_count{stage=\"validated\"} 0"));

        m.reconcile_status(ReconcileStatus::NotReady);
        m.reconcile_status(ReconcileStatus::PolicyUnavailable);
        m.reconcile_status(ReconcileStatus::Ready);
        m.gpu_nodes(5, true);
        m.set_upgrade_census(UpgradeCensus {
            failed: 2,
            ..UpgradeCensus::default()
        });
        m.node_gpus(&Sym::from("gpu-node-1"), 8, 7);
        m.node_stage("labelled", 4.0);
        let text = m.encode();
        for line in [
            "gpu_operator_reconciliation_status 1",
            // The invalid policy counts neither; the not-ready pass counts as failed.
            "gpu_operator_reconciliation_total 2",
            "gpu_operator_reconciliation_failed_total 1",
            "gpu_operator_gpu_nodes_total 5",
            "gpu_operator_reconciliation_has_nfd_labels 1",
            "gpu_operator_nodes_upgrades_failed 2",
            "kiln_node_gpus_expected{node=\"gpu-node-1\"} 8",
            "kiln_node_gpus_allocatable{node=\"gpu-node-1\"} 7",
            "kiln_node_ready_seconds_bucket{le=\"5.0\",stage=\"labelled\"} 1",
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line}:\n{text}");
        }
        // Each gauge: one descriptor, then its series in node-name order.
        m.node_gpus(&Sym::from("gpu-node-0"), 4, 4);
        let text = m.encode();
        let at = |line: &str| text.find(line).unwrap_or_else(|| panic!("{line}:\n{text}"));
        assert!(
            at("# TYPE kiln_node_gpus_expected gauge\n")
                < at("kiln_node_gpus_expected{node=\"gpu-node-0\"} 4\n")
        );
        assert!(
            at("kiln_node_gpus_expected{node=\"gpu-node-0\"} 4\n")
                < at("kiln_node_gpus_expected{node=\"gpu-node-1\"} 8\n")
        );
        assert!(
            at("kiln_node_gpus_expected{node=\"gpu-node-1\"} 8\n")
                < at("# TYPE kiln_node_gpus_allocatable gauge\n")
        );
        assert_eq!(
            text.matches("# TYPE kiln_node_gpus_allocatable gauge")
                .count(),
            1
        );
        assert!(text.contains(
            "# HELP kiln_node_gpus_allocatable Allocatable nvidia.com/gpu, nvidia.com/gpu.shared \
             and nvidia.com/mig-* of a node.\n"
        ));
        m.forget_node_gpus(&Sym::from("gpu-node-1"));
        let text = m.encode();
        assert!(!text.contains("gpu-node-1"));
        assert!(text.contains("kiln_node_gpus_allocatable{node=\"gpu-node-0\"} 4\n"));
    }

    /// A kube client over a fake API server: the token `good` is user `scraper` (allowed
    /// `get /metrics`), `other` is user `nobody` (not allowed), anything else unauthenticated.
    /// Counts the review requests it answers.
    fn fake_api() -> (kube::Client, Arc<std::sync::atomic::AtomicUsize>) {
        let (client, api) = fake_api_gated(None);
        (client, api.calls.clone())
    }

    /// What [`fake_api_gated`] saw: review requests, and how many were in flight (now, most).
    #[derive(Default)]
    struct FakeApi {
        calls: Arc<std::sync::atomic::AtomicUsize>,
        in_flight: std::sync::atomic::AtomicUsize,
        most_in_flight: std::sync::atomic::AtomicUsize,
    }

    /// [`fake_api`] whose answers each wait for a permit of `gate`, when given.
    fn fake_api_gated(gate: Option<Arc<Semaphore>>) -> (kube::Client, Arc<FakeApi>) {
        use http_body_util::Full;
        let api = Arc::new(FakeApi::default());
        let counted = api.clone();
        let service = tower::service_fn(move |req: axum::http::Request<kube::client::Body>| {
            let counted = counted.clone();
            let gate = gate.clone();
            async move {
                counted.calls.fetch_add(1, Ordering::SeqCst);
                let now = counted.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                counted.most_in_flight.fetch_max(now, Ordering::SeqCst);
                if let Some(gate) = gate {
                    gate.acquire().await.unwrap().forget();
                }
                counted.in_flight.fetch_sub(1, Ordering::SeqCst);
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
        (kube::Client::new(service, "default"), api)
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

    #[tokio::test]
    async fn reviews_run_four_at_a_time_and_callers_beyond_the_queue_get_503() {
        let gate = Arc::new(Semaphore::new(0));
        let (client, api) = fake_api_gated(Some(gate.clone()));
        let r = router(
            Arc::new(Metrics::new()),
            Some(MetricsAuthorizer::new(client)),
        );
        let callers = 100;
        let mut answers = tokio::task::JoinSet::new();
        for i in 0..callers {
            let r = r.clone();
            answers.spawn(async move {
                get_with(r, "/metrics", Some(&format!("Bearer random-{i}"))).await
            });
        }
        // Reviews are held at the gate, so the first answers are the callers turned away.
        let turned_away = callers - MAX_CONCURRENT_REVIEWS - MAX_WAITING_REVIEWS;
        for _ in 0..turned_away {
            assert_eq!(
                answers.join_next().await.unwrap().unwrap(),
                StatusCode::SERVICE_UNAVAILABLE
            );
        }
        while api.in_flight.load(Ordering::SeqCst) < MAX_CONCURRENT_REVIEWS {
            tokio::task::yield_now().await;
        }
        gate.add_permits(callers);
        let mut reviewed = 0;
        while let Some(answer) = answers.join_next().await {
            assert_eq!(answer.unwrap(), StatusCode::UNAUTHORIZED);
            reviewed += 1;
        }
        assert_eq!(reviewed, MAX_CONCURRENT_REVIEWS + MAX_WAITING_REVIEWS);
        assert_eq!(
            api.calls.load(Ordering::SeqCst),
            reviewed,
            "one TokenReview each"
        );
        assert_eq!(
            api.most_in_flight.load(Ordering::SeqCst),
            MAX_CONCURRENT_REVIEWS
        );
    }

    #[tokio::test]
    async fn random_tokens_keep_the_cache_bounded_and_do_not_evict_a_scraper() {
        let (client, calls) = fake_api();
        let auth = MetricsAuthorizer::new(client);
        assert_eq!(auth.check(Some("Bearer good")).await, StatusCode::OK);
        assert_eq!(
            auth.check(Some("Bearer other")).await,
            StatusCode::FORBIDDEN
        );
        let random = 3 * AUTH_CACHE_MAX;
        for i in 0..random {
            let header = format!("Bearer random-{i}");
            assert_eq!(auth.check(Some(&header)).await, StatusCode::UNAUTHORIZED);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 4 + random);
        {
            let cache = auth.cache.lock().unwrap();
            assert_eq!(cache.authenticated.0.len(), 2);
            assert_eq!(cache.unauthenticated.0.len(), AUTH_CACHE_MAX);
            // Keyed by hash: the newest random token is kept as its SHA-256, the oldest is gone.
            let newest: TokenHash = Sha256::digest(format!("random-{}", random - 1)).into();
            let oldest: TokenHash = Sha256::digest("random-0").into();
            assert!(cache.unauthenticated.0.contains_key(&newest));
            assert!(!cache.unauthenticated.0.contains_key(&oldest));
        }
        assert_eq!(auth.check(Some("Bearer good")).await, StatusCode::OK);
        assert_eq!(
            auth.check(Some("Bearer other")).await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(calls.load(Ordering::SeqCst), 4 + random, "still cached");
    }

    #[tokio::test]
    async fn an_oversized_token_is_answered_431_before_any_review() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (client, calls) = fake_api();
        let r = router(
            Arc::new(Metrics::new()),
            Some(MetricsAuthorizer::new(client)),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(kiln_httpd::serve(
            listener,
            r,
            kiln_httpd::Limits::DEFAULT,
            std::future::pending(),
        ));
        let ask = |token: String| async move {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            let request = format!(
                "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
                 Connection: close\r\n\r\n"
            );
            // The server may close before taking the whole request.
            let _ = s.write_all(request.as_bytes()).await;
            let mut answer = Vec::new();
            let _ = s.read_to_end(&mut answer).await;
            String::from_utf8_lossy(&answer).into_owned()
        };
        for size in [17 * 1024, 300 * 1024] {
            let answer = ask("t".repeat(size)).await;
            assert!(answer.starts_with("HTTP/1.1 431 "), "{size}: {answer}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0, "no TokenReview");
        let answer = ask("t".repeat(15 * 1024)).await;
        assert!(answer.starts_with("HTTP/1.1 401 "), "{answer}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
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
