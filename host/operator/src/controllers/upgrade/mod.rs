//! Rolling driver upgrades: the IO around [`kiln_core::upgrade`] (upstream's upgrade
//! controller, `gpu-operator.md` §6).
//!
//! ```text
//! UpgradeScope (driver DaemonSet + upgrade policy + who to report on)
//!   ├─ nodes from the view's node store (slimmed: upgrade labels/annotations, cordon, Ready)
//!   ├─ driver pods + ControllerRevisions, validator pods: PodWatches (label-selected, slimmed)
//!   ├─ workload pods: LIST ?fieldSelector=spec.nodeName=… only for nodes in
//!   │  wait-for-jobs / pod-deletion / drain (the only states that read them)
//!   ▼
//! kiln_core::upgrade::plan ─► per node: evictions, driver pod delete, ONE node merge patch
//!                              (state label + annotations + spec.unschedulable), Events
//! ```
//!
//! A pass at rest reads nothing from the API server: every input is a cache, and the loop
//! wakes only on what can start or move an upgrade ([`crate::cluster::live::Wake::upgrade`]: the driver
//! DaemonSet, a driver or validator pod, a node's upgrade labels/annotations/cordon/Ready, a
//! full reconcile of the policy). Its own node patches are waited for in the store before the
//! next pass plans (slot counting must see them).
//!
//! A node's progress is its state label and annotations, so a restarted operator resumes where
//! the last one stopped. The state machine is scoped to one driver DaemonSet and the nodes that
//! run its pods: the ClusterPolicy's (`nvidia-driver-daemonset`, [`cluster_policy_scope`]) or one
//! NVIDIADriver's ([`driver_scopes`]); one loop ([`run`]) passes over each, reading the view.
//!
//! Events (reason `GPUDriverUpgrade`, events.k8s.io/v1, one per transition): every transition
//! and failure on the node and on the scope's owner (`gpu-node-3: cordon-required ->
//! wait-for-jobs-required: cordoned`); progress notes of a wait (`waiting for 2 pod(s)
//! matching app=trainer, 41m so far`) on the node, at most every [`PROGRESS_EVENT_EVERY`].

pub mod eviction;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kiln_core::spec::{ClusterPolicy, DriverUpgradePolicySpec, DriverUpgradeStatus};
use kiln_core::upgrade::{
    self, Action, Counts, DriverPodFacts, Inputs, NodeFacts, NodePlan, PodFacts, Selector,
    UpgradeState,
};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Map, Value, json};
use tokio::sync::Notify;

use crate::cluster::node::SlimNode;
use crate::cluster::readiness::SlimPod;
use crate::cluster::view::View;
use crate::cluster::watch::DRIVER_DAEMONSET;
use crate::signals::metrics::{Metrics, UpgradeCensus};
use crate::{Error, Result, is_not_found};
use kiln_core::labels::LabelLookup;

/// The label every driver pod carries, the ClusterPolicy's and every NVIDIADriver's alike
/// (their pod anti-affinity keeps one per node by it): an NVIDIADriver's upgrade finds the
/// ClusterPolicy's driver pods left behind (orphaned) by it ([`ORPHANED_DRIVER_SELECTOR`]).
pub const DRIVER_COMPONENT_LABEL: (&str, &str) = ("app.kubernetes.io/component", "nvidia-driver");
/// [`DRIVER_COMPONENT_LABEL`] as a label selector.
pub const ORPHANED_DRIVER_SELECTOR: &str = "app.kubernetes.io/component=nvidia-driver";
/// A repeated progress Event (a wait) on a node is published at most this often.
pub const PROGRESS_EVENT_EVERY: Duration = Duration::from_secs(300);
/// Pass interval while an upgrade is under way (time-based steps: wait timeouts, validation).
pub const ACTIVE_INTERVAL: Duration = Duration::from_secs(5);
/// While an upgrade runs, `status.driverUpgrade` is written at most this often.
pub const STATUS_EVERY: Duration = Duration::from_secs(2);
/// Changes arriving this close together share one pass.
pub const DEBOUNCE: Duration = Duration::from_millis(300);

/// What one upgrade controller instance drives: one driver DaemonSet, its nodes, one policy.
#[derive(Debug, Clone)]
pub struct UpgradeScope {
    /// Namespace of the driver DaemonSet.
    pub namespace: String,
    /// Name of the driver DaemonSet.
    pub daemonset: String,
    /// `driver.upgradePolicy` (or the NVIDIADriver's); `None` or `autoUpgrade: false` removes
    /// the state label from the DaemonSet's nodes and does nothing else.
    pub policy: Option<DriverUpgradePolicySpec>,
    /// The object whose Events report every transition (ClusterPolicy or NVIDIADriver).
    pub owner: ObjectReference,
    /// Selector of the validator pods checked in `validation-required`
    /// ([`upgrade::VALIDATOR_SELECTOR`]).
    pub validator_selector: String,
}

impl UpgradeScope {
    /// An NVIDIADriver's driver (its owner is one): the ClusterPolicy's driver pods it finds
    /// orphaned on its nodes are its to replace (upstream v26.7.0 labels such a node
    /// `upgrade-required` when it is `""` or `upgrade-done`, and the upgrade then deletes the
    /// orphan so the CR's pod, kept off the node by the driver pods' anti-affinity, can start).
    pub fn replaces_orphans(&self) -> bool {
        self.owner.kind.as_deref() == Some("NVIDIADriver")
    }
}

/// What a pass found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Counts before the pass; `None` when auto upgrade is off or the DaemonSet is absent.
    pub counts: Option<Counts>,
    /// Nodes with something to do (the caller should come back soon).
    pub active: bool,
    /// API writes this pass sent.
    pub writes: u64,
}

/// How the upgrade controller runs.
#[derive(Debug, Clone)]
pub struct UpgradeConfig {
    /// `validation-required` gives up after this long (upstream 600 s).
    pub validation_timeout: Duration,
    /// `reportingInstance` of the Events.
    pub identity: String,
    /// Namespace of the driver and validator pods (their changes wake the loop at rest).
    pub namespace: String,
}

impl Default for UpgradeConfig {
    fn default() -> Self {
        UpgradeConfig {
            validation_timeout: Duration::from_secs(
                upgrade::VALIDATION_TIMEOUT_SECONDS.unsigned_abs(),
            ),
            identity: crate::leader::default_identity(),
            namespace: "gpu-operator".into(),
        }
    }
}

/// How long a pass waits for the node store to show this controller's own last patches.
pub const CATCH_UP_LIMIT: Duration = Duration::from_secs(3);

/// The upgrade controller's writer over the view of the cluster (nodes, driver and validator
/// pods, the driver DaemonSets); one per operator, driving the ClusterPolicy's driver and
/// every NVIDIADriver's ([`run`]).
pub struct Upgrader {
    client: Client,
    view: Arc<View>,
    /// What wakes the loop ([`crate::cluster::live::Wake::upgrade_notify`]).
    changed: Arc<Notify>,
    config: UpgradeConfig,
    /// Node → when its last progress Event went out (unix seconds).
    progress: std::sync::Mutex<HashMap<String, i64>>,
    /// Node → the `resourceVersion` this controller's last patch of it returned: the next pass
    /// waits until the store holds at least that ([`Upgrader::catch_up`]).
    patched: std::sync::Mutex<HashMap<String, String>>,
    /// Driver pods (`namespace/name`) this controller deleted whose deletion the pod store
    /// has not shown yet: judged terminating meanwhile, so they are not deleted twice.
    deleted: std::sync::Mutex<std::collections::HashSet<String>>,
    writes: AtomicU64,
}

impl Upgrader {
    /// An upgrader reading `view` and woken by its [`crate::cluster::live::Wake::upgrade`].
    pub fn start(client: Client, config: UpgradeConfig, view: Arc<View>) -> Arc<Upgrader> {
        Arc::new(Upgrader {
            client,
            changed: view.wake.upgrade_notify(),
            view,
            config,
            progress: Default::default(),
            patched: Default::default(),
            deleted: Default::default(),
            writes: AtomicU64::new(0),
        })
    }

    /// Fires when something the upgrade reads changed (and on [`Upgrader::poke`]).
    pub fn changed(&self) -> &Notify {
        &self.changed
    }

    /// Ask for a pass soon.
    pub fn poke(&self) {
        self.changed.notify_one();
    }

    /// Wait (at most [`CATCH_UP_LIMIT`]) until the node store holds every node at or past the
    /// `resourceVersion` this controller's last patch of it returned. Resource versions are
    /// compared as numbers where both parse (etcd's), else for equality.
    async fn catch_up(&self) {
        let deadline = tokio::time::Instant::now() + CATCH_UP_LIMIT;
        loop {
            {
                let mut patched = self.patched.lock().expect("patched lock");
                patched.retain(|name, rv| {
                    let Some(node) = self.view.nodes.get(name) else {
                        return false;
                    };
                    let have = node.resource_version().unwrap_or_default();
                    match (have.parse::<u64>(), rv.parse::<u64>()) {
                        (Ok(h), Ok(w)) => h < w,
                        _ => have != rv,
                    }
                });
                crate::memory::shrink_if_sparse(&mut patched);
                if patched.is_empty() {
                    return;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::debug!("node store behind this controller's patches; planning anyway");
                let mut patched = self.patched.lock().expect("patched lock");
                patched.clear();
                crate::memory::shrink_if_sparse(&mut patched);
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// API writes sent so far (node patches, evictions, pod deletes, Events, status).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    fn wrote(&self, n: u64) {
        self.writes.fetch_add(n, Ordering::Relaxed);
    }

    /// One pass over `scope` and its driver DaemonSet `ds` (as the caller's cache holds it):
    /// read the caches, plan, apply. Reads from the API server only the pods bound to nodes in
    /// `wait-for-jobs-required`, `pod-deletion-required` or `drain-required`.
    ///
    /// # Errors
    /// [`Error::Kube`] when listing a node's pods or a node patch fails; evictions that the API
    /// refuses (a PodDisruptionBudget) are retried next pass.
    pub async fn pass(&self, scope: &UpgradeScope, ds: &DaemonSet) -> Result<PassReport> {
        self.catch_up().await;
        let _ = self.view.nodes.wait_until_ready().await;
        let policy = scope.policy.as_ref().filter(|p| p.auto_upgrade);
        let nodes = self.view.nodes.state();
        let (mut drivers, revisions, _) = self.view.pods.slim_of(ds).await;
        if policy.is_some() && scope.replaces_orphans() {
            // The ClusterPolicy's driver pods left on this CR's nodes ([`node_facts`] keeps
            // the unowned ones on nodes the DaemonSet selects).
            let known: std::collections::HashSet<&str> = drivers.iter().map(|p| p.name()).collect();
            let orphans: Vec<Arc<SlimPod>> = self
                .view
                .pods
                .matching(&scope.namespace, ORPHANED_DRIVER_SELECTOR)
                .await
                .into_iter()
                .filter(|p| !known.contains(p.name()))
                .collect();
            drivers.extend(orphans);
        }
        let validators = self
            .view
            .pods
            .matching(&scope.namespace, &scope.validator_selector)
            .await;
        let desired = if policy.is_some() {
            kiln_core::readiness::current_revision(ds, &revisions)
        } else {
            None
        };
        let mut workloads = HashMap::new();
        if policy.is_some() {
            for n in &nodes {
                let state = UpgradeState::from_label(n.labels().label(upgrade::STATE_LABEL));
                if reads_workloads(state) {
                    let pods = self.pods_on(n.name()).await?;
                    tracing::debug!(
                        node = %n.name(),
                        %state,
                        pods = ?pods.iter().map(pod_summary).collect::<Vec<_>>(),
                        "pods on a node whose upgrade step reads them"
                    );
                    workloads.insert(n.name().to_string(), pods);
                }
            }
        }
        tracing::debug!(
            daemonset = %scope.daemonset,
            nodes = nodes.len(),
            drivers = drivers.len(),
            revisions = revisions.len(),
            validators = validators.len(),
            desired = ?desired,
            "upgrade pass"
        );
        let mut facts = node_facts(
            &Pods {
                drivers: &drivers,
                validators: &validators,
                workloads: &workloads,
            },
            scope,
            ds,
            &nodes,
            desired.as_deref(),
            policy.is_none(),
        );
        self.mark_deleted(&drivers, &mut facts);
        let Some(policy) = policy else {
            let plans = upgrade::disabled(&facts);
            let writes = self.apply(scope, &plans, 0).await?;
            return Ok(PassReport {
                counts: None,
                active: false,
                writes,
            });
        };
        let observed = ds.status.as_ref().and_then(|s| s.observed_generation);
        if desired.is_none() || observed < ds.metadata.generation {
            // The DaemonSet controller has not caught up with a template change yet.
            return Ok(PassReport {
                counts: Some(Counts::of(&facts, 0)),
                active: true,
                writes: 0,
            });
        }
        let now = unix_now();
        let plan = upgrade::plan(
            &Inputs {
                policy,
                now,
                validation_timeout: i64::try_from(self.config.validation_timeout.as_secs())
                    .unwrap_or(i64::MAX),
            },
            &facts,
        );
        let writes = self.apply(scope, &plan.nodes, now).await?;
        let active = plan.counts.pending + plan.counts.in_progress > plan.counts.failed
            || !plan.nodes.is_empty();
        Ok(PassReport {
            counts: Some(plan.counts),
            active,
            writes,
        })
    }

    /// The pods bound to `node` (all namespaces), for the states that wait for, delete or
    /// drain them.
    async fn pods_on(&self, node: &str) -> Result<Vec<Pod>> {
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        Ok(Api::<Pod>::all(self.client.clone())
            .list(&lp)
            .await
            .map_err(|e| Error::kube(format!("list pods on node {node}"), e))?
            .items)
    }

    /// Driver pods this controller deleted count as terminating until the store shows it.
    fn mark_deleted(&self, drivers: &[Arc<SlimPod>], facts: &mut [NodeFacts]) {
        let mut deleted = self.deleted.lock().expect("deleted lock");
        if deleted.is_empty() {
            return;
        }
        let still: std::collections::HashSet<String> = drivers
            .iter()
            .filter(|p| !p.is_deleting())
            .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name()))
            .collect();
        deleted.retain(|k| still.contains(k));
        for d in facts.iter_mut().filter_map(|f| f.driver.as_mut()) {
            if deleted.contains(&format!("{}/{}", d.namespace, d.name)) {
                d.terminating = true;
            }
        }
    }

    /// Apply the plans; returns the writes sent.
    async fn apply(&self, scope: &UpgradeScope, plans: &[NodePlan], now: i64) -> Result<u64> {
        let mut writes = 0;
        let nodes: Api<Node> = Api::all(self.client.clone());
        for np in plans {
            let mut labels = Map::new();
            let mut annotations = Map::new();
            let mut unschedulable: Option<Value> = None;
            let mut events = Vec::new();
            for a in &np.actions {
                match a {
                    Action::SetState(s) => {
                        let v = if *s == UpgradeState::Unknown {
                            Value::Null
                        } else {
                            json!(s.label())
                        };
                        labels.insert(upgrade::STATE_LABEL.into(), v);
                    }
                    Action::Annotate(k, v) => {
                        annotations
                            .insert((*k).into(), v.clone().map_or(Value::Null, Value::String));
                    }
                    Action::Cordon => unschedulable = Some(json!(true)),
                    Action::Uncordon => unschedulable = Some(Value::Null),
                    Action::DeletePods { pods, drain } => {
                        writes += self.evict(&np.node, pods, *drain).await;
                    }
                    Action::DeleteDriverPod { namespace, name } => {
                        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
                        match api.delete(name, &DeleteParams::default()).await {
                            Ok(_) => {
                                writes += 1;
                                self.deleted
                                    .lock()
                                    .expect("deleted lock")
                                    .insert(format!("{namespace}/{name}"));
                            }
                            Err(e) if is_not_found(&e) => {}
                            Err(e) => {
                                return Err(Error::kube(
                                    format!("delete driver pod {namespace}/{name}"),
                                    e,
                                ));
                            }
                        }
                    }
                    Action::Event {
                        warning,
                        progress,
                        note,
                    } => events.push((*warning, *progress, note.clone())),
                }
            }
            let mut body = Map::new();
            let mut meta = Map::new();
            if !labels.is_empty() {
                meta.insert("labels".into(), Value::Object(labels));
            }
            if !annotations.is_empty() {
                meta.insert("annotations".into(), Value::Object(annotations));
            }
            if !meta.is_empty() {
                body.insert("metadata".into(), Value::Object(meta));
            }
            if let Some(u) = unschedulable {
                body.insert("spec".into(), json!({"unschedulable": u}));
            }
            if !body.is_empty() {
                let patched = nodes
                    .patch(
                        &np.node,
                        &PatchParams::default(),
                        &Patch::Merge(Value::Object(body)),
                    )
                    .await
                    .map_err(|e| Error::kube(format!("patch node {}", np.node), e))?;
                writes += 1;
                if let Some(rv) = patched.metadata.resource_version {
                    self.patched
                        .lock()
                        .expect("patched lock")
                        .insert(np.node.clone(), rv);
                }
            }
            for (warning, progress, note) in events {
                writes += self
                    .publish(scope, &np.node, warning, progress, &note, now)
                    .await;
            }
        }
        self.wrote(writes);
        Ok(writes)
    }

    /// Evict `pods` (`namespace/name`) as `kubectl drain` does, stating node and reason for the
    /// chart's admission policies ([`crate::controllers::upgrade::eviction`]); a refusal (PodDisruptionBudget, 429) is
    /// logged and retried on the next pass.
    async fn evict(&self, node: &str, pods: &[String], drain: bool) -> u64 {
        let mut writes = 0;
        for key in pods {
            let Some((ns, name)) = key.split_once('/') else {
                continue;
            };
            let reason = if drain {
                crate::controllers::upgrade::eviction::Reason::Drain
            } else {
                crate::controllers::upgrade::eviction::Reason::GpuPod
            };
            match crate::controllers::upgrade::eviction::evict(&self.client, ns, name, node, reason)
                .await
            {
                Ok(_) => writes += 1,
                Err(e) if is_not_found(&e) => {}
                Err(e) => {
                    writes += 1;
                    tracing::info!(%node, pod = %key, drain, error = %e, "eviction refused; retrying next pass");
                }
            }
        }
        writes
    }

    /// Publish one Event on the node, and unless it is a progress note, on the owner too.
    async fn publish(
        &self,
        scope: &UpgradeScope,
        node: &str,
        warning: bool,
        progress: bool,
        note: &str,
        now: i64,
    ) -> u64 {
        if progress {
            let mut last = self.progress.lock().expect("progress lock");
            let every = i64::try_from(PROGRESS_EVENT_EVERY.as_secs()).unwrap_or(300);
            match last.get(node) {
                Some(t) if now - t < every => return 0,
                _ => {
                    last.insert(node.to_string(), now);
                }
            }
        }
        let node_ref = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..Default::default()
        };
        let mut writes = 0;
        let mut targets = vec![(node_ref, note.to_string())];
        if !progress {
            targets.push((scope.owner.clone(), format!("{node}: {note}")));
        }
        for (regarding, note) in targets {
            let ev = self.event(regarding, warning, &note);
            let ns = ev
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into());
            match Api::<K8sEvent>::namespaced(self.client.clone(), &ns)
                .create(&PostParams::default(), &ev)
                .await
            {
                Ok(_) => writes += 1,
                Err(e) => tracing::warn!(%node, error = %e, "could not publish upgrade event"),
            }
        }
        writes
    }

    fn event(&self, regarding: ObjectReference, warning: bool, note: &str) -> K8sEvent {
        let now = k8s_openapi::jiff::Timestamp::now();
        let ns = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let base = regarding.name.clone().unwrap_or_else(|| "kiln".into());
        K8sEvent {
            metadata: ObjectMeta {
                name: Some(format!("{base}.{:x}", now.as_nanosecond())),
                namespace: Some(ns),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some("DriverUpgrade".into()),
            reason: Some(upgrade::EVENT_REASON.into()),
            note: Some(kiln_plugin_host::text::bounded(note, 1000).into_owned()),
            regarding: Some(regarding),
            reporting_controller: Some("kiln".into()),
            reporting_instance: Some(self.config.identity.clone()),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            ..Default::default()
        }
    }
}

/// The pods a pass reads, by where they come from (the stores' slim pods are read one at a
/// time, so a pass never holds every driver pod as a full `Pod`).
pub struct Pods<'a> {
    /// The driver DaemonSet's pods (by its selector: owned ones and orphans it would select).
    pub drivers: &'a [Arc<SlimPod>],
    /// The validator pods ([`UpgradeScope::validator_selector`]).
    pub validators: &'a [Arc<SlimPod>],
    /// Per node, every pod bound to it (listed only for nodes whose state reads them:
    /// [`reads_workloads`]); driver pods among them are skipped.
    pub workloads: &'a HashMap<String, Vec<Pod>>,
}

/// The states whose step reads a node's other pods (waits for them, deletes or drains them).
pub fn reads_workloads(state: UpgradeState) -> bool {
    matches!(
        state,
        UpgradeState::WaitForJobsRequired
            | UpgradeState::PodDeletionRequired
            | UpgradeState::DrainRequired
    )
}

/// The managed nodes' facts: nodes running a pod of the DaemonSet (or an orphaned driver
/// pod it would select), and nodes mid-upgrade that its nodeSelector matches (with `sweep`,
/// every such node that carries a state).
pub fn node_facts(
    pods: &Pods<'_>,
    scope: &UpgradeScope,
    ds: &DaemonSet,
    nodes: &[Arc<SlimNode>],
    desired: Option<&str>,
    sweep: bool,
) -> Vec<NodeFacts> {
    let uid = ds.metadata.uid.clone().unwrap_or_default();
    let spec = ds.spec.as_ref();
    let match_labels = spec
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    let template = spec.and_then(|s| s.template.spec.as_ref());
    let digest = template.and_then(upgrade::config_digest);
    let node_selector = template
        .and_then(|t| t.node_selector.clone())
        .unwrap_or_default();
    let validator = Selector::parse(&scope.validator_selector).unwrap_or_default();
    let ours = Ours {
        namespace: &scope.namespace,
        match_labels: &match_labels,
        replaces_orphans: scope.replaces_orphans(),
    };
    let mut drivers: HashMap<String, DriverPodFacts> = HashMap::new();
    for p in pods.drivers {
        let Some(node) = p.node_name() else { continue };
        if ours.owned(p.namespace(), p.owned_by(&uid)) {
            let f = DriverPodFacts::from_pod(&**p, desired.map(|h| (h, digest)));
            // Prefer the live pod over one already terminating.
            let keep = drivers
                .get(node)
                .is_some_and(|d| !d.orphaned && !d.terminating && f.terminating);
            if !keep {
                drivers.insert(node.to_string(), f);
            }
        } else if ours.orphan(p.namespace(), p.has_owners(), &**p) {
            drivers
                .entry(node.to_string())
                .or_insert_with(|| DriverPodFacts::from_pod(&**p, None));
        }
    }
    // Per node: whether any of its validator pods is ready.
    let mut validators: HashMap<&str, bool> = HashMap::new();
    for p in pods.validators {
        if !validator.matches(&**p) {
            continue;
        }
        if let Some(node) = p.node_name() {
            *validators.entry(node).or_default() |= p.is_ready();
        }
    }
    let mut out = Vec::new();
    for n in nodes {
        let name = n.name();
        let selected = node_selector
            .iter()
            .all(|(k, v)| n.labels().label(k) == Some(v.as_str()));
        // An orphaned driver pod counts only where the DaemonSet would run its own: there,
        // deleting it lets the DaemonSet's pod start.
        let driver = drivers.remove(name).filter(|d| !d.orphaned || selected);
        // A node without a driver pod is managed only mid-upgrade (its pod is being
        // recreated) or, for the sweep when auto upgrade is off, while it carries a state;
        // decided from the store's copy, so the other nodes are never converted.
        let state = UpgradeState::from_label(n.labels().label(upgrade::STATE_LABEL));
        let keep = driver.is_some()
            || (selected && state.in_progress())
            || (sweep && selected && state != UpgradeState::Unknown);
        if !keep {
            continue;
        }
        let mut f = NodeFacts::from_node(&**n);
        // The ClusterPolicy's driver pod left on an NVIDIADriver's node: an upgrade request,
        // as upstream's node labelling makes it ([`UpgradeScope::replaces_orphans`]).
        if scope.replaces_orphans()
            && matches!(f.state, UpgradeState::Unknown | UpgradeState::Done)
            && driver
                .as_ref()
                .is_some_and(|d| d.orphaned && !d.terminating)
        {
            f.requested = true;
        }
        f.driver = driver;
        f.validator_ready = validators.get(name).copied();
        f.pods = pods
            .workloads
            .get(name)
            .into_iter()
            .flatten()
            .filter(|p| {
                let ns = p.metadata.namespace.as_deref();
                let owners = p.owner_references();
                !ours.owned(ns, owners.iter().any(|o| o.uid == uid))
                    && !ours.orphan(ns, !owners.is_empty(), *p)
            })
            .map(PodFacts::from_pod)
            .collect();
        out.push(f);
    }
    out
}

/// `namespace/name phase[ terminating]` of a pod, for the pass's debug log.
fn pod_summary(p: &Pod) -> String {
    let phase = p
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("-");
    let gone = if p.metadata.deletion_timestamp.is_some() {
        " terminating"
    } else {
        ""
    };
    format!(
        "{}/{} {phase}{gone}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Which pods of the operator namespace belong to a driver DaemonSet: those it owns (by uid)
/// and orphans its selector would select (left behind by a deleted DaemonSet).
struct Ours<'a> {
    namespace: &'a str,
    match_labels: &'a BTreeMap<String, String>,
    /// An NVIDIADriver's upgrade: the ClusterPolicy's driver pods left on its nodes
    /// ([`DRIVER_COMPONENT_LABEL`]) count as orphans too.
    replaces_orphans: bool,
}

impl Ours<'_> {
    /// A pod in `ns` with an owner reference of the DaemonSet's uid (`owned_by_uid`).
    fn owned(&self, ns: Option<&str>, owned_by_uid: bool) -> bool {
        ns == Some(self.namespace) && owned_by_uid
    }

    /// A pod in `ns` without owners whose `labels` the DaemonSet's selector matches (or, with
    /// `replaces_orphans`, that carries [`DRIVER_COMPONENT_LABEL`]).
    fn orphan(&self, ns: Option<&str>, has_owners: bool, labels: &impl LabelLookup) -> bool {
        let selected = !self.match_labels.is_empty()
            && self
                .match_labels
                .iter()
                .all(|(k, v)| labels.label(k) == Some(v.as_str()));
        let (component, driver) = DRIVER_COMPONENT_LABEL;
        let left_by_policy = self.replaces_orphans && labels.label(component) == Some(driver);
        ns == Some(self.namespace) && !has_owners && (selected || left_by_policy)
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Feed a pass into upstream's gauges (`gpu_operator_driver_auto_upgrade_enabled`,
/// `gpu_operator_nodes_upgrades_*`; `None`: auto upgrade off, all 0).
pub fn set_metrics(metrics: &Metrics, counts: Option<&Counts>) {
    let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
    let c = counts.cloned().unwrap_or_default();
    metrics.set_driver_auto_upgrade(counts.is_some());
    metrics.set_upgrade_census(UpgradeCensus {
        in_progress: n(c.in_progress),
        done: n(c.done),
        failed: n(c.failed),
        available: n(c.available),
        pending: n(c.pending),
    });
}

/// The scope of the active ClusterPolicy's driver, when it runs one: `None` when the policy
/// hands the driver to NVIDIADriver CRs, disables the driver, or turns sandbox workloads on
/// (upstream's gating). `policy` is `None` (labels swept) when auto upgrade is off.
pub fn cluster_policy_scope(policy: &ClusterPolicy, namespace: &str) -> Option<UpgradeScope> {
    let spec = &policy.spec;
    if spec.driver.use_nvidia_driver_crd == Some(true) {
        return None;
    }
    let off =
        spec.driver.common.enabled == Some(false) || spec.sandbox_workloads.enabled == Some(true);
    Some(UpgradeScope {
        namespace: namespace.into(),
        daemonset: DRIVER_DAEMONSET.into(),
        policy: if off {
            None
        } else {
            spec.driver.upgrade_policy.clone()
        },
        owner: policy.object_ref(&()),
        validator_selector: upgrade::VALIDATOR_SELECTOR.into(),
    })
}

/// The upgrade loop, until `shutdown` resolves: a pass over the ClusterPolicy's driver
/// ([`cluster_policy_scope`]) and over each NVIDIADriver's DaemonSets ([`driver_scopes`]) on
/// every change ([`Upgrader::changed`], debounced by [`DEBOUNCE`]) and every
/// [`ACTIVE_INTERVAL`] while an upgrade runs. Everything comes from the view (the policy and
/// the CRs from their stores, the driver DaemonSets from the DaemonSet store), so a pass with
/// nothing to do sends no request; the policy's `status.driverUpgrade` and the gauges
/// (`metrics`, [`set_metrics`]) follow each pass of its driver.
pub async fn run(
    upgrader: Arc<Upgrader>,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let body = async {
        let mut status = StatusState::default();
        loop {
            let policy = match cluster_policy_pass(&upgrader, &metrics, &mut status).await {
                Ok(active) => active,
                Err(e) => {
                    tracing::warn!(error = %e, "driver upgrade pass failed");
                    true
                }
            };
            let drivers = match driver_passes(&upgrader).await {
                Ok(active) => active,
                Err(e) => {
                    tracing::warn!(error = %e, "NVIDIADriver upgrade pass failed");
                    true
                }
            };
            if policy || drivers {
                let _ = tokio::time::timeout(ACTIVE_INTERVAL, upgrader.changed().notified()).await;
            } else {
                upgrader.changed().notified().await;
            }
            tokio::time::sleep(DEBOUNCE).await;
        }
    };
    tokio::select! {
        () = body => {}
        () = shutdown => {}
    }
}

/// The scopes of the NVIDIADrivers' DaemonSets, each with the CR's own `upgradePolicy`
/// ([`kiln_core::spec::nvidiadriver::NvidiaDriverSpec::upgrade_policy`]): every DaemonSet of
/// the view whose [`kiln_core::spec::nvidiadriver::NVIDIADRIVER_LABEL`] names a CR
/// ([`crate::cluster::live::owner_of`]), while the NVIDIADriver controller runs the driver
/// (no ClusterPolicy, or the active one sets `driver.useNvidiaDriverCRD`).
pub fn driver_scopes(view: &View, namespace: &str) -> Vec<(UpgradeScope, Arc<DaemonSet>)> {
    let Some(drivers) = &view.drivers else {
        return Vec::new();
    };
    let policies = view.policies();
    if let Some(p) = crate::cluster::view::active_of(&policies)
        && p.data["spec"]["driver"]["useNvidiaDriverCRD"] != Value::Bool(true)
    {
        return Vec::new();
    }
    view.daemonsets
        .state()
        .into_iter()
        .filter_map(|ds| {
            let cr = drivers.get(&crate::cluster::live::owner_of(&ds)?)?;
            let scope = UpgradeScope {
                namespace: namespace.to_string(),
                daemonset: ds.name_any(),
                policy: Some(cr.spec.upgrade_policy()),
                owner: cr.object_ref(&()),
                validator_selector: upgrade::VALIDATOR_SELECTOR.to_string(),
            };
            Some((scope, ds))
        })
        .collect()
}

/// One pass over each of [`driver_scopes`]; whether an upgrade is under way in any.
async fn driver_passes(upgrader: &Upgrader) -> Result<bool> {
    let mut active = false;
    for (scope, ds) in driver_scopes(&upgrader.view, &upgrader.config.namespace) {
        active |= upgrader.pass(&scope, &ds).await?.active;
    }
    Ok(active)
}

/// What the loop last wrote to `status.driverUpgrade` and when (the store may not show a
/// write yet when the next pass runs).
#[derive(Default)]
struct StatusState {
    at: Option<std::time::Instant>,
    written: Option<Option<DriverUpgradeStatus>>,
}

/// A written status still missing from the store is written again after this long.
const STATUS_REWRITE_AFTER: Duration = Duration::from_secs(30);

async fn cluster_policy_pass(
    upgrader: &Upgrader,
    metrics: &Metrics,
    last: &mut StatusState,
) -> Result<bool> {
    // Not waited for: the controller's store does not report readiness (kube-runtime 5), and
    // the policy's first full reconcile wakes this loop anyway.
    let objects = upgrader.view.policies();
    let Some(object) = crate::cluster::view::active_of(&objects) else {
        set_metrics(metrics, None);
        return Ok(false);
    };
    let policy: ClusterPolicy = parse_policy(object)?;
    let Some(scope) = cluster_policy_scope(&policy, &upgrader.config.namespace) else {
        set_metrics(metrics, None);
        return Ok(false);
    };
    let live = &upgrader.view.live;
    let _ = live.ready(crate::cluster::watch::LIVE_READY_LIMIT).await;
    let Some(ds) = live.daemonset(&scope.namespace, &scope.daemonset) else {
        tracing::debug!(daemonset = %scope.daemonset, "no driver DaemonSet yet");
        set_metrics(metrics, None);
        return Ok(false);
    };
    let report = upgrader.pass(&scope, &ds).await?;
    set_metrics(metrics, report.counts.as_ref());
    let want = report.counts.as_ref().map(DriverUpgradeStatus::from);
    let have = policy
        .status
        .as_ref()
        .and_then(|s| s.driver_upgrade.clone());
    // Every status write wakes the ClusterPolicy's reconcile: while nodes move, at most one
    // every STATUS_EVERY; the final counts always. A write the store does not show yet is not
    // repeated (for STATUS_REWRITE_AFTER).
    let due = !report.active || last.at.is_none_or(|t| t.elapsed() >= STATUS_EVERY);
    let pending = last.written.as_ref() == Some(&want)
        && last.at.is_some_and(|t| t.elapsed() < STATUS_REWRITE_AFTER);
    if want != have && due && !pending {
        last.at = Some(std::time::Instant::now());
        last.written = Some(want.clone());
        let body = driver_upgrade_patch(have.as_ref(), want.as_ref());
        Api::<ClusterPolicy>::all(upgrader.client.clone())
            .patch_status(
                &policy.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&body),
            )
            .await
            .map_err(|e| Error::kube("write status.driverUpgrade", e))?;
        upgrader.wrote(1);
    }
    Ok(report.active)
}

/// The JSON merge patch (RFC 7386) that turns `status.driverUpgrade` from `have` into `want`: a
/// merge patch keeps map keys it does not name, so a state no node is in any more (`unknown`
/// once every node is `upgrade-done`) is named with `null`, which deletes it.
fn driver_upgrade_patch(
    have: Option<&DriverUpgradeStatus>,
    want: Option<&DriverUpgradeStatus>,
) -> Value {
    let mut body = json!({"status": {"driverUpgrade": want}});
    if let (Some(have), Some(want)) = (have, want) {
        for state in have.nodes.keys().filter(|k| !want.nodes.contains_key(*k)) {
            body["status"]["driverUpgrade"]["nodes"][state.as_str()] = Value::Null;
        }
    }
    body
}

/// A ClusterPolicy of the controller's store as the typed spec.
fn parse_policy(object: &DynamicObject) -> Result<ClusterPolicy> {
    serde_json::to_value(object)
        .and_then(serde_json::from_value)
        .map_err(|e| Error::Json {
            action: format!("read ClusterPolicy {}", object.name_any()),
            source: e,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    /// RFC 7386 applied to `target`, as the API server applies a merge patch.
    fn merge(target: &mut Value, patch: &Value) {
        match (target, patch) {
            (Value::Object(t), Value::Object(p)) => {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
            (t, p) => *t = p.clone(),
        }
    }

    #[test]
    fn a_driver_upgrade_status_patch_drops_states_no_node_is_in_any_more() {
        let status = |nodes: Value| -> DriverUpgradeStatus {
            obj(json!({"totalNodes": 5, "upgradesDone": 5, "nodes": nodes}))
        };
        let have = status(json!({"unknown": 5}));
        let want = status(json!({"upgrade-done": 5}));
        let mut live = json!({"status": {"state": "ready", "driverUpgrade": have}});
        merge(&mut live, &driver_upgrade_patch(Some(&have), Some(&want)));
        assert_eq!(
            live["status"]["driverUpgrade"]["nodes"],
            json!({"upgrade-done": 5}),
            "{live}"
        );
        assert_eq!(
            live["status"]["state"], "ready",
            "the rest of status is kept"
        );
        // Nothing to drop without a previous status; no status at all when none is wanted.
        let first = driver_upgrade_patch(None, Some(&want));
        assert_eq!(
            first["status"]["driverUpgrade"]["nodes"],
            json!({"upgrade-done": 5})
        );
        assert_eq!(
            driver_upgrade_patch(Some(&have), None),
            json!({"status": {"driverUpgrade": null}})
        );
    }

    fn ds() -> DaemonSet {
        obj(json!({
            "metadata": {"name": "nvidia-driver-daemonset", "namespace": "gpu-operator", "uid": "ds1"},
            "spec": {"selector": {"matchLabels": {"app": "nvidia-driver-daemonset"}},
                "template": {"metadata": {"labels": {"app": "nvidia-driver-daemonset"}},
                    "spec": {"nodeSelector": {"nvidia.com/gpu.deploy.driver": "true"},
                        "containers": [{"name": "nvidia-driver-ctr",
                            "env": [{"name": "DRIVER_CONFIG_DIGEST", "value": "42"}]}]}}}
        }))
    }

    fn node(name: &str, state: Option<&str>) -> SlimNode {
        let mut labels = json!({"nvidia.com/gpu.deploy.driver": "true"});
        if let Some(s) = state {
            labels[STATE_LABEL_KEY] = json!(s);
        }
        obj(json!({"metadata": {"name": name, "labels": labels}}))
    }

    const STATE_LABEL_KEY: &str = upgrade::STATE_LABEL;

    fn pod(ns: &str, name: &str, node: &str, extra: Value) -> Pod {
        let mut p = json!({
            "metadata": {"name": name, "namespace": ns, "labels": {}},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0, "image": "i", "imageID": ""}]}
        });
        json_merge(&mut p, extra);
        obj(p)
    }

    fn json_merge(a: &mut Value, b: Value) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    json_merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn driver(name: &str, node: &str, hash: &str) -> Pod {
        pod(
            "gpu-operator",
            name,
            node,
            json!({"metadata": {"labels": {"app": "nvidia-driver-daemonset", "controller-revision-hash": hash},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvidia-driver-daemonset",
                    "uid": "ds1", "controller": true}]},
                "spec": {"containers": [{"name": "nvidia-driver-ctr",
                    "env": [{"name": "DRIVER_CONFIG_DIGEST", "value": "42"}]}]}}),
        )
    }

    fn scope() -> UpgradeScope {
        UpgradeScope {
            namespace: "gpu-operator".into(),
            daemonset: DRIVER_DAEMONSET.into(),
            policy: Some(DriverUpgradePolicySpec {
                auto_upgrade: true,
                ..Default::default()
            }),
            owner: ObjectReference::default(),
            validator_selector: upgrade::VALIDATOR_SELECTOR.into(),
        }
    }

    #[test]
    fn facts_per_node_from_the_driver_pods_workloads_and_validators() {
        let drivers = vec![
            driver("drv-a", "a", "new"),
            driver("drv-b", "b", "old"),
            // An orphaned driver pod (its DaemonSet was replaced) on c.
            pod(
                "gpu-operator",
                "drv-c",
                "c",
                json!({"metadata": {"labels": {"app": "nvidia-driver-daemonset"}}}),
            ),
        ];
        let validators = vec![pod(
            "gpu-operator",
            "val-a",
            "a",
            json!({"metadata": {"labels": {"app": "nvidia-operator-validator"}},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
        )];
        // Node b's pods as listed by node name: its own driver pod is not a workload.
        let workloads = HashMap::from([(
            "b".to_string(),
            vec![
                driver("drv-b", "b", "old"),
                pod(
                    "jobs",
                    "train",
                    "b",
                    json!({"metadata": {"labels": {"app": "trainer"}},
                    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
                ),
            ],
        )]);
        let slim = |ps: Vec<Pod>| -> Vec<Arc<SlimPod>> {
            ps.iter()
                .map(|p| {
                    let v = serde_json::to_value(p).unwrap();
                    Arc::new(serde_json::from_value::<SlimPod>(v).unwrap())
                })
                .collect()
        };
        let (drivers, validators) = (slim(drivers), slim(validators));
        let pods = Pods {
            drivers: &drivers,
            validators: &validators,
            workloads: &workloads,
        };
        let nodes = [
            node("a", Some("upgrade-done")),
            node("b", None),
            node("c", None),
            // Mid-upgrade, driver pod being recreated: kept.
            node("d", Some("pod-restart-required")),
            // Done, no driver pod: left out (kept only for the sweep).
            node("e", Some("upgrade-done")),
            // No driver pod, no state: not a driver node.
            node("f", None),
        ]
        .map(Arc::new);
        let f = node_facts(&pods, &scope(), &ds(), &nodes, Some("new"), false);
        let names: Vec<&str> = f.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d"]);
        let a = &f[0];
        let d = a.driver.as_ref().unwrap();
        assert!(d.current_revision && d.same_digest && d.ready && !d.orphaned);
        assert_eq!(a.validator_ready, Some(false));
        assert_eq!(a.state, UpgradeState::Done);
        let b = &f[1];
        assert!(!b.driver.as_ref().unwrap().current_revision);
        assert_eq!(b.validator_ready, None);
        assert_eq!(b.pods.len(), 1);
        assert!(b.pods[0].uses_gpu);
        assert!(f[2].driver.as_ref().unwrap().orphaned);
        assert!(f[3].driver.is_none());
        let swept = node_facts(&pods, &scope(), &ds(), &nodes, None, true);
        assert!(swept.iter().any(|n| n.name == "e"));
        assert!(!swept.iter().any(|n| n.name == "f"));
    }

    #[test]
    fn an_nvidiadriver_replaces_the_policys_orphaned_driver_pods_on_its_own_nodes() {
        // The CR's DaemonSet (pool a) and the ClusterPolicy's driver pods it left, orphaned,
        // on a node of pool a (in state done), a node of pool b and one mid-upgrade.
        let ds: DaemonSet = obj(json!({
            "metadata": {"name": "nvidia-gpu-driver-ubuntu22.04-a", "namespace": "gpu-operator",
                "uid": "cr-ds"},
            "spec": {"selector": {"matchLabels": {"app": "nvidia-gpu-driver-ubuntu22.04-a"}},
                "template": {"metadata": {"labels": {"app": "nvidia-gpu-driver-ubuntu22.04-a"}},
                    "spec": {"nodeSelector": {"pool": "a"}, "containers": [{"name": "nvidia-driver-ctr"}]}}}
        }));
        let left = |name: &str, node: &str| {
            pod(
                "gpu-operator",
                name,
                node,
                json!({"metadata": {"labels": {"app": "nvidia-driver-daemonset",
                    "app.kubernetes.io/component": "nvidia-driver"}}}),
            )
        };
        let drivers: Vec<Arc<SlimPod>> = [
            left("old-1", "a1"),
            left("old-2", "b1"),
            left("old-3", "a2"),
        ]
        .iter()
        .map(|p| {
            Arc::new(serde_json::from_value::<SlimPod>(serde_json::to_value(p).unwrap()).unwrap())
        })
        .collect();
        let workloads = HashMap::new();
        let pods = Pods {
            drivers: &drivers,
            validators: &[],
            workloads: &workloads,
        };
        let pooled = |name: &str, pool: &str, state: Option<&str>| -> Arc<SlimNode> {
            let mut labels = json!({"pool": pool});
            if let Some(s) = state {
                labels[STATE_LABEL_KEY] = json!(s);
            }
            Arc::new(obj(json!({"metadata": {"name": name, "labels": labels}})))
        };
        let nodes = [
            pooled("a1", "a", Some("upgrade-done")),
            pooled("a2", "a", Some("wait-for-jobs-required")),
            pooled("b1", "b", Some("upgrade-done")),
        ];
        let mut cr = scope();
        cr.daemonset = "nvidia-gpu-driver-ubuntu22.04-a".into();
        cr.owner = ObjectReference {
            kind: Some("NVIDIADriver".into()),
            name: Some("pool-a".into()),
            ..Default::default()
        };
        assert!(cr.replaces_orphans() && !scope().replaces_orphans());
        let f = node_facts(&pods, &cr, &ds, &nodes, Some("new"), false);
        let names: Vec<&str> = f.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a1", "a2"], "pool b's node is not this CR's");
        assert!(f.iter().all(|n| n.driver.as_ref().unwrap().orphaned));
        // Done with an orphan: an upgrade request (upstream's labelling); mid-upgrade: no new
        // request.
        assert!(f[0].requested && !f[1].requested);
        let plan = upgrade::plan(
            &Inputs {
                policy: cr.policy.as_ref().unwrap(),
                now: 0,
                validation_timeout: 600,
            },
            &f,
        );
        assert!(
            plan.actions("a1")
                .contains(&Action::SetState(UpgradeState::UpgradeRequired)),
            "{plan:?}"
        );
        // The ClusterPolicy's own scope finds no such orphans (its DaemonSet selects by `app`).
        let none = node_facts(&pods, &scope(), &ds, &nodes, Some("new"), false);
        assert!(
            none.iter().all(|n| n.driver.is_none() && !n.requested),
            "{none:?}"
        );
    }

    #[test]
    fn cluster_policy_gating() {
        let p = |spec: Value| -> ClusterPolicy {
            obj(
                json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                "metadata": {"name": "cluster-policy", "uid": "u"}, "spec": spec}),
            )
        };
        let on = p(json!({"driver": {"upgradePolicy": {"autoUpgrade": true}}}));
        let s = cluster_policy_scope(&on, "gpu-operator").unwrap();
        assert_eq!(s.daemonset, "nvidia-driver-daemonset");
        assert!(s.policy.unwrap().auto_upgrade);
        assert_eq!(s.owner.name.as_deref(), Some("cluster-policy"));
        let crd = p(
            json!({"driver": {"useNvidiaDriverCRD": true, "upgradePolicy": {"autoUpgrade": true}}}),
        );
        assert!(cluster_policy_scope(&crd, "gpu-operator").is_none());
        let sandbox = p(
            json!({"sandboxWorkloads": {"enabled": true}, "driver": {"upgradePolicy": {"autoUpgrade": true}}}),
        );
        assert!(
            cluster_policy_scope(&sandbox, "gpu-operator")
                .unwrap()
                .policy
                .is_none()
        );
        let off = p(json!({"driver": {"enabled": false, "upgradePolicy": {"autoUpgrade": true}}}));
        assert!(
            cluster_policy_scope(&off, "gpu-operator")
                .unwrap()
                .policy
                .is_none()
        );
    }

    #[test]
    fn only_waiting_deleting_and_draining_read_a_nodes_pods() {
        let reading: Vec<UpgradeState> = UpgradeState::ALL
            .into_iter()
            .filter(|s| reads_workloads(*s))
            .collect();
        assert_eq!(
            reading,
            [
                UpgradeState::WaitForJobsRequired,
                UpgradeState::PodDeletionRequired,
                UpgradeState::DrainRequired
            ]
        );
    }
}
