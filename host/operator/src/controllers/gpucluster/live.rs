//! What the GPUCluster controller applied, as the cluster holds it: one reflector per kind of
//! the DRA states' assets, selected by [`DRA_STATE_LABEL`] (namespaced kinds in the operator
//! namespace, cluster-scoped kinds cluster-wide). DaemonSets and Deployments are watched as full
//! objects (readiness reads their status), every other kind as metadata only. Deletion of what
//! the GPUCluster no longer renders is decided from these stores, so a restarted operator still
//! finds what it applied before; every event wakes the controller (a deleted object is applied
//! again, a DaemonSet's status re-judges readiness), and reading them costs no request.
//!
//! ```text
//! watch ?labelSelector=kiln.dev/dra-state (per asset kind) ─► Store ─► DraLive::{marker, objects}
//!                                                          └► wake ─► GPUCluster reconcile
//! ```

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::channel::mpsc;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kiln_core::plan::ObjectKey;
use kiln_core::spec::gpucluster::DraState;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use super::DRA_STATE_LABEL;
use crate::Result;
use crate::apply::Applier;

/// The metadata of one labelled object as its store holds it.
pub type Meta = PartialObjectMeta<DynamicObject>;

/// One labelled object: its key, the DRA state its label names, and whether a GPUCluster
/// owns it (only those are ever deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveObject {
    /// apiVersion, kind, namespace, name.
    pub key: ObjectKey,
    /// The [`DRA_STATE_LABEL`] value.
    pub state: String,
    /// Owned by a GPUCluster (`nvidia.com/v1alpha1`).
    pub owned: bool,
}

/// Every `(apiVersion, kind)` the DRA states' assets use, DeviceClasses at `device_class_api`
/// (the `resource.k8s.io` version the cluster serves).
pub fn dra_kinds(device_class_api: &str) -> BTreeSet<(String, String)> {
    DraState::ALL
        .into_iter()
        .flat_map(|s| kiln_render::assets::load_dra_state(s).unwrap_or_default())
        .filter_map(|a| ObjectKey::of(&a.object))
        .map(|k| {
            let api = if k.kind == "DeviceClass" {
                device_class_api.to_string()
            } else {
                k.api_version
            };
            (api, k.kind)
        })
        .collect()
}

/// The stores of labelled objects (see the module docs). Cheap to read; cloned stores share
/// their reflectors.
#[derive(Clone)]
pub struct DraLive {
    /// Metadata stores, per kind (neither DaemonSets nor Deployments).
    stores: Vec<(ApiResource, Store<Meta>)>,
    /// The labelled DaemonSets of the operator namespace.
    daemonsets: Store<DaemonSet>,
    /// The labelled Deployments of the operator namespace.
    deployments: Store<Deployment>,
    /// [`DraLive::ready`] has waited once.
    waited: Arc<AtomicBool>,
}

fn owned_by_gpu_cluster(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|r| r.kind == "GPUCluster" && r.api_version == "nvidia.com/v1alpha1")
}

fn live_object(
    api_version: &str,
    kind: &str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> LiveObject {
    LiveObject {
        key: ObjectKey {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            namespace: meta.namespace.clone(),
            name: meta.name.clone().unwrap_or_default(),
        },
        state: meta
            .labels
            .as_ref()
            .and_then(|l| l.get(DRA_STATE_LABEL))
            .cloned()
            .unwrap_or_default(),
        owned: owned_by_gpu_cluster(meta),
    }
}

impl DraLive {
    /// Stores filled by the caller (tests): `stores` per kind, the DaemonSets and Deployments.
    pub fn from_parts(
        stores: Vec<(ApiResource, Store<Meta>)>,
        daemonsets: Store<DaemonSet>,
        deployments: Store<Deployment>,
    ) -> Self {
        DraLive {
            stores,
            daemonsets,
            deployments,
            waited: Arc::default(),
        }
    }

    /// Start one reflector per served kind of [`dra_kinds`] (a kind the cluster does not
    /// serve is not watched), each event sending `()` on `wake`. The reflectors run as tasks
    /// on the current runtime with kube-runtime's default backoff.
    ///
    /// # Errors
    /// [`crate::Error::Kube`] when discovery of a kind fails other than "not served".
    pub async fn start(
        client: &Client,
        applier: &Applier,
        namespace: &str,
        device_class_api: &str,
        wake: &mpsc::UnboundedSender<()>,
    ) -> Result<Self> {
        let config = || crate::cluster::watch::config().labels(DRA_STATE_LABEL);
        let mut stores = Vec::new();
        let daemonsets = spawn_full::<DaemonSet>(
            Api::namespaced(client.clone(), namespace),
            config(),
            wake.clone(),
        );
        let deployments = spawn_full::<Deployment>(
            Api::namespaced(client.clone(), namespace),
            config(),
            wake.clone(),
        );
        for (api_version, kind) in dra_kinds(device_class_api) {
            if kind == "DaemonSet" || kind == "Deployment" {
                continue;
            }
            let Some((ar, namespaced)) = applier.resolve(&api_version, &kind).await? else {
                continue;
            };
            let api: Api<Meta> = if namespaced {
                Api::namespaced_with(client.clone(), namespace, &ar)
            } else {
                Api::all_with(client.clone(), &ar)
            };
            let writer = reflector::store::Writer::<Meta>::new(ar.clone());
            let store = writer.as_reader();
            let wake = wake.clone();
            let stream = watcher(api, config()).default_backoff();
            tokio::spawn(reflector::reflector(writer, stream).for_each(move |ev| {
                match ev {
                    Err(e) => {
                        tracing::warn!(%kind, error = %e, "watch of the GPUCluster's objects")
                    }
                    Ok(_) => {
                        let _ = wake.unbounded_send(());
                    }
                }
                futures::future::ready(())
            }));
            stores.push((ar, store));
        }
        Ok(DraLive::from_parts(stores, daemonsets, deployments))
    }

    /// Wait until every store has listed once, at most `limit` and only on the first call (a
    /// kind the operator may not list would otherwise hold up every reconcile); whether all
    /// have listed now.
    pub async fn ready(&self, limit: std::time::Duration) -> bool {
        let all = futures::future::join_all(
            self.stores
                .iter()
                .map(|(_, s)| s.wait_until_ready().boxed())
                .chain(std::iter::once(self.daemonsets.wait_until_ready().boxed()))
                .chain(std::iter::once(self.deployments.wait_until_ready().boxed())),
        );
        let ok = |res: Vec<std::result::Result<(), _>>| res.iter().all(std::result::Result::is_ok);
        if self.waited.swap(true, Ordering::SeqCst) {
            return all.now_or_never().is_some_and(ok);
        }
        tokio::time::timeout(limit, all).await.is_ok_and(ok)
    }

    /// The labelled DaemonSet `name` of `namespace`.
    pub fn daemonset(&self, namespace: &str, name: &str) -> Option<Arc<DaemonSet>> {
        self.daemonsets.get(&ObjectRef::new(name).within(namespace))
    }

    /// The labelled Deployment `name` of `namespace`.
    pub fn deployment(&self, namespace: &str, name: &str) -> Option<Arc<Deployment>> {
        self.deployments
            .get(&ObjectRef::new(name).within(namespace))
    }

    /// The change marker ([`crate::apply::marker_of`]) of the labelled object `key`; `None`
    /// when its kind is not watched or the object is not there.
    pub fn marker(&self, key: &ObjectKey) -> Option<String> {
        let ns = key.namespace.as_deref().unwrap_or_default();
        match (key.api_version.as_str(), key.kind.as_str()) {
            ("apps/v1", "DaemonSet") => {
                return self
                    .daemonset(ns, &key.name)
                    .map(|d| crate::apply::marker_of(&d.metadata));
            }
            ("apps/v1", "Deployment") => {
                return self
                    .deployment(ns, &key.name)
                    .map(|d| crate::apply::marker_of(&d.metadata));
            }
            _ => {}
        }
        let (ar, store) = self
            .stores
            .iter()
            .find(|(ar, _)| ar.api_version == key.api_version && ar.kind == key.kind)?;
        let mut r = ObjectRef::<Meta>::new_with(&key.name, ar.clone());
        if let Some(ns) = &key.namespace {
            r = r.within(ns);
        }
        store.get(&r).map(|m| crate::apply::marker_of(&m.metadata))
    }

    /// Every labelled object the stores hold now.
    pub fn objects(&self) -> Vec<LiveObject> {
        let daemonsets = self
            .daemonsets
            .state()
            .into_iter()
            .map(|d| live_object("apps/v1", "DaemonSet", &d.metadata));
        let deployments = self
            .deployments
            .state()
            .into_iter()
            .map(|d| live_object("apps/v1", "Deployment", &d.metadata));
        self.stores
            .iter()
            .flat_map(|(ar, store)| {
                store
                    .state()
                    .into_iter()
                    .map(move |m| live_object(&ar.api_version, &ar.kind, &m.metadata))
            })
            .chain(daemonsets)
            .chain(deployments)
            .collect()
    }
}

/// A reflector of full `K` objects over `api` with `config`, each event sending `()` on
/// `wake`; returns its store.
fn spawn_full<K>(api: Api<K>, config: watcher::Config, wake: mpsc::UnboundedSender<()>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, config).default_backoff();
    tokio::spawn(reflector::reflector(writer, stream).for_each(move |ev| {
        match ev {
            Err(e) => tracing::warn!(error = %e, "watch of the GPUCluster's workloads"),
            Ok(_) => {
                let _ = wake.unbounded_send(());
            }
        }
        futures::future::ready(())
    }));
    store
}
