//! Wiring: metrics server, leader election, and the kube-runtime Controller.
//!
//! Triggers (no fixed polling at steady state):
//! - the ClusterPolicy itself (any change);
//! - DaemonSets in the operator namespace owned by a ClusterPolicy (status changes drive
//!   readiness);
//! - Node changes of a label the operator reads (a new GPU node, an opt-out label;
//!   [`crate::nodes::reads_label`], not GFD's timestamp) → every ClusterPolicy;
//! - a ClusterPolicy deleted → every ClusterPolicy (the next oldest becomes active).

use std::sync::Arc;

use futures::{StreamExt, future};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kiln_core::spec::ClusterPolicy;
use kiln_render::Renderer;
use kube::Client;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};

use crate::context::{Config, Context};
use crate::leader::{self, Elector, LeaseConfig};
use crate::metrics::{Metrics, MetricsAuth, MetricsAuthorizer, router};
use crate::reconcile::{error_policy, reconcile};
use crate::{Error, Result};

/// Async worker threads of the operator's runtime: reconciles are sequential per policy and
/// rendering runs on the blocking pool, so two workers keep watches, HTTP and leader election
/// responsive. Fixed rather than one per core, so memory (glibc keeps one malloc arena per
/// thread) does not grow with the node's core count.
pub const WORKER_THREADS: usize = 2;
/// Most threads of the blocking pool (plugin calls, one state at a time per reconcile).
pub const MAX_BLOCKING_THREADS: usize = 4;

/// The ClusterPolicies that own `ds` (owner references of kind `ClusterPolicy`, `nvidia.com/v1`),
/// keyed as the cluster-scoped objects they are. kube-runtime's `owns` keys an owner with its
/// child's namespace, which for a cluster-scoped owner is a second queue key for the same policy:
/// two workers then reconciled one policy at once (double applies, contradictory Events).
pub fn owning_policies(ds: DaemonSet) -> Vec<ObjectRef<ClusterPolicy>> {
    ds.metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .filter(|o| o.kind == "ClusterPolicy" && o.api_version == "nvidia.com/v1")
        .map(|o| ObjectRef::new(&o.name))
        .collect()
}

/// The Tokio runtime `kiln operator` runs on ([`WORKER_THREADS`], [`MAX_BLOCKING_THREADS`]).
///
/// # Errors
/// When the runtime cannot start its threads.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    crate::memory::limit_malloc_arenas();
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
    let app = router(metrics.clone(), auth);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });

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
    let ctx = Arc::new(Context::new(
        client.clone(),
        renderer,
        metrics.clone(),
        config.clone(),
        version,
    ));

    let policies: Api<ClusterPolicy> = Api::all(client.clone());
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &config.namespace);
    // Metadata only: the trigger looks at labels, and node status heartbeats then cost a small
    // PartialObjectMetadata decode instead of a full Node.
    // Only labels the operator reads wake it (not GFD's per-minute gfd.timestamp).
    let node_changes = crate::nodes::node_triggers(watcher(
        Api::<PartialObjectMeta<Node>>::all(client.clone()),
        watcher::Config::default(),
    ));
    let policy_deletes = watcher(policies.clone(), watcher::Config::default())
        .filter(|ev| future::ready(matches!(ev, Ok(watcher::Event::Delete(_)))))
        .map(|_| ());
    let controller = Controller::new(policies, watcher::Config::default())
        .watches(daemonsets, watcher::Config::default(), owning_policies)
        .reconcile_all_on(futures::stream::select(node_changes, policy_deletes))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            match res {
                Ok((obj, action)) => tracing::debug!(policy = %obj.name, ?action, "reconciled"),
                Err(e) => tracing::warn!(error = %e, "controller"),
            }
            future::ready(())
        });
    tracing::info!(namespace = %config.namespace, "controller running");
    if config.leader_election {
        tokio::select! {
            () = controller => {
                metrics.set_leader(false);
                if let Err(e) = leader::release(&client, &lease).await {
                    tracing::warn!(error = %e, "lease not released (it expires on its own)");
                }
                Ok(())
            }
            () = elector.hold(&client) => {
                metrics.set_leader(false);
                Err(Error::LeadershipLost)
            }
        }
    } else {
        controller.await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemonset_maps_to_its_cluster_scoped_policy_key() {
        let policy: ClusterPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "cluster-policy", "uid": "u1"}, "spec": {}
        }))
        .unwrap();
        let ds: DaemonSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "nvidia-dcgm-exporter", "namespace": "gpu-operator",
                "ownerReferences": [
                    {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                     "name": "cluster-policy", "uid": "u1", "controller": true},
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "u2"}
                ]}
        }))
        .unwrap();
        // The same key the controller gives the policy itself: no namespace.
        assert_eq!(owning_policies(ds), vec![ObjectRef::from_obj(&policy)]);
        assert!(owning_policies(DaemonSet::default()).is_empty());
    }
}
