//! The one view of the cluster every controller reads ([`View`]): the stores the watches fill,
//! started once by `run` and handed to each controller as an `Arc<View>`. Every read here is a
//! store read; nothing here lists the API server. A test fills the same stores from its own
//! writers (kube's `reflector::store::Writer`, [`crate::cluster::store::NamedWriter`]) as a
//! watch would.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use kiln_core::spec::nvidiadriver::NVIDIADriver;
use kube::api::DynamicObject;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::cluster::facts::ConfigMapCache;
use crate::cluster::live::{LiveCache, Wake};
use crate::cluster::node::SlimNode;
use crate::cluster::readiness::PodWatches;
use crate::cluster::store::NamedStore;

/// The operator's view of the cluster: one store per watched kind, shared by every controller
/// and signal (no controller keeps a store of its own).
pub struct View {
    /// Every ClusterPolicy (as [`DynamicObject`]s: [`crate::cluster::watch::policy_resource`];
    /// the store the ClusterPolicy controller is built on).
    pub policies: Store<DynamicObject>,
    /// Every node, slimmed to what the operator reads ([`SlimNode`]; its labels are those
    /// [`crate::cluster::node::kept_label`] keeps).
    pub nodes: NamedStore<SlimNode>,
    /// Every DaemonSet of the operator namespace (the ClusterPolicy's, labelled
    /// [`kiln_core::plan::STATE_LABEL`], and the NVIDIADrivers', labelled
    /// [`kiln_core::spec::nvidiadriver::NVIDIADRIVER_LABEL`]; status included, managed fields
    /// reduced to other managers' additions: [`crate::cluster::live::start_daemonsets`]).
    pub daemonsets: Store<DaemonSet>,
    /// The pods and ControllerRevisions of `OnDelete` DaemonSets and the validator pods
    /// (watches started on first need, [`PodWatches`]).
    pub pods: Arc<PodWatches>,
    /// The operator namespace's ConfigMaps (metadata) and the keys of the referenced ones.
    pub config_maps: Arc<ConfigMapCache>,
    /// Every NVIDIADriver (the store the NVIDIADriver controller is built on); `None` when the
    /// cluster does not serve the NVIDIADriver CRD.
    pub drivers: Option<Store<NVIDIADriver>>,
    /// The objects kiln applied, found by [`kiln_core::plan::STATE_LABEL`] ([`LiveCache`]).
    pub live: Arc<LiveCache>,
    /// What the stores' events wake ([`Wake`]).
    pub wake: Wake,
}

impl View {
    /// Every ClusterPolicy as the store holds it.
    pub fn policies(&self) -> Vec<Arc<DynamicObject>> {
        self.policies.state()
    }

    /// Every node, waiting at most [`crate::cluster::watch::LIVE_READY_LIMIT`] for the store's
    /// first list (only the first call can wait: the store stays listed).
    pub async fn nodes(&self) -> Vec<Arc<SlimNode>> {
        let _ = tokio::time::timeout(
            crate::cluster::watch::LIVE_READY_LIMIT,
            self.nodes.wait_until_ready(),
        )
        .await;
        self.nodes.state()
    }

    /// Every NVIDIADriver, waiting at most [`crate::cluster::watch::LIVE_READY_LIMIT`] for the
    /// store's first list; `None` when the NVIDIADriver CRD is not served.
    pub async fn drivers(&self) -> Option<Vec<Arc<NVIDIADriver>>> {
        let store = self.drivers.as_ref()?;
        let _ = tokio::time::timeout(
            crate::cluster::watch::LIVE_READY_LIMIT,
            store.wait_until_ready(),
        )
        .await;
        Some(store.state())
    }

    /// The DaemonSet `namespace/name` as the store holds it (status included).
    pub fn daemonset(&self, namespace: &str, name: &str) -> Option<Arc<DaemonSet>> {
        self.daemonsets.get(&ObjectRef::new(name).within(namespace))
    }
}

/// The active ClusterPolicy among `all` ([`kiln_core::singleton::active_policy`]: the oldest).
pub fn active_of(all: &[Arc<DynamicObject>]) -> Option<&Arc<DynamicObject>> {
    let active = kiln_core::singleton::active_policy(all.iter().map(|p| &p.metadata))?;
    all.iter()
        .find(|p| p.metadata.name.as_deref() == Some(active))
}
