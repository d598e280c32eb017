//! The cluster's own record of what kiln applied: metadata-only reflector stores of the objects
//! labelled [`STATE_LABEL`], one per kind the assets use (namespaced kinds in the operator
//! namespace, cluster-scoped kinds cluster-wide). Deletion is decided from these
//! ([`kiln_core::plan::plan`]), so a restarted operator still finds — and deletes — an object
//! it applied before and no longer renders.
//!
//! ```text
//! metadata watch ?labelSelector=kiln.dev/state ─► Store (per kind) ─► LiveCache::objects
//! DaemonSets: one watch of the namespace (full objects: readiness reads their status; managed
//!   fields reduced to other managers' additions, the drift a reconcile removes), shared
//!   with the NVIDIADriver controller, labelled ones ─► LiveCache::daemonset
//! ConfigMaps: the ConfigMap cache's metadata watch of the namespace (all of them), labelled ones
//! a labelled object's event ─► Wake::reconcile (one deleted or losing the label is also gone:
//!   Wake::gone); every DaemonSet event also ─► the NVIDIADriver controller's feed
//! ```
//!
//! [`Wake`] is how the caches wake the controller: a trigger that reconciles every
//! ClusterPolicy, and a flag asking that reconcile to render and apply again (a full
//! reconcile) rather than only re-judge readiness and status from the caches.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kiln_core::State;
use kiln_core::plan::{LiveObject, ObjectKey, STATE_LABEL};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;

use kiln_core::spec::nvidiadriver::{NVIDIADRIVER_LABEL, NVIDIADriver};
use kube::ResourceExt as _;
use kube::runtime::reflector::ObjectRef;

use crate::Result;
use crate::apply::Applier;

/// The NVIDIADriver a DaemonSet belongs to: the one its [`NVIDIADRIVER_LABEL`] names (set on
/// every DaemonSet [`crate::controllers::driver::render`] produces); `None` without the label.
pub fn owner_of(ds: &DaemonSet) -> Option<ObjectRef<NVIDIADriver>> {
    ds.labels()
        .get(NVIDIADRIVER_LABEL)
        .map(|cr| ObjectRef::new(cr))
}

/// The metadata of one labelled object as its store holds it.
pub type Meta = PartialObjectMeta<DynamicObject>;

/// Every `(apiVersion, kind)` the state assets use (with and without OpenShift).
pub fn asset_kinds() -> BTreeSet<(String, String)> {
    State::ALL
        .into_iter()
        .flat_map(|s| {
            [false, true]
                .into_iter()
                .flat_map(move |os| kiln_render::assets::load_state(s, os).unwrap_or_default())
        })
        .filter_map(|a| ObjectKey::of(&a.object).map(|k| (k.api_version, k.kind)))
        .collect()
}

/// How caches wake the ClusterPolicy controller (cloned into every watch task).
///
/// [`Wake::reconcile`] sends one `()` on the channel the controller's `reconcile_all_on`
/// reads; [`Wake::full`] also sets a flag the next reconcile takes ([`Wake::take_full`]):
/// then it renders, labels and applies instead of only re-judging readiness. Objects deleted
/// behind kiln's back are recorded ([`Wake::gone`]) so the next reconcile re-applies them.
#[derive(Clone, Default)]
pub struct Wake {
    tx: Option<mpsc::UnboundedSender<()>>,
    upgrade: Arc<tokio::sync::Notify>,
    full: Arc<AtomicBool>,
    gone: Arc<Mutex<HashSet<ObjectKey>>>,
}

impl Wake {
    /// A wake and the stream of its triggers (for `Controller::reconcile_all_on`).
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<()>) {
        let (tx, rx) = mpsc::unbounded();
        (
            Wake {
                tx: Some(tx),
                ..Wake::default()
            },
            rx,
        )
    }

    /// Reconcile every ClusterPolicy (readiness and status only, unless [`Wake::full`]).
    pub fn reconcile(&self) {
        if let Some(tx) = &self.tx {
            let _ = tx.unbounded_send(());
        }
    }

    /// Ask the driver upgrade loop for a pass soon ([`crate::controllers::upgrade::run`]: a
    /// driver or validator pod, a DaemonSet, a node's upgrade state or the policy changed).
    pub fn upgrade(&self) {
        self.upgrade.notify_one();
    }

    /// What [`Wake::upgrade`] notifies (the upgrade loop waits on it).
    pub fn upgrade_notify(&self) -> Arc<tokio::sync::Notify> {
        self.upgrade.clone()
    }

    /// Ask for a full reconcile (render, label, apply) and trigger it.
    pub fn full(&self) {
        self.full.store(true, Ordering::SeqCst);
        self.reconcile();
    }

    /// Whether a full reconcile was asked for since the last call (clears the request).
    pub fn take_full(&self) -> bool {
        self.full.swap(false, Ordering::SeqCst)
    }

    /// Record that the labelled object `key` was deleted.
    pub fn gone(&self, key: ObjectKey) {
        self.gone.lock().expect("gone lock").insert(key);
    }

    /// Whether any of `keys` was deleted since [`Wake::clear_gone`].
    pub fn any_gone<'a>(&self, mut keys: impl Iterator<Item = &'a ObjectKey>) -> bool {
        let gone = self.gone.lock().expect("gone lock");
        !gone.is_empty() && keys.any(|k| gone.contains(k))
    }

    /// Forget recorded deletions (a full reconcile re-applies whatever is missing).
    pub fn clear_gone(&self) {
        self.gone.lock().expect("gone lock").clear();
    }
}

/// One store per watched kind, with the kind it holds (a metadata watch reports every object
/// as `PartialObjectMetadata`, so the kind comes from here), the DaemonSets as full objects
/// from the namespace's one DaemonSet watch ([`start_daemonsets`], shared with the NVIDIADriver
/// controller), and the ConfigMaps from the [`crate::cluster::facts::ConfigMapCache`]'s watch of every
/// ConfigMap of the namespace; of these two only the labelled ones count.
pub struct LiveCache {
    stores: Vec<(ApiResource, Store<Meta>)>,
    daemonsets: Option<Store<DaemonSet>>,
    config_maps: Option<Store<PartialObjectMeta<ConfigMap>>>,
    waited: std::sync::atomic::AtomicBool,
}

/// Whether `meta` carries [`STATE_LABEL`] (kiln applied it).
fn labelled(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .is_some_and(|l| l.contains_key(STATE_LABEL))
}

/// The wake-ups of a watch of one kind's labelled objects: an event of a labelled object
/// reconciles; a labelled object deleted, or losing the label, is [`Wake::gone`] (re-applied);
/// unlabelled objects wake nothing. Serves the watches selected by [`STATE_LABEL`] and the two
/// unfiltered watches the labelled objects share: the ConfigMap cache's and the namespace's
/// DaemonSet watch ([`start_daemonsets`]).
pub struct LabelledEvents {
    ar: ApiResource,
    wake: Wake,
    /// The labelled objects the watch has shown, by (namespace, name).
    seen: HashSet<(Option<String>, String)>,
}

impl LabelledEvents {
    /// Wake-ups for the watch of kind `ar` through `wake`.
    pub fn new(ar: ApiResource, wake: Wake) -> Self {
        LabelledEvents {
            ar,
            wake,
            seen: HashSet::new(),
        }
    }

    /// Wake for `ev` as described above.
    pub fn observe<K: kube::Resource>(&mut self, ev: &watcher::Event<K>) {
        let id = |o: &K| {
            (
                o.meta().namespace.clone(),
                o.meta().name.clone().unwrap_or_default(),
            )
        };
        match ev {
            watcher::Event::Init => self.seen.clear(),
            watcher::Event::InitApply(o) => {
                if labelled(o.meta()) {
                    self.seen.insert(id(o));
                }
            }
            watcher::Event::Apply(o) if labelled(o.meta()) => {
                self.seen.insert(id(o));
                self.wake.reconcile();
            }
            watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                if self.seen.remove(&id(o)) {
                    self.wake.gone(live_object_of(&self.ar, o.meta()).key);
                    self.wake.reconcile();
                }
            }
            watcher::Event::InitDone => {}
        }
    }
}

impl LiveCache {
    /// A cache over existing stores (tests fill them through a [`reflector::store::Writer`]).
    pub fn from_stores(stores: Vec<(ApiResource, Store<Meta>)>) -> Self {
        LiveCache {
            stores,
            daemonsets: None,
            config_maps: None,
            waited: Default::default(),
        }
    }

    /// This cache with the ConfigMaps of `store` (every ConfigMap of the operator namespace,
    /// metadata only) that carry [`STATE_LABEL`] as its labelled ConfigMaps.
    #[must_use]
    pub fn with_config_maps(mut self, store: Store<PartialObjectMeta<ConfigMap>>) -> Self {
        self.config_maps = Some(store);
        self
    }

    /// This cache with the DaemonSets of `store` (full objects, status included) that carry
    /// [`STATE_LABEL`] as its labelled DaemonSets; without one, [`LiveCache::daemonset`] finds
    /// none.
    #[must_use]
    pub fn with_daemonsets(mut self, store: Store<DaemonSet>) -> Self {
        self.daemonsets = Some(store);
        self
    }

    /// The labelled DaemonSet `namespace/name` as the cache holds it (status included).
    pub fn daemonset(&self, namespace: &str, name: &str) -> Option<Arc<DaemonSet>> {
        self.daemonsets
            .as_ref()?
            .get(&reflector::ObjectRef::new(name).within(namespace))
            .filter(|d| labelled(&d.metadata))
    }

    /// The labelled DaemonSet `key` when its managed fields name fields another manager added
    /// (the store keeps only that drift, [`trim_daemonset`]): those entries and the DaemonSet
    /// as JSON, for [`crate::apply::Applier::due`]. `None` for other kinds, or with no drift.
    pub fn foreign_daemonset(&self, key: &ObjectKey) -> Option<(Vec<ManagedFieldsEntry>, Value)> {
        if (key.api_version.as_str(), key.kind.as_str()) != ("apps/v1", "DaemonSet") {
            return None;
        }
        foreign_of(&*self.daemonset(key.namespace.as_deref().unwrap_or_default(), &key.name)?)
    }

    /// Start one metadata reflector per served kind of [`asset_kinds`] (a kind this cluster
    /// does not serve, say ServiceMonitor without its CRD, is not watched). The reflectors run
    /// as tasks on the current runtime, retrying with kube-runtime's default backoff.
    /// ConfigMaps and DaemonSets get no watch of their own: `config_maps` is the
    /// [`crate::cluster::facts::ConfigMapCache`]'s store of every ConfigMap of `namespace`
    /// (whose watch wakes through [`LabelledEvents`]), `daemonsets` the store of
    /// [`start_daemonsets`]; of both only the labelled ones count.
    ///
    /// # Errors
    /// [`crate::Error::Kube`] when discovery of a kind fails other than "not served".
    pub async fn start(
        client: &Client,
        applier: &Applier,
        namespace: &str,
        wake: &Wake,
        config_maps: Store<PartialObjectMeta<ConfigMap>>,
        daemonsets: Store<DaemonSet>,
    ) -> Result<Self> {
        let mut stores = Vec::new();
        for (api_version, kind) in asset_kinds() {
            let Some((ar, namespaced)) = applier.resolve(&api_version, &kind).await? else {
                continue;
            };
            if matches!(
                (api_version.as_str(), kind.as_str()),
                ("apps/v1", "DaemonSet") | ("v1", "ConfigMap")
            ) {
                continue;
            }
            // `Api<PartialObjectMeta<_>>`: metadata-only list and watch.
            let api: Api<Meta> = if namespaced {
                Api::namespaced_with(client.clone(), namespace, &ar)
            } else {
                Api::all_with(client.clone(), &ar)
            };
            let writer = reflector::store::Writer::<Meta>::new(ar.clone());
            let store = writer.as_reader();
            let stream =
                watcher(api, crate::cluster::watch::config().labels(STATE_LABEL)).default_backoff();
            let name = kind.clone();
            let mut events = LabelledEvents::new(ar.clone(), wake.clone());
            tokio::spawn(reflector::reflector(writer, stream).for_each(move |ev| {
                match ev {
                    Err(e) => tracing::warn!(kind = %name, error = %e, "watch of labelled objects"),
                    Ok(ev) => events.observe(&ev),
                }
                futures::future::ready(())
            }));
            stores.push((ar, store));
        }
        Ok(Self::from_stores(stores)
            .with_daemonsets(daemonsets)
            .with_config_maps(config_maps))
    }

    /// Wait until every store has listed once, at most `limit` and only on the first call (a
    /// kind the operator may not list, say for want of RBAC, would otherwise hold up every
    /// reconcile); returns whether all are ready now.
    pub async fn ready(&self, limit: std::time::Duration) -> bool {
        let all = || {
            let ds = self.daemonsets.iter().map(|s| s.wait_until_ready().boxed());
            let cms = self
                .config_maps
                .iter()
                .map(|s| s.wait_until_ready().boxed());
            futures::future::join_all(
                self.stores
                    .iter()
                    .map(|(_, s)| s.wait_until_ready().boxed())
                    .chain(ds)
                    .chain(cms),
            )
        };
        if self.waited.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return all()
                .now_or_never()
                .is_some_and(|res| res.iter().all(Result::is_ok));
        }
        match tokio::time::timeout(limit, all()).await {
            Ok(res) => res.iter().all(Result::is_ok),
            Err(_) => false,
        }
    }

    /// The change marker ([`crate::apply::marker_of`]) of the labelled object `key` as the
    /// cache holds it; `None` when its kind is not watched or the object is not there.
    pub fn marker(&self, key: &ObjectKey) -> Option<String> {
        if (key.api_version.as_str(), key.kind.as_str()) == ("apps/v1", "DaemonSet")
            && self.daemonsets.is_some()
        {
            let ns = key.namespace.as_deref().unwrap_or_default();
            return self
                .daemonset(ns, &key.name)
                .map(|d| crate::apply::marker_of(&d.metadata));
        }
        if (key.api_version.as_str(), key.kind.as_str()) == ("v1", "ConfigMap")
            && let Some(store) = &self.config_maps
        {
            let r = reflector::ObjectRef::new(&key.name)
                .within(key.namespace.as_deref().unwrap_or_default());
            return store
                .get(&r)
                .filter(|m| labelled(&m.metadata))
                .map(|m| crate::apply::marker_of(&m.metadata));
        }
        let (ar, store) = self
            .stores
            .iter()
            .find(|(ar, _)| ar.api_version == key.api_version && ar.kind == key.kind)?;
        let mut r = reflector::ObjectRef::<Meta>::new_with(&key.name, ar.clone());
        if let Some(ns) = &key.namespace {
            r = r.within(ns);
        }
        store.get(&r).map(|m| crate::apply::marker_of(&m.metadata))
    }

    /// Every labelled object the stores hold now.
    pub fn objects(&self) -> Vec<LiveObject> {
        let ds_ar = ApiResource::erase::<DaemonSet>(&());
        let daemonsets = self
            .daemonsets
            .iter()
            .flat_map(|s| s.state())
            .filter(|d| labelled(&d.metadata))
            .map(|d| live_object_of(&ds_ar, &d.metadata));
        let cm_ar = ApiResource::erase::<ConfigMap>(&());
        let config_maps = self
            .config_maps
            .iter()
            .flat_map(|s| s.state())
            .filter(|m| labelled(&m.metadata))
            .map(|m| live_object_of(&cm_ar, &m.metadata));
        self.stores
            .iter()
            .flat_map(|(ar, store)| store.state().into_iter().map(move |m| live_object(ar, &m)))
            .chain(daemonsets)
            .chain(config_maps)
            .collect()
    }
}

/// Every DaemonSet of `namespace`, full objects with managed fields reduced to the drift
/// ([`trim_daemonset`]; readiness reads their status): one watch for both controllers, since a label selector cannot match the
/// policy's ([`STATE_LABEL`]) and the NVIDIADriver CRs' DaemonSets
/// ([`kiln_core::spec::nvidiadriver::NVIDIADRIVER_LABEL`]) at once. A labelled one's event
/// wakes the ClusterPolicy controller through [`LabelledEvents`] (a status change re-judges
/// readiness from this store, with no request), a driver DaemonSet's (the policy's or an
/// NVIDIADriver's) also the driver upgrade loop, and a listed store both; every event is passed to `also` (the
/// NVIDIADriver controller's side, [`crate::controllers::driver::daemonset_feed`]) after the store
/// holds it. Unlabelled DaemonSets of the namespace (a site's, or NVIDIA's operator's during a
/// migration) are held as metadata without annotations ([`trim_daemonset`]) and wake nothing
/// here, except one that just lost the label.
pub fn start_daemonsets(
    client: &Client,
    namespace: &str,
    wake: &Wake,
    mut also: impl FnMut(&watcher::Event<DaemonSet>) + Send + 'static,
) -> Store<DaemonSet> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let writer = reflector::store::Writer::<DaemonSet>::default();
    let store = writer.as_reader();
    let mut events = LabelledEvents::new(ApiResource::erase::<DaemonSet>(&()), wake.clone());
    let stream = watcher(api, crate::cluster::watch::config())
        .default_backoff()
        .modify(trim_daemonset);
    let wake = wake.clone();
    tokio::spawn(reflector::reflector(writer, stream).for_each(move |ev| {
        match &ev {
            Err(e) => tracing::warn!(error = %e, "watch of the namespace's DaemonSets"),
            Ok(ev) => {
                events.observe(ev);
                also(ev);
            }
        }
        match ev {
            Ok(watcher::Event::Apply(d) | watcher::Event::Delete(d))
                if crate::cluster::wakes::daemonset(&d).upgrade =>
            {
                wake.upgrade();
            }
            Ok(watcher::Event::InitDone) => {
                wake.reconcile();
                wake.upgrade();
            }
            _ => {}
        }
        futures::future::ready(())
    }));
    store
}

/// A DaemonSet of the shared store ([`trim_daemonset`]) when its managed fields name fields
/// another manager added: those entries and the DaemonSet as JSON, for
/// [`crate::drift::remove_drift`]; `None` with no drift (at rest). No request.
pub fn foreign_of(d: &DaemonSet) -> Option<(Vec<ManagedFieldsEntry>, Value)> {
    let managed = d
        .metadata
        .managed_fields
        .clone()
        .filter(|m| !m.is_empty())?;
    Some((managed, serde_json::to_value(d).ok()?))
}

/// A DaemonSet as the shared store keeps it: managed fields (most of a DaemonSet's size)
/// dropped, except, on either controller's DaemonSets (the policy's, [`labelled`], and an
/// NVIDIADriver CR's, [`crate::controllers::driver::owner_of`]), the fields other managers added
/// and kiln does not own ([`kiln_core::drift::foreign`]: nothing at rest), which the next
/// reconcile removes; one that is neither the policy's nor an NVIDIADriver CR's
/// ([`crate::controllers::driver::owner_of`]) also loses its
/// annotations, spec and status, since every reader of the store filters on those two labels
/// and [`LabelledEvents`] reads only labels. When such a DaemonSet gains a label (kiln applies
/// over NVIDIA's), the watch event that shows it carries the whole object again.
fn trim_daemonset(d: &mut DaemonSet) {
    let managed = d.metadata.managed_fields.take();
    let ours = labelled(&d.metadata) || owner_of(d).is_some();
    if ours {
        let foreign =
            kiln_core::drift::foreign(&managed.unwrap_or_default(), crate::apply::FIELD_MANAGER);
        d.metadata.managed_fields = (!foreign.is_empty()).then_some(foreign);
    }
    if !ours {
        d.metadata.annotations = None;
        d.spec = None;
        d.status = None;
    }
}

/// `m` (of kind `ar`) as the plan sees it.
pub fn live_object(ar: &ApiResource, m: &Meta) -> LiveObject {
    live_object_of(ar, &m.metadata)
}

/// An object of kind `ar` with metadata `m` as the plan sees it.
pub fn live_object_of(
    ar: &ApiResource,
    m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> LiveObject {
    LiveObject {
        key: ObjectKey {
            api_version: ar.api_version.clone(),
            kind: ar.kind.clone(),
            namespace: m.namespace.clone(),
            name: m.name.clone().unwrap_or_default(),
        },
        state: m
            .labels
            .as_ref()
            .and_then(|l| l.get(STATE_LABEL))
            .cloned()
            .unwrap_or_default(),
        owned: m
            .owner_references
            .iter()
            .flatten()
            .any(|r| r.kind == "ClusterPolicy" && r.api_version == "nvidia.com/v1"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asset_kinds_cover_rbac_daemonsets_and_monitoring() {
        let kinds = asset_kinds();
        for (v, k) in [
            ("apps/v1", "DaemonSet"),
            ("v1", "ServiceAccount"),
            ("v1", "ConfigMap"),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
            ("monitoring.coreos.com/v1", "ServiceMonitor"),
            ("security.openshift.io/v1", "SecurityContextConstraints"),
        ] {
            assert!(kinds.contains(&(v.into(), k.into())), "{v} {k}");
        }
        assert_eq!(kinds.len(), 12, "{kinds:?}");
    }

    #[test]
    fn live_objects_take_kind_from_the_store_and_state_from_the_label() {
        let ar = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let m: Meta = serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": "x", "namespace": "gpu-operator",
                "labels": {STATE_LABEL: "dcgm"},
                "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                    "name": "p", "uid": "u"}]}
        }))
        .unwrap();
        let l = live_object(&ar, &m);
        assert_eq!(l.key.to_string(), "ConfigMap gpu-operator/x");
        assert_eq!(l.key.api_version, "v1");
        assert_eq!(l.state, "dcgm");
        assert!(l.owned);
    }

    #[tokio::test]
    async fn only_the_first_reconcile_waits_for_a_store_that_cannot_list() {
        let ar = ApiResource::erase::<k8s_openapi::api::core::v1::ServiceAccount>(&());
        let mut w = reflector::store::Writer::<Meta>::new(ar.clone());
        let cache = LiveCache::from_stores(vec![(ar, w.as_reader())]);
        let limit = std::time::Duration::from_millis(1);
        assert!(!cache.ready(limit).await);
        // Later calls never wait: the future completes on its first poll.
        let long = std::time::Duration::from_secs(3600);
        assert_eq!(cache.ready(long).now_or_never(), Some(false));
        w.apply_watcher_event(&watcher::Event::Init);
        w.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(cache.ready(long).now_or_never(), Some(true));
    }

    /// A ConfigMap's metadata in `gpu-operator`, labelled `kiln.dev/state=dcgm` when `label`.
    fn cm(name: &str, label: bool) -> PartialObjectMeta<ConfigMap> {
        let mut m = PartialObjectMeta::<ConfigMap>::default();
        m.metadata.name = Some(name.into());
        m.metadata.namespace = Some("gpu-operator".into());
        m.metadata.resource_version = Some("7".into());
        if label {
            m.metadata.labels = Some([(STATE_LABEL.to_string(), "dcgm".to_string())].into());
        }
        m
    }

    /// The key of ConfigMap `gpu-operator/name`.
    fn cm_key(name: &str) -> ObjectKey {
        ObjectKey {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("gpu-operator".into()),
            name: name.into(),
        }
    }

    #[test]
    fn an_unfiltered_watch_wakes_for_labelled_objects_only_and_a_lost_label_is_gone() {
        let ar = ApiResource::erase::<ConfigMap>(&());
        let (wake, mut wakes) = Wake::channel();
        let mut events = LabelledEvents::new(ar, wake.clone());
        let key = cm_key;
        let woken = |w: &mut mpsc::UnboundedReceiver<()>| {
            let mut n = 0;
            while w.try_recv().is_ok() {
                n += 1;
            }
            n
        };
        type Ev = watcher::Event<PartialObjectMeta<ConfigMap>>;
        events.observe(&Ev::Init);
        events.observe(&watcher::Event::InitApply(cm("ours", true)));
        events.observe(&watcher::Event::InitApply(cm("site", false)));
        events.observe(&Ev::InitDone);
        assert_eq!(woken(&mut wakes), 0, "a listing wakes nothing here");
        events.observe(&watcher::Event::Apply(cm("site", false)));
        events.observe(&watcher::Event::Delete(cm("site", false)));
        assert_eq!(woken(&mut wakes), 0, "a site ConfigMap wakes nothing");
        events.observe(&watcher::Event::Apply(cm("ours", true)));
        assert_eq!(woken(&mut wakes), 1);
        assert!(!wake.any_gone([key("ours")].iter()));
        // Its label removed: as a labelled watch would report it, deleted.
        events.observe(&watcher::Event::Apply(cm("ours", false)));
        assert_eq!(woken(&mut wakes), 1);
        assert!(wake.any_gone([key("ours")].iter()));
        wake.clear_gone();
        events.observe(&watcher::Event::Apply(cm("ours", false)));
        assert_eq!(woken(&mut wakes), 0, "no longer ours");
        events.observe(&watcher::Event::Apply(cm("new", true)));
        events.observe(&watcher::Event::Delete(cm("new", true)));
        assert_eq!(woken(&mut wakes), 2);
        assert!(wake.any_gone([key("new")].iter()));
    }

    #[test]
    fn the_shared_config_map_store_counts_labelled_config_maps_only() {
        let mut w = reflector::store::Writer::<PartialObjectMeta<ConfigMap>>::default();
        w.apply_watcher_event(&watcher::Event::Apply(cm("ours", true)));
        w.apply_watcher_event(&watcher::Event::Apply(cm("site", false)));
        let cache = LiveCache::from_stores(vec![]).with_config_maps(w.as_reader());
        let objects = cache.objects();
        assert_eq!(objects.len(), 1, "{objects:?}");
        assert_eq!(objects[0].key.to_string(), "ConfigMap gpu-operator/ours");
        assert_eq!(objects[0].state, "dcgm");
        assert_eq!(cache.marker(&cm_key("ours")).as_deref(), Some("rv7"));
        assert_eq!(cache.marker(&cm_key("site")), None);
    }

    /// DaemonSet `gpu-operator/name` at resourceVersion 9 with `labels`.
    fn ds(name: &str, labels: &[(&str, &str)]) -> DaemonSet {
        let mut d = DaemonSet::default();
        d.metadata.name = Some(name.into());
        d.metadata.namespace = Some("gpu-operator".into());
        d.metadata.resource_version = Some("9".into());
        d.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        d
    }

    #[test]
    fn the_shared_daemonset_store_counts_labelled_daemonsets_only() {
        let mut w = reflector::store::Writer::<DaemonSet>::default();
        w.apply_watcher_event(&watcher::Event::Apply(ds(
            "nvidia-dcgm-exporter",
            &[(STATE_LABEL, "dcgm-exporter")],
        )));
        // An NVIDIADriver CR's DaemonSet shares the store and is not the policy's.
        w.apply_watcher_event(&watcher::Event::Apply(ds(
            "nvidia-gpu-driver-ubuntu22.04-pool-a",
            &[(kiln_core::spec::nvidiadriver::NVIDIADRIVER_LABEL, "pool-a")],
        )));
        let cache = LiveCache::from_stores(vec![]).with_daemonsets(w.as_reader());
        let objects = cache.objects();
        assert_eq!(objects.len(), 1, "{objects:?}");
        assert_eq!(
            objects[0].key.to_string(),
            "DaemonSet gpu-operator/nvidia-dcgm-exporter"
        );
        assert_eq!(objects[0].state, "dcgm-exporter");
        let key = |name: &str| ObjectKey {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            namespace: Some("gpu-operator".into()),
            name: name.into(),
        };
        assert_eq!(
            cache.marker(&key("nvidia-dcgm-exporter")).as_deref(),
            Some("rv9")
        );
        assert_eq!(
            cache.marker(&key("nvidia-gpu-driver-ubuntu22.04-pool-a")),
            None
        );
        assert!(
            cache
                .daemonset("gpu-operator", "nvidia-gpu-driver-ubuntu22.04-pool-a")
                .is_none()
        );
        let upgrade = |d: DaemonSet| crate::cluster::wakes::daemonset(&d).upgrade;
        assert!(!upgrade(ds(crate::cluster::watch::DRIVER_DAEMONSET, &[])));
        assert!(upgrade(ds(
            crate::cluster::watch::DRIVER_DAEMONSET,
            &[(STATE_LABEL, "driver")]
        )));
        assert!(upgrade(ds(
            "nvidia-gpu-driver-ubuntu22.04-abc",
            &[(NVIDIADRIVER_LABEL, "pool-a")]
        )));
    }

    #[test]
    fn the_shared_daemonset_store_keeps_only_the_metadata_of_a_daemonset_neither_controller_owns() {
        use k8s_openapi::api::apps::v1::{DaemonSetSpec, DaemonSetStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let full = |labels: &[(&str, &str)]| {
            let mut d = ds("nvidia-device-plugin-daemonset", labels);
            d.metadata.annotations = Some(
                [(
                    "deprecated.daemonset.template.generation".into(),
                    "3".into(),
                )]
                .into(),
            );
            d.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
            d.spec = Some(DaemonSetSpec::default());
            d.status = Some(DaemonSetStatus {
                number_ready: 4,
                ..Default::default()
            });
            d
        };
        // NVIDIA's operator's DaemonSet during a migration: metadata and labels only.
        let mut nvidia = full(&[("app", "nvidia-device-plugin-daemonset")]);
        trim_daemonset(&mut nvidia);
        assert_eq!(
            nvidia.metadata.labels.as_ref().unwrap()["app"],
            "nvidia-device-plugin-daemonset"
        );
        assert_eq!(
            nvidia.metadata.name.as_deref(),
            Some("nvidia-device-plugin-daemonset")
        );
        assert!(nvidia.metadata.annotations.is_none());
        assert!(nvidia.metadata.managed_fields.is_none());
        assert!(nvidia.spec.is_none() && nvidia.status.is_none());
        // The policy's keeps, of its managed fields, only what other managers added and kiln
        // does not own (the drift a reconcile removes): nothing when nobody else wrote.
        let entry = |manager: &str, sub: Option<&str>, set: serde_json::Value| ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Apply".into()),
            subresource: sub.map(str::to_string),
            fields_v1: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                set,
            )),
            ..ManagedFieldsEntry::default()
        };
        let kiln = entry(
            crate::apply::FIELD_MANAGER,
            None,
            serde_json::json!({"f:metadata": {"f:labels": {"f:kiln.dev/state": {}}}}),
        );
        let status = entry(
            "kube-controller-manager",
            Some("status"),
            serde_json::json!({"f:status": {}}),
        );
        let mut clean = full(&[(STATE_LABEL, "x")]);
        clean.metadata.managed_fields = Some(vec![kiln.clone(), status.clone()]);
        trim_daemonset(&mut clean);
        assert!(clean.metadata.managed_fields.is_none());
        let mut drifted = full(&[(STATE_LABEL, "x"), ("team", "ml")]);
        let team =
            serde_json::json!({"f:metadata": {"f:labels": {"f:team": {}, "f:kiln.dev/state": {}}}});
        let untrimmed = vec![kiln, status, entry("intruder", None, team)];
        drifted.metadata.managed_fields = Some(untrimmed.clone());
        trim_daemonset(&mut drifted);
        let kept = drifted
            .metadata
            .managed_fields
            .as_deref()
            .unwrap_or_default();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(kept[0].manager.as_deref(), Some("intruder"));
        assert_eq!(
            kept[0].fields_v1.as_ref().unwrap().0,
            serde_json::json!({"f:metadata": {"f:labels": {"f:team": {}}}})
        );
        assert_eq!(foreign_of(&drifted).map(|(m, _)| m), Some(kept.to_vec()));
        // An NVIDIADriver CR's DaemonSet keeps its drift the same way.
        let mut driver = full(&[
            (kiln_core::spec::nvidiadriver::NVIDIADRIVER_LABEL, "pool-a"),
            ("team", "ml"),
        ]);
        driver.metadata.managed_fields = Some(untrimmed);
        trim_daemonset(&mut driver);
        assert_eq!(
            driver
                .metadata
                .managed_fields
                .as_deref()
                .unwrap_or_default(),
            kept
        );
        assert!(foreign_of(&clean).is_none());
        // Either controller's keeps what readiness, markers and the upgrade read.
        for label in [
            STATE_LABEL,
            kiln_core::spec::nvidiadriver::NVIDIADRIVER_LABEL,
        ] {
            let mut ours = full(&[(label, "x")]);
            trim_daemonset(&mut ours);
            assert!(ours.metadata.managed_fields.is_none(), "{label}");
            assert!(ours.metadata.annotations.is_some(), "{label}");
            assert!(ours.spec.is_some(), "{label}");
            assert_eq!(
                ours.status.as_ref().map(|s| s.number_ready),
                Some(4),
                "{label}"
            );
        }
    }
}
