//! One reconcile of one ClusterPolicy (upstream `gpu-operator.md` §2.2, with kiln's choices).
//! Every read comes from the view of the cluster ([`crate::cluster::view::View`]): the
//! ClusterPolicies, the nodes, the labelled objects and their DaemonSets.
//!
//! 1. A non-active policy (not the oldest) gets `ignored` written, naming the active one, and
//!    nothing else happens.
//! 2. When nothing a render depends on changed since the last full reconcile of this policy
//!    (same uid, generation, labels and annotations, same [`NodeFacts`], no applied object deleted or changed by
//!    someone else or carrying fields another manager added, no failed state due for a retry, no [`crate::cluster::live::Wake::full`] request),
//!    only readiness and status are judged again from the caches: a DaemonSet status event or a
//!    relabelled node costs no request but a status write when the status changes.
//! 3. Otherwise, a full reconcile: parse the policy ([`Policy::from_object`]; an invalid one gets
//!    `Error`/`ReconcileFailed` naming the field and nothing is deleted or applied); label the
//!    nodes ([`crate::controllers::policy::nodes`]); render every enabled state through its plugin chain; plan
//!    ([`kiln_core::plan::plan`]) over the renders and the cluster's labelled objects
//!    ([`crate::cluster::live`]); for each state in order apply (skipping what the cache shows unchanged),
//!    remove what other field managers added to an applied object (additive drift,
//!    [`crate::drift::remove_drift`]; an Event on the object names what went) and delete. A
//!    failing chain keeps its last applied objects and marks only that state.
//! 4. Judge ([`kiln_core::status::judge`]), write status when changed, Event on transitions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_core::State;
use kiln_core::context::TransformContext;
use kiln_core::labels::LabelPolicy;
use kiln_core::plan::{Render, StatePlan, hands_off, plan};
use kiln_core::singleton::active_policy;
use kiln_core::status::{Observation, StateResult, Verdict, judge, requeue_after};
use kiln_render::{Policy, RenderedState};
use kube::api::DynamicObject;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use crate::apply::{ObjKey, Outcome, key_of};
use crate::cluster::facts::NodeFacts;
use crate::cluster::node::SlimNode;
use crate::cluster::{facts, readiness};
use crate::context::{Context, Kept, Last, metadata_digest};
use crate::controllers::policy::nodes::label_nodes;
use crate::status::policy_resource;
use crate::{Error, Result};

/// One state's render: disabled, failed (with the error text) or its objects.
enum Rendered {
    Disabled,
    Failed(String),
    Objects(RenderedState),
}

/// How long after a failed state the next reconcile renders and applies again (the
/// controller's requeue while not ready is 30 s; a little less, so that requeue is the full one).
pub const RETRY_FAILED_AFTER: Duration = Duration::from_secs(25);

/// Reconciles start at most this often: during a rollout every
/// DaemonSet status event wakes the controller, and a reconcile that starts less than this
/// after the previous one waits out the rest first (the events meanwhile fold into it, since
/// the controller never queues a policy twice). A lone event is handled at once; the policy's
/// `ready` follows the last DaemonSet by at most this much more.
pub const RECONCILE_EVERY: Duration = Duration::from_millis(200);

/// Reconcile `policy`: the controller's reconcile function. On an API failure the status gets
/// `ReconcileFailed` (best effort) and the error goes to the controller's error policy.
///
/// # Errors
/// [`Error`] from the first API request that failed outside a single state.
pub async fn reconcile(policy: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Action> {
    let start = Instant::now();
    let res = reconcile_policy(&policy, &ctx).await;
    ctx.metrics.reconciled(start.elapsed());
    if let Err(e) = &res {
        ctx.metrics.error("reconcile");
        ctx.metrics
            .reconcile_status(crate::signals::metrics::ReconcileStatus::OperatorError);
        // The next trigger renders and applies again.
        ctx.memo
            .last
            .lock()
            .expect("last lock")
            .remove(policy.name_any().as_str());
        let _ = ctx
            .status
            .write(&policy, &Verdict::failed(&e.to_string()))
            .await;
    }
    res
}

/// The controller's error policy: retry after 10 s.
pub fn error_policy(_policy: Arc<DynamicObject>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

async fn reconcile_policy(arg: &DynamicObject, ctx: &Context) -> Result<Action> {
    let name = arg.name_any();
    let since = ctx
        .memo
        .paced
        .lock()
        .expect("paced lock")
        .map(|t| t.elapsed());
    if let Some(wait) = since.and_then(|s| RECONCILE_EVERY.checked_sub(s)) {
        tokio::time::sleep(wait).await;
    }
    *ctx.memo.paced.lock().expect("paced lock") = Some(Instant::now());
    let all = ctx.view.policies();
    // The freshest copy: the store's (the queued one may be older).
    let policy = all
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(&name))
        .cloned()
        .unwrap_or_else(|| Arc::new(arg.clone()));
    let active = active_policy(all.iter().map(|p| &p.metadata)).unwrap_or_default();
    if active != name {
        tracing::debug!(policy = %name, %active, "not the active ClusterPolicy");
        ctx.memo.last.lock().expect("last lock").remove(&name);
        let wrote = ctx.status.write(&policy, &Verdict::ignored(active)).await?;
        ctx.metrics.writes("status", u64::from(wrote));
        return Ok(Action::await_change());
    }
    let full = ctx.view.wake.take_full();
    let last = ctx.memo.last.lock().expect("last lock").get(&name).cloned();
    let nodes = ctx.view.nodes().await;
    let node_refs: Vec<&SlimNode> = nodes.iter().map(AsRef::as_ref).collect();
    if let Some(last) = last.filter(|l| {
        !full
            && l.uid == policy.metadata.uid.clone().unwrap_or_default()
            && l.generation == policy.metadata.generation
            && l.metadata == metadata_digest(&policy.metadata)
            && l.retry_at.is_none_or(|t| Instant::now() < t)
    }) && last.facts == NodeFacts::of(&node_refs)
        && !drifted(ctx).await?
    {
        return judge_and_write(ctx, &policy, &last, &node_refs).await;
    }
    let result = full_reconcile(ctx, &policy, nodes).await;
    // Once the whole reconcile is done (its renders, plan, applies and status are dropped by
    // now, so the heap they used goes back to the OS with the plugins), on every path out.
    let released = crate::memory::release_idle_memory(&ctx.renderer);
    tracing::debug!(
        plugins = released,
        "released loaded plugins and free heap until the next render"
    );
    result
}

/// Whether an object kiln applied was deleted, or changed by someone else, since: the cache
/// shows it gone (a recorded delete) or with a later marker than kiln's apply returned, or (a
/// DaemonSet, whose marker is its generation: a label added moves only its resourceVersion)
/// with drift due for removal.
async fn drifted(ctx: &Context) -> Result<bool> {
    let applied = ctx.applier.applied();
    if ctx.view.wake.any_gone(applied.iter().map(|(k, _)| k)) {
        return Ok(true);
    }
    let live = &ctx.view.live;
    Ok(applied.iter().any(|(key, marker)| {
        live.marker(key)
            .is_some_and(|m| crate::apply::marker_later(&m, marker))
            || live
                .foreign_daemonset(key)
                .is_some_and(|(managed, obj)| !ctx.applier.due(key, &managed, &obj).is_empty())
    }))
}

/// Each state's render through its plugin chain (disabled states are not rendered and their
/// cached render is dropped), with the time its plugins took.
async fn render_states(
    ctx: &Context,
    parsed: &Policy,
    tctx: &TransformContext,
) -> Vec<(State, Rendered, Duration)> {
    let mut renders = Vec::with_capacity(State::ALL.len());
    for state in State::ALL {
        let t0 = Instant::now();
        let rendered = if state.enabled(&parsed.spec) {
            match render(ctx, state, parsed, tctx).await {
                Ok(r) => Rendered::Objects(r),
                Err(e) => Rendered::Failed(e),
            }
        } else {
            ctx.memo.renders.forget(&state);
            Rendered::Disabled
        };
        renders.push((state, rendered, t0.elapsed()));
    }
    renders
}

/// Carry out each state's plan: apply an enabled state, delete a disabled one's objects,
/// orphan a state handed to NVIDIADriver CRs; a failure marks only its state. Counts each
/// state's time and errors.
async fn settle_states(
    ctx: &Context,
    renders: Vec<(State, Rendered, Duration)>,
    plans: Vec<(State, StatePlan)>,
    parsed: &Policy,
) -> Vec<(State, Kept)> {
    let mut states = Vec::with_capacity(State::ALL.len());
    for ((state, rendered, plugin_time), (_, sp)) in renders.into_iter().zip(plans) {
        let t0 = Instant::now();
        let kept = match rendered {
            Rendered::Failed(e) => Kept::Failed(e),
            // Pods survive: the NVIDIADriver DaemonSets replace them (upstream).
            Rendered::Disabled if hands_off(state, &parsed.spec) => {
                match crate::apply::orphan(&ctx.client, &sp.orphan).await {
                    Ok(n) => {
                        ctx.metrics.writes("delete", n);
                        Kept::HandedOff
                    }
                    Err(e) => Kept::Failed(e.to_string()),
                }
            }
            Rendered::Disabled => match delete(ctx, &sp.delete).await {
                Ok(()) => Kept::Disabled,
                Err(e) => Kept::Failed(e.to_string()),
            },
            Rendered::Objects(_) => apply_state(ctx, &sp)
                .await
                .unwrap_or_else(|e| Kept::Failed(e.to_string())),
        };
        if let Kept::Failed(e) = &kept {
            tracing::warn!(%state, error = %e, "state failed");
            ctx.metrics.error(state.name());
        }
        ctx.metrics
            .state_timing(state.name(), plugin_time + t0.elapsed(), plugin_time);
        states.push((state, kept));
    }
    states
}

/// Render, label, plan, apply and delete; remember the outcome ([`Last`]); judge and write
/// the status.
async fn full_reconcile(
    ctx: &Context,
    policy: &Arc<DynamicObject>,
    mut nodes: Vec<Arc<SlimNode>>,
) -> Result<Action> {
    let name = policy.name_any();
    let raw = serde_json::to_value(&**policy).map_err(|e| Error::Json {
        action: format!("serialize ClusterPolicy {name}"),
        source: e,
    })?;
    let parsed = match Policy::from_object(&raw) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(policy = %name, error = %e, "invalid ClusterPolicy; nothing changed");
            ctx.metrics
                .reconcile_status(crate::signals::metrics::ReconcileStatus::PolicyUnavailable);
            ctx.memo.last.lock().expect("last lock").remove(&name);
            let wrote = ctx
                .status
                .write(policy, &Verdict::failed(&e.to_string()))
                .await?;
            ctx.metrics.writes("status", u64::from(wrote));
            return Ok(Action::await_change());
        }
    };
    tracing::info!(policy = %name, "full reconcile");
    let rules = LabelPolicy::from_spec(&parsed.spec);
    *ctx.memo.labels.lock().expect("labels lock") = Some(rules.clone());
    // Labelling replaces a node it patched with a copy carrying the new labels.
    let summary = label_nodes(&ctx.client, &mut nodes, &rules).await?;
    ctx.metrics.writes("label", summary.patched as u64);
    let node_refs: Vec<&SlimNode> = nodes.iter().map(AsRef::as_ref).collect();
    let facts = NodeFacts::of(&node_refs);
    let base = base_context(ctx).await?;
    let mut tctx = facts::transform_context(&base, &node_refs);
    facts::read_references(
        &ctx.client,
        &ctx.config.namespace,
        &parsed.spec,
        &mut tctx,
        &ctx.view.config_maps,
    )
    .await;
    crate::controllers::policy::psa::reconcile_hook(
        ctx,
        &parsed.spec,
        tctx.openshift_version.is_some(),
    )
    .await;
    let owner = policy
        .controller_owner_ref(&policy_resource())
        .expect("ClusterPolicy has a name");
    let owner = serde_json::to_value(&owner).expect("an OwnerReference serializes");
    let renders = render_states(ctx, &parsed, &tctx).await;
    let live = &ctx.view.live;
    if !live.ready(crate::cluster::watch::LIVE_READY_LIMIT).await {
        tracing::warn!(
            "the caches of labelled objects have not listed yet; deleting only what they hold"
        );
    }
    // Whatever was deleted behind kiln's back is re-applied below (the cache lacks it).
    ctx.view.wake.clear_gone();
    let view: Vec<(State, Render<'_>)> = renders
        .iter()
        .map(|(state, r, _)| {
            let r = match r {
                Rendered::Disabled if hands_off(*state, &parsed.spec) => Render::HandedOff,
                Rendered::Disabled => Render::Disabled,
                Rendered::Failed(_) => Render::Failed,
                Rendered::Objects(o) => Render::Objects(&o.objects),
            };
            (*state, r)
        })
        .collect();
    let planned = plan(&view, &live.objects(), &owner, summary.gpu_nodes);
    let states = settle_states(ctx, renders, planned.states, &parsed).await;
    delete(ctx, &planned.orphans).await?;
    let failed = states.iter().any(|(_, k)| matches!(k, Kept::Failed(_)));
    let last = Last {
        uid: policy.metadata.uid.clone().unwrap_or_default(),
        generation: policy.metadata.generation,
        metadata: metadata_digest(&policy.metadata),
        facts,
        states,
        note: shadowing_note(ctx, &parsed),
        retry_at: failed.then(|| Instant::now() + RETRY_FAILED_AFTER),
    };
    ctx.memo
        .last
        .lock()
        .expect("last lock")
        .insert(name, last.clone());
    // The policy or its inputs changed: the driver upgrade loop looks again.
    ctx.view.wake.upgrade();
    judge_and_write(ctx, policy, &last, &node_refs).await
}

/// Judge readiness from the caches (each applied state's DaemonSets, the nodes) over what the
/// last full reconcile decided, and write the status when it changed. No request other than the
/// status write (and an Event on a transition).
async fn judge_and_write(
    ctx: &Context,
    policy: &DynamicObject,
    last: &Last,
    nodes: &[&SlimNode],
) -> Result<Action> {
    let live = &ctx.view.live;
    let node_labels: Vec<&crate::cluster::node::InternedLabels> =
        nodes.iter().map(|n| n.labels()).collect();
    let ns = &ctx.config.namespace;
    let mut results = Vec::with_capacity(last.states.len());
    for (state, kept) in &last.states {
        let result = match kept {
            Kept::Disabled => StateResult::Disabled,
            Kept::HandedOff => {
                crate::controllers::policy::handoff::policy_driver_result(&ctx.view).await
            }
            Kept::Failed(e) => StateResult::Failed(e.clone()),
            Kept::Applied(daemonsets) => {
                let mut not_ready = Vec::new();
                for (ds, generation) in daemonsets {
                    let cached = live.daemonset(ns, ds);
                    if let Some(why) = readiness::judge_daemonset(
                        ds,
                        cached.as_deref(),
                        *generation,
                        &ctx.view.pods,
                        &node_labels,
                    )
                    .await
                    {
                        not_ready.push(why);
                    }
                }
                if not_ready.is_empty() {
                    StateResult::Ready
                } else {
                    StateResult::NotReady(not_ready.join("; "))
                }
            }
        };
        results.push((*state, result));
    }
    let summary = crate::controllers::policy::nodes::summary(nodes);
    let mut verdict = judge(Observation {
        states: &results,
        gpu_nodes: summary.gpu_nodes,
        nfd_present: summary.nfd_present,
    });
    if let Some(note) = &last.note {
        let ready = &mut verdict.conditions[0];
        ready.message = if ready.message.is_empty() {
            note.clone()
        } else {
            format!("{}; {note}", ready.message)
        };
    }
    ctx.metrics
        .verdict(&verdict, summary.gpu_nodes, summary.nfd_present);
    let wrote = ctx.status.write(policy, &verdict).await?;
    ctx.metrics.writes("status", u64::from(wrote));
    // Not ready: judged again within MESSAGE_EVERY (from the caches, no request), so a
    // deferred message-only change is written.
    Ok(
        requeue_after(&verdict).map_or_else(Action::await_change, |after| {
            Action::requeue(after.min(crate::status::MESSAGE_EVERY))
        }),
    )
}

/// Adds to the Ready condition's message which drop-in plugins of the enabled states' chains
/// shadow a bundled standard plugin (`kiln plugin` sources; `--refuse-shadowing` makes them an
/// error instead), so `kubectl get clusterpolicy -o yaml` shows that a standard transform was
/// replaced.
fn shadowing_note(ctx: &Context, policy: &Policy) -> Option<String> {
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
    (!shadowing.is_empty()).then(|| {
        format!(
            "drop-in plugins shadow bundled standard plugins: {}",
            shadowing.join(", ")
        )
    })
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

async fn render(
    ctx: &Context,
    state: State,
    policy: &Policy,
    tctx: &TransformContext,
) -> std::result::Result<RenderedState, String> {
    let inputs = crate::memory::RenderCache::inputs(state, policy, tctx);
    if let Some(rendered) = ctx.memo.renders.get(&state, &inputs) {
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
        Ok(rendered) => ctx.memo.renders.put(state, inputs, rendered.clone()),
        Err(_) => ctx.memo.renders.forget(&state),
    }
    result
}

/// Apply a state's objects in order (skipping those the cache shows unchanged since kiln's
/// last apply: no request), then delete its stale objects. Returns the state's DaemonSets with
/// the generation kiln last applied, for readiness.
async fn apply_state(ctx: &Context, sp: &StatePlan) -> Result<Kept> {
    let cache = &ctx.view.live;
    let mut daemonsets = Vec::new();
    for obj in &sp.apply {
        let key = key_of(obj)?;
        let current = cache
            .marker(&key)
            .is_some_and(|m| ctx.applier.is_current(obj, &m));
        // The live object as kiln holds it with no read: the apply's answer, or the cached
        // DaemonSet when another manager added fields to it.
        let live = if current {
            cache.foreign_daemonset(&key)
        } else {
            let (outcome, applied) = ctx.applier.apply(obj).await?;
            ctx.metrics
                .writes("apply", u64::from(outcome == Outcome::Applied));
            if outcome == Outcome::KindNotServed {
                continue;
            }
            applied.as_ref().and_then(crate::drift::held)
        };
        if let Some((managed, live)) = live {
            crate::drift::remove_drift(
                &ctx.applier,
                &ctx.recorder,
                Some(&*ctx.metrics),
                &key,
                &managed,
                &live,
            )
            .await?;
        }
        if key.kind == "DaemonSet" {
            daemonsets.push((key.name.clone(), ctx.applier.generation(&key)));
        }
    }
    delete(ctx, &sp.delete).await?;
    Ok(Kept::Applied(daemonsets))
}

/// Delete `keys` (live, labelled, owned objects the plan chose).
async fn delete(ctx: &Context, keys: &[ObjKey]) -> Result<()> {
    for key in keys {
        let deleted = ctx.applier.delete(key).await?;
        ctx.metrics.writes("delete", u64::from(deleted));
    }
    Ok(())
}
