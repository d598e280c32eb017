//! The operator's view of the cluster ([`kiln_operator::cluster::view::View`]) over stores a
//! test fills from the in-memory API server's objects (`mock_api.rs`, which serves no watch),
//! as the operator's watches would fill them: the same stores production reads, fed through
//! kube's `reflector::store::Writer` (and the node store's
//! [`kiln_operator::store::NamedWriter`]).

use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kiln_core::spec::nvidiadriver::NVIDIADriver;
use kiln_operator::cluster::view::View;
use kiln_operator::facts::ConfigMapCache;
use kiln_operator::live::{LiveCache, Wake};
use kiln_operator::node::SlimNode;
use kiln_operator::readiness::PodWatches;
use kiln_operator::store::NamedWriter;
use kube::api::DynamicObject;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde_json::Value;

use super::mock_api::Server;

/// The writers behind a [`View`]'s ClusterPolicy, node, DaemonSet and NVIDIADriver stores.
/// Its ConfigMap store stays unlisted (a reconcile then reads each referenced ConfigMap, as
/// before the watch's first list); a test that wants the ConfigMap cache sets
/// [`View::config_maps`] itself.
pub struct Feed {
    server: Arc<Mutex<Server>>,
    pub policies: Writer<DynamicObject>,
    pub nodes: NamedWriter<SlimNode>,
    pub daemonsets: Writer<DaemonSet>,
    pub drivers: Writer<NVIDIADriver>,
}

/// `objects` as a first list into `w` (the store is then ready).
pub fn list<K>(w: &mut Writer<K>, objects: impl IntoIterator<Item = K>)
where
    K: kube::Resource + Clone,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    w.apply_watcher_event(&watcher::Event::Init);
    for o in objects {
        w.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    w.apply_watcher_event(&watcher::Event::InitDone);
}

/// The server's objects whose path starts with `prefix`, typed.
pub fn objects<K: serde::de::DeserializeOwned>(
    server: &Arc<Mutex<Server>>,
    prefix: &str,
) -> Vec<K> {
    let values: Vec<Value> = {
        let s = server.lock().unwrap();
        s.objects
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect()
    };
    values
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect()
}

const POLICIES: &str = "/apis/nvidia.com/v1/clusterpolicies/";
const NODES: &str = "/api/v1/nodes/";
const DRIVERS: &str = "/apis/nvidia.com/v1alpha1/nvidiadrivers/";

impl Feed {
    /// A view over `server` (through `client`) whose ClusterPolicies, nodes and NVIDIADrivers
    /// are the server's now, with no DaemonSet, `live` as the labelled objects and `wake` as
    /// what the stores wake.
    pub fn view(
        server: &Arc<Mutex<Server>>,
        client: &kube::Client,
        live: LiveCache,
        wake: Wake,
    ) -> (Feed, View) {
        let mut feed = Feed {
            server: server.clone(),
            policies: Writer::new(kiln_operator::watch::policy_resource()),
            nodes: NamedWriter::default(),
            daemonsets: Writer::default(),
            drivers: Writer::default(),
        };
        feed.sync();
        list(&mut feed.daemonsets, []);
        let config_maps = Writer::<PartialObjectMeta<ConfigMap>>::default();
        let view = View {
            policies: feed.policies.as_reader(),
            nodes: feed.nodes.as_reader(),
            daemonsets: feed.daemonsets.as_reader(),
            pods: Arc::new(PodWatches::new(client.clone(), wake.clone())),
            config_maps: Arc::new(ConfigMapCache::from_store(config_maps.as_reader())),
            drivers: Some(feed.drivers.as_reader()),
            live: Arc::new(live),
            wake,
        };
        (feed, view)
    }

    /// List the ClusterPolicies, nodes and NVIDIADrivers the server holds now into their
    /// stores (what their watches show after the server's changes).
    pub fn sync(&mut self) {
        list(&mut self.policies, objects(&self.server, POLICIES));
        self.nodes.apply(&watcher::Event::Init);
        for n in objects::<SlimNode>(&self.server, NODES) {
            self.nodes.apply(&watcher::Event::InitApply(Arc::new(n)));
        }
        self.nodes.apply(&watcher::Event::InitDone);
        list(&mut self.drivers, objects(&self.server, DRIVERS));
    }
}
