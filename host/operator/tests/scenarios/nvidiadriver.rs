//! NVIDIADriver (`nvidia.com/v1alpha1`): the committed CRD, and the controller against an
//! in-memory API server (`support/mock_api.rs`, shared with `policy.rs`),
//! asserting on the requests it recorded:
//! - two pools with different versions get one DaemonSet each, named as upstream, selecting
//!   only their nodes, with their own image, owned by their CR;
//! - overlapping selectors are refused: both CRs get an Error condition naming the other, and
//!   nothing is applied;
//! - with `driver.useNvidiaDriverCRD` a CR is reconciled, without it it is `disabled`;
//! - with the operator's caches wired, a reconcile reads no node, ClusterPolicy or
//!   NVIDIADriver from the API server;
//! - woken again with nothing changed (a DaemonSet status event), a reconcile sends no request
//!   (not the `secretEnv` Secret's GET either) and calls no plugin, and a render drops the
//!   plugins it loaded; a drifted DaemonSet alone is applied again; a pool's stale DaemonSet
//!   is found in the cache and deleted without a LIST;
//! - fields another manager added to a CR's DaemonSet (seen in the DaemonSet cache) are
//!   removed by one JSON patch with a `DriftRemoved` Event naming them, then nothing is sent;
//! - a handed-off ClusterPolicy judges the CRs' readiness from their store, with no LIST;
//! - a referenced ConfigMap (`repoConfig`) is read once, again only when its metadata watch
//!   shows a new `resourceVersion`, and not at all when the watch shows it gone;
//! - the ClusterPolicy, once it hands the driver off, deletes its driver DaemonSet with
//!   `propagationPolicy: Orphan` (pods are kept) and reports the CRs' readiness.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::http::Method;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kiln_core::plan::STATE_LABEL;
use kiln_core::spec::nvidiadriver::{NVIDIADRIVER_LABEL, NVIDIADriver};
use kiln_operator::facts::ConfigMapCache;
use kiln_operator::live::{LiveCache, Meta, Wake};
use kiln_operator::metrics::Metrics;
use kiln_operator::nvidiadriver::{DriverContext, reconcile};
use kiln_operator::{Config, Context};
use kube::api::ApiResource;
use kube::core::{GroupVersionKind, PartialObjectMeta};
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::support::fixtures;
use crate::support::mock_api::{Call, Server, calls, client};
use crate::support::view::Feed;

const NS: &str = "gpu-operator";
const OS_ID: &str = "feature.node.kubernetes.io/system-os_release.ID";
const OS_VERSION: &str = "feature.node.kubernetes.io/system-os_release.VERSION_ID";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const COMMITTED: &str = "deploy/crds/nvidiadrivers.nvidia.com.yaml";

/// Regenerate with `KILN_UPDATE_CRD=1 cargo test -p kiln-operator --test scenarios nvidiadriver::` (or
/// `kiln crdgen --nvidia-driver > deploy/crds/nvidiadrivers.nvidia.com.yaml`; the chart's
/// `crds/` holds the same file).
#[test]
fn committed_crd_matches_the_types() {
    let generated = kiln_operator::crd::nvidia_driver_crd_yaml();
    let chart = repo().join("deploy/helm/kiln/crds/nvidiadrivers.nvidia.com.yaml");
    if std::env::var_os("KILN_UPDATE_CRD").is_some() {
        std::fs::write(repo().join(COMMITTED), &generated).unwrap();
        std::fs::write(&chart, &generated).unwrap();
    }
    for path in [repo().join(COMMITTED), chart] {
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "{} drifted from the Rust types; regenerate with `kiln crdgen --nvidia-driver`",
            path.display()
        );
    }
}

#[test]
fn crd_keeps_upstreams_names_enums_and_defaults() {
    let crd = serde_json::to_value(kiln_operator::crd::nvidia_driver_crd()).unwrap();
    assert_eq!(crd["metadata"]["name"], "nvidiadrivers.nvidia.com");
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(crd["spec"]["names"]["kind"], "NVIDIADriver");
    assert_eq!(
        crd["spec"]["names"]["shortNames"],
        json!(["nvd", "nvdriver", "nvdrivers"])
    );
    let v = &crd["spec"]["versions"][0];
    assert_eq!(v["name"], "v1alpha1");
    assert!(v["subresources"]["status"].is_object());
    let spec = &v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(
        spec["driverType"]["enum"],
        json!(["gpu", "vgpu", "vgpu-host-manager"])
    );
    assert_eq!(spec["driverType"]["default"], "gpu");
    assert_eq!(
        spec["driverType"]["x-kubernetes-validations"][0]["rule"],
        "self == oldSelf"
    );
    assert_eq!(
        spec["kernelModuleType"]["enum"],
        json!(["auto", "open", "proprietary"])
    );
    assert_eq!(spec["kernelModuleType"]["default"], "auto");
    assert_eq!(spec["image"]["default"], "nvcr.io/nvidia/driver");
    assert_eq!(
        spec["startupProbe"]["properties"]["periodSeconds"]["minimum"].as_f64(),
        Some(1.0)
    );
    for field in [
        "repoConfig",
        "certConfig",
        "licensingConfig",
        "kernelModuleConfig",
        "virtualTopologyConfig",
        "nodeSelector",
        "nodeAffinity",
        "tolerations",
        "gds",
        "gdrcopy",
        "manager",
        "secretEnv",
    ] {
        assert!(spec[field].is_object(), "spec.{field}");
    }
    let status = &v["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
    assert_eq!(
        status["state"]["enum"],
        json!(["ignored", "ready", "notReady", "disabled"])
    );
}

/// The ClusterPolicy `cluster-policy` with `spec`.
fn policy(spec: Value) -> Value {
    fixtures::policy("cluster-policy", "2026-01-01T00:00:00Z", spec)
}

fn driver(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "generation": 1},
        "spec": spec})
}

/// A server holding `objects` (ClusterPolicies, NVIDIADrivers) and GPU nodes named
/// `<pool>-<i>` labelled `pool=<pool>` with NFD's Ubuntu 22.04 labels.
fn server_with(objects: &[Value], pools: &[(&str, usize)]) -> Arc<Mutex<Server>> {
    let mut s = Server::default();
    for o in objects {
        s.insert(o.clone());
    }
    for (pool, n) in pools {
        for i in 0..*n {
            s.insert(
                fixtures::node(&format!("{pool}-{i}"))
                    .label("nvidia.com/gpu.present", "true")
                    .label("pool", pool)
                    .label("nvidia.com/gpu.deploy.driver", "true")
                    .label(OS_ID, "ubuntu")
                    .label(OS_VERSION, "22.04")
                    .json(),
            );
        }
    }
    Arc::new(Mutex::new(s))
}

fn driver_context(server: &Arc<Mutex<Server>>) -> Arc<DriverContext> {
    Arc::new(fed_context(server, LiveCache::from_stores(vec![])).0)
}

/// A context whose view holds the server's nodes, ClusterPolicies and NVIDIADrivers now (as
/// the operator's watches would), no DaemonSet, and `live` as the labelled objects.
fn fed_context(server: &Arc<Mutex<Server>>, live: LiveCache) -> (DriverContext, Feed) {
    let host = kiln_plugin_host::PluginHost::new(
        kiln_plugin_host::HostConfig::default(),
        kiln_bundled_plugins::BUNDLED,
    )
    .unwrap();
    let mock = client(server.clone());
    let (feed, view) = Feed::view(server, &mock, live, Wake::default());
    let ctx = DriverContext::new(
        mock,
        kiln_render::Renderer::new(Arc::new(host)),
        NS,
        "v1.36.0",
        Vec::new(),
        Arc::new(view),
    );
    (ctx, feed)
}

/// Feed `w` a first list of `objects`, as a watch's initial list (the store is then ready).
fn listed<K>(w: &mut Writer<K>, objects: impl IntoIterator<Item = K>)
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

/// A context reading nodes, ClusterPolicies and NVIDIADrivers from the view's stores, filled
/// from the server's objects now (as `run` wires the operator's view).
fn cached_context(server: &Arc<Mutex<Server>>) -> Arc<DriverContext> {
    driver_context(server)
}

fn typed_driver(server: &Arc<Mutex<Server>>, name: &str) -> Arc<NVIDIADriver> {
    let s = server.lock().unwrap();
    let v = &s.objects[&format!("/apis/nvidia.com/v1alpha1/nvidiadrivers/{name}")];
    Arc::new(serde_json::from_value(v.clone()).unwrap())
}

/// The paths of the recorded `method` requests, in order.
fn paths(server: &Arc<Mutex<Server>>, method: &Method) -> Vec<String> {
    calls(server, method).into_iter().map(|c| c.path).collect()
}

fn ds_applies(server: &Arc<Mutex<Server>>) -> Vec<Call> {
    calls(server, &Method::PATCH)
        .into_iter()
        .filter(|c| c.path.contains("/daemonsets/"))
        .collect()
}

fn status_of(server: &Arc<Mutex<Server>>, name: &str) -> Value {
    let s = server.lock().unwrap();
    s.objects[&format!("/apis/nvidia.com/v1alpha1/nvidiadrivers/{name}")]["status"].clone()
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap()
}

fn handed_off() -> Value {
    policy(json!({"driver": {"useNvidiaDriverCRD": true}}))
}

#[tokio::test]
async fn from_caches_a_reconcile_reads_no_node_policy_or_driver() {
    let a = driver("pool-a", json!({"nodeSelector": {"pool": "a"}}));
    let b = driver("pool-b", json!({"nodeSelector": {"pool": "b"}}));
    let server = server_with(&[handed_off(), a, b], &[("a", 2), ("b", 3)]);
    let ctx = cached_context(&server);
    for name in ["pool-a", "pool-b"] {
        reconcile(typed_driver(&server, name), ctx.clone())
            .await
            .unwrap();
    }
    let reads: Vec<String> = paths(&server, &Method::GET)
        .into_iter()
        .filter(|p| {
            p.starts_with("/api/v1/nodes")
                || p.contains("/clusterpolicies")
                || p.contains("/nvidiadrivers")
        })
        .collect();
    assert_eq!(reads, Vec::<String>::new(), "read from the caches");
    let mut pools: Vec<(String, String)> = ds_applies(&server)
        .iter()
        .map(|a| {
            (
                a.body["metadata"]["labels"][NVIDIADRIVER_LABEL]
                    .as_str()
                    .unwrap()
                    .to_string(),
                a.body["spec"]["template"]["spec"]["nodeSelector"]["pool"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    pools.sort();
    assert_eq!(
        pools,
        [
            ("pool-a".to_string(), "a".to_string()),
            ("pool-b".to_string(), "b".to_string())
        ],
        "each CR's DaemonSet selects its pool (a label the node store keeps)"
    );
    // The shared objects are owned by the policy as the store holds it.
    let sa = calls(&server, &Method::PATCH)
        .into_iter()
        .find(|c| c.path.ends_with("/configmaps/nvidia-driver-startup-probe"))
        .expect("startup probe applied");
    assert_eq!(
        sa.body["metadata"]["ownerReferences"][0]["uid"],
        "uid-cluster-policy"
    );
}

/// Watch caches a test feeds by hand: the CRs' DaemonSets and the labelled shared objects of
/// the driver state, one writer per kind (as `run` and the labelled-object watches fill them).
struct Fed {
    feed: Feed,
    /// `(apiVersion, kind)` → its store's writer.
    shared: Vec<((String, &'static str), Writer<Meta>)>,
}

/// The kinds of the driver state's shared objects (its assets, OpenShift's SCC aside).
const SHARED_KINDS: [(&str, &str, &str); 6] = [
    ("", "v1", "ServiceAccount"),
    ("", "v1", "ConfigMap"),
    ("rbac.authorization.k8s.io", "v1", "Role"),
    ("rbac.authorization.k8s.io", "v1", "RoleBinding"),
    ("rbac.authorization.k8s.io", "v1", "ClusterRole"),
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
];

impl Fed {
    /// Empty, listed stores wired into a context that reads everything else from the view too.
    fn wired(server: &Arc<Mutex<Server>>) -> (Self, Arc<DriverContext>) {
        let mut shared = Vec::new();
        let mut stores = Vec::new();
        for (group, version, kind) in SHARED_KINDS {
            let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
            let mut w = Writer::<Meta>::new(ar.clone());
            listed(&mut w, []);
            stores.push((ar.clone(), w.as_reader()));
            shared.push(((ar.api_version, kind), w));
        }
        let (ctx, feed) = fed_context(server, LiveCache::from_stores(stores));
        (Fed { feed, shared }, Arc::new(ctx))
    }

    /// What the watches would report now: every DaemonSet and shared object the server holds.
    fn sync(&mut self, server: &Arc<Mutex<Server>>) {
        self.feed.sync();
        let objects: Vec<Value> = server.lock().unwrap().objects.values().cloned().collect();
        for o in objects {
            let api_version = o["apiVersion"].as_str().unwrap_or_default().to_string();
            let kind = o["kind"].as_str().unwrap_or_default();
            if kind == "DaemonSet" {
                let ds: DaemonSet = serde_json::from_value(o).unwrap();
                self.feed
                    .daemonsets
                    .apply_watcher_event(&watcher::Event::Apply(ds));
            } else if let Some((_, w)) = self
                .shared
                .iter_mut()
                .find(|((av, k), _)| *av == api_version && *k == kind)
            {
                let meta: Meta = serde_json::from_value(json!({
                    "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                    "metadata": o["metadata"]}))
                .unwrap();
                w.apply_watcher_event(&watcher::Event::Apply(meta));
            }
        }
    }
}

fn clear_calls(server: &Arc<Mutex<Server>>) {
    server.lock().unwrap().calls.clear();
}

fn all_calls(server: &Arc<Mutex<Server>>) -> Vec<String> {
    let s = server.lock().unwrap();
    s.calls
        .iter()
        .map(|c| format!("{} {}", c.method, c.path))
        .collect()
}

#[tokio::test]
async fn an_unchanged_cr_woken_again_sends_nothing_and_calls_no_plugin() {
    let server = server_with(
        &[
            handed_off(),
            driver(
                "pool-a",
                json!({"nodeSelector": {"pool": "a"}, "secretEnv": "driver-env"}),
            ),
        ],
        &[("a", 2)],
    );
    let secret = format!("/api/v1/namespaces/{NS}/secrets/driver-env");
    server.lock().unwrap().objects.insert(
        secret.clone(),
        json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "driver-env", "namespace": NS}}),
    );
    let (mut fed, ctx) = Fed::wired(&server);
    reconcile(typed_driver(&server, "pool-a"), ctx.clone())
        .await
        .unwrap();
    assert!(
        paths(&server, &Method::GET).contains(&secret),
        "the render read the secretEnv Secret"
    );
    let first = calls(&server, &Method::PATCH);
    let applied: Vec<&str> = first
        .iter()
        .filter(|c| !c.path.ends_with("/status"))
        .map(|c| c.body["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        applied,
        [
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet"
        ],
        "the first reconcile applies the state"
    );
    // The render dropped the plugins it loaded (they reload from the disk cache next time).
    let host = ctx.renderer.host();
    assert!(host.has_disk_cache());
    assert!(host.calls() > 0, "the first reconcile rendered");
    assert_eq!(host.loaded_plugins(), Vec::<String>::new());
    // The watches catch up; the CR comes back with its status (as the controller's store
    // hands it over).
    fed.sync(&server);
    clear_calls(&server);
    let rendered = host.calls();
    // A DaemonSet status event, say: the same inputs, the same live objects.
    reconcile(typed_driver(&server, "pool-a"), ctx.clone())
        .await
        .unwrap();
    assert_eq!(
        all_calls(&server),
        Vec::<String>::new(),
        "no request (not even the Secret's GET)"
    );
    assert_eq!(
        host.calls(),
        rendered,
        "the render was reused: no plugin called"
    );
    // Someone edits the DaemonSet (its generation moves): it is applied again, alone.
    {
        let mut s = server.lock().unwrap();
        let ds = s
            .objects
            .values_mut()
            .find(|o| o["kind"] == "DaemonSet")
            .unwrap();
        ds["metadata"]["generation"] = json!(2);
    }
    fed.sync(&server);
    reconcile(typed_driver(&server, "pool-a"), ctx.clone())
        .await
        .unwrap();
    let again = paths(&server, &Method::PATCH);
    assert_eq!(
        again,
        [format!(
            "/apis/apps/v1/namespaces/{NS}/daemonsets/{}",
            ds_applies_names(&first)[0]
        )],
        "only the drifted DaemonSet"
    );
    // The pool goes away (its nodes relabelled): its DaemonSet, found in the cache, is deleted.
    clear_calls(&server);
    let pool_ds = ds_applies_names(&first)[0].clone();
    {
        let mut s = server.lock().unwrap();
        for o in s.objects.values_mut().filter(|o| o["kind"] == "Node") {
            o["metadata"]["labels"]["pool"] = json!("elsewhere");
        }
    }
    fed.feed.sync();
    // As the node watch's pool signal does.
    ctx.inputs_changed();
    reconcile(typed_driver(&server, "pool-a"), ctx)
        .await
        .unwrap();
    let deletes = paths(&server, &Method::DELETE);
    assert_eq!(
        deletes,
        [format!(
            "/apis/apps/v1/namespaces/{NS}/daemonsets/{pool_ds}"
        )],
        "the stale DaemonSet, without a LIST"
    );
    // The pools changed, so the inputs are read again: the Secret's GET, and nothing listed.
    assert_eq!(
        paths(&server, &Method::GET),
        [secret],
        "{:?}",
        all_calls(&server)
    );
}

/// The render is reused on its CR's UID, generation and the input change count: an edit of
/// the CR's spec (a new generation) renders again though no other input changed, and only the
/// DaemonSet the edit changes is applied.
#[tokio::test]
async fn an_edited_cr_renders_again_without_an_input_change() {
    let server = server_with(
        &[
            handed_off(),
            driver("pool-a", json!({"nodeSelector": {"pool": "a"}})),
        ],
        &[("a", 2)],
    );
    let (mut fed, ctx) = Fed::wired(&server);
    reconcile(typed_driver(&server, "pool-a"), ctx.clone())
        .await
        .unwrap();
    let first = ds_applies(&server);
    assert_eq!(first.len(), 1, "one pool, one DaemonSet");
    fed.sync(&server);
    clear_calls(&server);
    let host = ctx.renderer.host();
    let rendered = host.calls();
    // The CR's spec edited: the API server bumps its generation.
    {
        let mut s = server.lock().unwrap();
        let cr = s
            .objects
            .values_mut()
            .find(|o| o["kind"] == "NVIDIADriver")
            .unwrap();
        cr["spec"]["env"] = json!([{"name": "KILN_TEST_EDIT", "value": "1"}]);
        cr["metadata"]["generation"] = json!(2);
    }
    reconcile(typed_driver(&server, "pool-a"), ctx.clone())
        .await
        .unwrap();
    assert!(host.calls() > rendered, "the edited CR was rendered again");
    let again = ds_applies(&server);
    assert_eq!(
        ds_applies_names(&again),
        ds_applies_names(&first),
        "its DaemonSet, applied again"
    );
    let env = &again[0].body["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "KILN_TEST_EDIT" && e["value"] == "1"),
        "with the edit: {env}"
    );
    let others: Vec<String> = paths(&server, &Method::PATCH)
        .into_iter()
        .filter(|p| !p.ends_with("/status") && !p.contains("/daemonsets/"))
        .collect();
    assert_eq!(
        others,
        Vec::<String>::new(),
        "the shared objects are current"
    );
}

/// The managed-fields entries of a drifted object: kiln's apply, which owns container `main`
/// (the fake records no managed fields of its own), and `intruder`'s, which owns `fields_v1`.
fn kiln_and_intruder(main: &str, fields_v1: Value) -> Value {
    json!([
        {"manager": "kiln", "operation": "Apply", "apiVersion": "apps/v1",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:template": {"f:spec": {
                "f:containers": {format!("k:{{\"name\":\"{main}\"}}"): {
                    ".": {}, "f:name": {}}}}}}}},
        {"manager": "intruder", "operation": "Apply", "apiVersion": "apps/v1",
            "fieldsType": "FieldsV1", "fieldsV1": fields_v1},
    ])
}

/// Additive drift on an NVIDIADriver's DaemonSet (issue 40), as for the ClusterPolicy's
/// states: another manager added a privileged sidecar and an env var without moving the
/// generation, so only the shared DaemonSet cache shows it (its event wakes the CR). One
/// reconcile removes both with one JSON patch guarded by the resourceVersion, applies nothing
/// and reads nothing, and a `DriftRemoved` Event names them and who set them; the next
/// reconcile sends nothing.
#[tokio::test]
async fn fields_another_manager_added_to_a_driver_daemonset_are_removed_with_an_event() {
    let server = server_with(
        &[
            handed_off(),
            driver("pool-a", json!({"nodeSelector": {"pool": "a"}})),
        ],
        &[("a", 2)],
    );
    let (mut fed, ctx) = Fed::wired(&server);
    reconcile(typed_driver(&server, "pool-a"), ctx.clone())
        .await
        .unwrap();
    let ds_name = ds_applies_names(&ds_applies(&server))[0].clone();
    let ds_path = format!("/apis/apps/v1/namespaces/{NS}/daemonsets/{ds_name}");
    fed.sync(&server);
    clear_calls(&server);
    reconcile(typed_driver(&server, "pool-a"), ctx.clone())
        .await
        .unwrap();
    assert_eq!(
        all_calls(&server),
        Vec::<String>::new(),
        "a clean reconcile"
    );

    let (rendered, main, sidecar, env_index) = {
        let mut s = server.lock().unwrap();
        let ds = s.objects.get_mut(&ds_path).unwrap();
        let rendered = ds["spec"].clone();
        ds["metadata"]["resourceVersion"] = json!("7");
        let containers = ds["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap();
        let main = containers[0]["name"].as_str().unwrap().to_string();
        let env = containers[0]["env"]
            .as_array_mut()
            .expect("the driver container has env");
        let env_index = env.len();
        env.push(json!({"name": "INJECTED", "value": "1"}));
        let sidecar = containers.len();
        containers.push(json!({"name": "sidecar", "image": "busybox",
            "securityContext": {"privileged": true}}));
        ds["metadata"]["managedFields"] = kiln_and_intruder(
            &main,
            json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
                format!("k:{{\"name\":\"{main}\"}}"): {".": {}, "f:name": {},
                    "f:env": {"k:{\"name\":\"INJECTED\"}": {".": {}, "f:name": {}, "f:value": {}}}},
                "k:{\"name\":\"sidecar\"}": {".": {}, "f:name": {}, "f:image": {},
                    "f:securityContext": {"f:privileged": {}}}}}}}}),
        );
        (rendered, main, sidecar, env_index)
    };
    // The DaemonSet watch's event: the cache shows the drift.
    fed.sync(&server);
    clear_calls(&server);
    reconcile(typed_driver(&server, "pool-a"), ctx.clone())
        .await
        .unwrap();

    assert!(calls(&server, &Method::GET).is_empty(), "no read");
    let patches: Vec<Call> = calls(&server, &Method::PATCH)
        .into_iter()
        .filter(|c| !c.path.ends_with("/status"))
        .collect();
    assert_eq!(
        patches
            .iter()
            .map(|c| (c.path.as_str(), &c.body))
            .collect::<Vec<_>>(),
        [(
            ds_path.as_str(),
            &json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "remove", "path": format!("/spec/template/spec/containers/{sidecar}")},
                {"op": "remove",
                    "path": format!("/spec/template/spec/containers/0/env/{env_index}")},
            ])
        )],
        "one JSON patch, no apply: the DaemonSet's generation did not move"
    );
    assert_eq!(
        server.lock().unwrap().objects[&ds_path]["spec"],
        rendered,
        "exactly kiln's render"
    );
    let events: Vec<Value> = calls(&server, &Method::POST)
        .into_iter()
        .map(|c| c.body)
        .filter(|b| b["reason"] == "DriftRemoved")
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "Warning");
    assert_eq!(events[0]["regarding"]["kind"], "DaemonSet");
    assert_eq!(events[0]["regarding"]["name"], ds_name.as_str());
    assert_eq!(events[0]["regarding"]["namespace"], NS);
    assert_eq!(
        events[0]["note"],
        format!(
            "removed what kiln does not render, set by intruder: \
             spec.template.spec.containers[name=sidecar], \
             spec.template.spec.containers[name={main}].env[name=INJECTED]"
        )
    );

    // The next reconcile finds nothing to remove (the fake keeps the intruder's stale managed
    // fields, which now name nothing the DaemonSet holds) and sends nothing.
    fed.sync(&server);
    clear_calls(&server);
    reconcile(typed_driver(&server, "pool-a"), ctx)
        .await
        .unwrap();
    assert_eq!(all_calls(&server), Vec::<String>::new());
}

/// The metadata store of the ConfigMap cache, fed by hand (as its watch would).
fn config_map_meta(name: &str, rv: &str) -> PartialObjectMeta<ConfigMap> {
    serde_json::from_value(json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": name, "namespace": NS, "resourceVersion": rv}}))
    .unwrap()
}

fn put_repo_config(server: &Arc<Mutex<Server>>, rv: &str, files: &[&str]) {
    let data: serde_json::Map<String, Value> = files
        .iter()
        .map(|f| {
            (
                (*f).to_string(),
                json!("deb http://mirror.example/ubuntu jammy main"),
            )
        })
        .collect();
    server.lock().unwrap().objects.insert(
        format!("/api/v1/namespaces/{NS}/configmaps/repos"),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "repos", "namespace": NS, "resourceVersion": rv},
            "data": data}),
    );
}

/// The `subPath`s the last applied driver DaemonSet mounts from the `repos` ConfigMap.
fn repo_mounts(server: &Arc<Mutex<Server>>) -> Vec<String> {
    let applies = ds_applies(server);
    let ds = &applies.last().expect("a DaemonSet applied").body;
    let mut out: Vec<String> = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["volumeMounts"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["name"] == "repos")
        .map(|m| m["subPath"].as_str().unwrap().to_string())
        .collect();
    out.sort();
    out
}

fn config_map_gets(server: &Arc<Mutex<Server>>) -> usize {
    calls(server, &Method::GET)
        .iter()
        .filter(|c| c.path.contains("/configmaps/"))
        .count()
}

#[tokio::test]
async fn a_referenced_config_map_is_read_again_only_when_its_watch_shows_it_changed() {
    let server = server_with(
        &[
            handed_off(),
            driver(
                "pool-a",
                json!({"nodeSelector": {"pool": "a"}, "repoConfig": {"name": "repos"}}),
            ),
        ],
        &[("a", 2)],
    );
    put_repo_config(&server, "7", &["a.list", "b.list"]);
    let mut watched = Writer::<PartialObjectMeta<ConfigMap>>::default();
    listed(&mut watched, [config_map_meta("repos", "7")]);
    let cache = Arc::new(ConfigMapCache::from_store(watched.as_reader()));
    let host = kiln_plugin_host::PluginHost::new(
        kiln_plugin_host::HostConfig::default(),
        kiln_bundled_plugins::BUNDLED,
    )
    .unwrap();
    let mock = client(server.clone());
    let (_feed, mut view) = Feed::view(
        &server,
        &mock,
        LiveCache::from_stores(vec![]),
        Wake::default(),
    );
    view.config_maps = cache.clone();
    let ctx = Arc::new(DriverContext::new(
        mock,
        kiln_render::Renderer::new(Arc::new(host)),
        NS,
        "v1.36.0",
        Vec::new(),
        Arc::new(view),
    ));
    assert!(!cache.wanted("repos"));
    reconcile(typed_driver(&server, "pool-a"), ctx.clone())
        .await
        .unwrap();
    assert_eq!(config_map_gets(&server), 1, "read once");
    assert!(
        cache.wanted("repos") && !cache.wanted("other"),
        "its changes now wake the reconcilers"
    );
    assert_eq!(
        repo_mounts(&server),
        ["a.list", "b.list"],
        "one mount per key"
    );
    clear_calls(&server);
    reconcile(typed_driver(&server, "pool-a"), ctx.clone())
        .await
        .unwrap();
    assert_eq!(config_map_gets(&server), 0, "unchanged: not read again");
    // A key is added: the watch shows a new resourceVersion, so it is read again.
    put_repo_config(&server, "8", &["a.list", "b.list", "c.list"]);
    watched.apply_watcher_event(&watcher::Event::Apply(config_map_meta("repos", "8")));
    // As the watch's change callback does (the ConfigMap is wanted).
    ctx.inputs_changed();
    reconcile(typed_driver(&server, "pool-a"), ctx.clone())
        .await
        .unwrap();
    assert_eq!(config_map_gets(&server), 1, "changed: read again");
    assert_eq!(repo_mounts(&server), ["a.list", "b.list", "c.list"]);
    // Deleted: the watch no longer lists it, so nothing is read and the CR fails naming it.
    watched.apply_watcher_event(&watcher::Event::Delete(config_map_meta("repos", "8")));
    ctx.inputs_changed();
    clear_calls(&server);
    reconcile(typed_driver(&server, "pool-a"), ctx.clone())
        .await
        .unwrap();
    assert_eq!(config_map_gets(&server), 0, "gone: not read");
    let status = status_of(&server, "pool-a");
    let error = condition(&status, "Error");
    assert_eq!(error["status"], "True", "{status}");
    assert!(
        error["message"].as_str().unwrap().contains("repos"),
        "{status}"
    );
}

fn ds_applies_names(patches: &[Call]) -> Vec<String> {
    patches
        .iter()
        .filter(|c| c.path.contains("/daemonsets/"))
        .map(|c| c.path.rsplit('/').next().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn two_pools_get_their_own_daemonset_and_version() {
    let a = driver(
        "pool-a",
        json!({"repository": "nvcr.io/nvidia", "image": "driver",
        "version": "570.172.08", "nodeSelector": {"pool": "a"}}),
    );
    let b = driver(
        "pool-b",
        json!({"repository": "nvcr.io/nvidia", "image": "driver",
        "version": "580.65.06", "nodeSelector": {"pool": "b"}, "kernelModuleType": "open"}),
    );
    let server = server_with(&[handed_off(), a, b], &[("a", 2), ("b", 3)]);
    let ctx = driver_context(&server);
    for name in ["pool-a", "pool-b"] {
        reconcile(typed_driver(&server, name), ctx.clone())
            .await
            .unwrap();
    }
    let applies = ds_applies(&server);
    let mut by_cr: BTreeMap<String, &Value> = BTreeMap::new();
    for a in &applies {
        by_cr.insert(
            a.body["metadata"]["labels"][NVIDIADRIVER_LABEL]
                .as_str()
                .unwrap()
                .to_string(),
            &a.body,
        );
    }
    assert_eq!(by_cr.len(), 2, "{applies:?}");
    for (cr, version, pool) in [("pool-a", "570.172.08", "a"), ("pool-b", "580.65.06", "b")] {
        let ds = by_cr[cr];
        let name = ds["metadata"]["name"].as_str().unwrap();
        assert!(
            name.starts_with("nvidia-gpu-driver-ubuntu22.04-") && name.len() <= 63,
            "{name}"
        );
        assert_eq!(ds["spec"]["selector"]["matchLabels"]["app"], name);
        assert_eq!(ds["metadata"]["ownerReferences"][0]["kind"], "NVIDIADriver");
        assert_eq!(ds["metadata"]["ownerReferences"][0]["name"], cr);
        assert!(
            ds["metadata"]["labels"].get(STATE_LABEL).is_none(),
            "the policy's plan never sees a CR's DaemonSet"
        );
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(pod["nodeSelector"]["pool"], pool);
        assert_eq!(pod["nodeSelector"][OS_VERSION], "22.04");
        let ctr = pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "nvidia-driver-ctr")
            .unwrap();
        assert_eq!(
            ctr["image"],
            format!("nvcr.io/nvidia/driver:{version}-ubuntu22.04")
        );
    }
    let b_env = &by_cr["pool-b"]["spec"]["template"]["spec"]["containers"];
    assert!(
        b_env
            .to_string()
            .contains("\"KERNEL_MODULE_TYPE\",\"value\":\"open\""),
        "pool-b's kernel module type: {b_env}"
    );
    assert_ne!(
        by_cr["pool-a"]["metadata"]["name"],
        by_cr["pool-b"]["metadata"]["name"]
    );
    // Each pool runs as its own service account, named as upstream names it and owned by the
    // CR; the shared startup-probe ConfigMap goes in as the policy's driver state (kept while
    // it hands off).
    for cr in ["pool-a", "pool-b"] {
        let account = format!("nvidia-gpu-driver-{cr}-ubuntu22.04");
        let sa = calls(&server, &Method::PATCH)
            .into_iter()
            .find(|c| c.path.ends_with(&format!("/serviceaccounts/{account}")))
            .expect("service account applied");
        assert_eq!(sa.body["metadata"]["labels"][STATE_LABEL], "driver");
        assert_eq!(sa.body["metadata"]["labels"][NVIDIADRIVER_LABEL], cr);
        assert_eq!(
            sa.body["metadata"]["ownerReferences"][0]["kind"],
            "NVIDIADriver"
        );
        assert_eq!(
            by_cr[cr]["spec"]["template"]["spec"]["serviceAccountName"],
            account.as_str()
        );
    }
    let cm = calls(&server, &Method::PATCH)
        .into_iter()
        .find(|c| c.path.ends_with("/configmaps/nvidia-driver-startup-probe"))
        .expect("startup probe applied");
    assert_eq!(cm.body["metadata"]["labels"][STATE_LABEL], "driver");
    assert_eq!(
        cm.body["metadata"]["ownerReferences"][0]["kind"],
        "ClusterPolicy"
    );
    // Without DaemonSet status yet, each is notReady waiting for its pods.
    for cr in ["pool-a", "pool-b"] {
        let st = status_of(&server, cr);
        assert_eq!(st["state"], "notReady");
        assert_eq!(condition(&st, "Error")["reason"], "DriverNotReady");
    }
}

#[tokio::test]
async fn overlapping_selectors_are_refused_naming_the_other() {
    let all = driver("everything", json!({"version": "570.172.08"}));
    let a = driver(
        "pool-a",
        json!({"version": "580.65.06", "nodeSelector": {"pool": "a"}}),
    );
    let server = server_with(&[handed_off(), all, a], &[("a", 1), ("b", 1)]);
    let ctx = driver_context(&server);
    for name in ["everything", "pool-a"] {
        reconcile(typed_driver(&server, name), ctx.clone())
            .await
            .unwrap();
    }
    assert!(ds_applies(&server).is_empty(), "nothing applied");
    for (cr, other) in [("everything", "pool-a"), ("pool-a", "everything")] {
        let st = status_of(&server, cr);
        assert_eq!(st["state"], "notReady");
        let err = condition(&st, "Error");
        assert_eq!(err["status"], "True");
        assert_eq!(err["reason"], "ConflictingNodeSelector");
        let msg = err["message"].as_str().unwrap();
        assert!(
            msg.contains(&format!("NVIDIADriver {other}")),
            "{cr}: {msg}"
        );
        assert_eq!(condition(&st, "Ready")["status"], "False");
    }
}

#[tokio::test]
async fn without_use_nvidia_driver_crd_a_driver_is_disabled() {
    let a = driver("pool-a", json!({"version": "570.172.08"}));
    let server = server_with(&[policy(json!({})), a], &[("a", 1)]);
    reconcile(typed_driver(&server, "pool-a"), driver_context(&server))
        .await
        .unwrap();
    assert!(ds_applies(&server).is_empty());
    let st = status_of(&server, "pool-a");
    assert_eq!(st["state"], "disabled");
    assert!(
        condition(&st, "Error")["message"]
            .as_str()
            .unwrap()
            .contains("useNvidiaDriverCRD")
    );
}

/// NVIDIA v26.7.0 reconciles an NVIDIADriver when no ClusterPolicy exists (the GPUCluster
/// path): kiln renders it with the ClusterPolicy CRD's defaults, and every object it applies
/// for the CR, the shared startup-probe ConfigMap included, is the CR's.
#[tokio::test]
async fn with_no_cluster_policy_a_driver_is_reconciled() {
    let a = driver(
        "pool-a",
        json!({"repository": "nvcr.io/nvidia", "image": "driver", "version": "570.172.08"}),
    );
    let server = server_with(&[a], &[("a", 2)]);
    reconcile(typed_driver(&server, "pool-a"), driver_context(&server))
        .await
        .unwrap();
    let applies = ds_applies(&server);
    assert_eq!(applies.len(), 1, "{}", status_of(&server, "pool-a"));
    assert_eq!(
        applies[0].body["metadata"]["ownerReferences"][0]["name"],
        "pool-a"
    );
    for path in [
        "/serviceaccounts/nvidia-gpu-driver-pool-a-ubuntu22.04",
        "/configmaps/nvidia-driver-startup-probe",
    ] {
        let obj = calls(&server, &Method::PATCH)
            .into_iter()
            .find(|c| c.path.ends_with(path))
            .unwrap_or_else(|| panic!("{path} applied"));
        assert_eq!(
            obj.body["metadata"]["ownerReferences"][0]["kind"], "NVIDIADriver",
            "{path}"
        );
    }
    let st = status_of(&server, "pool-a");
    assert_eq!(st["state"], "notReady", "{st}");
    assert_eq!(condition(&st, "Error")["reason"], "DriverNotReady");
}

/// Precompiled drivers run one DaemonSet per kernel: when the pool's nodes move to another
/// kernel, the next reconcile applies the new kernel's DaemonSet and deletes the stale one
/// (upstream `cleanupStaleDriverDaemonsets`).
#[tokio::test]
async fn a_kernel_change_replaces_the_precompiled_daemonset() {
    const KERNEL: &str = "feature.node.kubernetes.io/kernel-version.full";
    let a = driver(
        "pool-a",
        json!({"repository": "nvcr.io/nvidia", "image": "driver", "version": "570", "usePrecompiled": true}),
    );
    let server = server_with(&[handed_off(), a], &[("a", 2)]);
    let set_kernel = |k: &str| {
        let mut s = server.lock().unwrap();
        for i in 0..2 {
            let node = s.objects.get_mut(&format!("/api/v1/nodes/a-{i}")).unwrap();
            node["metadata"]["labels"][KERNEL] = json!(k);
        }
    };
    set_kernel("6.8.0-40-generic");
    let (mut fed, ctx) = Fed::wired(&server);
    reconcile(typed_driver(&server, "pool-a"), ctx.clone())
        .await
        .unwrap();
    let first = ds_applies_names(&ds_applies(&server));
    assert_eq!(first.len(), 1, "{}", status_of(&server, "pool-a"));
    let ds = &ds_applies(&server)[0].body;
    assert_eq!(
        ds["spec"]["template"]["spec"]["nodeSelector"][KERNEL],
        "6.8.0-40-generic"
    );
    clear_calls(&server);
    set_kernel("6.8.0-45-generic");
    // What the watches show now; the operator's node watch signals a label change.
    fed.sync(&server);
    ctx.inputs_changed();
    reconcile(typed_driver(&server, "pool-a"), ctx)
        .await
        .unwrap();
    let second = ds_applies_names(&ds_applies(&server));
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first, "a new DaemonSet for the new kernel");
    let deleted: Vec<String> = calls(&server, &Method::DELETE)
        .into_iter()
        .map(|c| c.path)
        .collect();
    assert_eq!(
        deleted,
        [format!(
            "/apis/apps/v1/namespaces/{NS}/daemonsets/{}",
            first[0]
        )],
        "the old kernel's DaemonSet is deleted"
    );
    assert!(!server.lock().unwrap().objects.contains_key(&format!(
        "/apis/apps/v1/namespaces/{NS}/daemonsets/{}",
        first[0]
    )));
}

/// `driverType: vgpu-host-manager` renders NVIDIA's vGPU host manager DaemonSet for the pool
/// (selecting `nvidia.com/gpu.deploy.vgpu-manager`, cgroup and VFIO mounts, no startup probe),
/// run by `nvidia-vgpu-manager-<cr>-<os>`.
#[tokio::test]
async fn a_vgpu_host_manager_driver_renders_the_host_manager() {
    let a = driver(
        "hosts",
        json!({"driverType": "vgpu-host-manager", "repository": "nvcr.io/nvidia",
            "image": "vgpu-manager", "version": "580.65.06"}),
    );
    let server = server_with(&[handed_off(), a], &[("a", 1)]);
    reconcile(typed_driver(&server, "hosts"), driver_context(&server))
        .await
        .unwrap();
    let applies = ds_applies(&server);
    assert_eq!(applies.len(), 1, "{:?}", status_of(&server, "hosts"));
    let ds = &applies[0].body;
    assert!(
        ds["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("nvidia-vgpu-host-manager-driver-ubuntu22.04-")
    );
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod["nodeSelector"]["nvidia.com/gpu.deploy.vgpu-manager"],
        "true"
    );
    assert!(
        pod["nodeSelector"]
            .get("nvidia.com/gpu.deploy.driver")
            .is_none()
    );
    assert_eq!(
        pod["serviceAccountName"],
        "nvidia-vgpu-manager-hosts-ubuntu22.04"
    );
    let ctr = &pod["containers"][0];
    assert_eq!(
        ctr["image"],
        "nvcr.io/nvidia/vgpu-manager:580.65.06-ubuntu22.04"
    );
    assert!(ctr.get("startupProbe").is_none());
    let mounts = ctr["volumeMounts"].to_string();
    assert!(
        mounts.contains("/dev/vfio") && mounts.contains("/sys/fs/cgroup"),
        "{mounts}"
    );
}

/// A labelled object as the cache of labelled objects holds it, owned by the policy.
fn labelled(name: &str, state: &str) -> Meta {
    serde_json::from_value(json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": name, "namespace": NS, "labels": {STATE_LABEL: state},
            "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                "name": "cluster-policy", "uid": "uid-cluster-policy", "controller": true}]}
    }))
    .unwrap()
}

fn store(
    ar: &ApiResource,
    objs: Vec<Meta>,
) -> (ApiResource, kube::runtime::reflector::Store<Meta>) {
    let mut w = Writer::<Meta>::new(ar.clone());
    listed(&mut w, objs);
    (ar.clone(), w.as_reader())
}

/// A full reconcile of the handed-off policy against a server holding the policy, the CR
/// `pool-a` (no status) and what the policy's own driver state left there; `drivers`, when
/// given, is the NVIDIADriver store the policy reads the CRs' readiness from.
async fn reconcile_handed_off(drivers: Option<Store<NVIDIADriver>>) -> Arc<Mutex<Server>> {
    let cp = handed_off();
    let server = server_with(
        &[
            cp.clone(),
            driver("pool-a", json!({"nodeSelector": {"pool": "a"}})),
        ],
        &[("a", 2)],
    );
    // What the policy's own driver state left in the cluster before the switch.
    {
        let mut s = server.lock().unwrap();
        for (path, kind) in [
            (
                "/apis/apps/v1/namespaces/gpu-operator/daemonsets/nvidia-driver-daemonset",
                "DaemonSet",
            ),
            (
                "/api/v1/namespaces/gpu-operator/serviceaccounts/nvidia-driver",
                "ServiceAccount",
            ),
        ] {
            s.objects.insert(
                path.into(),
                json!({"kind": kind, "metadata": {"name": "x"}}),
            );
        }
    }
    let live = LiveCache::from_stores(vec![
        store(
            &ApiResource::erase::<k8s_openapi::api::apps::v1::DaemonSet>(&()),
            vec![labelled("nvidia-driver-daemonset", "driver")],
        ),
        store(
            &ApiResource::erase::<k8s_openapi::api::core::v1::ServiceAccount>(&()),
            vec![labelled("nvidia-driver", "driver")],
        ),
    ]);
    let host = kiln_plugin_host::PluginHost::new(
        kiln_plugin_host::HostConfig::default(),
        kiln_bundled_plugins::BUNDLED,
    )
    .unwrap();
    let mock = client(server.clone());
    let (_feed, mut view) = Feed::view(&server, &mock, live, Wake::default());
    if let Some(store) = drivers {
        view.drivers = Some(store);
    }
    let ctx = Context::new(
        mock,
        kiln_render::Renderer::new(Arc::new(host)),
        Arc::new(Metrics::new()),
        Config {
            namespace: NS.into(),
            ..Config::default()
        },
        "v1.36.0".into(),
        Arc::new(view),
    );
    let typed: Arc<kube::api::DynamicObject> = Arc::new(serde_json::from_value(cp).unwrap());
    kiln_operator::reconcile::reconcile(typed, Arc::new(ctx))
        .await
        .unwrap();
    server
}

/// The policy's status (`status` of `cluster-policy` on `server`).
fn policy_status(server: &Arc<Mutex<Server>>) -> Value {
    server.lock().unwrap().objects["/apis/nvidia.com/v1/clusterpolicies/cluster-policy"]["status"]
        .clone()
}

#[tokio::test]
async fn switching_use_nvidia_driver_crd_on_orphans_the_policys_driver_pods() {
    let server = reconcile_handed_off(None).await;
    let deletes: Vec<Call> = calls(&server, &Method::DELETE)
        .into_iter()
        .filter(|c| c.path.contains("nvidia-driver"))
        .collect();
    let all: Vec<String> = server
        .lock()
        .unwrap()
        .calls
        .iter()
        .map(|c| format!("{} {} {}", c.method, c.path, c.body))
        .collect();
    assert_eq!(deletes.len(), 1, "{all:#?}");
    assert_eq!(
        deletes[0].path,
        "/apis/apps/v1/namespaces/gpu-operator/daemonsets/nvidia-driver-daemonset"
    );
    assert_eq!(
        deletes[0].body["propagationPolicy"], "Orphan",
        "the driver pods are kept"
    );
    // The shared service account stays; nothing of the driver state is applied by the policy.
    assert!(
        !calls(&server, &Method::PATCH)
            .iter()
            .any(|c| c.path.ends_with("/daemonsets/nvidia-driver-daemonset"))
    );
    // The policy's readiness is the NVIDIADriver's (no status yet: not ready).
    let st = policy_status(&server);
    assert_eq!(st["state"], "notReady", "{st}");
    assert!(
        st.to_string().contains("NVIDIADriver pool-a: notReady"),
        "{st}"
    );
}

/// With the NVIDIADriver controller's store wired (as `run` does), a handed-off policy judges
/// the CRs from it: no LIST of NVIDIADrivers on any reconcile (a DaemonSet status event of a
/// rollout re-judges the policy's readiness), and what the store holds is what counts.
#[tokio::test]
async fn a_handed_off_policy_reads_the_crs_readiness_from_their_store() {
    let mut ready = driver("pool-a", json!({"nodeSelector": {"pool": "a"}}));
    ready["status"] = json!({"state": "ready", "conditions": []});
    let mut waiting = driver("pool-b", json!({"nodeSelector": {"pool": "b"}}));
    waiting["status"] = json!({"state": "notReady", "conditions": [{"type": "Error",
        "status": "True", "reason": "DriverNotReady", "message": "2 of 3 pods ready",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    let mut w = Writer::<NVIDIADriver>::default();
    listed(
        &mut w,
        [ready, waiting].map(|d| serde_json::from_value(d).unwrap()),
    );
    let server = reconcile_handed_off(Some(w.as_reader())).await;
    let lists: Vec<String> = all_calls(&server)
        .into_iter()
        .filter(|c| c.contains("nvidiadrivers"))
        .collect();
    assert_eq!(lists, Vec::<String>::new(), "no NVIDIADriver request");
    let st = policy_status(&server).to_string();
    // pool-a is ready in the store (the server's copy has no status), pool-b is not.
    assert!(!st.contains("NVIDIADriver pool-a"), "{st}");
    assert!(
        st.contains("NVIDIADriver pool-b: notReady (2 of 3 pods ready)"),
        "{st}"
    );
}

/// `helm template` with `--set` flags; `None` without testcluster/bin/helm.
fn helm_template(set: &[&str]) -> Option<Vec<Value>> {
    let helm = repo().join("testcluster/bin/helm");
    if !helm.exists() {
        eprintln!("testcluster/bin/helm not built; skipping");
        return None;
    }
    let mut cmd = std::process::Command::new(&helm);
    cmd.args(["template", "kiln", "deploy/helm/kiln", "--namespace", NS]);
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd.current_dir(repo()).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    Some(
        serde_yaml_ng::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .filter(|v: &Value| !v.is_null())
            .collect(),
    )
}

#[test]
fn the_chart_deploys_the_default_nvidiadriver_as_nvidias_does() {
    let Some(objects) = helm_template(&["driver.nvidiaDriverCRD.enabled=true"]) else {
        return;
    };
    let of = |kind: &str| -> Vec<&Value> { objects.iter().filter(|o| o["kind"] == kind).collect() };
    let drivers = of("NVIDIADriver");
    assert_eq!(drivers.len(), 1);
    let doc = kiln_render::nvidiadriver::NvidiaDriverDoc::from_object(drivers[0]).unwrap();
    assert_eq!(doc.name, "default");
    assert!(doc.pruned.is_empty(), "{:?}", doc.pruned);
    assert_eq!(doc.spec.version, "595.91.07");
    assert_eq!(doc.spec.node_selector, None, "every GPU node");
    let cp = of("ClusterPolicy")[0];
    assert_eq!(cp["spec"]["driver"]["useNvidiaDriverCRD"], true);
    // The rest of the driver block is rendered too (NVIDIA's chart does; an upgradePolicy in
    // the values still governs the NVIDIADrivers' DaemonSets).
    assert_eq!(cp["spec"]["driver"]["version"], "595.91.07");
    let Some(objects) = helm_template(&[
        "driver.nvidiaDriverCRD.enabled=true",
        "driver.nvidiaDriverCRD.deployDefaultCR=false",
    ]) else {
        return;
    };
    assert!(!objects.iter().any(|o| o["kind"] == "NVIDIADriver"));
    let Some(objects) = helm_template(&[]) else {
        return;
    };
    assert!(!objects.iter().any(|o| o["kind"] == "NVIDIADriver"));
}
