//! Rolling driver upgrades: the IO around [`kiln_core::upgrade`] (upstream's upgrade
//! controller, `gpu-operator.md` §6).
//!
//! ```text
//! UpgradeScope (driver DaemonSet + upgrade policy + who to report on)
//!   ├─ GET DaemonSet, LIST its ControllerRevisions (current revision hash)
//!   ├─ LIST Nodes (fresh: slot counting must see this operator's own last writes)
//!   ├─ pods from a reflector store (driver pods, workloads, validators per node)
//!   ▼
//! kiln_core::upgrade::plan ─► per node: evictions, driver pod delete, ONE node merge patch
//!                              (state label + annotations + spec.unschedulable), Events
//! ```
//!
//! A node's progress is its state label and annotations, so a restarted operator resumes where
//! the last one stopped. The state machine is scoped to one driver DaemonSet and the nodes that
//! run its pods: the ClusterPolicy's (`nvidia-driver-daemonset`, [`run_cluster_policy`]) or one
//! NVIDIADriver's (its controller builds an [`UpgradeScope`] and calls [`Upgrader::pass`]).
//!
//! Events (reason `GPUDriverUpgrade`, events.k8s.io/v1, one per transition): every transition
//! and failure on the node and on the scope's owner (`gpu-node-3: cordon-required ->
//! wait-for-jobs-required: cordoned`); progress notes of a wait (`waiting for 2 pod(s)
//! matching app=trainer, 41m so far`) on the node, at most every [`PROGRESS_EVENT_EVERY`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kiln_core::spec::{ClusterPolicy, DriverUpgradePolicySpec, DriverUpgradeStatus};
use kiln_core::upgrade::{
    self, Action, Counts, DriverPodFacts, Inputs, NodeFacts, NodePlan, PodFacts, Selector,
    UpgradeState,
};
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Map, Value, json};
use tokio::sync::Notify;

use crate::metrics::{Metrics, UpgradeCensus};
use crate::{Error, Result, is_not_found};

/// The ClusterPolicy's driver DaemonSet (assets/state-driver).
pub const DRIVER_DAEMONSET: &str = "nvidia-driver-daemonset";
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
            identity: crate::context::default_identity(),
            namespace: "gpu-operator".into(),
        }
    }
}

/// The upgrade controller's cluster view and writer; one per operator, shared by the
/// ClusterPolicy loop and the NVIDIADriver controller.
pub struct Upgrader {
    client: Client,
    pods: Store<Pod>,
    changed: Arc<Notify>,
    config: UpgradeConfig,
    /// Node → when its last progress Event went out (unix seconds).
    progress: std::sync::Mutex<HashMap<String, i64>>,
    writes: AtomicU64,
    /// The watch tasks, stopped when the upgrader goes.
    tasks: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
    /// An upgrade is under way: every pod change wakes the loop (at rest only pods in
    /// [`UpgradeConfig::namespace`] do, so a quiet cluster costs no requests).
    active: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Upgrader {
    fn drop(&mut self) {
        for t in self.tasks.lock().expect("tasks lock").drain(..) {
            t.abort();
        }
    }
}

impl Upgrader {
    /// Start the pod reflector (all namespaces; managed fields dropped) and return the
    /// upgrader; [`Upgrader::changed`] fires on every pod change.
    pub fn start(client: Client, config: UpgradeConfig) -> Arc<Upgrader> {
        let (reader, writer) = reflector::store::<Pod>();
        let changed = Arc::new(Notify::new());
        let notify = changed.clone();
        let active = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let busy = active.clone();
        let ns = config.namespace.clone();
        let api: Api<Pod> = Api::all(client.clone());
        let stream = reflector::reflector(
            writer,
            watcher(api, watcher::Config::default()).modify(|p| {
                p.managed_fields_mut().clear();
            }),
        )
        .default_backoff()
        .touched_objects();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                let wake = match &ev {
                    Ok(p) => {
                        busy.load(Ordering::Relaxed)
                            || p.metadata.namespace.as_deref() == Some(ns.as_str())
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "upgrade pod watch");
                        false
                    }
                };
                if wake {
                    notify.notify_one();
                }
            }
        });
        Arc::new(Upgrader {
            client,
            pods: reader,
            changed,
            config,
            progress: Default::default(),
            writes: AtomicU64::new(0),
            tasks: std::sync::Mutex::new(vec![task.abort_handle()]),
            active,
        })
    }

    /// Fires when a pod changes (and when [`Upgrader::poke`] is called).
    pub fn changed(&self) -> &Notify {
        &self.changed
    }

    /// Ask for a pass soon (a node, DaemonSet or policy changed).
    pub fn poke(&self) {
        self.changed.notify_one();
    }

    /// API writes sent so far (node patches, evictions, pod deletes, Events, status).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    fn wrote(&self, n: u64) {
        self.writes.fetch_add(n, Ordering::Relaxed);
    }

    /// One pass over `scope`: read, plan, apply.
    ///
    /// # Errors
    /// [`Error::Kube`] when a read fails or a node patch fails; evictions that the API refuses
    /// (a PodDisruptionBudget) are retried next pass.
    pub async fn pass(&self, scope: &UpgradeScope) -> Result<PassReport> {
        self.pods.wait_until_ready().await.ok();
        let dss: Api<DaemonSet> = Api::namespaced(self.client.clone(), &scope.namespace);
        let Some(ds) = dss
            .get_opt(&scope.daemonset)
            .await
            .map_err(|e| Error::kube(format!("get DaemonSet {}", scope.daemonset), e))?
        else {
            return Ok(PassReport::default());
        };
        let policy = scope.policy.as_ref().filter(|p| p.auto_upgrade);
        let nodes = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| Error::kube("list nodes", e))?
            .items;
        let desired = if policy.is_some() {
            self.current_revision(&ds).await?
        } else {
            None
        };
        let facts = node_facts(
            &self.pods.state(),
            scope,
            &ds,
            &nodes,
            desired.as_deref(),
            policy.is_none(),
        );
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

    /// The DaemonSet's current template revision: the `controller-revision-hash` of its
    /// newest ControllerRevision, and the template's `DRIVER_CONFIG_DIGEST`.
    async fn current_revision(&self, ds: &DaemonSet) -> Result<Option<String>> {
        let Some(uid) = ds.metadata.uid.as_deref() else {
            return Ok(None);
        };
        let selector = ds
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.as_ref())
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let ns = ds.metadata.namespace.clone().unwrap_or_default();
        let revisions = Api::<ControllerRevision>::namespaced(self.client.clone(), &ns)
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| Error::kube("list controllerrevisions", e))?;
        let newest = revisions
            .items
            .iter()
            .filter(|r| r.owner_references().iter().any(|o| o.uid == uid))
            .max_by_key(|r| r.revision);
        let name = ds.name_any();
        Ok(newest.and_then(|r| {
            r.labels()
                .get(upgrade::REVISION_HASH_LABEL)
                .cloned()
                .or_else(|| {
                    r.name_any()
                        .strip_prefix(&format!("{name}-"))
                        .map(str::to_string)
                })
        }))
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
                            Ok(_) => writes += 1,
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
                nodes
                    .patch(
                        &np.node,
                        &PatchParams::default(),
                        &Patch::Merge(Value::Object(body)),
                    )
                    .await
                    .map_err(|e| Error::kube(format!("patch node {}", np.node), e))?;
                writes += 1;
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

    /// Evict `pods` (`namespace/name`) as `kubectl drain` does; a refusal (PodDisruptionBudget,
    /// 429) is logged and retried on the next pass.
    async fn evict(&self, node: &str, pods: &[String], drain: bool) -> u64 {
        let mut writes = 0;
        for key in pods {
            let Some((ns, name)) = key.split_once('/') else {
                continue;
            };
            let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            match api.evict(name, &EvictParams::default()).await {
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

/// The managed nodes' facts: nodes running a pod of the DaemonSet (or an orphaned driver
/// pod it would select), and nodes mid-upgrade that its nodeSelector matches (with `sweep`,
/// every such node that carries a state).
pub fn node_facts(
    pods: &[Arc<Pod>],
    scope: &UpgradeScope,
    ds: &DaemonSet,
    nodes: &[Node],
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
    let mut by_node: HashMap<&str, Vec<&Pod>> = HashMap::new();
    let mut drivers: HashMap<&str, DriverPodFacts> = HashMap::new();
    for p in pods {
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            continue;
        };
        let in_ns = p.metadata.namespace.as_deref() == Some(scope.namespace.as_str());
        let owners = p.owner_references();
        let owned = owners.iter().any(|o| o.uid == uid);
        let orphan = in_ns
            && owners.is_empty()
            && !match_labels.is_empty()
            && match_labels
                .iter()
                .all(|(k, v)| p.labels().get(k) == Some(v));
        if in_ns && owned {
            let f = DriverPodFacts::from_pod(p, desired.map(|h| (h, digest)));
            // Prefer the live pod over one already terminating.
            let keep = drivers
                .get(node)
                .is_some_and(|d| !d.orphaned && !d.terminating && f.terminating);
            if !keep {
                drivers.insert(node, f);
            }
        } else if orphan {
            drivers
                .entry(node)
                .or_insert_with(|| DriverPodFacts::from_pod(p, None));
        } else {
            by_node.entry(node).or_default().push(p);
        }
    }
    let mut out = Vec::new();
    for n in nodes {
        let name = n.name_any();
        let mut f = NodeFacts::from_node(n);
        let selected = node_selector
            .iter()
            .all(|(k, v)| n.labels().get(k) == Some(v));
        f.driver = drivers.remove(name.as_str());
        // A node without a driver pod is managed only mid-upgrade (its pod is being
        // recreated) or, for the sweep when auto upgrade is off, while it carries a state.
        let keep = f.driver.is_some()
            || (selected && f.state.in_progress())
            || (sweep && selected && f.state != UpgradeState::Unknown);
        if !keep {
            continue;
        }
        let here = by_node.get(name.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        let validators: Vec<&&Pod> = here
            .iter()
            .filter(|p| validator.matches(&labels_of(p)))
            .collect();
        f.validator_ready = if validators.is_empty() {
            None
        } else {
            Some(validators.iter().any(|p| pod_ready(p)))
        };
        f.pods = here.iter().map(|p| PodFacts::from_pod(p)).collect();
        out.push(f);
    }
    out
}

fn labels_of(p: &Pod) -> BTreeMap<String, String> {
    p.metadata.labels.clone().unwrap_or_default()
}

fn pod_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().is_some_and(|s| {
            s.phase.as_deref() == Some("Running")
                && s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
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

/// The upgrade loop of the ClusterPolicy's driver, until `shutdown` resolves: a pass on every
/// change (debounced by [`DEBOUNCE`]) and every [`ACTIVE_INTERVAL`] while an upgrade runs. At
/// rest only changes that can start one wake it — a DaemonSet in `namespace`, a pod there (a
/// new driver pod), a ClusterPolicy, a node's upgrade label or annotation — so a quiet cluster
/// costs no requests; `status.driverUpgrade` and the gauges ([`set_metrics`]) follow each pass.
pub async fn run_cluster_policy(
    upgrader: Arc<Upgrader>,
    namespace: String,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let client = upgrader.client.clone();
    spawn_pokes(&upgrader, &client, &namespace);
    let policies: Api<ClusterPolicy> = Api::all(client.clone());
    let body = async {
        let mut last_status = None;
        loop {
            let pass =
                cluster_policy_pass(&upgrader, &policies, &namespace, &metrics, &mut last_status);
            let active = match pass.await {
                Ok(active) => active,
                Err(e) => {
                    tracing::warn!(error = %e, "driver upgrade pass failed");
                    true
                }
            };
            upgrader.active.store(active, Ordering::Relaxed);
            if active {
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

async fn cluster_policy_pass(
    upgrader: &Upgrader,
    policies: &Api<ClusterPolicy>,
    namespace: &str,
    metrics: &Metrics,
    last_status: &mut Option<std::time::Instant>,
) -> Result<bool> {
    let list = policies
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube("list clusterpolicies", e))?;
    let active = kiln_core::singleton::active_policy(list.items.iter().map(|p| &p.metadata));
    let Some(policy) = list
        .items
        .iter()
        .find(|p| p.metadata.name.as_deref() == active)
    else {
        set_metrics(metrics, None);
        return Ok(false);
    };
    let Some(scope) = cluster_policy_scope(policy, namespace) else {
        set_metrics(metrics, None);
        return Ok(false);
    };
    let report = upgrader.pass(&scope).await?;
    set_metrics(metrics, report.counts.as_ref());
    let want = report.counts.as_ref().map(DriverUpgradeStatus::from);
    let have = policy
        .status
        .as_ref()
        .and_then(|s| s.driver_upgrade.clone());
    // Every status write wakes the ClusterPolicy's reconcile: while nodes move, at most one
    // every STATUS_EVERY; the final counts always.
    let due = !report.active || last_status.is_none_or(|t| t.elapsed() >= STATUS_EVERY);
    if want != have && due {
        *last_status = Some(std::time::Instant::now());
        let body = json!({"status": {"driverUpgrade": want}});
        policies
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

/// A hash of a node's `nvidia.com/gpu-driver-upgrade*` labels and annotations.
fn upgrade_meta_hash(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for m in [labels, annotations] {
        for (k, v) in m
            .iter()
            .filter(|(k, _)| k.starts_with("nvidia.com/gpu-driver-upgrade"))
        {
            (k, v).hash(&mut h);
        }
        0xffu8.hash(&mut h);
    }
    h.finish()
}

/// Wake the loop on node, DaemonSet and ClusterPolicy changes (pods wake it through the store).
fn spawn_pokes(upgrader: &Upgrader, client: &Client, namespace: &str) {
    let notify = upgrader.changed.clone();
    let nodes = watcher(
        Api::<kube::core::PartialObjectMeta<Node>>::all(client.clone()),
        watcher::Config::default(),
    );
    let dss = watcher(
        Api::<DaemonSet>::namespaced(client.clone(), namespace),
        watcher::Config::default(),
    )
    .map(|e| e.map(|_| ()));
    let policies = watcher(
        Api::<ClusterPolicy>::all(client.clone()),
        watcher::Config::default(),
    )
    .map(|e| e.map(|_| ()));
    // Only a change of what the state machine reads on a node wakes the loop (not heartbeats).
    let mut last: HashMap<String, u64> = HashMap::new();
    let nodes = nodes
        .default_backoff()
        .touched_objects()
        .filter_map(move |e| {
            let wake = e.ok().is_some_and(|n| {
                let h = upgrade_meta_hash(n.labels(), n.annotations());
                last.insert(n.name_any(), h) != Some(h)
            });
            std::future::ready(wake.then_some(Ok::<(), watcher::Error>(())))
        });
    let all = futures::stream::select(
        nodes,
        futures::stream::select(dss, policies).default_backoff(),
    );
    let task = tokio::spawn(async move {
        futures::pin_mut!(all);
        while all.next().await.is_some() {
            notify.notify_one();
        }
    });
    upgrader
        .tasks
        .lock()
        .expect("tasks lock")
        .push(task.abort_handle());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
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

    fn node(name: &str, state: Option<&str>) -> Node {
        let mut labels = json!({"nvidia.com/gpu.deploy.driver": "true"});
        if let Some(s) = state {
            labels[STATE_LABEL_KEY] = json!(s);
        }
        obj(json!({"metadata": {"name": name, "labels": labels}}))
    }

    const STATE_LABEL_KEY: &str = upgrade::STATE_LABEL;

    fn pod(ns: &str, name: &str, node: &str, extra: Value) -> Arc<Pod> {
        let mut p = json!({
            "metadata": {"name": name, "namespace": ns, "labels": {}},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0, "image": "i", "imageID": ""}]}
        });
        json_merge(&mut p, extra);
        Arc::new(obj(p))
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

    fn driver(name: &str, node: &str, hash: &str) -> Arc<Pod> {
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
        let pods = vec![
            driver("drv-a", "a", "new"),
            driver("drv-b", "b", "old"),
            // An orphaned driver pod (its DaemonSet was replaced) on c.
            pod(
                "gpu-operator",
                "drv-c",
                "c",
                json!({"metadata": {"labels": {"app": "nvidia-driver-daemonset"}}}),
            ),
            pod(
                "gpu-operator",
                "val-a",
                "a",
                json!({"metadata": {"labels": {"app": "nvidia-operator-validator"}},
                "status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
            ),
            pod(
                "jobs",
                "train",
                "b",
                json!({"metadata": {"labels": {"app": "trainer"}},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
            ),
        ];
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
        ];
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
    fn only_upgrade_metadata_changes_the_wake_hash() {
        let l = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let base = upgrade_meta_hash(&l(&[("a", "1")]), &l(&[]));
        assert_eq!(
            base,
            upgrade_meta_hash(&l(&[("a", "2")]), &l(&[("gfd.timestamp", "9")]))
        );
        assert_ne!(
            base,
            upgrade_meta_hash(&l(&[(upgrade::SKIP_LABEL, "true")]), &l(&[]))
        );
        assert_ne!(
            base,
            upgrade_meta_hash(&l(&[]), &l(&[(upgrade::UPGRADE_REQUESTED, "true")]))
        );
    }
}
