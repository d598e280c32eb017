//! Wiring: metrics server, leader election, the one view of the cluster
//! ([`crate::cluster::view::View`]) and the controllers over it, each started once.
//!
//! Triggers (no fixed polling at steady state), all read from the view's stores (kube
//! reflector stores; the node and pod stores are [`crate::cluster::store`]'s name-keyed ones):
//! - the ClusterPolicy itself (any change; one watch fills the view's policy store that every
//!   controller reads);
//! - labelled objects ([`crate::cluster::live`]): a DaemonSet status change re-judges readiness from the
//!   cache; an object deleted behind kiln's back is re-applied;
//! - node changes of what the operator reads ([`crate::controllers::policy::nodes::watch_nodes`]: a new GPU node,
//!   an opt-out label, not GFD's timestamp): that node is labelled, then readiness is judged
//!   again (a full reconcile only when [`crate::cluster::facts::NodeFacts`] change);
//! - pods of `OnDelete` DaemonSets ([`crate::cluster::readiness::PodWatches`]);
//! - a ClusterPolicy deleted → every ClusterPolicy (the next oldest becomes active).

use std::sync::Arc;

use futures::{StreamExt, future};
use kiln_render::Renderer;
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::runtime::{Controller, watcher};

use kiln_core::spec::nvidiadriver::NVIDIADriver;
use kube::runtime::reflector::store::Writer;

use crate::cluster::facts::ConfigMapCache;
use crate::cluster::live::{self, LiveCache, Wake};
use crate::cluster::node::SlimNode;
use crate::cluster::readiness::PodWatches;
use crate::cluster::store::NamedWriter;
use crate::cluster::view::View;
use crate::context::{Config, Context};
use crate::controllers::driver::DaemonSetFeed;
use crate::controllers::policy::nodes;
use crate::controllers::policy::reconcile::{error_policy, reconcile};
use crate::controllers::upgrade::{UpgradeConfig, Upgrader};
use crate::leader::{self, Elector, LeaseConfig};
use crate::signals::metrics::{Metrics, MetricsAuth, MetricsAuthorizer, router};
use crate::{Error, Result};

/// Async worker threads of the operator's runtime: reconciles are sequential per policy and
/// rendering runs on the blocking pool, so two workers keep watches, HTTP and leader election
/// responsive. Fixed rather than one per core, so memory (each thread's stack) does not grow
/// with the node's core count.
pub const WORKER_THREADS: usize = 2;
/// Most threads of the blocking pool (plugin calls, one state at a time per reconcile).
pub const MAX_BLOCKING_THREADS: usize = 4;

/// Every resource the operator watches besides the asset kinds
/// ([`crate::cluster::live::asset_kinds`]), as (API group, resource, namespaced): nodes
/// ([`crate::controllers::policy::nodes`]), the pods and ControllerRevisions of `OnDelete` DaemonSets and the
/// validator pods ([`crate::cluster::readiness::PodWatches`]; the validator pods' events also feed
/// [`crate::signals::timeline`]), every DaemonSet ([`crate::cluster::live::start_daemonsets`], the policy's and
/// the NVIDIADrivers'), the ConfigMaps' metadata ([`crate::cluster::facts::ConfigMapCache`]),
/// ClusterPolicies and NVIDIADrivers. A namespaced one is watched in the operator namespace
/// only. The operator's RBAC must grant `list` and `watch` on each (`tests/deploy.rs`): a
/// watch refused after its list leaves its store at that first list for good, retried every
/// 30 s.
pub const WATCHED_RESOURCES: &[(&str, &str, bool)] = &[
    ("", "nodes", false),
    ("", "pods", true),
    ("apps", "controllerrevisions", true),
    ("apps", "daemonsets", true),
    ("", "configmaps", true),
    ("nvidia.com", "clusterpolicies", false),
    ("nvidia.com", "nvidiadrivers", false),
    ("nvidia.com", "gpuclusters", false),
    ("apps", "deployments", true),
];

/// The Tokio runtime `kiln operator` runs on ([`WORKER_THREADS`], [`MAX_BLOCKING_THREADS`]).
///
/// # Errors
/// When the runtime cannot start its threads.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .enable_all()
        .build()
}

/// Run the operator until SIGTERM or Ctrl-C (or, with leader election, until leadership is
/// lost, which returns [`Error::LeadershipLost`] so the process exits and restarts).
///
/// # Errors
/// As [`run_until`].
pub async fn run(client: Client, renderer: Renderer, config: Config) -> Result<()> {
    run_until(client, renderer, config, shutdown_signal()).await
}

/// SIGTERM (what the kubelet sends) or Ctrl-C.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = term => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

/// Run the operator until `shutdown` completes: a standby stops waiting for the Lease; the
/// leader lets running reconciles finish, then releases the Lease so a standby takes over at
/// its next poll ([`leader::release`]). `/readyz` answers 200 as soon as the health server
/// listens, on the leader and on a standby alike (readiness is "serving", not "leading";
/// `kiln_leader` tells which replica leads).
///
/// The starts, in order: the health and metrics server, leadership, the view of the cluster
/// ([`start_view`]: every watch, once), the signals ([`start_signals`]), the node watch, the
/// ClusterPolicy controller ([`policy_controller`]), the driver upgrade, the NVIDIADriver
/// controller ([`start_drivers`]), then leading until `shutdown` ([`lead`]). Each controller
/// gets the one [`View`]; none starts another.
///
/// # Errors
/// [`Error::Serve`] when the metrics address cannot be bound; [`Error::Kube`] when the server
/// version cannot be read or discovery fails; [`Error::LeadershipLost`].
pub async fn run_until(
    client: Client,
    renderer: Renderer,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    use futures::FutureExt as _;
    let shutdown = shutdown.boxed().shared();
    if !renderer.host().has_disk_cache() {
        tracing::warn!(
            "no usable precompiled-plugin cache directory (set {}): compiled plugins stay in \
             memory between reconciles",
            kiln_plugin_host::CACHE_DIR_ENV
        );
    }
    let metrics = Arc::new(Metrics::new());
    serve_health(&client, &config, &metrics).await?;
    // Serving: a standby is Ready too (a Deployment of 2 replicas becomes Available).
    metrics.set_ready();
    let lease = LeaseConfig::new(&config.namespace, &config.identity);
    let mut elector = Elector::new(lease.clone());
    if config.leader_election {
        tokio::select! {
            () = elector.acquire(&client) => {}
            () = shutdown.clone() => return Ok(()),
        }
    }
    // Without leader election this replica is the one doing the work.
    metrics.set_leader(true);
    let version = client
        .apiserver_version()
        .await
        .map_err(|e| Error::kube("read server version", e))?
        .git_version;
    let (wake, wakes) = Wake::channel();
    let (view, feeds) = start_view(&client, &config.namespace, &wake).await?;
    let ctx = Arc::new(Context::new(
        client.clone(),
        renderer,
        metrics.clone(),
        config,
        version,
        view.clone(),
    ));
    let timeline = start_signals(&ctx);
    let (pools_tx, pools) = futures::channel::mpsc::unbounded();
    tokio::spawn(nodes::watch_nodes(
        nodes::NodeWatch {
            client: client.clone(),
            wake: wake.clone(),
            labels: ctx.memo.labels.clone(),
            metrics: metrics.clone(),
            timeline: Some(timeline),
            pools: Some(pools_tx),
        },
        feeds.nodes,
    ));
    let (controller, policy_deletes, policy_changes) = policy_controller(&ctx, feeds.policies);
    let upgrade = UpgradeConfig {
        validation_timeout: ctx.config.upgrade_validation_timeout,
        identity: ctx.config.identity.clone(),
        namespace: ctx.config.namespace.clone(),
    };
    let upgrader = Upgrader::start(client, upgrade, view);
    tokio::spawn(crate::controllers::upgrade::run(
        upgrader,
        metrics.clone(),
        shutdown.clone(),
    ));
    crate::controllers::gpucluster::start(&ctx, ctx.view.nodes.clone(), shutdown.clone()).await?;
    let changes = futures::stream::select(
        futures::stream::select(pools, policy_changes),
        feeds.config_maps,
    );
    start_drivers(&ctx, feeds.drivers, changes, &shutdown);
    let controller = controller
        .reconcile_all_on(futures::stream::select(wakes, policy_deletes))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|res| {
            match res {
                Ok((obj, action)) => tracing::debug!(policy = %obj.name, ?action, "reconciled"),
                Err(e) => tracing::warn!(error = %e, "controller"),
            }
            future::ready(())
        });
    tracing::info!(namespace = %ctx.config.namespace, "controller running");
    lead(controller, &ctx, &metrics, &lease, elector).await
}

/// Bind the metrics address and serve `/metrics`, `/healthz` and `/readyz` there (header cap,
/// timeouts and a connection cap that keeps the probes answered: `kiln_httpd`).
///
/// # Errors
/// [`Error::Serve`] when the address cannot be bound.
async fn serve_health(client: &Client, config: &Config, metrics: &Arc<Metrics>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(&config.metrics_addr)
        .await
        .map_err(|source| Error::Serve {
            addr: config.metrics_addr.clone(),
            source,
        })?;
    tracing::info!(addr = %config.metrics_addr, auth = ?config.metrics_auth, "serving /metrics /healthz /readyz");
    let auth = match config.metrics_auth {
        MetricsAuth::Kubernetes => Some(MetricsAuthorizer::new(client.clone())),
        MetricsAuth::None => None,
    };
    tokio::spawn(kiln_httpd::serve(
        listener,
        router(metrics.clone(), auth),
        kiln_httpd::Limits::DEFAULT,
        future::pending(),
    ));
    Ok(())
}

/// What [`start_view`] hands the controllers besides the [`View`]: the writers of the stores
/// whose watches a controller drives (the node watch labels nodes; the ClusterPolicy and
/// NVIDIADriver controllers are built on their kinds' watches), and the change feeds of the
/// NVIDIADriver controller.
struct Feeds {
    /// The view's node store ([`crate::controllers::policy::nodes::watch_nodes`]).
    nodes: NamedWriter<SlimNode>,
    /// The view's ClusterPolicy store ([`policy_controller`]).
    policies: Writer<DynamicObject>,
    /// The view's NVIDIADriver store and the NVIDIADriver side of the DaemonSet watch
    /// ([`crate::controllers::driver::run`]); `None` when the CRD is not served.
    drivers: Option<(Writer<NVIDIADriver>, DaemonSetFeed)>,
    /// Changes of a referenced ConfigMap ([`crate::cluster::facts::ConfigMapCache`]).
    config_maps: Changes,
}

/// Start every watch of the view once: the pod watches, the ConfigMaps' metadata, every
/// DaemonSet of the namespace (one watch for every controller; the NVIDIADriver side's feed
/// only when its CRD is served), the labelled objects ([`LiveCache::start`]), and the stores
/// the node, ClusterPolicy and NVIDIADriver watches fill ([`Feeds`]).
///
/// # Errors
/// [`Error::Kube`] when discovery fails.
async fn start_view(client: &Client, namespace: &str, wake: &Wake) -> Result<(Arc<View>, Feeds)> {
    let applier = crate::apply::Applier::new(client.clone());
    let served = applier
        .serves("nvidia.com/v1alpha1", "NVIDIADriver")
        .await?;
    let pods = Arc::new(PodWatches::new(client.clone(), wake.clone()));
    // A referenced ConfigMap changed: a full reconcile of the policy, every NVIDIADriver again.
    let (config_map_tx, config_maps) = futures::channel::mpsc::unbounded();
    let full = wake.clone();
    let on_change = move || {
        full.full();
        let _ = config_map_tx.unbounded_send(());
    };
    let config_map_cache = Arc::new(ConfigMapCache::start(client, namespace, on_change, wake));
    let (feed, driver_daemonsets) = crate::controllers::driver::daemonset_feed();
    let daemonsets = live::start_daemonsets(client, namespace, wake, feed);
    let live = LiveCache::start(
        client,
        &applier,
        namespace,
        wake,
        config_map_cache.store(),
        daemonsets.clone(),
    )
    .await?;
    let nodes = NamedWriter::<SlimNode>::default();
    let policies = Writer::<DynamicObject>::new(crate::status::policy_resource());
    // Not served: the feed is dropped, so the DaemonSet watch's sends go nowhere.
    let drivers = served.then(|| (Writer::<NVIDIADriver>::default(), driver_daemonsets));
    let view = View {
        policies: policies.as_reader(),
        nodes: nodes.as_reader(),
        daemonsets,
        pods,
        config_maps: config_map_cache,
        drivers: drivers.as_ref().map(|(w, _)| w.as_reader()),
        live: Arc::new(live),
        wake: wake.clone(),
    };
    let feeds = Feeds {
        nodes,
        policies,
        drivers,
        config_maps,
    };
    Ok((Arc::new(view), feeds))
}

/// Start the signals over the view: the readiness timeline and allocatable gauges (fed by the
/// node watch through the returned sender, and by the validator pods' events through a tap
/// on the view's validator pod watch) and the Event series renewal.
fn start_signals(ctx: &Arc<Context>) -> futures::channel::mpsc::Sender<nodes::TimelineEvent> {
    let (timeline_tx, timeline_rx) =
        futures::channel::mpsc::channel(crate::signals::timeline::NODE_EVENTS);
    // Unbounded: about one validator pod a GPU node, and the timeline keeps up between them.
    let (validator_tx, validator_events) = futures::channel::mpsc::unbounded();
    let tapped = ctx.view.pods.tap_matching(
        &ctx.config.namespace,
        crate::signals::timeline::VALIDATOR_SELECTOR,
        move |ev| {
            let _ = validator_tx.unbounded_send(ev.clone());
        },
    );
    if !tapped {
        tracing::warn!("validator pod watch already running: no readiness timeline of validators");
    }
    // Drops kube's Event series cache once idle (after a rollout's per-node Events).
    tokio::spawn(ctx.recorder.clone().run_renewal());
    tokio::spawn(crate::signals::timeline::run(
        ctx.metrics.clone(),
        ctx.recorder.clone(),
        timeline_rx,
        validator_events,
    ));
    timeline_tx
}

/// A change feed that ends nowhere: `()` on each event.
type Changes = futures::channel::mpsc::UnboundedReceiver<()>;

/// The ClusterPolicy controller over one watch of the ClusterPolicies, which fills the view's
/// policy store through `writer` and reports what the controller does not: a deleted policy
/// makes every other one judged again (the next oldest becomes active; the first feed), and a
/// policy added, deleted, replaced or edited (a new generation;
/// [`kiln_core::singleton::PolicyRevisions`]) re-judges every NVIDIADriver (it renders with
/// the policy; the second feed) — a status write does not. The reflector writes an event to
/// the store before it passes it on, so whoever a change wakes reads the store with that
/// change.
fn policy_controller(
    ctx: &Arc<Context>,
    writer: Writer<DynamicObject>,
) -> (Controller<DynamicObject>, Changes, Changes) {
    use kube::runtime::WatchStreamExt;
    let ar = crate::status::policy_resource();
    let (deleted_tx, policy_deletes) = futures::channel::mpsc::unbounded();
    let (changed_tx, policy_changes) = futures::channel::mpsc::unbounded();
    let mut revisions = kiln_core::singleton::PolicyRevisions::default();
    let store = writer.as_reader();
    // The last policy deleted: no label rules for the node watch to apply (a GPUCluster's
    // controller labels the nodes then).
    let (labels, remaining) = (ctx.memo.labels.clone(), store.clone());
    let policies = watcher(
        Api::<DynamicObject>::all_with(ctx.client.clone(), &ar),
        crate::cluster::watch::config(),
    )
    .reflect(writer)
    .inspect(move |ev| {
        // A closed channel: that controller is not running (no NVIDIADriver CRD).
        match ev {
            Ok(watcher::Event::Delete(p)) => {
                revisions.deleted(&p.metadata);
                if remaining.is_empty() {
                    *labels.lock().expect("labels lock") = None;
                }
                let _ = deleted_tx.unbounded_send(());
                let _ = changed_tx.unbounded_send(());
            }
            // The operator's own status writes are most of a policy's events and change
            // nothing an NVIDIADriver render reads.
            // (The guard records the revision.)
            Ok(watcher::Event::Apply(p)) if revisions.applied(&p.metadata) => {
                let _ = changed_tx.unbounded_send(());
            }
            Ok(watcher::Event::InitApply(p)) => {
                revisions.applied(&p.metadata);
            }
            // A re-list (after a watch gap) may hold changes no Apply reported.
            Ok(watcher::Event::InitDone) => {
                let _ = changed_tx.unbounded_send(());
            }
            _ => {}
        }
    })
    .applied_objects();
    (
        Controller::for_stream_with(policies, store, ar),
        policy_deletes,
        policy_changes,
    )
}

/// Start the NVIDIADriver controller (a driver per node pool; [`crate::controllers::driver`])
/// over the view when its CRD is served (`drivers`); else drop its feeds, so the watches'
/// sends are dropped instead of queued for nobody.
fn start_drivers(
    ctx: &Arc<Context>,
    drivers: Option<(Writer<NVIDIADriver>, DaemonSetFeed)>,
    changes: impl futures::Stream<Item = ()> + Send + 'static,
    shutdown: &(impl std::future::Future<Output = ()> + Clone + Send + Sync + 'static),
) {
    let Some((writer, daemonsets)) = drivers else {
        return;
    };
    let mut driver = crate::controllers::driver::DriverContext::new(
        ctx.client.clone(),
        ctx.renderer.clone(),
        &ctx.config.namespace,
        &ctx.kubernetes_version,
        ctx.config.images.clone(),
        ctx.view.clone(),
    );
    driver.recorder = ctx.recorder.clone();
    driver.metrics = Some(ctx.metrics.clone());
    tokio::spawn(crate::controllers::driver::run(
        Arc::new(driver),
        writer,
        changes,
        daemonsets,
        shutdown.clone(),
    ));
}

/// Run `controller` to its end; with leader election, until the Lease is lost instead
/// ([`Error::LeadershipLost`]), and release the Lease after a clean end.
///
/// # Errors
/// [`Error::LeadershipLost`].
async fn lead(
    controller: impl std::future::Future<Output = ()>,
    ctx: &Context,
    metrics: &Metrics,
    lease: &LeaseConfig,
    mut elector: Elector,
) -> Result<()> {
    if !ctx.config.leader_election {
        controller.await;
        return Ok(());
    }
    tokio::select! {
        () = controller => {
            metrics.set_leader(false);
            if let Err(e) = leader::release(&ctx.client, lease).await {
                tracing::warn!(error = %e, "lease not released (it expires on its own)");
            }
            Ok(())
        }
        () = elector.hold(&ctx.client) => {
            metrics.set_leader(false);
            Err(Error::LeadershipLost)
        }
    }
}
