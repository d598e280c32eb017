//! The cluster's own record of what kiln applied: metadata-only reflector stores of the objects
//! labelled [`STATE_LABEL`], one per kind the assets use (namespaced kinds in the operator
//! namespace, cluster-scoped kinds cluster-wide). Deletion is decided from these
//! ([`kiln_core::plan::plan`]), so a restarted operator still finds — and deletes — an object
//! it applied before and no longer renders.
//!
//! ```text
//! metadata watch ?labelSelector=kiln.dev/state ─► Store (per kind) ─► LiveCache::objects
//! ```

use std::collections::BTreeSet;

use futures::{FutureExt, StreamExt};
use kiln_core::State;
use kiln_core::plan::{LiveObject, ObjectKey, STATE_LABEL};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use crate::Result;
use crate::apply::Applier;

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

/// One store per watched kind, with the kind it holds (a metadata watch reports every object
/// as `PartialObjectMetadata`, so the kind comes from here).
pub struct LiveCache {
    stores: Vec<(ApiResource, Store<Meta>)>,
    waited: std::sync::atomic::AtomicBool,
}

impl LiveCache {
    /// A cache over existing stores (tests fill them through a [`reflector::store::Writer`]).
    pub fn from_stores(stores: Vec<(ApiResource, Store<Meta>)>) -> Self {
        LiveCache {
            stores,
            waited: Default::default(),
        }
    }

    /// Start one metadata reflector per served kind of [`asset_kinds`] (a kind this cluster
    /// does not serve, say ServiceMonitor without its CRD, is not watched). The reflectors run
    /// as tasks on the current runtime, retrying with kube-runtime's default backoff.
    ///
    /// # Errors
    /// [`crate::Error::Kube`] when discovery of a kind fails other than "not served".
    pub async fn start(client: &Client, applier: &Applier, namespace: &str) -> Result<Self> {
        let mut stores = Vec::new();
        for (api_version, kind) in asset_kinds() {
            let Some((ar, namespaced)) = applier.resolve(&api_version, &kind).await? else {
                continue;
            };
            // `Api<PartialObjectMeta<_>>`: metadata-only list and watch.
            let api: Api<Meta> = if namespaced {
                Api::namespaced_with(client.clone(), namespace, &ar)
            } else {
                Api::all_with(client.clone(), &ar)
            };
            let writer = reflector::store::Writer::<Meta>::new(ar.clone());
            let store = writer.as_reader();
            let stream =
                watcher(api, watcher::Config::default().labels(STATE_LABEL)).default_backoff();
            let name = kind.clone();
            tokio::spawn(reflector::reflector(writer, stream).for_each(move |ev| {
                if let Err(e) = ev {
                    tracing::warn!(kind = %name, error = %e, "watch of labelled objects");
                }
                futures::future::ready(())
            }));
            stores.push((ar, store));
        }
        Ok(Self::from_stores(stores))
    }

    /// Wait until every store has listed once, at most `limit` and only on the first call (a
    /// kind the operator may not list, say for want of RBAC, would otherwise hold up every
    /// reconcile); returns whether all are ready now.
    pub async fn ready(&self, limit: std::time::Duration) -> bool {
        let all =
            || futures::future::join_all(self.stores.iter().map(|(_, s)| s.wait_until_ready()));
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
        self.stores
            .iter()
            .flat_map(|(ar, store)| store.state().into_iter().map(move |m| live_object(ar, &m)))
            .collect()
    }
}

/// `m` (of kind `ar`) as the plan sees it.
pub fn live_object(ar: &ApiResource, m: &Meta) -> LiveObject {
    LiveObject {
        key: ObjectKey {
            api_version: ar.api_version.clone(),
            kind: ar.kind.clone(),
            namespace: m.namespace(),
            name: m.name_any(),
        },
        state: m.labels().get(STATE_LABEL).cloned().unwrap_or_default(),
        owned: m
            .owner_references()
            .iter()
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
}
