//! DaemonSet readiness: judge a DaemonSet (from the store of the namespace's shared DaemonSet
//! watch, [`crate::live::start_daemonsets`]) with [`kiln_core::readiness::daemonset_readiness`];
//! a DaemonSet ready by upstream's rules is still not ready while it covers fewer nodes than its
//! selector matches ([`kiln_core::plan::uncovered_nodes`]). `OnDelete` DaemonSets also need
//! their pods and ControllerRevisions: from watches on the DaemonSet's selector ([`PodWatches`],
//! started on first need, each change waking the controller and the driver upgrade loop), or,
//! without them, listed. [`PodWatches`] also holds the validator pod watch, which wakes the
//! upgrade loop only and feeds the readiness timeline ([`PodWatches::tap_matching`]).

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateTerminated, ContainerStatus, EnvVar, Pod,
    PodCondition, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kiln_core::plan::uncovered_nodes;
use kiln_core::readiness::{NotReady, Readiness, daemonset_readiness, is_on_delete};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::live::Wake;
use crate::node::{InternedLabels, Sym};
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
    pods: Store<SlimPod>,
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
pub type Tap<K> = Box<dyn FnMut(&watcher::Event<K>) + Send>;

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

/// A reflector over the objects of `api` matching `selector`, slimmed by `slim`, as a task.
/// Each change wakes the driver upgrade loop and, with `reconciles` (an `OnDelete` DaemonSet's
/// pods and revisions: they change its readiness), the controller; every event is counted in
/// `changes` and passed to `tap` after the store holds it.
fn spawn_reflector<K>(
    api: Api<K>,
    selector: &str,
    slim: fn(K) -> K,
    wake: Wake,
    reconciles: bool,
    changes: Arc<AtomicU64>,
    mut tap: Option<Tap<K>>,
) -> (Store<K>, tokio::task::JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + Default
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let writer = reflector::store::Writer::<K>::default();
    let store = writer.as_reader();
    let stream = watcher(api, crate::watch::config().labels(selector))
        .default_backoff()
        .modify(move |o: &mut K| *o = slim(std::mem::take(o)));
    let kind = K::kind(&());
    let selector = selector.to_string();
    let task = tokio::spawn(reflector::reflector(writer, stream).for_each(move |ev| {
        if let Ok(ev) = &ev {
            changes.fetch_add(1, Ordering::Relaxed);
            if let Some(tap) = &mut tap {
                tap(ev);
            }
        }
        match ev {
            Err(e) => tracing::warn!(%kind, %selector, error = %e, "pod watch"),
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                if reconciles {
                    wake.reconcile();
                }
                wake.upgrade();
            }
            Ok(_) => {}
        }
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
        tap: impl FnMut(&watcher::Event<SlimPod>) + Send + 'static,
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
        tap: Option<Tap<SlimPod>>,
    ) -> (
        Store<SlimPod>,
        Option<Store<ControllerRevision>>,
        Arc<AtomicU64>,
        bool,
    ) {
        let mut watched = self.watched.lock().expect("watched lock");
        let key = (ns.to_string(), key);
        let start = watched.get(&key).is_none_or(|w| w.selector != selector);
        if start {
            let changes = Arc::new(AtomicU64::new(0));
            let (pods, t1) = spawn_reflector(
                Api::<SlimPod>::namespaced(self.client.clone(), ns),
                selector,
                SlimPod::trim,
                self.wake.clone(),
                with_revisions,
                changes.clone(),
                tap,
            );
            let mut tasks = vec![t1];
            let revisions = with_revisions.then(|| {
                let (revisions, t2) = spawn_reflector(
                    Api::<ControllerRevision>::namespaced(self.client.clone(), ns),
                    selector,
                    slim_revision,
                    self.wake.clone(),
                    true,
                    changes.clone(),
                    None,
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

/// Where an `OnDelete` DaemonSet's pods and revisions come from.
#[derive(Clone, Copy)]
pub enum PodSource<'a> {
    /// Watches ([`PodWatches`]).
    Watches(&'a PodWatches),
    /// List them (pods in pages of [`POD_PAGE`]).
    List(&'a Client),
}

/// Judge the DaemonSet `ds` (as the cache holds it; `None` when missing) named `name`, against
/// the labels of every node. `min_generation` is the generation kiln's last apply returned: a
/// cached copy older than that is not judged (the cache has not seen the apply yet). Returns
/// `None` when ready, else the reason text (`nvidia-driver-daemonset: 2 pod(s) unavailable`,
/// `…: scheduled on 461 of 500 matching nodes`).
///
/// # Errors
/// [`Error::Kube`] when listing pods or revisions fails ([`PodSource::List`] only).
pub async fn judge_daemonset<L: kiln_core::labels::LabelLookup + Sync>(
    name: &str,
    ds: Option<&DaemonSet>,
    min_generation: i64,
    source: PodSource<'_>,
    nodes: &[L],
) -> Result<Option<String>> {
    if let Some(d) = ds
        && d.metadata.generation.unwrap_or(0) < min_generation
    {
        return Ok(Some(format!("{name}: {}", NotReady::NotObserved)));
    }
    let readiness = match (ds.filter(|d| is_on_delete(d) && d.status.is_some()), source) {
        (Some(ds), PodSource::Watches(w)) => w.readiness(ds).await,
        (Some(ds), PodSource::List(client)) => {
            let (pods, revisions) = list_pods_and_revisions(client, name, ds).await?;
            daemonset_readiness(Some(ds), &pods, &revisions)
        }
        (None, _) => daemonset_readiness::<SlimPod, ControllerRevision>(ds, &[], &[]),
    };
    Ok(match readiness {
        Readiness::NotReady(why) => Some(format!("{name}: {why}")),
        Readiness::Ready => {
            ds.and_then(|d| uncovered_nodes(d, nodes))
                .map(|(matching, desired)| {
                    format!("{name}: scheduled on {desired} of {matching} matching nodes")
                })
        }
    })
}

async fn list_pods_and_revisions(
    client: &Client,
    name: &str,
    ds: &DaemonSet,
) -> Result<(Vec<SlimPod>, Vec<ControllerRevision>)> {
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let lp = ListParams::default().labels(&selector_of(ds));
    let api = Api::<SlimPod>::namespaced(client.clone(), &ns);
    let mut pods = Vec::new();
    let mut page_params = lp.clone().limit(POD_PAGE);
    loop {
        let page = api
            .list(&page_params)
            .await
            .map_err(|e| Error::kube(format!("list pods of {name}"), e))?;
        pods.extend(page.items.into_iter().map(SlimPod::trim));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => {
                page_params = page_params.continue_token(&token);
            }
            _ => break,
        }
    }
    let revisions = Api::<ControllerRevision>::namespaced(client.clone(), &ns)
        .list(&lp)
        .await
        .map_err(|e| Error::kube(format!("list revisions of {name}"), e))?
        .items;
    Ok((pods, revisions))
}

/// Pods per list request when judging an `OnDelete` DaemonSet (one per GPU node): bounds one
/// response body however large the cluster is.
pub const POD_PAGE: u32 = 100;

/// A pod as the operator's pod stores hold it ([`PodWatches`]): what the `OnDelete` rule and
/// the driver upgrade read ([`kiln_core::readiness::daemonset_readiness`],
/// [`kiln_core::upgrade::DriverPodFacts`], the validator's readiness) and the readiness
/// timeline ([`crate::timeline::validator_facts`]), and nothing else — name, namespace, labels,
/// owner references, deletion timestamp, the node it is bound to, its `DRIVER_CONFIG_DIGEST`,
/// phase, the `Ready` condition with its transition time and each container's name, ready
/// flag, restart count and, when it terminated, exit code and finish time. Deserialized
/// straight from the API's JSON (every other field is skipped while parsing), then
/// [`SlimPod::trim`]med: labels and owner references interned ([`InternedLabels`]). Held in a
/// store, with its key, 1,361 bytes for a driver pod and 1,572 for a validator pod (five init
/// containers), measured by `cargo bench -p kiln-operator --bench node_memory` (1,971 and
/// 2,187 with the labels and owners in `ObjectMeta`): these stores hold two pods a GPU node.
/// [`SlimPod::to_pod`] gives the rules that read a `Pod` one.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct SlimPod {
    /// Name, namespace and deletion timestamp ([`SlimPod::trim`] clears the rest, and moves
    /// the labels and owner references out: [`SlimPod::labels`], `owners`).
    pub metadata: ObjectMeta,
    /// The labels, interned (filled by [`SlimPod::trim`]).
    #[serde(skip)]
    labels: InternedLabels,
    /// The owner references, interned (filled by [`SlimPod::trim`]).
    #[serde(skip)]
    owners: Box<[SlimOwner]>,
    #[serde(default)]
    spec: SlimSpec,
    #[serde(default)]
    status: SlimStatus,
}

/// An owner reference, its texts interned (a DaemonSet's pods all name the same owner).
#[derive(Clone, Debug)]
struct SlimOwner {
    api_version: Sym,
    kind: Sym,
    name: Sym,
    uid: Sym,
    controller: Option<bool>,
    block_owner_deletion: Option<bool>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimSpec {
    node_name: Option<String>,
    /// Parsed, then folded into `digest` by [`SlimPod::trim`].
    containers: Option<Vec<EnvOnly>>,
    init_containers: Option<Vec<EnvOnly>>,
    #[serde(skip)]
    digest: Option<String>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
struct EnvOnly {
    env: Option<Vec<SlimEnv>>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
struct SlimEnv {
    name: String,
    value: Option<String>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimStatus {
    phase: Option<String>,
    conditions: Option<Vec<SlimCondition>>,
    container_statuses: Option<Vec<SlimContainerStatus>>,
    init_container_statuses: Option<Vec<SlimContainerStatus>>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    /// When the status last changed (the readiness timeline's `validated` stage).
    #[serde(default)]
    last_transition_time: Option<Time>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimContainerStatus {
    #[serde(default)]
    name: String,
    #[serde(default)]
    ready: bool,
    #[serde(default)]
    restart_count: i32,
    /// How the container last ended, when it did (the timeline's validator init containers).
    #[serde(default)]
    state: SlimState,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
struct SlimState {
    #[serde(default)]
    terminated: Option<SlimTerminated>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimTerminated {
    #[serde(default)]
    exit_code: i32,
    #[serde(default)]
    finished_at: Option<Time>,
}

impl kube::Resource for SlimPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The readiness rule reads a watched pod as it is (no `Pod` is built).
impl kiln_core::readiness::PodFacts for SlimPod {
    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    fn namespace(&self) -> Option<&str> {
        self.metadata.namespace.as_deref()
    }
    fn label(&self, key: &str) -> Option<&str> {
        kiln_core::labels::LabelLookup::label(&self.labels, key)
    }
    fn first_owner_uid(&self) -> Option<&str> {
        self.owners.first().map(|o| &*o.uid)
    }
    fn phase(&self) -> Option<&str> {
        self.status.phase.as_deref()
    }
    fn containers_ready(&self) -> bool {
        self.status
            .container_statuses
            .as_ref()
            .is_none_or(|cs| cs.iter().all(|c| c.ready))
    }
}

impl SlimPod {
    /// Keep only what the rules read: the metadata named in [`SlimPod`], the digest (the
    /// containers' environments dropped), the `Ready` condition (with its transition time) and
    /// the container statuses (name, ready, restarts, a termination's exit code and finish
    /// time).
    #[must_use]
    pub fn trim(self) -> SlimPod {
        let m = self.metadata;
        let digest = self
            .spec
            .containers
            .iter()
            .chain(self.spec.init_containers.iter())
            .flatten()
            .flat_map(|c| c.env.iter().flatten())
            .find(|e| e.name == kiln_core::driver_digest::ENV)
            .and_then(|e| e.value.clone());
        let mut status = self.status;
        if let Some(cs) = &mut status.conditions {
            cs.retain(|c| c.type_ == "Ready");
            cs.shrink_to_fit();
        }
        let owners = m
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
        SlimPod {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                deletion_timestamp: m.deletion_timestamp,
                ..ObjectMeta::default()
            },
            labels: InternedLabels::of(m.labels.iter().flatten(), |_| true),
            owners,
            spec: SlimSpec {
                node_name: self.spec.node_name,
                digest,
                ..SlimSpec::default()
            },
            status,
        }
    }

    /// The pod the rules read: this one's fields in a `Pod` (the digest as the environment of
    /// one container; container statuses without images, their state only when terminated).
    pub fn to_pod(&self) -> Pod {
        let statuses = |v: &Option<Vec<SlimContainerStatus>>| {
            v.as_ref().map(|cs| {
                cs.iter()
                    .map(|c| ContainerStatus {
                        name: c.name.clone(),
                        ready: c.ready,
                        restart_count: c.restart_count,
                        state: c.state.terminated.as_ref().map(|t| ContainerState {
                            terminated: Some(ContainerStateTerminated {
                                exit_code: t.exit_code,
                                finished_at: t.finished_at.clone(),
                                ..ContainerStateTerminated::default()
                            }),
                            ..ContainerState::default()
                        }),
                        ..ContainerStatus::default()
                    })
                    .collect()
            })
        };
        let containers = self
            .spec
            .digest
            .as_ref()
            .map(|d| {
                vec![Container {
                    env: Some(vec![EnvVar {
                        name: kiln_core::driver_digest::ENV.to_string(),
                        value: Some(d.clone()),
                        ..EnvVar::default()
                    }]),
                    ..Container::default()
                }]
            })
            .unwrap_or_default();
        let owners = self
            .owners
            .iter()
            .map(|o| OwnerReference {
                api_version: o.api_version.to_string(),
                kind: o.kind.to_string(),
                name: o.name.to_string(),
                uid: o.uid.to_string(),
                controller: o.controller,
                block_owner_deletion: o.block_owner_deletion,
            })
            .collect::<Vec<_>>();
        Pod {
            metadata: ObjectMeta {
                labels: (!self.labels.is_empty()).then(|| self.labels.to_map()),
                owner_references: (!owners.is_empty()).then_some(owners),
                ..self.metadata.clone()
            },
            spec: Some(PodSpec {
                node_name: self.spec.node_name.clone(),
                containers,
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: self.status.phase.clone(),
                conditions: self.status.conditions.as_ref().map(|cs| {
                    cs.iter()
                        .map(|c| PodCondition {
                            type_: c.type_.clone(),
                            status: c.status.clone(),
                            last_transition_time: c.last_transition_time.clone(),
                            ..PodCondition::default()
                        })
                        .collect()
                }),
                container_statuses: statuses(&self.status.container_statuses),
                init_container_statuses: statuses(&self.status.init_container_statuses),
                ..PodStatus::default()
            }),
        }
    }
}

/// Judge the live DaemonSet `live` (as an apply or a watch returned it; `None` when missing)
/// against the labels of every node (`nodes`), listing pods and revisions of an `OnDelete`
/// DaemonSet ([`judge_daemonset`] with [`PodSource::List`]; for callers without caches, such
/// as the benchmark's observer).
///
/// # Errors
/// [`Error::Json`] when the object is not a DaemonSet; [`Error::Kube`] when listing pods or
/// revisions fails.
pub async fn daemonset_not_ready(
    client: &Client,
    name: &str,
    live: Option<&DynamicObject>,
    nodes: &[BTreeMap<String, String>],
) -> Result<Option<String>> {
    let ds = live.map(|o| as_daemonset(name, o)).transpose()?;
    judge_daemonset(name, ds.as_ref(), 0, PodSource::List(client), nodes).await
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
                    format!("list {}", p.metadata.name.clone().unwrap())
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
        assert_eq!(pods[0].spec.node_name.as_deref(), Some("gpu-node-1"));
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
    fn a_slim_pod_reads_the_same_to_the_rules() {
        let full: Pod = serde_json::from_value(driver_pod()).unwrap();
        let slim: SlimPod = serde_json::from_value(driver_pod()).unwrap();
        let slim = slim.trim();
        assert_eq!(slim.spec.digest.as_deref(), Some("3379408550"));
        assert!(slim.spec.containers.is_none() && slim.metadata.annotations.is_none());
        assert!(slim.metadata.managed_fields.is_none());
        let pod = slim.to_pod();
        for desired in [
            Some(("abc", Some("3379408550"))),
            Some(("new", Some("1"))),
            None,
        ] {
            assert_eq!(
                DriverPodFacts::from_pod(&pod, desired),
                DriverPodFacts::from_pod(&full, desired)
            );
        }
        let facts = DriverPodFacts::from_pod(&pod, Some(("abc", Some("3379408550"))));
        assert!(facts.current_revision && facts.same_digest && facts.crash_looping && !facts.ready);
        assert_eq!(
            pod.spec.as_ref().unwrap().node_name.as_deref(),
            Some("gpu-node-1")
        );
        let conditions = pod.status.as_ref().unwrap().conditions.as_ref().unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(
            (conditions[0].type_.as_str(), conditions[0].status.as_str()),
            ("Ready", "True")
        );
        assert_eq!(
            pod.metadata.owner_references.as_ref().unwrap()[0].uid,
            "ds1"
        );
        assert_eq!(
            pod.metadata.labels.as_ref().unwrap()["controller-revision-hash"],
            "abc"
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
            let slim = Arc::new(serde_json::from_value::<SlimPod>(pod).unwrap().trim());
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
