//! Wiring: metrics server, leader election, and the kube-runtime Controller.
//!
//! Triggers (no fixed polling at steady state), all read from caches the watches fill (kube
//! reflector stores; the node and pod stores are [`crate::cluster::store`]'s name-keyed ones):
//! - the ClusterPolicy itself (any change; one watch fills the policy cache the controller and
//!   the NVIDIADriver reconciler read, [`crate::context::Caches::policies`]);
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

use crate::context::{Config, Context};
use crate::controllers::policy::reconcile::{error_policy, reconcile};
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
/// The starts, in order: the health and metrics server, leadership, the shared watches
/// ([`start_watches`]: pods, ConfigMaps, DaemonSets, nodes), the signals (Event renewal and
/// the readiness timeline), the ClusterPolicy watch and controller ([`policy_controller`]),
/// the driver upgrade, the NVIDIADriver controller ([`start_drivers`]), then leading until
/// `shutdown` ([`lead`]).
///
/// # Errors
/// [`Error::Serve`] when the metrics address cannot be bound; [`Error::Kube`] when the server
/// version cannot be read; [`Error::LeadershipLost`].
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
    let mut ctx = Context::new(client.clone(), renderer, metrics.clone(), config, version);
    let (wake, wakes) = crate::cluster::live::Wake::channel();
    ctx.caches.wake = wake.clone();
    let ctx = Arc::new(ctx);
    let watches = start_watches(&ctx, &wake);
    let (controller, policy_deletes, policy_changes) = policy_controller(&ctx);
    // Rolling driver upgrades of the ClusterPolicy's driver ([`crate::controllers::upgrade`]), reading the
    // reconciler's caches.
    let upgrader = crate::controllers::upgrade::Upgrader::start(
        client.clone(),
        crate::controllers::upgrade::UpgradeConfig {
            validation_timeout: ctx.config.upgrade_validation_timeout,
            identity: ctx.config.identity.clone(),
            namespace: ctx.config.namespace.clone(),
        },
        crate::controllers::upgrade::Sources {
            nodes: watches.nodes.clone(),
            pods: watches.pods.clone(),
            changed: wake.upgrade_notify(),
        },
    );
    tokio::spawn(crate::controllers::upgrade::run_cluster_policy(
        upgrader.clone(),
        ctx.clone(),
        shutdown.clone(),
    ));
    crate::controllers::gpucluster::start(&ctx, watches.nodes.clone(), shutdown.clone()).await?;
    start_drivers(&ctx, watches, upgrader, &wake, policy_changes, &shutdown).await?;
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

/// What [`start_watches`] started and hands on: the stores the controllers and the upgrade
/// read, and the change feeds of the NVIDIADriver controller.
struct Watches {
    /// The node store ([`crate::controllers::policy::nodes::watch_nodes`]).
    nodes: crate::cluster::store::NamedStore<crate::cluster::node::SlimNode>,
    /// The pod watches (`OnDelete` DaemonSets' pods and revisions, the validator pods).
    pods: Arc<crate::cluster::readiness::PodWatches>,
    /// Every DaemonSet of the namespace ([`crate::cluster::live::start_daemonsets`]).
    daemonsets: kube::runtime::reflector::Store<k8s_openapi::api::apps::v1::DaemonSet>,
    /// The NVIDIADriver side of the DaemonSet watch ([`crate::controllers::driver::daemonset_feed`]).
    driver_daemonsets: crate::controllers::driver::DaemonSetFeed,
    /// Node pool changes ([`crate::controllers::policy::nodes::NodeWatch::pools`]).
    pools: futures::channel::mpsc::UnboundedReceiver<()>,
    /// Changes of a referenced ConfigMap ([`crate::cluster::facts::ConfigMapCache`]).
    config_maps: futures::channel::mpsc::UnboundedReceiver<()>,
}

/// Start the shared watches and the signals they feed, each once, and set them in `ctx`'s
/// caches: the pod watches (with the validator pods' tap feeding the readiness timeline), the
/// Event series renewal, the readiness timeline, the ConfigMaps' metadata, every DaemonSet of
/// the namespace (one watch for both controllers), and the nodes.
fn start_watches(ctx: &Arc<Context>, wake: &crate::cluster::live::Wake) -> Watches {
    let (client, namespace) = (&ctx.client, &ctx.config.namespace);
    // Per-node readiness timeline and allocatable gauges, while this replica leads, fed by the
    // node watch below and the validator pods' events from the driver upgrade's watch of them.
    let (timeline_tx, timeline_rx) =
        futures::channel::mpsc::channel(crate::signals::timeline::NODE_EVENTS);
    let pods = Arc::new(crate::cluster::readiness::PodWatches::new(
        client.clone(),
        wake.clone(),
    ));
    // Unbounded: about one validator pod a GPU node, and the timeline keeps up between them.
    let (validator_tx, validator_events) = futures::channel::mpsc::unbounded();
    let tapped = pods.tap_matching(
        namespace,
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
    let _ = ctx.caches.pods.set(pods.clone());
    // A referenced ConfigMap changed: a full reconcile of the policy, every NVIDIADriver again.
    let (config_map_tx, config_maps) = futures::channel::mpsc::unbounded();
    let config_map_wake = wake.clone();
    let cache = crate::cluster::facts::ConfigMapCache::start(
        client,
        namespace,
        move || {
            config_map_wake.full();
            let _ = config_map_tx.unbounded_send(());
        },
        wake,
    );
    let _ = ctx.caches.config_maps.set(Arc::new(cache));
    // One watch of the namespace's DaemonSets for both controllers (the NVIDIADriver side's
    // feed is dropped unless its CRD is served).
    let (daemonset_feed, driver_daemonsets) = crate::controllers::driver::daemonset_feed();
    let daemonsets =
        crate::cluster::live::start_daemonsets(client, namespace, wake, daemonset_feed);
    let _ = ctx.caches.daemonsets.set(daemonsets.clone());
    // Node pool changes for the NVIDIADriver controller (dropped unless its CRD is served).
    let (pools_tx, pools) = futures::channel::mpsc::unbounded();
    let node_writer =
        crate::cluster::store::NamedWriter::<crate::cluster::node::SlimNode>::default();
    let nodes = node_writer.as_reader();
    ctx.caches.set_nodes(node_writer.as_reader());
    tokio::spawn(crate::controllers::policy::nodes::watch_nodes(
        crate::controllers::policy::nodes::NodeWatch {
            client: client.clone(),
            wake: wake.clone(),
            labels: ctx.caches.labels.clone(),
            metrics: ctx.metrics.clone(),
            timeline: Some(timeline_tx),
            pools: Some(pools_tx),
        },
        node_writer,
    ));
    Watches {
        nodes,
        pods,
        daemonsets,
        driver_daemonsets,
        pools,
        config_maps,
    }
}

/// A change feed that ends nowhere: `()` on each event.
type Changes = futures::channel::mpsc::UnboundedReceiver<()>;

/// The ClusterPolicy controller over one watch of the ClusterPolicies, which fills the
/// controller's store (the policy cache, set in `ctx`) and reports what the controller does
/// not: a deleted policy makes every other one judged again (the next oldest becomes active;
/// the first feed), and a policy added, deleted, replaced or edited (a new generation;
/// [`kiln_core::singleton::PolicyRevisions`]) re-judges every NVIDIADriver (it renders with
/// the policy; the second feed) — a status write does not. The reflector writes an event to
/// the store before it passes it on, so whoever a change wakes reads the store with that
/// change.
fn policy_controller(ctx: &Arc<Context>) -> (Controller<DynamicObject>, Changes, Changes) {
    use kube::runtime::WatchStreamExt;
    let ar = crate::status::policy_resource();
    let (deleted_tx, policy_deletes) = futures::channel::mpsc::unbounded();
    let (changed_tx, policy_changes) = futures::channel::mpsc::unbounded();
    let mut revisions = kiln_core::singleton::PolicyRevisions::default();
    let writer = kube::runtime::reflector::store::Writer::<DynamicObject>::new(ar.clone());
    let store = writer.as_reader();
    ctx.caches.set_policies(store.clone());
    // The last policy deleted: no label rules for the node watch to apply (a GPUCluster's
    // controller labels the nodes then).
    let (labels, remaining) = (ctx.caches.labels.clone(), store.clone());
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

/// Start the NVIDIADriver controller (a driver per node pool; [`crate::controllers::driver`]) when
/// its CRD is served, reading the same stores as the ClusterPolicy reconciler; else close its
/// feeds, so the watches' sends are dropped instead of queued for nobody.
///
/// # Errors
/// [`Error::Kube`] when discovery or the labelled objects' cache fails.
async fn start_drivers(
    ctx: &Arc<Context>,
    watches: Watches,
    upgrader: Arc<crate::controllers::upgrade::Upgrader>,
    wake: &crate::cluster::live::Wake,
    policy_changes: Changes,
    shutdown: &(impl std::future::Future<Output = ()> + Clone + Send + Sync + 'static),
) -> Result<()> {
    if !ctx
        .applier
        .serves("nvidia.com/v1alpha1", "NVIDIADriver")
        .await?
    {
        drop((watches, policy_changes));
        return Ok(());
    }
    let mut drivers = crate::controllers::driver::DriverContext::new(
        ctx.client.clone(),
        ctx.renderer.clone(),
        &ctx.config.namespace,
        &ctx.kubernetes_version,
        ctx.config.images.clone(),
    );
    drivers.upgrader = Some(upgrader);
    drivers.recorder = ctx.recorder.clone();
    drivers.metrics = Some(ctx.metrics.clone());
    drivers.caches = crate::controllers::driver::DriverCaches {
        nodes: ctx.caches.nodes().cloned(),
        policies: ctx.caches.policies().cloned(),
        pods: ctx.caches.pods.get().cloned(),
        config_maps: ctx.caches.config_maps.get().cloned(),
        live: Some(ctx.shared_live().await?.clone()),
        drivers: ctx.caches.drivers.clone(),
        ..Default::default()
    };
    let _ = drivers.caches.daemonsets.set(watches.daemonsets);
    tokio::spawn(crate::controllers::driver::run(
        Arc::new(drivers),
        wake.clone(),
        futures::stream::select(
            futures::stream::select(watches.pools, policy_changes),
            watches.config_maps,
        ),
        watches.driver_daemonsets,
        shutdown.clone(),
    ));
    Ok(())
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
