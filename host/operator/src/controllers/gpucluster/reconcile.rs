//! One reconcile of the GPUCluster (see the [module docs](super)): every read from the
//! controller's stores, every write only when something changed.
//!
//! 1. Deleted (a deletion timestamp): nothing; the garbage collector deletes what it owns.
//! 2. A ClusterPolicy exists (the oldest, as [`kiln_core::singleton::active_policy`] picks
//!    it): `notReady`, `PrerequisiteNotMet` naming it; nothing applied or deleted.
//! 3. Parse ([`GpuClusterDoc::from_object`]; an invalid spec: `ReconcileFailed`, nothing
//!    changed); label the operator namespace for admin access (once per process); label the
//!    nodes ([`super::labels::plan`]).
//! 4. Render every enabled DRA state (cached per spec and context); apply each state's objects
//!    in order, labelled [`DRA_STATE_LABEL`] and owned by the GPUCluster; delete every owned,
//!    labelled object no state renders any more (a failed state keeps its objects).
//! 5. Judge the applied DaemonSets and Deployments from the cache and write the status when it
//!    changed ([`Verdict`]).

use std::collections::BTreeSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_core::plan::ObjectKey;
use kiln_core::spec::gpucluster::{DraState, GpuClusterStatus};
use kiln_render::Renderer;
use kiln_render::gpucluster::GpuClusterDoc;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::DRA_STATE_LABEL;
use super::live::{DraLive, Meta};
use super::verdict::Verdict;
use crate::apply::{Applier, FIELD_MANAGER, Outcome, key_of};
use crate::cluster::node::SlimNode;
use crate::cluster::store::NamedStore;
use crate::{Error, Result};

/// The stores a reconcile reads.
pub struct GpuCaches {
    /// The GPUClusters (the controller's store).
    pub clusters: Store<DynamicObject>,
    /// The ClusterPolicies' metadata.
    pub policies: Store<Meta>,
    /// The operator's node store.
    pub nodes: NamedStore<SlimNode>,
    /// The labelled objects.
    pub live: DraLive,
}

/// What reconciles remember between them.
#[derive(Default)]
pub struct Memo {
    /// The last render: its inputs' digest and each enabled state's objects or error.
    render: Option<(u64, Rendered)>,
    /// The operator namespace carries [`super::ADMIN_ACCESS_LABEL`] (set by this process).
    namespace_labelled: bool,
}

/// Each enabled state's objects, or why it failed.
type Rendered = Vec<(DraState, std::result::Result<Vec<Value>, String>)>;

/// Everything a reconcile needs.
pub struct GpuContext {
    /// API client.
    pub client: Client,
    /// Server-side apply (this controller's own, with its own record of what it applied).
    pub applier: Applier,
    /// Renders the DRA states through their plugins.
    pub renderer: Renderer,
    /// The operator namespace (the namespaced operands').
    pub namespace: String,
    /// The API server's version.
    pub kubernetes_version: String,
    /// Fallback image overrides (`env`, image), as the operator's configuration gives them.
    pub images: Vec<(String, String)>,
    /// The DeviceClass `apiVersion` ([`device_class_api`]).
    pub device_class_api: String,
    /// What reconciles read.
    pub caches: GpuCaches,
    /// The render cache and the namespace label's record.
    pub memo: Mutex<Memo>,
}

/// The `resource.k8s.io` version the cluster serves DeviceClasses at, newest first
/// ([`super::DEVICE_CLASS_APIS`]); the GA version when none is served (the apply then skips
/// them as not served).
///
/// # Errors
/// [`Error::Kube`] on discovery failures other than "not served".
pub async fn device_class_api(applier: &Applier) -> Result<String> {
    for api in super::DEVICE_CLASS_APIS {
        if applier.serves(api, "DeviceClass").await? {
            return Ok(api.to_string());
        }
    }
    Ok(super::DEVICE_CLASS_APIS[0].to_string())
}

/// A digest of every node's name and labels (the node poll's; order-independent).
pub fn node_digest(nodes: &[Arc<SlimNode>]) -> u64 {
    let mut lines: Vec<String> = nodes
        .iter()
        .map(|n| {
            let labels: Vec<String> = n.labels().iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{} {}", n.name(), labels.join(","))
        })
        .collect();
    lines.sort();
    let mut h = DefaultHasher::new();
    lines.hash(&mut h);
    h.finish()
}

/// The controller's error policy: retry after 10 s.
pub fn error_policy(_gc: Arc<DynamicObject>, err: &Error, _ctx: Arc<GpuContext>) -> Action {
    tracing::warn!(error = %err, "GPUCluster reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

/// Reconcile the GPUCluster `gc` (the controller's reconcile function; see the module docs).
///
/// # Errors
/// [`Error`] from a request that failed outside a single state (node labels, the namespace
/// label, a delete, the status write).
pub async fn reconcile(gc: Arc<DynamicObject>, ctx: Arc<GpuContext>) -> Result<Action> {
    let name = gc.name_any();
    // The freshest copy: the store's.
    let gc = ctx
        .caches
        .clusters
        .state()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some(&name))
        .unwrap_or(gc);
    if gc.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let policies = ctx.caches.policies.state();
    if let Some(policy) = kiln_core::singleton::active_policy(policies.iter().map(|p| &p.metadata))
    {
        tracing::info!(policy, "a ClusterPolicy exists: the GPUCluster waits");
        write_status(&ctx, &gc, &Verdict::cluster_policy_exists(policy)).await?;
        return Ok(Action::await_change());
    }
    let raw = serde_json::to_value(&*gc).map_err(|e| Error::Json {
        action: format!("serialize GPUCluster {name}"),
        source: e,
    })?;
    let doc = match GpuClusterDoc::from_object(&raw) {
        Ok(d) => d,
        Err(e) => {
            write_status(&ctx, &gc, &Verdict::invalid(&e.to_string())).await?;
            return Ok(Action::await_change());
        }
    };
    label_namespace(&ctx).await?;
    let nodes = label_nodes(&ctx).await?;
    let node_refs: Vec<&SlimNode> = nodes.iter().map(AsRef::as_ref).collect();
    let rendered = render(&ctx, &doc, &node_refs).await;
    let owner = json!({
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "GPUCluster",
        "name": name,
        "uid": gc.metadata.uid.clone().unwrap_or_default(),
        "controller": true,
        "blockOwnerDeletion": true,
    });
    if !ctx
        .caches
        .live
        .ready(crate::cluster::watch::LIVE_READY_LIMIT)
        .await
    {
        tracing::warn!(
            "the GPUCluster's object caches have not listed yet; deleting only what they hold"
        );
    }
    let mut failed: Option<(DraState, String)> = None;
    let mut workloads = Vec::new();
    let mut keep: BTreeSet<ObjectKey> = BTreeSet::new();
    let mut failed_states: BTreeSet<&'static str> = BTreeSet::new();
    for (state, result) in &rendered {
        let outcome = match result {
            Ok(objects) => {
                keep.extend(objects.iter().filter_map(ObjectKey::of));
                apply_state(&ctx, *state, objects, &owner, &mut workloads).await
            }
            Err(e) => Err(e.clone()),
        };
        if let Err(e) = outcome {
            tracing::warn!(%state, error = %e, "GPUCluster state failed");
            failed_states.insert(state.name());
            failed.get_or_insert((*state, e));
        }
    }
    for stale in
        ctx.caches.live.objects().into_iter().filter(|l| {
            l.owned && !keep.contains(&l.key) && !failed_states.contains(l.state.as_str())
        })
    {
        tracing::info!(kind = %stale.key.kind, name = %stale.key.name, "deleting what the GPUCluster no longer renders");
        ctx.applier.delete(&stale.key).await?;
    }
    let verdict = match failed {
        Some((state, e)) => Verdict::state_failed(state.name(), &e),
        None if workloads
            .iter()
            .any(|w| not_ready(&ctx, w, &node_refs).is_some()) =>
        {
            Verdict::operand_not_ready()
        }
        None => Verdict::Ready,
    };
    write_status(&ctx, &gc, &verdict).await?;
    Ok(match verdict {
        Verdict::Ready => Action::await_change(),
        // Judged again from the caches (no request); DaemonSet events wake it sooner.
        Verdict::NotReady { .. } => Action::requeue(Duration::from_secs(30)),
    })
}

/// A workload whose readiness decides the verdict: (kind, name) in the operator namespace.
type Workload = (&'static str, String);

/// Why the applied workload `w` is not ready, from the cache; `None` when ready. A DaemonSet is
/// ready when its controller saw its last generation, every desired pod is updated and
/// available, and it covers every node its `nodeSelector` matches
/// ([`kiln_core::plan::uncovered_nodes`]); a Deployment when it saw its last generation and
/// every replica is updated and ready.
pub fn not_ready(ctx: &GpuContext, w: &Workload, nodes: &[&SlimNode]) -> Option<String> {
    let ns = &ctx.namespace;
    match w.0 {
        "DaemonSet" => {
            let Some(ds) = ctx.caches.live.daemonset(ns, &w.1) else {
                return Some(format!("DaemonSet {} not observed yet", w.1));
            };
            daemonset_not_ready(&ds, nodes)
        }
        _ => {
            let Some(d) = ctx.caches.live.deployment(ns, &w.1) else {
                return Some(format!("Deployment {} not observed yet", w.1));
            };
            deployment_not_ready(&d)
        }
    }
}

/// Why DaemonSet `ds` is not ready (see [`not_ready`]); `None` when it is.
pub fn daemonset_not_ready(ds: &DaemonSet, nodes: &[&SlimNode]) -> Option<String> {
    let name = ds.name_any();
    let generation = ds.metadata.generation.unwrap_or_default();
    let Some(s) = &ds.status else {
        return Some(format!("DaemonSet {name} has no status yet"));
    };
    if s.observed_generation.unwrap_or_default() < generation {
        return Some(format!(
            "DaemonSet {name} generation {generation} not observed yet"
        ));
    }
    let desired = s.desired_number_scheduled;
    let updated = s.updated_number_scheduled.unwrap_or_default();
    let available = s.number_available.unwrap_or_default();
    if updated < desired || available < desired || s.number_unavailable.unwrap_or_default() > 0 {
        return Some(format!(
            "DaemonSet {name}: {available} of {desired} pods available, {updated} updated"
        ));
    }
    kiln_core::plan::uncovered_nodes(ds, nodes.iter().copied()).map(|(matching, desired)| {
        format!("DaemonSet {name}: {desired} pods desired for {matching} matching nodes")
    })
}

/// Why Deployment `d` is not ready (see [`not_ready`]); `None` when it is.
pub fn deployment_not_ready(d: &Deployment) -> Option<String> {
    let name = d.name_any();
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let generation = d.metadata.generation.unwrap_or_default();
    let s = d.status.clone().unwrap_or_default();
    let ready = s.ready_replicas.unwrap_or_default();
    let updated = s.updated_replicas.unwrap_or_default();
    (s.observed_generation.unwrap_or_default() < generation || ready < want || updated < want)
        .then(|| format!("Deployment {name}: {ready} of {want} replicas ready"))
}

/// `obj` as applied for `state`: [`DRA_STATE_LABEL`] set, `ownerReferences` replaced by
/// `[owner]` (the GPUCluster's controller reference).
pub fn desired_object(obj: &Value, state: DraState, owner: &Value) -> Value {
    let mut desired = obj.clone();
    if !desired["metadata"]["labels"].is_object() {
        desired["metadata"]["labels"] = json!({});
    }
    desired["metadata"]["labels"][DRA_STATE_LABEL] = json!(state.name());
    desired["metadata"]["ownerReferences"] = json!([owner]);
    desired
}

/// Apply `state`'s `objects` in order, skipping those the cache shows unchanged since this
/// process applied them; adds its DaemonSets and Deployments to `workloads`.
async fn apply_state(
    ctx: &GpuContext,
    state: DraState,
    objects: &[Value],
    owner: &Value,
    workloads: &mut Vec<Workload>,
) -> std::result::Result<(), String> {
    for obj in objects {
        let desired = desired_object(obj, state, owner);
        let key = key_of(&desired).map_err(|e| e.to_string())?;
        let current = ctx
            .caches
            .live
            .marker(&key)
            .is_some_and(|m| ctx.applier.is_current(&desired, &m));
        if !current {
            let (outcome, _) = ctx
                .applier
                .apply(&desired)
                .await
                .map_err(|e| e.to_string())?;
            if outcome == Outcome::KindNotServed {
                continue;
            }
        }
        match key.kind.as_str() {
            "DaemonSet" => workloads.push(("DaemonSet", key.name.clone())),
            "Deployment" => workloads.push(("Deployment", key.name.clone())),
            _ => {}
        }
    }
    Ok(())
}

/// Label the operator namespace [`super::ADMIN_ACCESS_LABEL`]`=true` (a merge patch, once per
/// process).
async fn label_namespace(ctx: &GpuContext) -> Result<()> {
    if ctx.memo.lock().expect("memo lock").namespace_labelled {
        return Ok(());
    }
    Api::<Namespace>::all(ctx.client.clone())
        .patch(
            &ctx.namespace,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {super::ADMIN_ACCESS_LABEL: "true"}}})),
        )
        .await
        .map_err(|e| Error::kube(format!("label namespace {}", ctx.namespace), e))?;
    ctx.memo.lock().expect("memo lock").namespace_labelled = true;
    Ok(())
}

/// Patch each node whose GPUCluster labels are not right ([`super::labels::plan`]); returns
/// every node, a patched one as it is now labelled.
async fn label_nodes(ctx: &GpuContext) -> Result<Vec<Arc<SlimNode>>> {
    let api = Api::<Node>::all(ctx.client.clone());
    let mut nodes = ctx.caches.nodes.state();
    nodes.sort_by(|a, b| a.name().cmp(b.name()));
    for node in &mut nodes {
        let labels = node.labels().to_map();
        let patch = super::labels::plan(&labels);
        if patch.is_empty() {
            continue;
        }
        let body: serde_json::Map<String, Value> = patch
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().map_or(Value::Null, Value::String)))
            .collect();
        tracing::info!(node = node.name(), ?patch, "GPUCluster node labels");
        api.patch(
            node.name(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": body}})),
        )
        .await
        .map_err(|e| Error::kube(format!("patch labels of node {}", node.name()), e))?;
        *node = Arc::new(node.with_labels(&kiln_core::labels::apply_patch(&labels, &patch)));
    }
    Ok(nodes)
}

/// Every enabled state's render, from the cache when the spec and the context are those of
/// the last render.
async fn render(ctx: &GpuContext, doc: &GpuClusterDoc, nodes: &[&SlimNode]) -> Rendered {
    let mut base = kiln_render::defaults::render_context();
    base.operator_namespace = ctx.namespace.clone();
    base.kubernetes_version = ctx.kubernetes_version.clone();
    for (env, image) in &ctx.images {
        kiln_render::defaults::set_fallback_image(&mut base, env, image);
    }
    let tctx = crate::cluster::facts::transform_context(&base, nodes);
    let mut h = DefaultHasher::new();
    (&doc.spec_text, format!("{tctx:?}"), &ctx.device_class_api).hash(&mut h);
    let digest = h.finish();
    if let Some((d, r)) = &ctx.memo.lock().expect("memo lock").render
        && *d == digest
    {
        return r.clone();
    }
    let (renderer, doc2, api) = (
        ctx.renderer.clone(),
        doc.clone(),
        ctx.device_class_api.clone(),
    );
    let rendered: Rendered = tokio::task::spawn_blocking(move || {
        kiln_render::gpucluster::render(&renderer, &doc2, &tctx, &api)
            .into_iter()
            .map(|(s, r)| (s, r.map_err(|e| e.to_string())))
            .collect()
    })
    .await
    .unwrap_or_else(|e| {
        DraState::enabled_states(&doc.spec)
            .into_iter()
            .map(|s| (s, Err(format!("render task: {e}"))))
            .collect()
    });
    let released = crate::memory::release_idle_memory(&ctx.renderer);
    tracing::debug!(
        plugins = released,
        "released loaded plugins after the GPUCluster render"
    );
    if rendered.iter().all(|(_, r)| r.is_ok()) {
        ctx.memo.lock().expect("memo lock").render = Some((digest, rendered.clone()));
    }
    rendered
}

/// Write `verdict` into the GPUCluster's status (a merge patch of `status`) when it changes
/// what the cached GPUCluster holds.
async fn write_status(ctx: &GpuContext, gc: &DynamicObject, verdict: &Verdict) -> Result<()> {
    let current: GpuClusterStatus = gc
        .data
        .get("status")
        .and_then(|s| serde_json::from_value(s.clone()).ok())
        .unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let next = verdict.status(&current, &ctx.namespace, &now);
    if next == current {
        return Ok(());
    }
    let name = gc.name_any();
    let body = json!({"status": serde_json::to_value(&next).map_err(|e| Error::Json {
        action: "serialize GPUCluster status".into(),
        source: e,
    })?});
    Api::<DynamicObject>::all_with(ctx.client.clone(), &super::gpu_cluster_resource())
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(&body),
        )
        .await
        .map_err(|e| Error::kube(format!("write status of GPUCluster {name}"), e))?;
    tracing::info!(state = ?next.state, "GPUCluster status");
    Ok(())
}
