//! The NVIDIADriver controller (`nvidia.com/v1alpha1`, upstream `NVIDIADriverReconciler`): one
//! driver DaemonSet per NVIDIADriver and node pool, rendered through the `state-driver` assets
//! and the `driver` plugin chain of the active ClusterPolicy (with no ClusterPolicy, of
//! [`kiln_render::nvidiadriver::standalone_policy`], as NVIDIA v26.7.0 reconciles CRs without
//! one). Each CR's DaemonSets roll through the upgrade controller with the CR's own
//! `upgradePolicy`.
//!
//! ```text
//! NVIDIADriver ─┐
//! ClusterPolicy ┼─► disabled? (driver.useNvidiaDriverCRD off) ─► status disabled
//! every CR ─────┤   overlapping selectors? ─► Error naming the others, nothing applied
//! nodes ────────┘   per pool: policy_spec ─► render state-driver ─► finish_daemonset
//!                     ─► server-side apply (DaemonSet, service account and RBAC owned by the
//!                        CR; ConfigMap as the policy's driver state) ─► drift removed
//!                     ─► readiness ─► status
//! ```
//!
//! Fields another manager added to an applied object (a sidecar, an env var, a label) are
//! removed as for the ClusterPolicy's states ([`crate::drift::remove_drift`], a `DriftRemoved`
//! Event naming them), read with no request off the apply's answer or, for a DaemonSet whose
//! generation did not move, off the shared DaemonSet cache, which keeps a CR DaemonSet's
//! drift and wakes the CR on its change ([`daemonset_feed`]).
//!
//! A reconcile reads only the view (nodes, ClusterPolicies, CRs, the CRs' DaemonSets, the
//! labelled shared objects, `OnDelete` pods): when its inputs are unchanged it calls no plugin
//! (a per-CR render cache), and an object whose desired form is what this process last applied
//! and whose live marker has not moved is not applied again, so a driver rollout's DaemonSet
//! status events cost no request beyond a changed status.
//!
//! Pure rules are in [`kiln_core::spec::nvidiadriver`]; this module does the IO. The
//! ClusterPolicy side (its driver DaemonSet deleted with Orphan propagation, its readiness
//! including the CRs') is [`kiln_core::plan::hands_off`] with [`crate::apply::orphan`]
//! and [`crate::controllers::policy::handoff::policy_driver_result`].

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{StreamExt, future};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};
use kiln_core::State;
use kiln_core::plan::{ObjectKey, desired_object};
use kiln_core::spec::nvidiadriver::{
    NVIDIADRIVER_LABEL, NVIDIADriver, NvidiaDriverSpec, NvidiaDriverState, NvidiaDriverStatus,
    node_pools_for, overlaps,
};
use kiln_core::status::{ConditionSpec, set_condition};
use kiln_render::{Policy, Renderer};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::apply::{Applier, key_of};
use crate::cluster::live::owner_of;
use crate::cluster::node::InternedLabels;
use crate::cluster::view::View;
use crate::cluster::{facts, readiness};
use crate::{Error, Result, is_not_found};

/// Condition reasons of an NVIDIADriver's status.
pub mod reasons {
    /// Every driver pod of the CR is ready.
    pub const READY: &str = "Reconciled";
    /// Some driver pod is not ready yet.
    pub const NOT_READY: &str = "DriverNotReady";
    /// Another NVIDIADriver selects some of the same nodes.
    pub const CONFLICT: &str = "ConflictingNodeSelector";
    /// No ClusterPolicy, or the ClusterPolicy does not hand the driver to NVIDIADriver CRs.
    pub const DISABLED: &str = "NVIDIADriverCRDDisabled";
    /// The CR, or the ClusterPolicy it renders with, cannot be rendered or applied.
    pub const FAILED: &str = "ReconcileFailed";
}

/// How long a not-ready NVIDIADriver waits before it is judged again (DaemonSet and node
/// events wake it sooner).
pub const NOT_READY_REQUEUE: Duration = Duration::from_secs(30);

/// What the controller needs: its own client, applier and renderer (clones of the operator's),
/// the operator namespace, the server version and the fallback image overrides.
pub struct DriverContext {
    /// API client.
    pub client: Client,
    /// Server-side apply (field manager `kiln`).
    pub applier: Applier,
    /// Publishes the `DriftRemoved` Events ([`crate::drift::remove_drift`]); `run` shares the
    /// ClusterPolicy reconciler's.
    pub recorder: crate::signals::events::Events,
    /// Counts drift corrections (writes of kind `drift`), when set (`run` sets the operator's).
    pub metrics: Option<Arc<crate::signals::metrics::Metrics>>,
    /// Renders `state-driver`.
    pub renderer: Renderer,
    /// Operator namespace (where driver DaemonSets go).
    pub namespace: String,
    /// The API server's version.
    pub kubernetes_version: String,
    /// Fallback image overrides, `ENV` → image.
    pub images: Vec<(String, String)>,
    /// The cluster as the operator's watches hold it (shared with every controller): a
    /// reconcile reads nothing else, however many nodes there are.
    pub view: Arc<View>,
    /// Each CR's last successful render (its desired objects, owners set), the inputs it came
    /// from and the [`Fresh`] it was last confirmed at: a reconcile with the same inputs (a
    /// DaemonSet status event) calls no plugin, and one at the same [`Fresh`] reads no input.
    pub renders: crate::memory::RenderCache<String, (Fresh, Vec<Value>)>,
    /// Changes of a render input other than the CR itself seen so far
    /// ([`DriverContext::inputs_changed`]).
    changes: AtomicU64,
}

/// A CR's UID and generation and the input change count a render was made at: while all
/// three hold, a reconcile reuses that render without reading its inputs again (the
/// `secretEnv` Secret GET included).
pub type Fresh = (String, Option<i64>, u64);

/// The change marker ([`crate::apply::marker_of`]) of `key` as `view` holds it: a DaemonSet
/// from the CRs' DaemonSets, anything else from the labelled objects (the driver state's
/// shared objects carry `kiln.dev/state=driver`); `None` when not there (then it is applied).
fn marker(view: &View, key: &ObjectKey) -> Option<String> {
    if (key.api_version.as_str(), key.kind.as_str()) == ("apps/v1", "DaemonSet") {
        return cr_daemonset(view, key).map(|d| crate::apply::marker_of(&d.metadata));
    }
    view.live.marker(key)
}

/// The CR DaemonSet `key` when another manager added fields to it
/// ([`crate::cluster::live::foreign_of`]); `None` for other kinds, with no drift, or not there.
fn foreign_daemonset(view: &View, key: &ObjectKey) -> Option<(Vec<ManagedFieldsEntry>, Value)> {
    if (key.api_version.as_str(), key.kind.as_str()) != ("apps/v1", "DaemonSet") {
        return None;
    }
    crate::cluster::live::foreign_of(&*cr_daemonset(view, key)?)
}

/// The CR DaemonSet `key` (labelled [`NVIDIADRIVER_LABEL`]) as `view` holds it (status
/// included). The store keeps a CR DaemonSet's pod template and its other managers' additions
/// (the drift a reconcile removes); a pool's `nodeSelector` matches any label the node store
/// keeps ([`crate::cluster::node::kept_label`]), so a pool chosen by what the driver itself
/// makes GFD report (the `nvidia.com/` labels kiln does not read) cannot be circular.
fn cr_daemonset(view: &View, key: &ObjectKey) -> Option<Arc<DaemonSet>> {
    view.daemonset(key.namespace.as_deref().unwrap_or_default(), &key.name)
        .filter(|d| owner_of(d).is_some())
}

impl DriverContext {
    /// A context over `client`, `renderer` and the cluster `view` for `namespace`, publishing
    /// Events as reporter `kiln` and counting no metrics.
    pub fn new(
        client: Client,
        renderer: Renderer,
        namespace: &str,
        kubernetes_version: &str,
        images: Vec<(String, String)>,
        view: Arc<View>,
    ) -> Self {
        let reporter = kube::runtime::events::Reporter {
            controller: "kiln".into(),
            instance: None,
        };
        DriverContext {
            applier: Applier::new(client.clone()),
            recorder: crate::signals::events::Events::new(client.clone(), reporter),
            metrics: None,
            client,
            renderer,
            namespace: namespace.to_string(),
            kubernetes_version: kubernetes_version.to_string(),
            images,
            view,
            renders: crate::memory::RenderCache::default(),
            changes: AtomicU64::new(0),
        }
    }

    /// Record that a render input other than a CR's own spec may have changed: a node pool,
    /// the ClusterPolicy (one added, deleted, replaced or edited — not a status write,
    /// [`kiln_core::singleton::PolicyRevisions`] — and each re-list), a
    /// referenced ConfigMap ([`run`] calls this for each of its `cluster_changes`, and for each
    /// CR deletion, before the reconciles they trigger).
    /// Every CR then reads its inputs again on its next reconcile.
    pub fn inputs_changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// The count [`DriverContext::inputs_changed`] has reached.
    fn changes_seen(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }
}

/// The outcome of one NVIDIADriver reconcile, before it becomes a status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverVerdict {
    /// `status.state`.
    pub state: NvidiaDriverState,
    /// Reason of the `Ready` (when ready) or `Error` condition ([`reasons`]).
    pub reason: &'static str,
    /// Message of that condition.
    pub message: String,
}

impl DriverVerdict {
    fn new(state: NvidiaDriverState, reason: &'static str, message: impl Into<String>) -> Self {
        DriverVerdict {
            state,
            reason,
            message: message.into(),
        }
    }

    /// The `Ready` and `Error` conditions: ready sets `Ready=True`/`Error=False`; anything else
    /// `Ready=False` and `Error=True` with the reason and message (upstream's pair).
    pub fn conditions(&self) -> [ConditionSpec; 2] {
        let ready = self.state == NvidiaDriverState::Ready;
        [
            ConditionSpec {
                type_: "Ready",
                status: ready,
                reason: if ready { reasons::READY } else { self.reason },
                message: if ready {
                    String::new()
                } else {
                    self.message.clone()
                },
            },
            ConditionSpec {
                type_: "Error",
                status: !ready,
                reason: if ready { reasons::READY } else { self.reason },
                message: if ready {
                    String::new()
                } else {
                    self.message.clone()
                },
            },
        ]
    }
}

/// The status to store: `current` with `verdict` merged (set-condition semantics, so an
/// unchanged condition keeps its transition time and a steady state writes nothing).
pub fn make_status(
    current: Option<&NvidiaDriverStatus>,
    verdict: &DriverVerdict,
    namespace: &str,
    now: &Time,
    generation: Option<i64>,
) -> NvidiaDriverStatus {
    let mut status = current.cloned().unwrap_or_default();
    status.state = verdict.state;
    status.namespace = Some(namespace.to_string());
    for c in verdict.conditions() {
        set_condition(&mut status.conditions, &c, now, generation);
    }
    status
}

/// The message of an overlap: the nodes of this CR are also selected by `others`.
pub fn conflict_message(others: &BTreeSet<String>) -> String {
    let names: Vec<&str> = others.iter().map(String::as_str).collect();
    format!(
        "nodeSelector overlaps with NVIDIADriver {}: a node may be selected by one NVIDIADriver \
         only; nothing is applied until the selectors are disjoint",
        names.join(", ")
    )
}

/// Run the NVIDIADriver controller until `shutdown`. Triggers: a CR changed (itself; a CR
/// deleted, every other one: it can end an overlap), a change of one of the CRs' DaemonSets
/// (the CR its [`NVIDIADRIVER_LABEL`] names, [`owner_of`]; every CR each time the shared
/// DaemonSet watch lists), and `cluster_changes` — the node watch's pool changes
/// ([`crate::controllers::policy::nodes::NodeWatch::pools`]), ClusterPolicy changes and changes of referenced
/// ConfigMaps ([`crate::cluster::facts::ConfigMapCache`]), all from the operator's own watches: each
/// reconciles every CR (pools and overlaps depend on every node and CR; CRs are few, one per
/// node pool, and a reconcile with unchanged inputs sends nothing). One watch of its own, the
/// CRs', which fills `writer`, the view's NVIDIADriver store ([`View::drivers`]); every CR
/// change, its status included, also wakes the ClusterPolicy reconciler (the policy's
/// readiness includes the CRs') and the driver upgrade loop (a CR's `upgradePolicy`) through
/// the view's [`crate::cluster::live::Wake`], after the store holds the change. The DaemonSet
/// changes come from the namespace's DaemonSet watch the controllers share (`daemonsets`,
/// [`daemonset_feed`]), whose store is the view's.
pub async fn run(
    ctx: Arc<DriverContext>,
    writer: reflector::store::Writer<NVIDIADriver>,
    cluster_changes: impl futures::Stream<Item = ()> + Send + 'static,
    daemonsets: DaemonSetFeed,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    use kube::runtime::WatchStreamExt;
    let (deleted_tx, driver_deletes) = futures::channel::mpsc::unbounded();
    let store = writer.as_reader();
    let memo = ctx.clone();
    let wake = ctx.view.wake.clone();
    let drivers = watcher(
        Api::<NVIDIADriver>::all(ctx.client.clone()),
        crate::cluster::watch::config(),
    )
    // Managed fields are nothing kiln reads.
    .modify(|d: &mut NVIDIADriver| d.metadata.managed_fields = None)
    .reflect(writer)
    .inspect(move |ev| match ev {
        // A listed store (at start, after a watch gap) may change the policy's verdict too.
        Ok(watcher::Event::Apply(_) | watcher::Event::InitDone) => {
            wake.reconcile();
            wake.upgrade();
        }
        Ok(watcher::Event::Delete(d)) => {
            memo.renders.forget(&d.name_any());
            memo.inputs_changed();
            wake.reconcile();
            wake.upgrade();
            let _ = deleted_tx.unbounded_send(());
        }
        _ => {}
    })
    .applied_objects();
    let counted = ctx.clone();
    let cluster_changes = cluster_changes.inspect(move |()| counted.inputs_changed());
    let triggers = futures::stream::select(
        futures::stream::select(cluster_changes, driver_deletes),
        daemonsets.listed,
    );
    Controller::for_stream(drivers, store)
        .reconcile_all_on(triggers)
        .reconcile_on(daemonsets.changes)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            match res {
                Ok((obj, action)) => {
                    tracing::debug!(nvidiadriver = %obj.name, ?action, "reconciled")
                }
                Err(e) => tracing::warn!(error = %e, "nvidiadriver controller"),
            }
            future::ready(())
        })
        .await;
}

/// What the namespace's DaemonSet watch ([`crate::cluster::live::start_daemonsets`]) tells [`run`]: the
/// CR a changed DaemonSet belongs to ([`owner_of`]), and that the store has listed.
pub struct DaemonSetFeed {
    /// The owning CR of each DaemonSet applied or deleted.
    pub changes: futures::channel::mpsc::UnboundedReceiver<ObjectRef<NVIDIADriver>>,
    /// One per (re-)list of the DaemonSets: every CR is judged again.
    pub listed: futures::channel::mpsc::UnboundedReceiver<()>,
}

/// The NVIDIADriver side of the namespace's DaemonSet watch: the watch's `also` callback and
/// the [`DaemonSetFeed`] it fills. A DaemonSet without [`NVIDIADRIVER_LABEL`] feeds nothing;
/// a dropped feed makes the callback a no-op.
pub fn daemonset_feed() -> (
    impl FnMut(&watcher::Event<DaemonSet>) + Send + 'static,
    DaemonSetFeed,
) {
    let (ds_tx, changes) = futures::channel::mpsc::unbounded();
    let (listed_tx, listed) = futures::channel::mpsc::unbounded();
    let feed = move |ev: &watcher::Event<DaemonSet>| match ev {
        watcher::Event::Apply(d) | watcher::Event::Delete(d) => {
            if let Some(cr) = owner_of(d) {
                let _ = ds_tx.unbounded_send(cr);
            }
        }
        watcher::Event::InitDone => {
            let _ = listed_tx.unbounded_send(());
        }
        watcher::Event::Init | watcher::Event::InitApply(_) => {}
    };
    (feed, DaemonSetFeed { changes, listed })
}

/// The controller's error policy: retry after 10 s.
pub fn error_policy(_cr: Arc<NVIDIADriver>, err: &Error, _ctx: Arc<DriverContext>) -> Action {
    tracing::warn!(error = %err, "NVIDIADriver reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

/// Reconcile one NVIDIADriver: decide ([`decide`]), write its status when it changed.
///
/// # Errors
/// [`Error`] from the first API request that failed.
pub async fn reconcile(cr: Arc<NVIDIADriver>, ctx: Arc<DriverContext>) -> Result<Action> {
    let verdict = match decide(&cr, &ctx).await {
        Ok(v) => v,
        Err(e) => DriverVerdict::new(NvidiaDriverState::NotReady, reasons::FAILED, e.to_string()),
    };
    write_status(&ctx, &cr, &verdict).await?;
    Ok(match verdict.state {
        NvidiaDriverState::Ready | NvidiaDriverState::Disabled => Action::await_change(),
        _ if verdict.reason == reasons::CONFLICT => Action::await_change(),
        _ => Action::requeue(NOT_READY_REQUEUE),
    })
}

/// The verdict. The CR's DaemonSets roll through the driver upgrade loop, which reads the CR's
/// `upgradePolicy` and its DaemonSets from the view ([`crate::controllers::upgrade`]).
async fn decide(cr: &NVIDIADriver, ctx: &DriverContext) -> Result<DriverVerdict> {
    let name = cr.name_any();
    // Before any input is read: a change arriving after this makes the next reconcile read
    // them again.
    let seen = ctx.changes_seen();
    let (policy, cp_owner) = match active_policy(ctx) {
        Ok(p) => p,
        Err(verdict) => return Ok(verdict),
    };
    if let Some(why) = kiln_render::nvidiadriver::unsupported(&cr.spec) {
        return Ok(DriverVerdict::new(
            NvidiaDriverState::NotReady,
            reasons::FAILED,
            why,
        ));
    }
    let nodes = ctx.view.nodes().await;
    let nodes: Vec<&InternedLabels> = nodes.iter().map(|n| n.labels()).collect();
    let all = ctx.view.drivers().await.unwrap_or_default();
    let specs: Vec<(String, &NvidiaDriverSpec)> =
        all.iter().map(|d| (d.name_any(), &d.spec)).collect();
    if let Some(others) = overlaps(&specs, nodes.iter().copied()).get(&name) {
        tracing::warn!(nvidiadriver = %name, ?others, "overlapping node selectors; not applied");
        return Ok(DriverVerdict::new(
            NvidiaDriverState::NotReady,
            reasons::CONFLICT,
            conflict_message(others),
        ));
    }
    let desired = match render(cr, &policy, cp_owner.as_ref(), ctx, &nodes, seen).await {
        Ok(d) => d,
        Err(e) => {
            return Ok(DriverVerdict::new(
                NvidiaDriverState::NotReady,
                reasons::FAILED,
                e,
            ));
        }
    };
    let (applied, not_ready) = apply_desired(ctx, &desired, &nodes).await?;
    delete_stale(ctx, &name, &applied).await?;
    let verdict = if applied.is_empty() {
        DriverVerdict::new(
            NvidiaDriverState::NotReady,
            reasons::NOT_READY,
            "no GPU node with NFD's OS labels matches the nodeSelector",
        )
    } else if not_ready.is_empty() {
        DriverVerdict::new(NvidiaDriverState::Ready, reasons::READY, "")
    } else {
        DriverVerdict::new(
            NvidiaDriverState::NotReady,
            reasons::NOT_READY,
            not_ready.join("; "),
        )
    };
    Ok(verdict)
}

/// The policy an NVIDIADriver renders with and the owner of its shared driver objects: the
/// active ClusterPolicy's, or with no ClusterPolicy the CRD's policy defaults (NVIDIA v26.7.0
/// does too) and no owner (the shared objects are the CR's own). `Err` holds the verdict
/// when the active policy is invalid or does not hand the driver to NVIDIADriver CRs.
fn active_policy(
    ctx: &DriverContext,
) -> std::result::Result<(Policy, Option<Value>), DriverVerdict> {
    let policies = ctx.view.policies();
    Ok(match crate::cluster::view::active_of(&policies) {
        None => (kiln_render::nvidiadriver::standalone_policy(), None),
        Some(cp) => {
            let cp_raw = serde_json::to_value(&**cp).expect("a DynamicObject serializes");
            let cp_name = cp.metadata.name.clone().unwrap_or_default();
            let policy = match Policy::from_object(&cp_raw) {
                Ok(p) => p,
                Err(e) => {
                    return Err(DriverVerdict::new(
                        NvidiaDriverState::NotReady,
                        reasons::FAILED,
                        format!("ClusterPolicy {cp_name}: {e}"),
                    ));
                }
            };
            if !policy.spec.driver.use_nvidia_driver_crd.unwrap_or(false) {
                return Err(DriverVerdict::new(
                    NvidiaDriverState::Disabled,
                    reasons::DISABLED,
                    format!(
                        "ClusterPolicy {cp_name} does not set driver.useNvidiaDriverCRD: its own \
                         driver DaemonSet runs the driver"
                    ),
                ));
            }
            let owner = cp
                .controller_owner_ref(&crate::status::policy_resource())
                .map(|o| serde_json::to_value(o).expect("an OwnerReference serializes"));
            (policy, owner)
        }
    })
}

/// Apply each of a CR's `desired` objects that the caches do not show current, remove other
/// managers' additions, and judge each DaemonSet against the labels of every node (`nodes`).
/// Returns the applied DaemonSets' names and why those not ready are not.
///
/// # Errors
/// [`Error`] from the first apply or drift patch that failed.
async fn apply_desired(
    ctx: &DriverContext,
    desired: &[Value],
    nodes: &[&InternedLabels],
) -> Result<(BTreeSet<String>, Vec<String>)> {
    let mut not_ready = Vec::new();
    let mut applied = BTreeSet::new();
    for obj in desired {
        let key = key_of(obj)?;
        let current = marker(&ctx.view, &key).is_some_and(|m| ctx.applier.is_current(obj, &m));
        // The live object as kiln holds it with no read, for drift: the apply's answer, or
        // the cached DaemonSet when another manager added fields to it.
        let (live, held) = if current {
            (None, foreign_daemonset(&ctx.view, &key))
        } else {
            let live = ctx.applier.apply(obj).await?.1;
            let held = live.as_ref().and_then(crate::drift::held);
            (live, held)
        };
        if let Some((managed, object)) = held {
            crate::drift::remove_drift(
                &ctx.applier,
                &ctx.recorder,
                ctx.metrics.as_deref(),
                &key,
                &managed,
                &object,
            )
            .await?;
        }
        if key.kind == "DaemonSet" {
            applied.insert(key.name.clone());
            // The apply's answer when there was one (the cache may not have it yet), else the
            // cached DaemonSet, status included.
            let ds = match &live {
                Some(l) => Some(Arc::new(readiness::as_daemonset(&key.name, l)?)),
                None => cr_daemonset(&ctx.view, &key),
            };
            if let Some(why) =
                readiness::judge_daemonset(&key.name, ds.as_deref(), 0, &ctx.view.pods, nodes).await
            {
                not_ready.push(why);
            }
        }
    }
    Ok((applied, not_ready))
}

/// The objects to apply for `cr`: per node pool its DaemonSet and its own service account and
/// RBAC (owned by the CR, labelled [`NVIDIADRIVER_LABEL`];
/// [`kiln_render::nvidiadriver::render_pools`]), and once the state's shared objects (the
/// startup-probe ConfigMap), labelled `kiln.dev/state=driver` and owned by the policy through
/// `cp_owner`, its controller reference (shared by every CR's DaemonSets, and kept while the
/// policy hands the driver off, [`kiln_core::plan::Render::HandedOff`]), or by the CR when
/// there is no ClusterPolicy (`None`). `nodes` are the labels of
/// every node. Reuses the CR's last render ([`DriverContext::renders`]) when every input
/// (CR UID and spec, derived policy spec and driver chain, cluster facts and referenced
/// objects, pools, policy owner) is unchanged: no plugin is called. While the CR's UID and
/// generation and the input change count `seen` ([`DriverContext::inputs_changed`], read
/// before `policy` and `nodes` were) are those of its last render, that render is reused
/// without reading the inputs again (no `secretEnv` GET on a DaemonSet status event). After a
/// render the loaded plugins are dropped and free heap returned
/// ([`crate::memory::release_idle_memory`]).
///
/// # Errors
/// The render error's text (naming the CR and the plugin or field).
pub async fn render<L: kiln_core::labels::LabelLookup>(
    cr: &NVIDIADriver,
    policy: &Policy,
    cp_owner: Option<&Value>,
    ctx: &DriverContext,
    nodes: &[L],
    seen: u64,
) -> std::result::Result<Vec<Value>, String> {
    let name = cr.name_any();
    let uid = cr.metadata.uid.clone().unwrap_or_default();
    let fresh: Fresh = (uid.clone(), cr.metadata.generation, seen);
    if let Some((at, objects)) = ctx.renders.last(&name)
        && at == fresh
    {
        return Ok(objects);
    }
    let derived = kiln_render::nvidiadriver::derived_policy(policy, &name, &cr.spec)
        .map_err(|e| e.to_string())?;
    let mut base = kiln_render::defaults::render_context();
    base.operator_namespace = ctx.namespace.clone();
    base.kubernetes_version = ctx.kubernetes_version.clone();
    for (env, image) in &ctx.images {
        kiln_render::defaults::set_fallback_image(&mut base, env, image);
    }
    facts::read_references(
        &ctx.client,
        &ctx.namespace,
        &derived.spec,
        &mut base,
        &ctx.view.config_maps,
    )
    .await;
    // On OpenShift one pool per RHCOS version, as upstream (its DaemonSet names hash it).
    let pools = node_pools_for(&cr.spec, nodes.iter(), base.openshift_version.is_some());
    // Everything the objects below depend on, compared whole ([`crate::memory::RenderCache`]).
    let inputs = format!(
        "{uid}\n{}\n{:?}\n{:?}\n{base:?}\n{pools:?}\n{cp_owner:?}",
        derived.spec_text,
        derived.plugins.chain(State::Driver),
        cr.spec
    );
    if let Some((_, objects)) = ctx.renders.get(&name, &inputs) {
        ctx.renders
            .put(name.clone(), inputs, (fresh, objects.clone()));
        return Ok(objects);
    }
    let (renderer, spec, n) = (ctx.renderer.clone(), cr.spec.clone(), name.clone());
    let rendered = tokio::task::spawn_blocking(move || {
        kiln_render::nvidiadriver::render_pools(&renderer, &derived, &n, &uid, &spec, &pools, &base)
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| format!("render task: {e}"));
    // Renders are rare (inputs changed): the plugins go until the next one, as after a
    // ClusterPolicy's full reconcile ([`crate::memory::release_idle_memory`]).
    let released = crate::memory::release_idle_memory(&ctx.renderer);
    tracing::debug!(nvidiadriver = %name, plugins = released, "released loaded plugins and free heap");
    let rendered = match rendered.and_then(|r| r) {
        Ok(r) => r,
        Err(e) => {
            ctx.renders.forget(&name);
            return Err(e);
        }
    };
    let cr_owner = serde_json::to_value(cr.controller_owner_ref(&()).expect("a named CR"))
        .expect("an OwnerReference serializes");
    let mut out = Vec::new();
    for (i, (_, objects)) in rendered.into_iter().enumerate() {
        for mut obj in objects {
            if obj["kind"] == "DaemonSet" {
                obj["metadata"]["ownerReferences"] = json!([cr_owner]);
                out.push(obj);
            } else if obj["metadata"]["labels"][NVIDIADRIVER_LABEL].is_string() {
                // The pool's own service account and RBAC.
                out.push(desired_object(&obj, State::Driver, &cr_owner));
            } else if i == 0 {
                out.push(desired_object(
                    &obj,
                    State::Driver,
                    cp_owner.unwrap_or(&cr_owner),
                ));
            }
        }
    }
    ctx.renders.put(name, inputs, (fresh, out.clone()));
    Ok(out)
}

/// Delete the CR's DaemonSets (by [`NVIDIADRIVER_LABEL`]) that this reconcile did not apply
/// (a node pool that went away), found in the view's DaemonSets. Their pods go with them
/// (background propagation).
async fn delete_stale(ctx: &DriverContext, cr: &str, applied: &BTreeSet<String>) -> Result<()> {
    let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let names: Vec<String> = ctx
        .view
        .daemonsets
        .state()
        .iter()
        .filter(|d| d.labels().get(NVIDIADRIVER_LABEL).map(String::as_str) == Some(cr))
        .map(|d| d.name_any())
        .collect();
    for name in names {
        if applied.contains(&name) {
            continue;
        }
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => tracing::info!(daemonset = %name, nvidiadriver = %cr, "deleted stale"),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(Error::kube(format!("delete DaemonSet {name}"), e)),
        }
    }
    Ok(())
}

async fn write_status(
    ctx: &DriverContext,
    cr: &NVIDIADriver,
    verdict: &DriverVerdict,
) -> Result<()> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let current = cr.status.as_ref();
    let new = make_status(
        current,
        verdict,
        &ctx.namespace,
        &now,
        cr.metadata.generation,
    );
    if current == Some(&new) {
        return Ok(());
    }
    let name = cr.name_any();
    let api: Api<NVIDIADriver> = Api::all(ctx.client.clone());
    match api
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": new})),
        )
        .await
    {
        Ok(_) => {
            tracing::info!(nvidiadriver = %name, state = ?verdict.state, reason = verdict.reason, "status written");
            Ok(())
        }
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(Error::kube(
            format!("write status of NVIDIADriver {name}"),
            e,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemonset_event_wakes_the_nvidiadriver_its_label_names() {
        let mut ds = DaemonSet::default();
        assert_eq!(owner_of(&ds), None);
        ds.metadata.labels = Some([(NVIDIADRIVER_LABEL.to_string(), "pool-a".into())].into());
        assert_eq!(owner_of(&ds), Some(ObjectRef::new("pool-a")));
    }

    #[test]
    fn the_shared_daemonset_watch_feeds_the_cr_a_daemonset_names_and_each_listing() {
        let (mut feed, mut out) = daemonset_feed();
        let mut ours = DaemonSet::default();
        ours.metadata.labels = Some([(NVIDIADRIVER_LABEL.to_string(), "pool-a".into())].into());
        let mut policy = DaemonSet::default();
        policy.metadata.labels =
            Some([(kiln_core::plan::STATE_LABEL.to_string(), "driver".into())].into());
        feed(&watcher::Event::Init);
        feed(&watcher::Event::InitApply(ours.clone()));
        feed(&watcher::Event::InitDone);
        feed(&watcher::Event::Apply(policy.clone()));
        feed(&watcher::Event::Delete(policy));
        feed(&watcher::Event::Apply(ours.clone()));
        feed(&watcher::Event::Delete(ours));
        let mut changes = Vec::new();
        while let Ok(cr) = out.changes.try_recv() {
            changes.push(cr);
        }
        assert_eq!(
            changes,
            vec![ObjectRef::new("pool-a"), ObjectRef::new("pool-a")]
        );
        assert!(out.listed.try_recv().is_ok());
        assert!(out.listed.try_recv().is_err(), "one listing");
        drop(out);
        // Nobody listening (no NVIDIADriver CRD): sends are dropped.
        feed(&watcher::Event::InitDone);
    }

    #[test]
    fn verdicts_become_upstreams_condition_pair_and_steady_states_write_nothing() {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let v = DriverVerdict::new(
            NvidiaDriverState::NotReady,
            reasons::CONFLICT,
            conflict_message(&BTreeSet::from(["other".to_string()])),
        );
        let s = make_status(None, &v, "gpu-operator", &now, Some(3));
        assert_eq!(s.state, NvidiaDriverState::NotReady);
        let err = s.conditions.iter().find(|c| c.type_ == "Error").unwrap();
        assert_eq!(err.status, "True");
        assert_eq!(err.reason, "ConflictingNodeSelector");
        assert!(
            err.message.contains("NVIDIADriver other"),
            "{}",
            err.message
        );
        assert_eq!(err.observed_generation, Some(3));
        let later = Time(k8s_openapi::jiff::Timestamp::now());
        assert_eq!(
            make_status(Some(&s), &v, "gpu-operator", &later, Some(3)),
            s
        );
        let ok = make_status(
            Some(&s),
            &DriverVerdict::new(NvidiaDriverState::Ready, reasons::READY, ""),
            "gpu-operator",
            &later,
            Some(3),
        );
        let ready = ok.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Reconciled")
        );
    }
}
