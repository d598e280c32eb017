//! Operator configuration and the shared context every ClusterPolicy reconcile receives: the
//! cluster handle ([`Cluster`]), the status writer ([`StatusWriter`]), the view of the cluster
//! ([`View`]) and what the reconciler remembers ([`Memo`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kiln_core::State;
use kiln_core::labels::LabelPolicy;
use kiln_render::Renderer;
use kube::Client;
use kube::runtime::events::Reporter;

use crate::signals::events::Events;

use crate::apply::Applier;
use crate::cluster::view::View;
use crate::signals::metrics::Metrics;
use crate::status::StatusWriter;

/// How the operator runs (from the CLI flags / environment).
#[derive(Debug, Clone)]
pub struct Config {
    /// Namespace the operands go into (upstream env `OPERATOR_NAMESPACE`; default `gpu-operator`).
    pub namespace: String,
    /// Drop-in plugin directory searched before the bundled plugins.
    pub plugins_dir: Option<std::path::PathBuf>,
    /// Address of the `/metrics`, `/healthz`, `/readyz` server (e.g. `0.0.0.0:8080`).
    pub metrics_addr: String,
    /// Who may read `/metrics` (default: callers the API server authorizes).
    pub metrics_auth: crate::signals::metrics::MetricsAuth,
    /// Take part in leader election on the Lease `kiln-operator` in [`Config::namespace`].
    pub leader_election: bool,
    /// This replica's identity in the Lease (default: hostname or a random id).
    pub identity: String,
    /// Image overrides for the fallback images, `ENV` → image.
    pub images: Vec<(String, String)>,
    /// How long a driver upgrade waits in `validation-required` for the validator before the
    /// node is `upgrade-failed` (upstream 600 s; [`crate::controllers::upgrade`]).
    pub upgrade_validation_timeout: std::time::Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: "gpu-operator".into(),
            plugins_dir: None,
            metrics_addr: "0.0.0.0:8080".into(),
            metrics_auth: crate::signals::metrics::MetricsAuth::default(),
            leader_election: false,
            identity: crate::leader::default_identity(),
            images: Vec::new(),
            upgrade_validation_timeout: std::time::Duration::from_secs(
                kiln_core::upgrade::VALIDATION_TIMEOUT_SECONDS.unsigned_abs(),
            ),
        }
    }
}

/// The cluster handle: the API client, server-side apply (with its discovery cache), the
/// configuration and the server's version.
pub struct Cluster {
    /// API client.
    pub client: Client,
    /// Server-side apply with caches that make steady-state reconciles write nothing.
    pub applier: Applier,
    /// Configuration.
    pub config: Config,
    /// The API server's version (`v1.36.3`), read once at start.
    pub kubernetes_version: String,
}

/// What the ClusterPolicy reconciler remembers between reconciles (its own state, not the
/// cluster's: that is the [`View`]): each state's last render, what the last full reconcile of
/// each policy decided ([`Last`]), the labelling rules node events use and the pacing.
#[derive(Default)]
pub struct Memo {
    /// Each state's last render and its inputs (unchanged inputs call no plugin).
    pub renders: crate::memory::RenderCache,
    /// What the last full reconcile of each policy (by name) decided.
    pub last: Mutex<HashMap<String, Last>>,
    /// The labelling rules of the active policy's last full reconcile (node events label the
    /// changed node with them).
    pub labels: Arc<Mutex<Option<LabelPolicy>>>,
    /// When the last reconcile of the active policy started ([`crate::controllers::policy::reconcile::RECONCILE_EVERY`]).
    pub paced: Mutex<Option<std::time::Instant>>,
}

/// One state as the last full reconcile left it.
#[derive(Debug, Clone, PartialEq)]
pub enum Kept {
    /// Disabled (its objects deleted).
    Disabled,
    /// Handed to NVIDIADriver CRs (`driver.useNvidiaDriverCRD`): its DaemonSets deleted with
    /// Orphan propagation; readiness is the CRs' ([`crate::controllers::policy::handoff::policy_driver_result`]).
    HandedOff,
    /// The chain or an apply failed, with the error text.
    Failed(String),
    /// Applied: its DaemonSets by name, with the `metadata.generation` the apply returned
    /// (the cache must show at least that generation before its status counts).
    Applied(Vec<(String, i64)>),
}

/// What a full reconcile of one policy decided, for the cheap reconciles after it (a DaemonSet
/// status change, a node relabelled) that only re-judge readiness and status from the caches.
#[derive(Debug, Clone)]
pub struct Last {
    /// The policy's `metadata.uid`.
    pub uid: String,
    /// The policy's `metadata.generation` (spec changes bump it; status writes do not).
    pub generation: Option<i64>,
    /// A hash of the policy's labels and annotations ([`metadata_digest`]): the plugin chains
    /// live in an annotation, and a metadata change does not bump the generation.
    pub metadata: u64,
    /// The node facts the render used.
    pub facts: crate::cluster::facts::NodeFacts,
    /// Per state, in order.
    pub states: Vec<(State, Kept)>,
    /// The shadowing note for the Ready condition, if any.
    pub note: Option<String>,
    /// When a state failed: render and apply again on the first reconcile after this instant.
    pub retry_at: Option<std::time::Instant>,
}

/// A hash of `meta`'s labels and annotations (what of a policy's metadata a render may read,
/// besides name and uid).
pub fn metadata_digest(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    meta.labels.hash(&mut h);
    meta.annotations.hash(&mut h);
    h.finish()
}

/// Everything a reconcile needs, shared by all reconciles through an `Arc`: the cluster handle
/// ([`Cluster`], also reached through `Deref`: `ctx.client`, `ctx.config`), the status writer,
/// the view of the cluster, what the reconciler remembers, the renderer and the metrics.
pub struct Context {
    /// Client, applier, configuration, server version.
    pub cluster: Cluster,
    /// Writes status and Events.
    pub status: StatusWriter,
    /// The cluster as the operator's watches hold it (shared with every controller).
    pub view: Arc<View>,
    /// What the reconciler remembers between reconciles.
    pub memo: Memo,
    /// Renders a state through its plugin chain.
    pub renderer: Renderer,
    /// Publishes Events on the ClusterPolicy (also used by [`Context::status`]) and the
    /// timeline's on nodes.
    pub recorder: Events,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
}

impl std::ops::Deref for Context {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

impl Context {
    /// Build a context over `client`, `renderer` and the cluster `view`.
    pub fn new(
        client: Client,
        renderer: Renderer,
        metrics: Arc<Metrics>,
        config: Config,
        kubernetes_version: String,
        view: Arc<View>,
    ) -> Self {
        let reporter = Reporter {
            controller: "kiln".into(),
            instance: Some(config.identity.clone()),
        };
        let recorder = Events::new(client.clone(), reporter);
        Context {
            status: StatusWriter::new(client.clone(), recorder.clone(), &config.namespace),
            recorder,
            cluster: Cluster {
                applier: Applier::new(client.clone()),
                client,
                config,
                kubernetes_version,
            },
            view,
            memo: Memo::default(),
            renderer,
            metrics,
        }
    }
}
