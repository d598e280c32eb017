//! The GPUCluster controller (`nvidia.com/v1alpha1`, the cluster-scoped singleton
//! `gpu-cluster`; NVIDIA v26.7.0's `GPUClusterReconciler`): it deploys the DRA enablement stack
//! beside (never with) a ClusterPolicy — NVIDIA's DRA driver for GPUs, the DRA validation,
//! DCGM and the exporter — from the DRA states' assets and standard plugins
//! ([`kiln_render::gpucluster`]), and reports `status.state` `ready` / `notReady` with
//! NVIDIA's conditions ([`verdict`]). The driver comes from the host or from NVIDIADriver CRs,
//! which the NVIDIADriver controller reconciles without a ClusterPolicy
//! ([`kiln_render::nvidiadriver::standalone_policy`]); this controller labels the GPU nodes
//! `nvidia.com/gpu.deploy.driver=true` for them ([`labels`]).
//!
//! ```text
//! GPUCluster watch ─┐
//! ClusterPolicies (metadata watch) ─┤
//! labelled objects (DraLive) ───────┼─► reconcile ─► a ClusterPolicy? ─► notReady, PrerequisiteNotMet
//! node store (polled, no request) ──┘               parse ─► namespace admin-access label
//!                                                   ─► node deploy labels ─► render each DRA state
//!                                                   ─► apply (labelled kiln.dev/dra-state, owned)
//!                                                   ─► delete what is no longer rendered
//!                                                   ─► readiness (DaemonSets, Deployment) ─► status
//! ```
//!
//! Reads come from watches only (this module's own stores: the GPUCluster, the ClusterPolicies'
//! metadata, the labelled objects; the operator's node store): at rest a reconcile sends no
//! request — a render is cached per spec and context, an object whose desired form was applied
//! and whose live marker has not moved is skipped ([`crate::apply::Applier::is_current`]),
//! nodes already labelled get no patch, and the status is written only when it changes.
//! Ownership: every object carries the GPUCluster's controller reference (deleting the
//! GPUCluster lets the garbage collector delete them) and [`DRA_STATE_LABEL`], by which what
//! it no longer renders is found and deleted, also after a restart.

pub mod labels;
pub mod live;
pub mod reconcile;
pub mod verdict;

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, future};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::{Controller, WatchStreamExt, reflector, watcher};

use crate::Result;
use crate::cluster::node::SlimNode;
use crate::cluster::store::NamedStore;
use crate::context::Context;

/// The label on every object the GPUCluster controller applies, naming the DRA state that
/// rendered it (`kiln.dev/dra-state=dra-driver`); deletion is decided from it. A label of its
/// own: the ClusterPolicy's objects carry `kiln.dev/state`, so neither controller's pruning
/// can reach the other's objects.
pub const DRA_STATE_LABEL: &str = "kiln.dev/dra-state";

/// The namespace label the kube-scheduler requires before it admits `adminAccess: true` in a
/// ResourceClaim or ResourceClaimTemplate (DCGM's and the exporter's); set on the operator
/// namespace and never removed (upstream: other admin-access consumers may rely on it).
pub const ADMIN_ACCESS_LABEL: &str = "resource.kubernetes.io/admin-access";

/// The `resource.k8s.io` versions a DeviceClass may be served at, newest first: the first the
/// cluster serves is the DeviceClasses' `apiVersion` (upstream takes it from discovery too).
pub const DEVICE_CLASS_APIS: [&str; 3] = [
    "resource.k8s.io/v1",
    "resource.k8s.io/v1beta2",
    "resource.k8s.io/v1beta1",
];

/// How often the node store is looked at for a node whose labels changed (a new GPU node, a
/// GPU gone, a deploy label removed by hand): a read of the operator's node cache, no request.
pub const NODE_POLL: Duration = Duration::from_secs(10);

/// The GPUCluster API resource (`nvidia.com/v1alpha1`, `gpuclusters`, cluster-scoped).
pub fn gpu_cluster_resource() -> ApiResource {
    ApiResource::erase::<kiln_core::spec::gpucluster::GPUCluster>(&())
}

/// The ClusterPolicy API resource (`nvidia.com/v1`, `clusterpolicies`).
fn cluster_policy_resource() -> ApiResource {
    ApiResource::erase::<kiln_core::spec::ClusterPolicy>(&())
}

/// Start the GPUCluster controller when the cluster serves the GPUCluster CRD: its watches
/// (the GPUClusters, the ClusterPolicies' metadata, the labelled objects of [`live`]), a poll of
/// `nodes` (the operator's node store; [`NODE_POLL`]) and the controller, which stops on
/// `shutdown`. Reads `ctx`'s client, renderer, configuration and server version only.
///
/// # Errors
/// [`crate::Error::Kube`] when discovery fails.
pub async fn start(
    ctx: &Context,
    nodes: NamedStore<SlimNode>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let applier = crate::apply::Applier::new(ctx.client.clone());
    if !applier.serves("nvidia.com/v1alpha1", "GPUCluster").await? {
        return Ok(());
    }
    let device_class_api = reconcile::device_class_api(&applier).await?;
    let (wake, wakes) = futures::channel::mpsc::unbounded::<()>();
    let live = live::DraLive::start(
        &ctx.client,
        &applier,
        &ctx.config.namespace,
        &device_class_api,
        &wake,
    )
    .await?;
    let policy_writer = reflector::store::Writer::<live::Meta>::new(cluster_policy_resource());
    let policies = policy_writer.as_reader();
    let policy_wake = wake.clone();
    tokio::spawn(
        reflector::reflector(
            policy_writer,
            watcher(
                Api::<live::Meta>::all_with(ctx.client.clone(), &cluster_policy_resource()),
                crate::cluster::watch::config(),
            )
            .default_backoff(),
        )
        .for_each(move |ev| {
            if ev.is_ok() {
                let _ = policy_wake.unbounded_send(());
            }
            future::ready(())
        }),
    );
    tokio::spawn(poll_nodes(nodes.clone(), wake.clone()));
    let ar = gpu_cluster_resource();
    let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
    let clusters = writer.as_reader();
    let stream = watcher(
        Api::<DynamicObject>::all_with(ctx.client.clone(), &ar),
        crate::cluster::watch::config(),
    )
    .default_backoff()
    .reflect(writer)
    .applied_objects();
    let gctx = Arc::new(reconcile::GpuContext {
        client: ctx.client.clone(),
        applier,
        renderer: ctx.renderer.clone(),
        namespace: ctx.config.namespace.clone(),
        kubernetes_version: ctx.kubernetes_version.clone(),
        images: ctx.config.images.clone(),
        device_class_api,
        caches: reconcile::GpuCaches {
            clusters: clusters.clone(),
            policies,
            nodes,
            live,
        },
        memo: std::sync::Mutex::default(),
    });
    let controller = Controller::for_stream_with(stream, clusters, ar)
        .reconcile_all_on(wakes)
        .graceful_shutdown_on(shutdown)
        .run(reconcile::reconcile, reconcile::error_policy, gctx)
        .for_each(|res| {
            if let Err(e) = res {
                tracing::warn!(error = %e, "GPUCluster controller");
            }
            future::ready(())
        });
    tokio::spawn(controller);
    tracing::info!("GPUCluster controller running");
    Ok(())
}

/// Wake the controller when the labels of the nodes change (a digest of every node's name and
/// labels, taken from the store every [`NODE_POLL`]; no request).
async fn poll_nodes(
    nodes: NamedStore<SlimNode>,
    wake: futures::channel::mpsc::UnboundedSender<()>,
) {
    let mut last = None;
    loop {
        tokio::time::sleep(NODE_POLL).await;
        let digest = reconcile::node_digest(&nodes.state());
        if last.is_some_and(|l| l != digest) && wake.unbounded_send(()).is_err() {
            return;
        }
        last = Some(digest);
    }
}
