//! Operator configuration and the shared context every reconcile receives.

use std::sync::Arc;

use kiln_render::Renderer;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};

use crate::apply::Applier;
use crate::metrics::Metrics;

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
    pub metrics_auth: crate::metrics::MetricsAuth,
    /// Take part in leader election on the Lease `kiln-operator` in [`Config::namespace`].
    pub leader_election: bool,
    /// This replica's identity in the Lease (default: hostname or a random id).
    pub identity: String,
    /// Image overrides for the fallback images, `ENV` → image.
    pub images: Vec<(String, String)>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: "gpu-operator".into(),
            plugins_dir: None,
            metrics_addr: "0.0.0.0:8080".into(),
            metrics_auth: crate::metrics::MetricsAuth::default(),
            leader_election: false,
            identity: default_identity(),
            images: Vec::new(),
        }
    }
}

/// `$POD_NAME`, else `$HOSTNAME`, else `kiln-<pid>`.
pub fn default_identity() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| format!("kiln-{}", std::process::id()))
}

/// Everything a reconcile needs; shared by all reconciles through an `Arc`.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Renders a state through its plugin chain.
    pub renderer: Renderer,
    /// Server-side apply with caches that make steady-state reconciles write nothing.
    pub applier: Applier,
    /// Publishes Events on the ClusterPolicy.
    pub recorder: Recorder,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Configuration.
    pub config: Config,
    /// The API server's version (`v1.36.3`), read once at start.
    pub kubernetes_version: String,
    /// The labelled objects in the cluster (what kiln applied, found again after a restart);
    /// started by the first reconcile ([`Context::live`]) unless set before.
    live: tokio::sync::OnceCell<crate::live::LiveCache>,
    /// Each state's last render and its inputs (unchanged inputs call no plugin).
    pub renders: crate::memory::RenderCache,
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
        Context {
            applier: Applier::new(client.clone()),
            recorder: Recorder::new(client.clone(), reporter),
            client,
            renderer,
            metrics,
            config,
            kubernetes_version,
            live: tokio::sync::OnceCell::new(),
            renders: Default::default(),
        }
    }

    /// Use `live` as the cache of labelled objects instead of starting reflectors (tests);
    /// `false` when one is set already.
    pub fn set_live(&self, live: crate::live::LiveCache) -> bool {
        self.live.set(live).is_ok()
    }

    /// The cache of labelled objects, starting its reflectors on first use
    /// ([`crate::live::LiveCache::start`]).
    ///
    /// # Errors
    /// [`crate::Error::Kube`] when discovering the watched kinds fails.
    pub async fn live(&self) -> crate::Result<&crate::live::LiveCache> {
        self.live
            .get_or_try_init(|| {
                crate::live::LiveCache::start(&self.client, &self.applier, &self.config.namespace)
            })
            .await
    }
}
