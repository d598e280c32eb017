//! DaemonSet readiness: judge a DaemonSet (from the store of the namespace's shared DaemonSet
//! watch, [`crate::cluster::live::start_daemonsets`]) with [`kiln_core::readiness::daemonset_readiness`];
//! a DaemonSet ready by upstream's rules is still not ready while it covers fewer nodes than its
//! selector matches ([`kiln_core::plan::uncovered_nodes`]). `OnDelete` DaemonSets also need
//! their pods and ControllerRevisions: from watches on the DaemonSet's selector ([`PodWatches`],
//! started on first need, each change waking the controller and the driver upgrade loop).
//! [`PodWatches`] also holds the validator pod watch, which wakes the upgrade loop only and
//! feeds the readiness timeline ([`PodWatches::tap_matching`]).

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use internment::ArcIntern;
use kiln_core::plan::uncovered_nodes;
use kiln_core::readiness::{NotReady, Readiness, daemonset_readiness, is_on_delete};
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::cluster::live::Wake;
use crate::cluster::node::{InternedLabels, Sym, sym};
use crate::{Error, Result};

/// How long a first readiness check of an `OnDelete` DaemonSet waits for its new pod and
/// revision watches to list.
pub const POD_WATCH_READY_LIMIT: Duration = Duration::from_secs(10);

/// A ControllerRevision reduced to what the `OnDelete` rule and the driver upgrade read (name,
/// namespace, labels, owner references, revision; not its template data).
pub fn slim_revision(r: ControllerRevision) -> ControllerRevision {
    ControllerRevision {
        metadata: ObjectMeta {
            name: r.metadata.name,
            namespace: r.metadata.namespace,
            labels: r.metadata.labels,
            owner_references: r.metadata.owner_references,
            ..ObjectMeta::default()
        },
        revision: r.revision,
        data: None,
    }
}

struct Watched {
    selector: String,
    pods: PodStore,
    revisions: Option<Store<ControllerRevision>>,
    /// Events either watch has seen.
    changes: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Watches of the pods and ControllerRevisions of each `OnDelete` DaemonSet, by its
/// `spec.selector.matchLabels` (slimmed: [`SlimPod`], [`slim_revision`]); restarted when the
/// selector changes. Their changes wake the controller (a pod moving to the new revision
/// changes readiness) and the driver upgrade loop. Also the watch of the pods matching a
/// selector (the validator pods, [`PodWatches::matching`]), whose changes wake the upgrade loop
/// only and whose events the readiness timeline reads ([`PodWatches::tap_matching`]).
pub struct PodWatches {
    client: Client,
    wake: Wake,
    watched: Mutex<HashMap<(String, String), Watched>>,
    /// Per DaemonSet (`namespace`, `name`): the readiness last judged, with the DaemonSet's
    /// `resourceVersion` and its watches' change count it was judged at (while neither moves
    /// — another DaemonSet's rollout — the pods are not read again).
    judged: Mutex<HashMap<(String, String), Judged>>,
}

/// What else sees a watch's events, after its store holds them (the readiness timeline sees
/// the validator pods' through [`PodWatches::tap_matching`]).
pub type Tap = Box<dyn FnMut(&PodEvent) + Send>;

/// A judged readiness with the DaemonSet `resourceVersion` and watch change count it is for.
type Judged = (Option<String>, u64, Readiness);

/// The [`PodWatches`] key of the watch of the pods matching `selector`.
fn matching_key(selector: &str) -> String {
    format!("selector {selector}")
}

fn selector_of(ds: &DaemonSet) -> String {
    ds.spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// What one of [`PodWatches`]' watches does with each event once its store holds it: counts
/// it in `changes`, and on a change wakes the driver upgrade loop and, with `reconciles` (an
/// `OnDelete` DaemonSet's pods and revisions: they change its readiness), the controller.
struct Signals {
    wake: Wake,
    reconciles: bool,
    changes: Arc<AtomicU64>,
    kind: &'static str,
    selector: String,
}

impl Signals {
    fn seen<K>(&self, ev: &std::result::Result<watcher::Event<K>, watcher::Error>) {
        match ev {
            Err(e) => {
                tracing::warn!(kind = self.kind, selector = %self.selector, error = %e, "pod watch");
                return;
            }
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                if self.reconciles {
                    self.wake.reconcile();
                }
                self.wake.upgrade();
            }
            Ok(_) => {}
        }
        self.changes.fetch_add(1, Ordering::Relaxed);
    }
}

/// A reflector over the ControllerRevisions of `api` matching `selector`
/// ([`slim_revision`]ed), as a task signalling each event ([`Signals`]).
fn spawn_revision_watch(
    api: Api<ControllerRevision>,
    signals: Signals,
) -> (Store<ControllerRevision>, tokio::task::JoinHandle<()>) {
    let writer = reflector::store::Writer::<ControllerRevision>::default();
    let store = writer.as_reader();
    let stream = watcher(
        api,
        crate::cluster::watch::config().labels(&signals.selector),
    )
    .default_backoff()
    .modify(|o: &mut ControllerRevision| *o = slim_revision(std::mem::take(o)));
    let task = tokio::spawn(reflector::reflector(writer, stream).for_each(move |ev| {
        signals.seen(&ev);
        futures::future::ready(())
    }));
    (store, task)
}

/// A watch of the pods of `api` matching `selector` into a [`PodStore`] (each pod a
/// [`SlimPod`] as it arrives), as a task signalling each event ([`Signals`]) and passing it
/// to `tap` once the store holds it.
fn spawn_pod_watch(
    api: Api<WirePod>,
    signals: Signals,
    mut tap: Option<Tap>,
) -> (PodStore, tokio::task::JoinHandle<()>) {
    let mut writer = PodStoreWriter::default();
    let store = writer.as_reader();
    let stream = watcher(
        api,
        crate::cluster::watch::config().labels(&signals.selector),
    )
    .default_backoff();
    let task = tokio::spawn(stream.for_each(move |ev| {
        let ev = ev.map(|ev| crate::cluster::store::map_event(ev, |p| Arc::new(p.object)));
        if let Ok(ev) = &ev {
            writer.apply(ev);
            if let Some(tap) = &mut tap {
                tap(ev);
            }
        }
        signals.seen(&ev);
        futures::future::ready(())
    }));
    (store, task)
}

impl PodWatches {
    /// Watches over `client`, waking `wake`.
    pub fn new(client: Client, wake: Wake) -> Self {
        PodWatches {
            client,
            wake,
            watched: Mutex::default(),
            judged: Mutex::default(),
        }
    }

    /// The pods and revisions of `ds` as its watches hold them (started on first need, then
    /// waited for at most [`POD_WATCH_READY_LIMIT`]), with the watches' change count.
    pub async fn slim_of(
        &self,
        ds: &DaemonSet,
    ) -> (Vec<Arc<SlimPod>>, Vec<Arc<ControllerRevision>>, u64) {
        let ns = ds.metadata.namespace.clone().unwrap_or_default();
        let name = ds.metadata.name.clone().unwrap_or_default();
        let (pods, revisions, changes, _) = self.watch(&ns, name, &selector_of(ds), true, None);
        let _ = tokio::time::timeout(POD_WATCH_READY_LIMIT, async {
            let _ = pods.wait_until_ready().await;
            if let Some(r) = &revisions {
                let _ = r.wait_until_ready().await;
            }
        })
        .await;
        let version = changes.load(Ordering::Relaxed);
        (
            pods.state(),
            revisions.map(|r| r.state()).unwrap_or_default(),
            version,
        )
    }

    /// [`daemonset_readiness`] of the `OnDelete` DaemonSet `ds` over its watched pods and
    /// revisions; judged again only when `ds` or its watches changed since the last call.
    pub async fn readiness(&self, ds: &DaemonSet) -> Readiness {
        let key = (
            ds.metadata.namespace.clone().unwrap_or_default(),
            ds.metadata.name.clone().unwrap_or_default(),
        );
        let (pods, revisions, version) = self.slim_of(ds).await;
        let rv = ds.metadata.resource_version.clone();
        if let Some((r, v, judged)) = self.judged.lock().expect("judged lock").get(&key)
            && *r == rv
            && *v == version
        {
            return judged.clone();
        }
        let judged = daemonset_readiness(Some(ds), &pods, &revisions);
        self.judged
            .lock()
            .expect("judged lock")
            .insert(key, (rv, version, judged.clone()));
        judged
    }

    /// The pods in `namespace` matching the label selector `selector` (the driver upgrade's
    /// validator pods), from a watch of their own started on first need (or by
    /// [`PodWatches::tap_matching`]), then waited for at most [`POD_WATCH_READY_LIMIT`]. Its
    /// events wake the driver upgrade loop only.
    pub async fn matching(&self, namespace: &str, selector: &str) -> Vec<Arc<SlimPod>> {
        let (pods, ..) = self.watch(namespace, matching_key(selector), selector, false, None);
        let _ = tokio::time::timeout(POD_WATCH_READY_LIMIT, pods.wait_until_ready()).await;
        pods.state()
    }

    /// Start the watch [`PodWatches::matching`] reads for `namespace` and `selector` now,
    /// passing each of its events, from its first listing on, to `tap` (the readiness
    /// timeline's validator pods: one watch serves both). A watch already running (one
    /// [`PodWatches::matching`] started has no tap) is kept and `tap` dropped; returns whether
    /// `tap` was installed.
    pub fn tap_matching(
        &self,
        namespace: &str,
        selector: &str,
        tap: impl FnMut(&PodEvent) + Send + 'static,
    ) -> bool {
        let key = matching_key(selector);
        self.watch(namespace, key, selector, false, Some(Box::new(tap)))
            .3
    }

    /// The stores of watch `key` in `ns` (started, or restarted when its selector changed,
    /// `tap` then seeing its events), its change count, and whether it was started now; one
    /// lock held throughout, so two callers never both start it. `with_revisions`: an
    /// `OnDelete` DaemonSet's watches (its revisions too, and changes wake the controller).
    fn watch(
        &self,
        ns: &str,
        key: String,
        selector: &str,
        with_revisions: bool,
        tap: Option<Tap>,
    ) -> (
        PodStore,
        Option<Store<ControllerRevision>>,
        Arc<AtomicU64>,
        bool,
    ) {
        let mut watched = self.watched.lock().expect("watched lock");
        let key = (ns.to_string(), key);
        let start = watched.get(&key).is_none_or(|w| w.selector != selector);
        if start {
            let changes = Arc::new(AtomicU64::new(0));
            let signals = |kind, reconciles| Signals {
                wake: self.wake.clone(),
                reconciles,
                changes: changes.clone(),
                kind,
                selector: selector.to_string(),
            };
            let (pods, t1) = spawn_pod_watch(
                Api::namespaced(self.client.clone(), ns),
                signals("Pod", with_revisions),
                tap,
            );
            let mut tasks = vec![t1];
            let revisions = with_revisions.then(|| {
                let (revisions, t2) = spawn_revision_watch(
                    Api::namespaced(self.client.clone(), ns),
                    signals("ControllerRevision", true),
                );
                tasks.push(t2);
                revisions
            });
            watched.insert(
                key.clone(),
                Watched {
                    selector: selector.to_string(),
                    pods,
                    revisions,
                    changes,
                    tasks,
                },
            );
        }
        let w = &watched[&key];
        (
            w.pods.clone(),
            w.revisions.clone(),
            w.changes.clone(),
            start,
        )
    }
}

/// Judge the DaemonSet `ds` (as the view holds it; `None` when missing) named `name`, against
/// the labels of every node, an `OnDelete` one over its pods and revisions as `pods` watches
/// them. `min_generation` is the generation kiln's last apply returned: a cached copy older
/// than that is not judged (the store has not seen the apply yet). Returns `None` when ready,
/// else the reason text (`nvidia-driver-daemonset: 2 pod(s) unavailable`, `…: scheduled on 461
/// of 500 matching nodes`).
pub async fn judge_daemonset<L: kiln_core::labels::LabelLookup + Sync>(
    name: &str,
    ds: Option<&DaemonSet>,
    min_generation: i64,
    pods: &PodWatches,
    nodes: &[L],
) -> Option<String> {
    if let Some(d) = ds
        && d.metadata.generation.unwrap_or(0) < min_generation
    {
        return Some(format!("{name}: {}", NotReady::NotObserved));
    }
    let readiness = match ds.filter(|d| is_on_delete(d) && d.status.is_some()) {
        Some(ds) => pods.readiness(ds).await,
        None => daemonset_readiness::<SlimPod, ControllerRevision>(ds, &[], &[]),
    };
    match readiness {
        Readiness::NotReady(why) => Some(format!("{name}: {why}")),
        Readiness::Ready => {
            ds.and_then(|d| uncovered_nodes(d, nodes))
                .map(|(matching, desired)| {
                    format!("{name}: scheduled on {desired} of {matching} matching nodes")
                })
        }
    }
}

/// A pod as the operator's pod stores hold it ([`PodWatches`], [`PodStore`]): what the
/// `OnDelete` rule and the driver upgrade read ([`kiln_core::readiness::daemonset_readiness`],
/// [`kiln_core::upgrade::DriverPodFacts`], the validator's readiness) and the readiness
/// timeline ([`crate::signals::timeline::validator_facts`]), and nothing else — name, namespace, labels,
/// owner references, deletion timestamp, the node it is bound to, its `DRIVER_CONFIG_DIGEST`,
/// phase, the `Ready` condition with its transition time and each container's name, ready
/// flag, restart count and, when it terminated, exit code and finish time.
///
/// Built while the API's JSON is parsed (every other field, managed fields included, is
/// skipped; the watches decode a [`WirePod`], `serde` a `SlimPod` the same way). Every text
/// that pods share is interned ([`Sym`]): namespace, node name, digest, phase, container
/// names; the label set and the owner references are interned whole, so a DaemonSet
/// revision's pods share one copy ([`InternedLabels`]). These stores hold two pods a GPU node;
/// what one costs in a [`PodStore`]: `cargo bench -p kiln-operator --bench node_memory`
/// (figures in `deploy/operator/README.md`, Memory).
/// The rules read it as it is: [`kiln_core::readiness::PodFacts`] (readiness),
/// [`kiln_core::upgrade::DriverPod`] (the driver upgrade), [`kiln_core::labels::LabelLookup`]
/// (selectors); no `Pod` is built from it.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(from = "RawPod")]
pub struct SlimPod {
    /// `metadata.name` (also the key of its [`PodStore`]).
    name: Arc<str>,
    namespace: Option<Sym>,
    deletion_timestamp: Option<Time>,
    labels: InternedLabels,
    owners: ArcIntern<Box<[SlimOwner]>>,
    node_name: Option<Sym>,
    /// The value of [`kiln_core::driver_digest::ENV`] in any container's environment.
    digest: Option<Sym>,
    phase: Option<Sym>,
    /// The `Ready` condition (the only one the rules read).
    ready: Option<SlimCondition>,
    containers: Box<[SlimContainerStatus]>,
    init_containers: Box<[SlimContainerStatus]>,
}

/// An owner reference, its texts interned.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SlimOwner {
    api_version: Sym,
    kind: Sym,
    name: Sym,
    uid: Sym,
    controller: Option<bool>,
    block_owner_deletion: Option<bool>,
}

/// The `Ready` condition: its status (`True`, `False`, `Unknown`) and when it last changed
/// (the readiness timeline's `validated` stage).
#[derive(Clone, Debug)]
struct SlimCondition {
    status: Sym,
    last_transition_time: Option<Time>,
}

/// A container's status: name, ready flag, restarts and, when it terminated, its exit code
/// and finish time (the timeline's validator init containers).
#[derive(Clone, Debug)]
struct SlimContainerStatus {
    name: Sym,
    ready: bool,
    restart_count: i32,
    terminated: Option<(i32, Option<Time>)>,
}

/// A pod as the pod watches decode it ([`crate::cluster::store::Watched`]).
pub type WirePod = crate::cluster::store::Watched<SlimPod>;

impl crate::cluster::store::WatchedKind for SlimPod {
    type Raw = RawPod;
    type Scope = k8s_openapi::NamespaceResourceScope;
    const KIND: &'static str = "Pod";
    const PLURAL: &'static str = "pods";

    fn split(p: RawPod) -> (crate::cluster::store::Identity, SlimPod) {
        let id = crate::cluster::store::Identity {
            name: p.metadata.name.clone(),
            namespace: p.metadata.namespace.clone(),
            resource_version: p.metadata.resource_version.clone(),
        };
        (id, p.into())
    }
}

/// What is decoded of a pod's JSON.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct RawPod {
    #[serde(default)]
    metadata: RawMeta,
    #[serde(default)]
    spec: WireSpec,
    #[serde(default)]
    status: WireStatus,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RawMeta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    deletion_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireSpec {
    node_name: Option<String>,
    containers: Option<Vec<EnvOnly>>,
    init_containers: Option<Vec<EnvOnly>>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
struct EnvOnly {
    env: Option<Vec<WireEnv>>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
struct WireEnv {
    name: String,
    value: Option<String>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireStatus {
    phase: Option<String>,
    conditions: Option<Vec<WireCondition>>,
    container_statuses: Option<Vec<WireContainerStatus>>,
    init_container_statuses: Option<Vec<WireContainerStatus>>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    #[serde(default)]
    last_transition_time: Option<Time>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireContainerStatus {
    #[serde(default)]
    name: String,
    #[serde(default)]
    ready: bool,
    #[serde(default)]
    restart_count: i32,
    #[serde(default)]
    state: WireState,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
struct WireState {
    #[serde(default)]
    terminated: Option<WireTerminated>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireTerminated {
    #[serde(default)]
    exit_code: i32,
    #[serde(default)]
    finished_at: Option<Time>,
}

/// The readiness rule reads a watched pod as it is (no `Pod` is built).
impl kiln_core::readiness::PodFacts for SlimPod {
    fn name(&self) -> &str {
        SlimPod::name(self)
    }
    fn namespace(&self) -> Option<&str> {
        SlimPod::namespace(self)
    }
    fn label(&self, key: &str) -> Option<&str> {
        kiln_core::labels::LabelLookup::label(&self.labels, key)
    }
    fn first_owner_uid(&self) -> Option<&str> {
        self.owners.first().map(|o| &*o.uid)
    }
    fn phase(&self) -> Option<&str> {
        self.phase.as_deref()
    }
    fn containers_ready(&self) -> bool {
        self.containers.iter().all(|c| c.ready)
    }
}

/// Labels of a watched pod (selectors match them as they are).
impl kiln_core::labels::LabelLookup for SlimPod {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.label(key)
    }
}

/// What the driver upgrade reads of a driver pod, from the store's copy (no `Pod` is built).
impl kiln_core::upgrade::DriverPod for SlimPod {
    fn name(&self) -> &str {
        &self.name
    }
    fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }
    fn terminating(&self) -> bool {
        self.deletion_timestamp.is_some()
    }
    fn phase(&self) -> Option<&str> {
        self.phase.as_deref()
    }
    fn config_digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }
    fn containers(&self) -> impl Iterator<Item = (bool, i32)> {
        self.containers.iter().map(|c| (c.ready, c.restart_count))
    }
    fn init_containers(&self) -> impl Iterator<Item = (bool, i32)> {
        self.init_containers
            .iter()
            .map(|c| (c.ready, c.restart_count))
    }
}

fn slim_statuses(v: Option<Vec<WireContainerStatus>>) -> Box<[SlimContainerStatus]> {
    v.into_iter()
        .flatten()
        .map(|c| SlimContainerStatus {
            name: Sym::from(c.name.as_str()),
            ready: c.ready,
            restart_count: c.restart_count,
            terminated: c.state.terminated.map(|t| (t.exit_code, t.finished_at)),
        })
        .collect()
}

/// Keeps only what the rules read (see [`SlimPod`]): the digest is taken from the containers'
/// environments, which are dropped; of the conditions, `Ready`.
impl From<RawPod> for SlimPod {
    fn from(p: RawPod) -> Self {
        let m = p.metadata;
        let digest = p
            .spec
            .containers
            .iter()
            .chain(p.spec.init_containers.iter())
            .flatten()
            .flat_map(|c| c.env.iter().flatten())
            .find(|e| e.name == kiln_core::driver_digest::ENV)
            .and_then(|e| e.value.clone());
        let owners: Box<[SlimOwner]> = m
            .owner_references
            .iter()
            .flatten()
            .map(|o| SlimOwner {
                api_version: Sym::from(o.api_version.as_str()),
                kind: Sym::from(o.kind.as_str()),
                name: Sym::from(o.name.as_str()),
                uid: Sym::from(o.uid.as_str()),
                controller: o.controller,
                block_owner_deletion: o.block_owner_deletion,
            })
            .collect();
        let status = p.status;
        SlimPod {
            name: m.name.unwrap_or_default().into(),
            namespace: sym(m.namespace),
            deletion_timestamp: m.deletion_timestamp,
            labels: InternedLabels::of(m.labels.iter().flatten(), |_| true),
            owners: ArcIntern::new(owners),
            node_name: sym(p.spec.node_name),
            digest: sym(digest),
            phase: sym(status.phase),
            ready: status
                .conditions
                .into_iter()
                .flatten()
                .find(|c| c.type_ == "Ready")
                .map(|c| SlimCondition {
                    status: Sym::from(c.status.as_str()),
                    last_transition_time: c.last_transition_time,
                }),
            containers: slim_statuses(status.container_statuses),
            init_containers: slim_statuses(status.init_container_statuses),
        }
    }
}

impl SlimPod {
    /// `metadata.name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `metadata.namespace`.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// `spec.nodeName` (`None` while unscheduled).
    pub fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    /// Whether it carries a deletion timestamp (it is terminating).
    pub fn is_deleting(&self) -> bool {
        self.deletion_timestamp.is_some()
    }

    /// Whether one of its owner references has uid `uid`.
    pub fn owned_by(&self, uid: &str) -> bool {
        self.owners.iter().any(|o| &*o.uid == uid)
    }

    /// Whether it has no owner reference.
    pub fn has_owners(&self) -> bool {
        !self.owners.is_empty()
    }

    /// Not terminating, `Running`, and its `Ready` condition `True`.
    pub fn is_ready(&self) -> bool {
        self.deletion_timestamp.is_none()
            && self.phase.as_deref() == Some("Running")
            && self.ready.as_ref().is_some_and(|c| &*c.status == "True")
    }

    /// The `Ready` condition's `lastTransitionTime` when its status is `True`.
    pub fn ready_since(&self) -> Option<Option<&Time>> {
        self.ready
            .as_ref()
            .filter(|c| &*c.status == "True")
            .map(|c| c.last_transition_time.as_ref())
    }

    /// Whether it is still in its init containers (the stuck-node signal's validator in Init):
    /// not terminating, `Pending`, and some init container not yet terminated with exit code
    /// 0 (or none started).
    pub fn in_init(&self) -> bool {
        self.deletion_timestamp.is_none()
            && self.phase.as_deref() == Some("Pending")
            && (self.init_containers.is_empty()
                || self
                    .init_containers
                    .iter()
                    .any(|c| !matches!(c.terminated, Some((0, _)))))
    }

    /// The exit code and finish time of init container `name`, once it terminated.
    pub fn init_terminated(&self, name: &str) -> Option<(i32, Option<&Time>)> {
        self.init_containers
            .iter()
            .find(|c| &*c.name == name)?
            .terminated
            .as_ref()
            .map(|(code, at)| (*code, at.as_ref()))
    }
}

/// A pod watch event as [`PodStore`] and a watch's tap see it.
pub type PodEvent = watcher::Event<Arc<SlimPod>>;

/// The pods of one pod watch, by name ([`crate::cluster::store`]: why not kube's `Store`).
pub type PodStore = crate::cluster::store::NamedStore<SlimPod>;

/// Applies a pod watch's events to its [`PodStore`].
pub type PodStoreWriter = crate::cluster::store::NamedWriter<SlimPod>;

impl crate::cluster::store::Keyed for SlimPod {
    fn key(&self) -> Arc<str> {
        self.name.clone()
    }
}

/// The DaemonSet `name` as an apply or a watch returned it.
///
/// # Errors
/// [`Error::Json`] when the object is not a DaemonSet.
pub fn as_daemonset(name: &str, live: &DynamicObject) -> Result<DaemonSet> {
    serde_json::to_value(live)
        .and_then(serde_json::from_value)
        .map_err(|e| Error::Json {
            action: format!("read DaemonSet {name}"),
            source: e,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kiln_core::upgrade::DriverPodFacts;

    /// A client whose API server lists one validator pod and refuses every watch (the
    /// watcher retries it with backoff, never listing again); counts the LISTs.
    fn listing_client(lists: Arc<AtomicU64>) -> Client {
        use axum::extract::RawQuery;
        use axum::http::{StatusCode, header};
        let pods = move |RawQuery(query): RawQuery| async move {
            let json = [(header::CONTENT_TYPE, "application/json")];
            if query.unwrap_or_default().contains("watch=true") {
                return (StatusCode::INTERNAL_SERVER_ERROR, json, String::new());
            }
            lists.fetch_add(1, Ordering::SeqCst);
            let list = serde_json::json!({"apiVersion": "v1", "kind": "PodList",
                "metadata": {"resourceVersion": "3"},
                "items": [{"metadata": {"name": "nvidia-operator-validator-a",
                    "namespace": "gpu-operator", "resourceVersion": "3"},
                    "spec": {"nodeName": "gpu-node-1"}}]});
            (StatusCode::OK, json, list.to_string())
        };
        let api = axum::Router::new().route(
            "/api/v1/namespaces/gpu-operator/pods",
            axum::routing::get(pods),
        );
        Client::new(api, "default")
    }

    #[tokio::test]
    async fn the_tapped_validator_watch_feeds_its_first_listing_and_serves_matching() {
        let lists = Arc::new(AtomicU64::new(0));
        let (wake, _wakes) = Wake::channel();
        let watches = PodWatches::new(listing_client(lists.clone()), wake);
        let selector = kiln_core::upgrade::VALIDATOR_SELECTOR;
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let tapped = watches.tap_matching("gpu-operator", selector, move |ev| {
            let seen = match ev {
                watcher::Event::Init => "init".to_string(),
                watcher::Event::InitApply(p) => {
                    format!("list {}", p.name())
                }
                watcher::Event::InitDone => "done".to_string(),
                watcher::Event::Apply(_) | watcher::Event::Delete(_) => "change".to_string(),
            };
            let _ = tx.unbounded_send(seen);
        });
        assert!(tapped);
        assert!(
            !watches.tap_matching("gpu-operator", selector, |_| {}),
            "one watch per selector: a second tap is refused"
        );
        let seen: Vec<String> = tokio::time::timeout(Duration::from_secs(10), rx.take(3).collect())
            .await
            .expect("the tap sees the first listing");
        assert_eq!(seen, ["init", "list nvidia-operator-validator-a", "done"]);
        let pods = watches.matching("gpu-operator", selector).await;
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].node_name(), Some("gpu-node-1"));
        assert_eq!(
            lists.load(Ordering::SeqCst),
            1,
            "matching reads the tapped watch"
        );
    }

    fn driver_pod() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "nvidia-driver-daemonset-x1", "namespace": "gpu-operator",
                "uid": "p1", "resourceVersion": "9", "generateName": "nvidia-driver-daemonset-",
                "labels": {"app": "nvidia-driver-daemonset", "controller-revision-hash": "abc"},
                "annotations": {"kubectl.kubernetes.io/default-container": "nvidia-driver-ctr"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                    "name": "nvidia-driver-daemonset", "uid": "ds1", "controller": true}],
                "managedFields": [{"manager": "kube-controller-manager"}]},
            "spec": {"nodeName": "gpu-node-1",
                "initContainers": [{"name": "k8s-driver-manager", "image": "m",
                    "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}],
                "containers": [{"name": "nvidia-driver-ctr", "image": "d",
                    "env": [{"name": "DRIVER_CONFIG_DIGEST", "value": "3379408550"},
                            {"name": "OTHER", "value": "x"}]}],
                "volumes": [{"name": "run", "hostPath": {"path": "/run/nvidia"}}]},
            "status": {"phase": "Running",
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                "initContainerStatuses": [{"name": "k8s-driver-manager", "ready": true, "restartCount": 0,
                    "image": "m", "imageID": ""}],
                "containerStatuses": [{"name": "nvidia-driver-ctr", "ready": false, "restartCount": 12,
                    "image": "d", "imageID": ""}]}
        })
    }

    #[test]
    fn pods_of_a_daemonset_revision_share_their_labels_owners_and_texts() {
        let a: SlimPod = serde_json::from_value(driver_pod()).unwrap();
        let mut other = driver_pod();
        other["metadata"]["name"] = serde_json::json!("nvidia-driver-daemonset-x2");
        other["spec"]["nodeName"] = serde_json::json!("gpu-node-2");
        let b: SlimPod = serde_json::from_value(other).unwrap();
        assert_eq!(
            (a.name(), b.name()),
            ("nvidia-driver-daemonset-x1", "nvidia-driver-daemonset-x2")
        );
        assert_eq!(
            (a.node_name(), b.node_name()),
            (Some("gpu-node-1"), Some("gpu-node-2"))
        );
        // Interned values compare by address: equal means one copy.
        assert_eq!(a.labels, b.labels, "one label set");
        assert!(std::ptr::eq(&**a.owners, &**b.owners), "one owner list");
        assert!(std::ptr::eq(
            &**a.digest.as_ref().unwrap(),
            &**b.digest.as_ref().unwrap()
        ));
        // A pod of the next revision has a set of its own.
        let mut next = driver_pod();
        next["metadata"]["labels"]["controller-revision-hash"] = serde_json::json!("def");
        let c: SlimPod = serde_json::from_value(next).unwrap();
        assert_ne!(a.labels, c.labels);
        use kiln_core::readiness::PodFacts;
        assert_eq!(c.label("controller-revision-hash"), Some("def"));
        assert_eq!(a.first_owner_uid(), Some("ds1"));
    }

    #[test]
    fn a_slim_pod_reads_the_same_to_the_rules() {
        let full: Pod = serde_json::from_value(driver_pod()).unwrap();
        let slim: SlimPod = serde_json::from_value(driver_pod()).unwrap();
        assert_eq!(slim.digest.as_deref(), Some("3379408550"));
        for desired in [
            Some(("abc", Some("3379408550"))),
            Some(("new", Some("1"))),
            None,
        ] {
            assert_eq!(
                DriverPodFacts::from_pod(&slim, desired),
                DriverPodFacts::from_pod(&full, desired)
            );
        }
        let facts = DriverPodFacts::from_pod(&slim, Some(("abc", Some("3379408550"))));
        assert!(facts.current_revision && facts.same_digest && facts.crash_looping && !facts.ready);
        assert_eq!(slim.node_name(), Some("gpu-node-1"));
        assert!(slim.is_ready(), "Running with Ready=True");
        assert!(slim.owned_by("ds1") && slim.has_owners());
        assert_eq!(
            kiln_core::labels::LabelLookup::label(&slim, "controller-revision-hash"),
            Some("abc")
        );
    }

    #[test]
    fn on_delete_readiness_judges_a_slim_pod_as_the_full_one() {
        use kiln_core::readiness::{NotReady, PodFacts};
        let ds: DaemonSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "nvidia-driver-daemonset", "namespace": "gpu-operator",
                "uid": "ds1", "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": "nvidia-driver-daemonset"}},
                "updateStrategy": {"type": "OnDelete"},
                "template": {"metadata": {}, "spec": {"containers": []}}},
            "status": {"desiredNumberScheduled": 1, "currentNumberScheduled": 1,
                "numberMisscheduled": 0, "numberReady": 1, "numberUnavailable": 0,
                "observedGeneration": 1}
        }))
        .unwrap();
        let rev: ControllerRevision = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "nvidia-driver-daemonset-abc", "namespace": "gpu-operator",
                "labels": {"controller-revision-hash": "abc"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                    "name": "nvidia-driver-daemonset", "uid": "ds1", "controller": true}]},
            "revision": 1
        }))
        .unwrap();
        let mut ready = driver_pod();
        ready["status"]["containerStatuses"][0]["ready"] = true.into();
        let mut pending = driver_pod();
        pending["status"]["phase"] = "Pending".into();
        for (pod, want) in [
            (
                driver_pod(),
                Readiness::NotReady(NotReady::ContainerNotReady {
                    pod: "nvidia-driver-daemonset-x1".into(),
                }),
            ),
            (
                pending,
                Readiness::NotReady(NotReady::NotRunning {
                    pod: "nvidia-driver-daemonset-x1".into(),
                    phase: "Pending".into(),
                }),
            ),
            (ready, Readiness::Ready),
        ] {
            let full: Pod = serde_json::from_value(pod.clone()).unwrap();
            let slim = Arc::new(serde_json::from_value::<SlimPod>(pod).unwrap());
            assert_eq!(slim.phase(), full.phase());
            assert_eq!(slim.containers_ready(), full.containers_ready());
            let revs = [Arc::new(rev.clone())];
            assert_eq!(daemonset_readiness(Some(&ds), &[slim], &revs), want);
            assert_eq!(
                daemonset_readiness(Some(&ds), &[full], std::slice::from_ref(&rev)),
                want
            );
        }
    }
}
