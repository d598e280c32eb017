//! Name-keyed stores for the objects the operator keeps one of per node: the node store
//! ([`crate::cluster::node::SlimNode`]) and the pod stores ([`crate::cluster::readiness::SlimPod`]).
//!
//! A watch's events are applied as kube-runtime's reflector applies them (a relist is
//! gathered, then replaces the whole set; the store is ready once the first list is in), but
//! kube's `Store` is not used for these: it keys each object by an `ObjectRef` and needs each
//! object to carry a whole `ObjectMeta` (almost all of it empty here), which at one node and
//! two pods a GPU node would be most of the operator's memory. Here an object's key is its
//! name, one allocation shared with the object ([`Keyed::key`]). The other stores (policies, DaemonSets, ConfigMaps, CRs: a few
//! objects each) stay kube's.
//!
//! Panics: every method takes the store's lock and panics if a thread panicked while holding
//! it (a poisoned lock), as kube's store does.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;

/// An object kept in a [`NamedStore`]: its name, the store's key (a clone of the object's own
/// `Arc`, no copy of the text).
pub trait Keyed {
    /// `metadata.name`.
    fn key(&self) -> Arc<str>;
}

type Objects<T> = Arc<RwLock<HashMap<Arc<str>, Arc<T>>>>;

/// The objects one watch holds, by name (a watch of namespaced objects covers one namespace),
/// and whether it has listed once. Cheap to clone (one shared map).
pub struct NamedStore<T> {
    objects: Objects<T>,
    ready: tokio::sync::watch::Receiver<bool>,
}

impl<T> Clone for NamedStore<T> {
    fn clone(&self) -> Self {
        NamedStore {
            objects: self.objects.clone(),
            ready: self.ready.clone(),
        }
    }
}

/// Applies a watch's events to its [`NamedStore`].
pub struct NamedWriter<T> {
    objects: Objects<T>,
    /// A relist in progress.
    buffer: Option<HashMap<Arc<str>, Arc<T>>>,
    ready: tokio::sync::watch::Sender<bool>,
}

/// An empty writer whose store is not ready until its first list is applied.
impl<T> Default for NamedWriter<T> {
    fn default() -> Self {
        NamedWriter {
            objects: Arc::default(),
            buffer: None,
            ready: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl<T: Keyed> NamedWriter<T> {
    /// The store this writer fills.
    pub fn as_reader(&self) -> NamedStore<T> {
        NamedStore {
            objects: self.objects.clone(),
            ready: self.ready.subscribe(),
        }
    }

    /// Apply one watch event: `Init` starts a relist (dropping one in progress), `InitApply`
    /// adds to it, `InitDone` replaces the store's objects with it (and marks the store ready,
    /// the first time); `Apply` and `Delete` change one object of the live set at once (kube's
    /// watcher sends none while a relist is in progress).
    pub fn apply(&mut self, ev: &watcher::Event<Arc<T>>) {
        match ev {
            watcher::Event::Init => self.buffer = Some(HashMap::new()),
            watcher::Event::InitApply(o) => {
                self.buffer
                    .get_or_insert_default()
                    .insert(o.key(), o.clone());
            }
            watcher::Event::InitDone => {
                let mut listed = self.buffer.take().unwrap_or_default();
                listed.shrink_to_fit();
                *self.objects.write().expect("store lock") = listed;
                self.ready.send_replace(true);
            }
            watcher::Event::Apply(o) => {
                self.objects
                    .write()
                    .expect("store lock")
                    .insert(o.key(), o.clone());
            }
            watcher::Event::Delete(o) => {
                self.objects.write().expect("store lock").remove(&*o.key());
            }
        }
    }

    /// A writer whose store holds `objects` as one complete list, ready (tests, benches; read
    /// it through [`NamedWriter::as_reader`]).
    pub fn listed(objects: impl IntoIterator<Item = T>) -> Self {
        let mut w = NamedWriter::default();
        w.apply(&watcher::Event::Init);
        for o in objects {
            w.apply(&watcher::Event::InitApply(Arc::new(o)));
        }
        w.apply(&watcher::Event::InitDone);
        w
    }
}

impl<T> NamedStore<T> {
    /// Every object it holds (in no particular order): a new `Vec` of `Arc` clones, O(n),
    /// taken under the read lock.
    pub fn state(&self) -> Vec<Arc<T>> {
        self.objects
            .read()
            .expect("store lock")
            .values()
            .cloned()
            .collect()
    }

    /// The object named `name`, if held.
    pub fn get(&self, name: &str) -> Option<Arc<T>> {
        self.objects.read().expect("store lock").get(name).cloned()
    }

    /// How many objects it holds.
    pub fn len(&self) -> usize {
        self.objects.read().expect("store lock").len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wait until the watch has listed once (forever if its writer is dropped before).
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.clone();
        if ready.wait_for(|r| *r).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// `ev` with its object converted by `f` (a watch's wire type into what a store keeps).
pub fn map_event<A, B>(ev: watcher::Event<A>, f: impl Fn(A) -> B) -> watcher::Event<B> {
    match ev {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(f(o)),
        watcher::Event::Apply(o) => watcher::Event::Apply(f(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(f(o)),
    }
}

/// What a watch for a [`NamedStore`] decodes: the kept object, built while the JSON is parsed
/// ([`WatchedKind::Raw`] names only the fields it keeps; managed fields and the rest are
/// skipped), and, for kube's watcher (which reads each object's `resourceVersion` through
/// [`kube::Resource`]), an `ObjectMeta` holding only its name, namespace and
/// `resourceVersion`, dropped with the envelope once the object is stored.
#[derive(Clone, Debug)]
pub struct Watched<T> {
    metadata: ObjectMeta,
    /// The object as its store keeps it.
    pub object: T,
}

/// The identity kube's watcher and `Api` read of a watched object.
#[derive(Clone, Debug, Default)]
pub struct Identity {
    /// `metadata.name`.
    pub name: Option<String>,
    /// `metadata.namespace` (`None` for cluster-scoped kinds).
    pub namespace: Option<String>,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
}

/// A core (`v1`) kind kept in a [`NamedStore`] and watched as [`Watched`]: how its JSON is
/// decoded and how the API addresses it.
pub trait WatchedKind: Sized {
    /// What is decoded of an object's JSON.
    type Raw: serde::de::DeserializeOwned;
    /// `k8s_openapi::NamespaceResourceScope` or `k8s_openapi::ClusterResourceScope`.
    type Scope;
    /// The kind (`Node`).
    const KIND: &'static str;
    /// Its resource name (`nodes`).
    const PLURAL: &'static str;
    /// The object kept of `raw`, with its identity (an object without a name gets the empty
    /// name as its store key; the API server never sends one).
    fn split(raw: Self::Raw) -> (Identity, Self);
}

/// Decodes [`WatchedKind::Raw`] and splits it; fails as that decode fails (malformed JSON, a
/// field of the wrong type).
impl<'de, T: WatchedKind> serde::Deserialize<'de> for Watched<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (id, object) = T::split(T::Raw::deserialize(d)?);
        Ok(Watched {
            metadata: ObjectMeta {
                name: id.name,
                namespace: id.namespace,
                resource_version: id.resource_version,
                ..ObjectMeta::default()
            },
            object,
        })
    }
}

impl<T: WatchedKind> kube::Resource for Watched<T> {
    type DynamicType = ();
    type Scope = T::Scope;

    fn kind(_: &()) -> Cow<'_, str> {
        T::KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        T::PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Obj(Arc<str>, u32);

    impl Keyed for Obj {
        fn key(&self) -> Arc<str> {
            self.0.clone()
        }
    }

    fn obj(name: &str, v: u32) -> Arc<Obj> {
        Arc::new(Obj(name.into(), v))
    }

    fn names(store: &NamedStore<Obj>) -> Vec<(String, u32)> {
        let mut v: Vec<(String, u32)> = store
            .state()
            .iter()
            .map(|o| (o.0.to_string(), o.1))
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn a_relist_replaces_the_set_and_changes_apply_one_object() {
        let mut w = NamedWriter::<Obj>::default();
        let store = w.as_reader();
        assert!(
            tokio::time::timeout(
                std::time::Duration::from_millis(20),
                store.wait_until_ready()
            )
            .await
            .is_err(),
            "not ready before the first list"
        );
        w.apply(&watcher::Event::Init);
        w.apply(&watcher::Event::InitApply(obj("a", 1)));
        w.apply(&watcher::Event::InitApply(obj("b", 1)));
        assert!(store.is_empty(), "a list in progress is not served");
        w.apply(&watcher::Event::InitDone);
        store.wait_until_ready().await;
        assert_eq!(names(&store), [("a".into(), 1), ("b".into(), 1)]);
        w.apply(&watcher::Event::Apply(obj("a", 2)));
        w.apply(&watcher::Event::Delete(obj("b", 1)));
        assert_eq!(names(&store), [("a".into(), 2)]);
        assert_eq!(store.get("a").map(|o| o.1), Some(2));
        assert!(store.get("b").is_none());
        // A relist drops what it did not list.
        w.apply(&watcher::Event::Init);
        w.apply(&watcher::Event::InitApply(obj("c", 1)));
        assert_eq!(
            names(&store),
            [("a".into(), 2)],
            "the old set until the list is done"
        );
        w.apply(&watcher::Event::InitDone);
        assert_eq!(names(&store), [("c".into(), 1)]);
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn the_key_is_the_objects_own_name() {
        let w = NamedWriter::listed([Obj("a".into(), 1)]);
        let o = w.as_reader().get("a").unwrap();
        let key = w.objects.read().unwrap().keys().next().unwrap().clone();
        assert!(std::ptr::eq(&*key, &*o.0), "no second copy of the name");
    }
}
