//! One reconcile of one ClusterPolicy (upstream `gpu-operator.md` §2.2, with kiln's choices):
//!
//! 1. List every ClusterPolicy; a non-active one (not the oldest) gets `ignored` written, naming
//!    the active one, and nothing else happens.
//! 2. Parse the policy ([`Policy::from_object`]); an invalid one gets `Error`/`ReconcileFailed`
//!    naming the field and nothing is deleted or applied.
//! 3. Label the nodes ([`crate::nodes`]).
//! 4. Render every enabled state through its plugin chain.
//! 5. Plan ([`kiln_core::plan::plan`]) over the renders and the cluster's labelled objects
//!    ([`crate::live`]): per state the objects to apply (labelled `kiln.dev/state`, owned by the
//!    policy; DaemonSets only when GPU nodes exist, as upstream) and the objects to delete
//!    (disabled states', and those a render no longer produces). A failing chain keeps its
//!    last applied objects and marks only that state.
//! 6. For each state in order: apply, judge DaemonSet readiness, delete.
//! 7. Judge ([`kiln_core::status::judge`]), write status when changed, Event on transitions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_core::State;
use kiln_core::context::TransformContext;
use kiln_core::labels::LabelPolicy;
use kiln_core::plan::{Render, StatePlan, plan};
use kiln_core::singleton::active_policy;
use kiln_core::spec::ClusterPolicy;
use kiln_core::status::{Observation, StateResult, Verdict, judge, requeue_after};
use kiln_render::{Policy, RenderedState};
use kube::Resource;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::runtime::controller::Action;

use crate::apply::{ObjKey, Outcome, key_of};
use crate::context::Context;
use crate::nodes::{label_nodes, list_nodes};
use crate::status::write_status;
use crate::{Error, Result, facts, readiness};

/// How long a reconcile waits for the caches of labelled objects to list once; past it, the
/// reconcile goes on with what they hold (deleting less, never more).
pub const LIVE_READY_LIMIT: Duration = Duration::from_secs(30);

/// One state's render: disabled, failed (with the error text) or its objects.
enum Rendered {
    Disabled,
    Failed(String),
    Objects(RenderedState),
}

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
    let owner = serde_json::to_value(&owner).expect("an OwnerReference serializes");
    let mut renders = Vec::with_capacity(State::ALL.len());
    for state in State::ALL {
        let t0 = Instant::now();
        let rendered = if state.enabled(&parsed.spec) {
            match render(ctx, state, &parsed, &tctx).await {
                Ok(r) => Rendered::Objects(r),
                Err(e) => Rendered::Failed(e),
            }
        } else {
            ctx.renders.forget(state);
            Rendered::Disabled
        };
        renders.push((state, rendered, t0.elapsed()));
    }
    let live = ctx.live().await?;
    if !live.ready(LIVE_READY_LIMIT).await {
        tracing::warn!(
            "the caches of labelled objects have not listed yet; deleting only what they hold"
        );
    }
    let view: Vec<(State, Render<'_>)> = renders
        .iter()
        .map(|(state, r, _)| {
            let r = match r {
                Rendered::Disabled => Render::Disabled,
                Rendered::Failed(_) => Render::Failed,
                Rendered::Objects(o) => Render::Objects(&o.objects),
            };
            (*state, r)
        })
        .collect();
    let planned = plan(&view, &live.objects(), &owner, summary.gpu_nodes);
    let node_labels: Vec<_> = nodes.iter().map(facts::node_labels).collect();
    let mut results = Vec::with_capacity(State::ALL.len());
    for ((state, rendered, plugin_time), (_, sp)) in renders.into_iter().zip(planned.states) {
        let t0 = Instant::now();
        let result = match rendered {
            Rendered::Failed(e) => StateResult::Failed(e),
            Rendered::Disabled => match delete(ctx, &sp.delete).await {
                Ok(()) => StateResult::Disabled,
                Err(e) => StateResult::Failed(e.to_string()),
            },
            Rendered::Objects(_) => apply_state(ctx, &sp, &node_labels)
                .await
                .unwrap_or_else(|e| StateResult::Failed(e.to_string())),
        };
        if let StateResult::Failed(e) = &result {
            tracing::warn!(%state, error = %e, "state failed");
            ctx.metrics.error(state.name());
        }
        ctx.metrics
            .state_timing(state.name(), plugin_time + t0.elapsed(), plugin_time);
        results.push((state, result));
    }
    delete(ctx, &planned.orphans).await?;
    let mut verdict = judge(Observation {
        states: &results,
        gpu_nodes: summary.gpu_nodes,
        nfd_present: summary.nfd_present,
    });
    note_shadowing(ctx, &parsed, &mut verdict);
    let wrote = write_status(ctx, policy, &verdict).await?;
    ctx.metrics.writes("status", u64::from(wrote));
    Ok(requeue_after(&verdict).map_or_else(Action::await_change, Action::requeue))
}

/// Adds to the Ready condition's message which drop-in plugins of the enabled states' chains
/// shadow a bundled standard plugin (`kiln plugin` sources; `--refuse-shadowing` makes them an
/// error instead), so `kubectl get clusterpolicy -o yaml` shows that a standard transform was
/// replaced.
fn note_shadowing(ctx: &Context, policy: &Policy, verdict: &mut Verdict) {
    let host = ctx.renderer.host();
    let mut shadowing: Vec<String> = State::ALL
        .into_iter()
        .filter(|s| s.enabled(&policy.spec))
        .flat_map(|s| policy.plugins.chain(s))
        .filter_map(|p| {
            host.shadowing_drop_in(&p.name)
                .map(|path| format!("{} ({})", p.name, path.display()))
        })
        .collect();
    shadowing.sort();
    shadowing.dedup();
    if shadowing.is_empty() {
        return;
    }
    let note = format!(
        "drop-in plugins shadow bundled standard plugins: {}",
        shadowing.join(", ")
    );
    let ready = &mut verdict.conditions[0];
    ready.message = if ready.message.is_empty() {
        note
    } else {
        format!("{}; {note}", ready.message)
    };
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
        kiln_render::defaults::set_fallback_image(&mut base, env, image);
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
    let result = tokio::task::spawn_blocking(move || {
        renderer
            .render_state(state, &policy, &tctx)
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| format!("render task: {e}"))?;
    match &result {
        Ok(rendered) => ctx.renders.put(state, inputs, rendered.clone()),
        Err(_) => ctx.renders.forget(state),
    }
    result
}

/// Apply a state's objects in order, judge its DaemonSets (upstream's rules, then coverage of
/// every node their selector matches, [`kiln_core::plan::uncovered_nodes`]), delete its stale
/// objects.
async fn apply_state(
    ctx: &Context,
    sp: &StatePlan,
    node_labels: &[std::collections::BTreeMap<String, String>],
) -> Result<StateResult> {
    let mut not_ready = Vec::new();
    let cache = ctx.live().await?;
    for obj in &sp.apply {
        let key = key_of(obj)?;
        // Unchanged since our last apply, by the cache: no request. DaemonSets are still read,
        // their status is what readiness judges.
        if key.kind != "DaemonSet"
            && cache
                .marker(&key)
                .is_some_and(|m| ctx.applier.is_current(obj, &m))
        {
            continue;
        }
        let (outcome, live) = ctx.applier.apply(obj).await?;
        ctx.metrics
            .writes("apply", u64::from(outcome == Outcome::Applied));
        if key.kind == "DaemonSet"
            && let Some(why) =
                readiness::daemonset_not_ready(&ctx.client, &key.name, live.as_ref(), node_labels)
                    .await?
        {
            not_ready.push(why);
        }
    }
    delete(ctx, &sp.delete).await?;
    Ok(if not_ready.is_empty() {
        StateResult::Ready
    } else {
        StateResult::NotReady(not_ready.join("; "))
    })
}

/// Delete `keys` (live, labelled, owned objects the plan chose).
async fn delete(ctx: &Context, keys: &[ObjKey]) -> Result<()> {
    for key in keys {
        let deleted = ctx.applier.delete(key).await?;
        ctx.metrics.writes("delete", u64::from(deleted));
    }
    Ok(())
}
