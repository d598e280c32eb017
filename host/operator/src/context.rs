//! Operator configuration and the shared context every reconcile receives: the cluster handle
//! ([`Cluster`]), the status writer ([`StatusWriter`]) and the caches ([`Caches`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::cluster::node::SlimNode;
use kiln_core::State;
use kiln_core::labels::LabelPolicy;
use kiln_render::Renderer;
use kube::Client;
use kube::api::DynamicObject;
use kube::runtime::events::Reporter;

use crate::signals::events::Events;
use kube::runtime::reflector::Store;

use crate::apply::Applier;
use crate::cluster::live::Wake;
use crate::cluster::store::NamedStore;
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

/// The caches reconciles read instead of the API server: the ClusterPolicies (the controller's
/// store), the nodes (slimmed, [`crate::controllers::policy::nodes::watch_nodes`]), the labelled objects
/// ([`crate::cluster::live`]), each state's last render, and what the last full reconcile of each
/// policy decided ([`Last`]). Stores not set (tests, before `run` wires them) fall back to
/// reads from the API server.
#[derive(Default)]
pub struct Caches {
    policies: OnceLock<Store<DynamicObject>>,
    nodes: OnceLock<NamedStore<SlimNode>>,
    /// The labelled objects in the cluster (what kiln applied, found again after a restart);
    /// started by the first reconcile ([`Context::live`]) unless set before.
    live: tokio::sync::OnceCell<Arc<crate::cluster::live::LiveCache>>,
    /// Each state's last render and its inputs (unchanged inputs call no plugin).
    pub renders: crate::memory::RenderCache,
    /// What the last full reconcile of each policy (by name) decided.
    pub last: Mutex<HashMap<String, Last>>,
    /// The labelling rules of the active policy's last full reconcile (node events label the
    /// changed node with them).
    pub labels: Arc<Mutex<Option<LabelPolicy>>>,
    /// Wakes the controller (a no-op until `run` wires a channel).
    pub wake: Wake,
    /// When the last reconcile of the active policy started ([`crate::controllers::policy::reconcile::RECONCILE_EVERY`]).
    pub paced: Mutex<Option<std::time::Instant>>,
    /// Watches of the pods and revisions of `OnDelete` DaemonSets (started on first need when
    /// set; else readiness lists them) and of the validator pods (started by `run` with the
    /// readiness timeline's tap).
    pub pods: OnceLock<Arc<crate::cluster::readiness::PodWatches>>,
    /// The operator namespace's ConfigMaps (metadata) and the keys of the referenced ones as
    /// last read (set by `run`; else every referenced ConfigMap is read each full reconcile).
    pub config_maps: OnceLock<Arc<crate::cluster::facts::ConfigMapCache>>,
    /// Every DaemonSet of the operator namespace ([`crate::cluster::live::start_daemonsets`], set by
    /// `run` and shared with the NVIDIADriver controller); else the labelled objects' cache
    /// starts that watch itself.
    pub daemonsets: OnceLock<Store<k8s_openapi::api::apps::v1::DaemonSet>>,
    /// The NVIDIADriver CRs (the NVIDIADriver controller's store, shared with
    /// [`crate::controllers::driver::DriverCaches::drivers`] and set when that controller starts): a
    /// policy that hands the driver off judges the CRs' readiness from it. Not set (no
    /// NVIDIADriver CRD, tests): listed.
    pub drivers: Arc<OnceLock<Store<kiln_core::spec::nvidiadriver::NVIDIADriver>>>,
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

impl Caches {
    /// Use `store` as the ClusterPolicies (the controller's, as [`DynamicObject`]s: see
    /// [`crate::status::policy_resource`]); `false` when one is set already.
    pub fn set_policies(&self, store: Store<DynamicObject>) -> bool {
        self.policies.set(store).is_ok()
    }

    /// The ClusterPolicy store, when set.
    pub fn policies(&self) -> Option<&Store<DynamicObject>> {
        self.policies.get()
    }

    /// Use `store` as the nodes; `false` when one is set already.
    pub fn set_nodes(&self, store: NamedStore<SlimNode>) -> bool {
        self.nodes.set(store).is_ok()
    }

    /// The node store, when set.
    pub fn nodes(&self) -> Option<&NamedStore<SlimNode>> {
        self.nodes.get()
    }
}

/// Everything a reconcile needs, shared by all reconciles through an `Arc`: the cluster handle
/// ([`Cluster`], also reached through `Deref`: `ctx.client`, `ctx.config`), the status writer,
/// the caches, the renderer and the metrics.
pub struct Context {
    /// Client, applier, configuration, server version.
    pub cluster: Cluster,
    /// Writes status and Events.
    pub status: StatusWriter,
    /// What reconciles read instead of the API server.
    pub caches: Caches,
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
    /// Build a context over `client` and `renderer`.
    pub fn new(
        client: Client,
        renderer: Renderer,
        metrics: Arc<Metrics>,
        config: Config,
        kubernetes_version: String,
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
            caches: Caches::default(),
            renderer,
            metrics,
        }
    }

    /// Use `live` as the cache of labelled objects instead of starting reflectors (tests);
    /// `false` when one is set already.
    pub fn set_live(&self, live: crate::cluster::live::LiveCache) -> bool {
        self.caches.live.set(Arc::new(live)).is_ok()
    }

    /// The cache of labelled objects, starting its reflectors on first use
    /// ([`crate::cluster::live::LiveCache::start`]).
    ///
    /// # Errors
    /// [`crate::Error::Kube`] when discovering the watched kinds fails.
    pub async fn live(&self) -> crate::Result<&crate::cluster::live::LiveCache> {
        Ok(self.shared_live().await?)
    }

    /// [`Context::live`] as a handle another controller can keep (the NVIDIADriver
    /// controller reads the markers of the driver state's shared objects from it).
    ///
    /// # Errors
    /// As [`Context::live`].
    pub async fn shared_live(&self) -> crate::Result<&Arc<crate::cluster::live::LiveCache>> {
        self.caches
            .live
            .get_or_try_init(|| async {
                crate::cluster::live::LiveCache::start(
                    &self.client,
                    &self.applier,
                    &self.config.namespace,
                    &self.caches.wake,
                    self.caches.config_maps.get().map(|c| c.store()),
                    self.caches.daemonsets.get().cloned(),
                )
                .await
                .map(Arc::new)
            })
            .await
    }
}
