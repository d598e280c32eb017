//! One reconcile of one ClusterPolicy (upstream `gpu-operator.md` §2.2, with kiln's choices):
//!
//! 1. List every ClusterPolicy; a non-active one (not the oldest) gets `ignored` written, naming
//!    the active one, and nothing else happens.
//! 2. Parse the policy ([`Policy::from_object`]); an invalid one gets `Error`/`ReconcileFailed`
//!    naming the field and nothing is deleted or applied.
//! 3. Label the nodes ([`crate::nodes`]).
//! 4. For each state in order: enabled → render through the plugin chain, apply each object
//!    (DaemonSets only when GPU nodes exist, as upstream), judge DaemonSet readiness, delete
//!    objects the chain left out; a failing chain keeps the last applied objects and marks only
//!    that state. Disabled → delete its objects.
//! 5. Judge ([`kiln_core::status::judge`]), write status when changed, Event on transitions.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kiln_core::State;
use kiln_core::context::TransformContext;
use kiln_core::labels::LabelPolicy;
use kiln_core::singleton::active_policy;
use kiln_core::spec::ClusterPolicy;
use kiln_core::status::{Observation, StateResult, Verdict, judge, requeue_after};
use kiln_render::{Policy, RenderedState};
use kube::Resource;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::runtime::controller::Action;

use crate::apply::{ObjKey, Outcome};
use crate::context::Context;
use crate::nodes::{NodeSummary, label_nodes, list_nodes};
use crate::status::write_status;
use crate::{Error, Result, facts, readiness};

/// Objects applied per state by this process (so objects a site plugin stops producing are
/// deleted too, not only the ones named in `assets/`).
#[derive(Default)]
pub struct Applied(Mutex<HashMap<State, BTreeSet<ObjKey>>>);

/// Reconcile `policy`: the controller's reconcile function. On an API failure the status gets
/// `ReconcileFailed` (best effort) and the error goes to the controller's error policy.
///
/// # Errors
/// [`Error`] from the first API request that failed outside a single state.
pub async fn reconcile(policy: Arc<ClusterPolicy>, ctx: Arc<Context>) -> Result<Action> {
    let start = Instant::now();
    let res = reconcile_policy(&policy, &ctx).await;
    ctx.metrics.reconciled(start.elapsed());
    let released = crate::memory::release_idle_memory(&ctx.renderer);
    tracing::debug!(
        plugins = released,
        "released loaded plugins until the next render"
    );
    if let Err(e) = &res {
        ctx.metrics.error("reconcile");
        let _ = write_status(&ctx, &policy, &Verdict::failed(&e.to_string())).await;
    }
    res
}

/// The controller's error policy: retry after 10 s.
pub fn error_policy(_policy: Arc<ClusterPolicy>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

async fn reconcile_policy(policy: &ClusterPolicy, ctx: &Context) -> Result<Action> {
    let name = policy.metadata.name.clone().unwrap_or_default();
    let ar = ApiResource::erase::<ClusterPolicy>(&());
    let all = Api::<DynamicObject>::all_with(ctx.client.clone(), &ar)
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube("list clusterpolicies", e))?;
    let active = active_policy(all.items.iter().map(|p| &p.metadata)).unwrap_or_default();
    if active != name {
        tracing::info!(policy = %name, %active, "not the active ClusterPolicy");
        write_status(ctx, policy, &Verdict::ignored(active)).await?;
        return Ok(Action::await_change());
    }
    let raw = all
        .items
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(&name))
        .map(|p| serde_json::to_value(p).expect("a DynamicObject serializes"))
        .unwrap_or_default();
    let parsed = match Policy::from_object(&raw) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(policy = %name, error = %e, "invalid ClusterPolicy; nothing changed");
            let wrote = write_status(ctx, policy, &Verdict::failed(&e.to_string())).await?;
            ctx.metrics.writes("status", u64::from(wrote));
            return Ok(Action::await_change());
        }
    };
    let mut nodes = list_nodes(&ctx.client).await?;
    let summary = label_nodes(
        &ctx.client,
        &mut nodes,
        &LabelPolicy::from_spec(&parsed.spec),
    )
    .await?;
    ctx.metrics.writes("label", summary.patched as u64);
    let base = base_context(ctx).await?;
    let mut tctx = facts::transform_context(&base, &nodes);
    read_references(ctx, &parsed.spec, &mut tctx).await;
    let owner = policy
        .controller_owner_ref(&())
        .expect("ClusterPolicy has a name");
    let mut results = Vec::with_capacity(State::ALL.len());
    for state in State::ALL {
        let t0 = Instant::now();
        let (result, plugin_time) = if state.enabled(&parsed.spec) {
            run_state(ctx, state, &parsed, &tctx, &owner, &summary).await
        } else {
            (delete_state(ctx, state, &parsed).await, Duration::ZERO)
        };
        if let StateResult::Failed(e) = &result {
            tracing::warn!(%state, error = %e, "state failed");
            ctx.metrics.error(state.name());
        }
        ctx.metrics
            .state_timing(state.name(), t0.elapsed(), plugin_time);
        results.push((state, result));
    }
    let verdict = judge(Observation {
        states: &results,
        gpu_nodes: summary.gpu_nodes,
        nfd_present: summary.nfd_present,
    });
    let wrote = write_status(ctx, policy, &verdict).await?;
    ctx.metrics.writes("status", u64::from(wrote));
    Ok(requeue_after(&verdict).map_or_else(Action::await_change, Action::requeue))
}

/// The transform context before node facts: namespace, server version, fallback images (with
/// overrides) and whether the ServiceMonitor CRD is served.
async fn base_context(ctx: &Context) -> Result<TransformContext> {
    let mut base = kiln_render::defaults::render_context();
    base.operator_namespace = ctx.config.namespace.clone();
    base.kubernetes_version = ctx.kubernetes_version.clone();
    base.has_service_monitor_crd = ctx
        .applier
        .serves("monitoring.coreos.com/v1", "ServiceMonitor")
        .await?;
    for (env, image) in &ctx.config.images {
        base.fallback_images.retain(|(e, _)| e != env);
        base.fallback_images.push((env.clone(), image.clone()));
    }
    Ok(base)
}

/// Reads the ConfigMaps (keys) and Secrets (existence, metadata only) that `spec` names into
/// the transform context. A missing object is simply left out (the plugin that needs it then
/// fails its state naming the field); a failed read is logged and treated as missing, so one
/// unreadable object cannot stop the other states.
async fn read_references(
    ctx: &Context,
    spec: &kiln_core::spec::ClusterPolicySpec,
    tctx: &mut TransformContext,
) {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let refs = facts::references(spec);
    let ns = &ctx.config.namespace;
    let config_maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    for name in &refs.config_maps {
        match config_maps.get_opt(name).await {
            Ok(Some(cm)) => tctx.config_maps.push(facts::config_map_keys(&cm)),
            Ok(None) => tracing::debug!(configmap = %name, %ns, "referenced ConfigMap not found"),
            Err(e) => {
                tracing::warn!(configmap = %name, %ns, error = %e, "cannot read a referenced ConfigMap")
            }
        }
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    for name in &refs.secrets {
        match secrets.get_metadata_opt(name).await {
            Ok(Some(_)) => tctx.secrets.push(name.clone()),
            Ok(None) => tracing::debug!(secret = %name, %ns, "referenced Secret not found"),
            Err(e) => {
                tracing::warn!(secret = %name, %ns, error = %e, "cannot read a referenced Secret")
            }
        }
    }
}

/// The keys of a state's asset objects after placeholders (what upstream deletes by name).
fn asset_keys(state: State, policy: &Policy, ns: &str) -> BTreeSet<ObjKey> {
    kiln_render::assets::load_state(state, false)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|a| {
            let mut o = a.object;
            kiln_render::placeholders::fill(&mut o, ns, policy.spec.runtime_class());
            ObjKey::of(&o).ok()
        })
        .collect()
}

async fn render(
    ctx: &Context,
    state: State,
    policy: &Policy,
    tctx: &TransformContext,
) -> std::result::Result<RenderedState, String> {
    let inputs = crate::memory::RenderCache::inputs(state, policy, tctx);
    if let Some(rendered) = ctx.renders.get(state, &inputs) {
        return Ok(rendered);
    }
    let (renderer, policy, tctx) = (ctx.renderer.clone(), policy.clone(), tctx.clone());
    let result = tokio::task::spawn_blocking(move || renderer.render_state(state, &policy, &tctx))
        .await
        .map_err(|e| format!("render task: {e}"))?
        .map_err(|e| e.to_string());
    match &result {
        Ok(rendered) => ctx.renders.put(state, inputs, rendered.clone()),
        Err(_) => ctx.renders.forget(state),
    }
    result
}

async fn run_state(
    ctx: &Context,
    state: State,
    policy: &Policy,
    tctx: &TransformContext,
    owner: &OwnerReference,
    nodes: &NodeSummary,
) -> (StateResult, Duration) {
    let t0 = Instant::now();
    let rendered = render(ctx, state, policy, tctx).await;
    let plugin_time = t0.elapsed();
    let rendered = match rendered {
        Ok(r) => r,
        Err(e) => return (StateResult::Failed(e), plugin_time),
    };
    (
        apply_state(ctx, state, policy, &rendered, owner, nodes)
            .await
            .unwrap_or_else(|e| StateResult::Failed(e.to_string())),
        plugin_time,
    )
}

async fn apply_state(
    ctx: &Context,
    state: State,
    policy: &Policy,
    rendered: &RenderedState,
    owner: &OwnerReference,
    nodes: &NodeSummary,
) -> Result<StateResult> {
    let mut keys = BTreeSet::new();
    let mut not_ready = Vec::new();
    for obj in &rendered.objects {
        let key = ObjKey::of(obj)?;
        keys.insert(key.clone());
        let is_ds = key.kind == "DaemonSet";
        if is_ds && nodes.gpu_nodes == 0 {
            continue; // upstream: no GPU nodes → DaemonSets are not created, state ready
        }
        let (outcome, live) = ctx.applier.apply(obj, owner).await?;
        ctx.metrics
            .writes("apply", u64::from(outcome == Outcome::Applied));
        if is_ds
            && let Some(why) =
                readiness::daemonset_not_ready(&ctx.client, &key.name, live.as_ref()).await?
        {
            not_ready.push(why);
        }
    }
    let mut stale = asset_keys(state, policy, &ctx.config.namespace);
    {
        let mut applied = ctx.applied.0.lock().expect("applied lock");
        let prev = applied.insert(state, keys.clone()).unwrap_or_default();
        stale.extend(prev);
    }
    for key in stale.difference(&keys) {
        let deleted = ctx.applier.delete_owned(key).await?;
        ctx.metrics.writes("delete", u64::from(deleted));
    }
    Ok(if not_ready.is_empty() {
        StateResult::Ready
    } else {
        StateResult::NotReady(not_ready.join("; "))
    })
}

async fn delete_state(ctx: &Context, state: State, policy: &Policy) -> StateResult {
    ctx.renders.forget(state);
    let mut keys = asset_keys(state, policy, &ctx.config.namespace);
    keys.extend(
        ctx.applied
            .0
            .lock()
            .expect("applied lock")
            .remove(&state)
            .unwrap_or_default(),
    );
    for key in &keys {
        match ctx.applier.delete_owned(key).await {
            Ok(deleted) => ctx.metrics.writes("delete", u64::from(deleted)),
            Err(e) => return StateResult::Failed(e.to_string()),
        }
    }
    StateResult::Disabled
}
