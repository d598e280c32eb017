//! Reconciler scenarios against an in-memory API server (`support/mock_api.rs`: a `tower`
//! service behind a real `kube::Client`, in the style of controller-rs's mock API tests): no
//! cluster, no timing.
//! Each scenario calls [`reconcile`] once or twice on a fresh [`Context`] and asserts on the
//! requests the fake server recorded:
//! - a newer ClusterPolicy is `ignored`, and nothing but its status is written;
//! - every applied object carries `kiln.dev/state=<state>` and the policy as owner;
//! - a disabled state's labelled objects are deleted;
//! - after a restart (fresh context, no memory), an object labelled with a state that the
//!   render no longer produces (a site plugin's leftover) is deleted; one not owned by a
//!   ClusterPolicy is not;
//! - an invalid policy gets an error naming the field, and nothing is applied or deleted;
//! - a failing plugin chain keeps its state's objects (none deleted or re-applied) and marks
//!   only that state;
//! - with the caches wired (policies, nodes, DaemonSets), a DaemonSet status change costs no
//!   request but the status write and its Event, and none at all when the verdict is unchanged;
//! - GFD's per-minute label churn on nodes wakes nothing; a new GPU node is labelled alone;
//! - what another field manager added to a DaemonSet (a privileged sidecar, an env var) or to
//!   another applied object (a label) is removed by one JSON patch each, guarded by the
//!   resourceVersion, with an Event naming it; a clean reconcile after sends nothing.

use std::sync::{Arc, Mutex};

use axum::http::Method;
use kiln_core::plan::STATE_LABEL;
use kiln_operator::live::{LiveCache, Meta, Wake};
use kiln_operator::metrics::Metrics;
use kiln_operator::reconcile::reconcile;
use kiln_operator::store::NamedWriter;
use kiln_operator::{Config, Context};
use kube::api::ApiResource;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::support::fixtures::{node, pod, policy, sample_spec};
use crate::support::mock_api::{Call, Server, calls, client};
use crate::support::view::Feed;

const NS: &str = "gpu-operator";

/// A labelled object as the cache of labelled objects holds it.
fn labelled(name: &str, state: &str, owned: bool) -> Meta {
    let owners = if owned {
        json!([{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cluster-policy",
            "uid": "uid-cluster-policy", "controller": true}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": name, "namespace": NS, "labels": {STATE_LABEL: state},
            "ownerReferences": owners}
    }))
    .unwrap()
}

/// A listed store of kind `ar` holding `objs`.
fn store(
    ar: &ApiResource,
    objs: Vec<Meta>,
) -> (ApiResource, kube::runtime::reflector::Store<Meta>) {
    let mut w = Writer::<Meta>::new(ar.clone());
    w.apply_watcher_event(&watcher::Event::Init);
    for o in objs {
        w.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    w.apply_watcher_event(&watcher::Event::InitDone);
    (ar.clone(), w.as_reader())
}

/// A context over the fake server with the bundled plugins and `live` as the cluster's
/// labelled objects.
fn context(server: &Arc<Mutex<Server>>, live: LiveCache) -> Arc<Context> {
    context_with(server, live, kiln_plugin_host::HostConfig::default())
}

/// [`context`] with the plugin host's settings `config`.
fn context_with(
    server: &Arc<Mutex<Server>>,
    live: LiveCache,
    config: kiln_plugin_host::HostConfig,
) -> Arc<Context> {
    fed_context(server, |_| live, config).0
}

/// A context over the fake server whose view ([`Feed`]) holds the server's policies and nodes
/// now, with `live(&feed)` as the cluster's labelled objects.
fn fed_context(
    server: &Arc<Mutex<Server>>,
    live: impl FnOnce(&Feed) -> LiveCache,
    config: kiln_plugin_host::HostConfig,
) -> (Arc<Context>, Feed) {
    let host = kiln_plugin_host::PluginHost::new(config, kiln_bundled_plugins::BUNDLED).unwrap();
    let renderer = kiln_render::Renderer::new(Arc::new(host));
    let config = Config {
        namespace: NS.into(),
        ..Config::default()
    };
    let mock = client(server.clone());
    let (feed, mut view) = Feed::view(
        server,
        &mock,
        LiveCache::from_stores(vec![]),
        Wake::default(),
    );
    view.live = Arc::new(live(&feed));
    let ctx = Context::new(
        mock,
        renderer,
        Arc::new(Metrics::new()),
        config,
        "v1.36.0".into(),
        Arc::new(view),
    );
    (Arc::new(ctx), feed)
}

fn server_with(policies: &[Value], gpu_nodes: usize) -> Arc<Mutex<Server>> {
    let mut s = Server::default();
    for p in policies {
        s.insert(p.clone());
    }
    for i in 0..gpu_nodes {
        s.insert(node(&format!("gpu-node-{i}")).nfd_gpu().node_info().json());
    }
    Arc::new(Mutex::new(s))
}

fn typed(p: &Value) -> Arc<kube::api::DynamicObject> {
    Arc::new(serde_json::from_value(p.clone()).unwrap())
}

fn cm() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&())
}

fn ds() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::apps::v1::DaemonSet>(&())
}

#[tokio::test]
async fn a_newer_policy_is_ignored_and_only_its_status_is_written() {
    let first = policy("cluster-policy", "2026-01-01T00:00:00Z", json!({}));
    let second = policy("second", "2026-01-02T00:00:00Z", json!({}));
    let server = server_with(&[first, second.clone()], 0);
    let ctx = context(&server, LiveCache::from_stores(vec![]));
    reconcile(typed(&second), ctx).await.unwrap();
    let patches = calls(&server, &Method::PATCH);
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert_eq!(
        patches[0].path,
        "/apis/nvidia.com/v1/clusterpolicies/second/status"
    );
    assert_eq!(patches[0].body["status"]["state"], "ignored");
    assert!(calls(&server, &Method::DELETE).is_empty());
    assert!(
        calls(&server, &Method::GET)
            .iter()
            .all(|c| !c.path.starts_with("/api/v1/nodes")),
        "an ignored policy reads no node"
    );
}

#[tokio::test]
async fn applied_objects_are_labelled_and_stale_disabled_and_orphaned_ones_deleted() {
    let mut spec = sample_spec();
    spec["dcgmExporter"]["enabled"] = json!(false);
    let p = policy("cluster-policy", "2026-01-01T00:00:00Z", spec);
    let server = server_with(std::slice::from_ref(&p), 2);
    // What a previous operator process left in the cluster: the disabled state's DaemonSet, a
    // ConfigMap a site plugin once added to dcgm, and a ConfigMap labelled dcgm that no
    // ClusterPolicy owns (not kiln's to delete).
    let live = LiveCache::from_stores(vec![
        store(
            &ds(),
            vec![labelled("nvidia-dcgm-exporter", "dcgm-exporter", true)],
        ),
        store(
            &cm(),
            vec![
                labelled("site-extra", "dcgm", true),
                labelled("someone-elses", "dcgm", false),
            ],
        ),
    ]);
    let ctx = context(&server, live);
    reconcile(typed(&p), ctx).await.unwrap();

    let deletes: Vec<String> = calls(&server, &Method::DELETE)
        .into_iter()
        .map(|c| c.path)
        .collect();
    // In state order: dcgm's stale ConfigMap, then the disabled dcgm-exporter's DaemonSet.
    assert_eq!(
        deletes,
        [
            "/api/v1/namespaces/gpu-operator/configmaps/site-extra",
            "/apis/apps/v1/namespaces/gpu-operator/daemonsets/nvidia-dcgm-exporter",
        ]
    );

    let applies: Vec<Call> = calls(&server, &Method::PATCH)
        .into_iter()
        .filter(|c| !c.path.starts_with("/api/v1/nodes") && !c.path.ends_with("/status"))
        .collect();
    assert!(applies.len() > 20, "{}", applies.len());
    for a in &applies {
        let labels = &a.body["metadata"]["labels"];
        assert!(
            labels[STATE_LABEL].as_str().is_some_and(|s| !s.is_empty()),
            "{} lacks {STATE_LABEL}: {labels}",
            a.path
        );
        assert_eq!(
            a.body["metadata"]["ownerReferences"][0]["name"], "cluster-policy",
            "{}",
            a.path
        );
    }
    let dp = applies
        .iter()
        .find(|a| {
            a.path
                .ends_with("/daemonsets/nvidia-device-plugin-daemonset")
        })
        .expect("device plugin applied");
    assert_eq!(dp.body["metadata"]["labels"][STATE_LABEL], "device-plugin");
    assert!(
        !applies.iter().any(|a| a.path.contains("dcgm-exporter")),
        "the disabled state is not applied"
    );
}

#[tokio::test]
async fn objects_the_cache_shows_unchanged_are_not_read_or_applied_again() {
    let p = policy("cluster-policy", "2026-01-01T00:00:00Z", sample_spec());
    let server = server_with(std::slice::from_ref(&p), 2);
    let sa = ApiResource::erase::<k8s_openapi::api::core::v1::ServiceAccount>(&());
    let mut writer = Writer::<Meta>::new(sa.clone());
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let ctx = context(
        &server,
        LiveCache::from_stores(vec![(sa.clone(), writer.as_reader())]),
    );
    reconcile(typed(&p), ctx.clone()).await.unwrap();
    let is_sa = |c: &Call| c.path.contains("/serviceaccounts/");
    let applied = calls(&server, &Method::PATCH)
        .iter()
        .filter(|c| is_sa(c))
        .count();
    assert!(applied > 5, "{applied} ServiceAccounts applied");
    // The watch reports what was applied (the fake server's objects, as metadata).
    let objects: Vec<Value> = {
        let s = server.lock().unwrap();
        s.objects
            .iter()
            .filter(|(k, _)| k.contains("/serviceaccounts/"))
            .map(|(_, v)| v.clone())
            .collect()
    };
    for o in objects {
        let mut m = o.clone();
        m["apiVersion"] = json!("meta.k8s.io/v1");
        m["kind"] = json!("PartialObjectMetadata");
        writer.apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(m).unwrap()));
    }
    server.lock().unwrap().calls.clear();
    reconcile(typed(&p), ctx).await.unwrap();
    let sa_calls: Vec<String> = server
        .lock()
        .unwrap()
        .calls
        .iter()
        .filter(|c| is_sa(c))
        .map(|c| format!("{} {}", c.method, c.path))
        .collect();
    assert!(sa_calls.is_empty(), "{sa_calls:?}");
    let ds_gets = calls(&server, &Method::GET)
        .iter()
        .filter(|c| c.path.contains("/daemonsets/"))
        .count();
    assert_eq!(ds_gets, 0, "DaemonSet status comes from the cache");
}

#[tokio::test]
async fn a_drop_in_shadowing_a_standard_plugin_is_named_in_the_status() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("device-plugin.wasm");
    std::fs::write(&path, kiln_bundled_plugins::get("device-plugin").unwrap()).unwrap();
    let p = policy("cluster-policy", "2026-01-01T00:00:00Z", sample_spec());
    let server = server_with(std::slice::from_ref(&p), 1);
    let ctx = context_with(
        &server,
        LiveCache::from_stores(vec![]),
        kiln_plugin_host::HostConfig {
            drop_in_dir: Some(dir.path().to_path_buf()),
            ..Default::default()
        },
    );
    reconcile(typed(&p), ctx).await.unwrap();
    let status = calls(&server, &Method::PATCH)
        .into_iter()
        .rfind(|c| c.path.ends_with("/clusterpolicies/cluster-policy/status"))
        .expect("a status write");
    let ready = status.body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.ends_with(&format!(
            "drop-in plugins shadow bundled standard plugins: device-plugin ({})",
            path.display()
        )),
        "{message}"
    );
}

/// The server's objects under `prefix`, as typed objects.
fn server_objects<K: serde::de::DeserializeOwned>(
    server: &Arc<Mutex<Server>>,
    prefix: &str,
) -> Vec<K> {
    let s = server.lock().unwrap();
    s.objects
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(_, v)| serde_json::from_value(v.clone()).unwrap())
        .collect()
}

/// A context whose view holds the server's policies and nodes now and the DaemonSets a test
/// feeds ([`sync_caches`]), the labelled DaemonSets read from that store.
fn cached_context(server: &Arc<Mutex<Server>>) -> (Arc<Context>, Feed) {
    fed_context(
        server,
        |feed| LiveCache::from_stores(vec![]).with_daemonsets(feed.daemonsets.as_reader()),
        kiln_plugin_host::HostConfig::default(),
    )
}

/// Feed the server's current nodes and DaemonSets into the caches (what the watches would
/// report), each DaemonSet with a status of `ready` pods on every GPU node.
fn sync_caches(server: &Arc<Mutex<Server>>, caches: &mut Feed, ready: i32) {
    for n in server_objects::<kiln_operator::node::SlimNode>(server, "/api/v1/nodes/") {
        caches.nodes.apply(&watcher::Event::Apply(Arc::new(n)));
    }
    let ds_prefix = format!("/apis/apps/v1/namespaces/{NS}/daemonsets/");
    let all: Vec<Value> = {
        let s = server.lock().unwrap();
        s.objects
            .iter()
            .filter(|(k, _)| k.starts_with(&ds_prefix))
            .map(|(_, v)| v.clone())
            .collect()
    };
    for mut d in all {
        let generation = d["metadata"]["generation"].as_i64().unwrap();
        d["status"] = json!({"currentNumberScheduled": ready, "desiredNumberScheduled": ready,
            "numberMisscheduled": 0, "numberReady": ready, "numberAvailable": ready,
            "updatedNumberScheduled": ready, "numberUnavailable": 0,
            "observedGeneration": generation});
        caches
            .daemonsets
            .apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(d).unwrap()));
    }
}

/// The message of the `Error` condition a status write sets.
fn error_message(call: &Call) -> String {
    call.body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Error")
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn status_of(call: &Call) -> (String, String) {
    (
        call.body["status"]["state"]
            .as_str()
            .unwrap_or_default()
            .into(),
        call.path.clone(),
    )
}

#[tokio::test]
async fn an_invalid_policy_gets_an_error_naming_the_field_and_nothing_is_applied_or_deleted() {
    let mut spec = sample_spec();
    spec["mig"]["strategy"] = json!("double");
    let p = policy("cluster-policy", "2026-01-01T00:00:00Z", spec);
    let server = server_with(std::slice::from_ref(&p), 2);
    let live = LiveCache::from_stores(vec![store(
        &ds(),
        vec![labelled("nvidia-dcgm-exporter", "dcgm-exporter", true)],
    )]);
    let ctx = context(&server, live);
    reconcile(typed(&p), ctx).await.unwrap();
    let patches = calls(&server, &Method::PATCH);
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert_eq!(
        status_of(&patches[0]),
        (
            "notReady".into(),
            "/apis/nvidia.com/v1/clusterpolicies/cluster-policy/status".into()
        )
    );
    let message = error_message(&patches[0]);
    assert!(message.contains("spec.mig.strategy"), "{message}");
    assert!(calls(&server, &Method::DELETE).is_empty());
}

#[tokio::test]
async fn a_failing_plugin_chain_keeps_its_last_good_objects_and_marks_only_its_state() {
    let p = policy("cluster-policy", "2026-01-01T00:00:00Z", sample_spec());
    let server = server_with(std::slice::from_ref(&p), 2);
    let (ctx, _caches) = cached_context(&server);
    reconcile(typed(&p), ctx.clone()).await.unwrap();
    let dp = "/apis/apps/v1/namespaces/gpu-operator/daemonsets/nvidia-device-plugin-daemonset";
    assert!(server.lock().unwrap().objects.contains_key(dp));
    // The device plugin's standard plugin pinned to a digest it does not have: its chain
    // fails. The policy's generation moves on, as an edit makes it.
    let mut broken = p.clone();
    broken["metadata"]["generation"] = json!(2);
    broken["metadata"]["annotations"] =
        json!({"kiln.dev/plugins": format!("device-plugin:\n  pin: \"{}\"\n", "0".repeat(64))});
    // The labelled objects as the cache now holds them (what the first reconcile applied).
    let objs: Vec<Meta> = {
        let s = server.lock().unwrap();
        s.objects
            .iter()
            .filter(|(k, _)| k.contains("/daemonsets/"))
            .map(|(_, v)| {
                let mut m = v.clone();
                m["apiVersion"] = json!("meta.k8s.io/v1");
                m["kind"] = json!("PartialObjectMetadata");
                serde_json::from_value(m).unwrap()
            })
            .collect()
    };
    assert!(objs.len() > 3);
    {
        let mut s = server.lock().unwrap();
        s.objects.insert(
            "/apis/nvidia.com/v1/clusterpolicies/cluster-policy".into(),
            broken.clone(),
        );
        s.calls.clear();
    }
    // A restarted operator: its view lists the edited policy.
    let ctx = context(&server, LiveCache::from_stores(vec![store(&ds(), objs)]));
    reconcile(typed(&broken), ctx).await.unwrap();
    assert!(
        calls(&server, &Method::DELETE).is_empty(),
        "{:?}",
        calls(&server, &Method::DELETE)
    );
    assert!(server.lock().unwrap().objects.contains_key(dp));
    let patches = calls(&server, &Method::PATCH);
    assert!(!patches.iter().any(|c| c.path == dp), "not applied either");
    let status = patches
        .iter()
        .rfind(|c| c.path.ends_with("/status"))
        .expect("a status write");
    let message = error_message(status);
    assert!(message.contains("device-plugin: failed: "), "{message}");
    assert!(!message.contains("dcgm-exporter: failed"), "{message}");
}

#[tokio::test]
async fn a_daemonset_status_change_costs_no_request_but_the_status_write() {
    let mut spec = sample_spec();
    // No OnDelete DaemonSet (the driver's): its pods would be listed without pod watches.
    spec["driver"]["enabled"] = json!(false);
    let p = policy("cluster-policy", "2026-01-01T00:00:00Z", spec);
    let server = server_with(std::slice::from_ref(&p), 2);
    let (ctx, mut caches) = cached_context(&server);
    reconcile(typed(&p), ctx.clone()).await.unwrap();
    let first = calls(&server, &Method::PATCH);
    let last_status = first.iter().rfind(|c| c.path.ends_with("/status")).unwrap();
    assert_eq!(status_of(last_status).0, "notReady");
    assert!(
        first
            .iter()
            .filter(|c| c.path.contains("/daemonsets/"))
            .count()
            > 4,
        "the DaemonSets were applied"
    );
    // The watches report the labelled nodes and the DaemonSets, now ready on both GPU nodes.
    sync_caches(&server, &mut caches, 2);
    server.lock().unwrap().calls.clear();
    reconcile(typed(&p), ctx.clone()).await.unwrap();
    let sent: Vec<String> = server
        .lock()
        .unwrap()
        .calls
        .iter()
        .map(|c| format!("{} {}", c.method, c.path))
        .collect();
    assert_eq!(
        sent,
        [
            "POST /apis/events.k8s.io/v1/namespaces/default/events".to_string(),
            "PATCH /apis/nvidia.com/v1/clusterpolicies/cluster-policy/status".to_string(),
        ],
        "only the Event and the status write"
    );
    assert_eq!(
        status_of(&calls(&server, &Method::PATCH)[0]).0,
        "ready",
        "{:?}",
        calls(&server, &Method::PATCH)[0].body
    );
    // Another status event that changes nothing the verdict reads: no request at all.
    server.lock().unwrap().calls.clear();
    sync_caches(&server, &mut caches, 2);
    reconcile(typed(&p), ctx.clone()).await.unwrap();
    assert!(server.lock().unwrap().calls.is_empty());
    // A pod lost on one node: notReady, again only the Event and status.
    sync_caches(&server, &mut caches, 1);
    reconcile(typed(&p), ctx).await.unwrap();
    let patches: Vec<Call> = calls(&server, &Method::PATCH)
        .into_iter()
        .filter(|c| !c.path.contains("/events"))
        .collect();
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert_eq!(status_of(&patches[0]).0, "notReady");
    assert!(
        error_message(&patches[0]).contains("scheduled on 1 of 2 matching nodes"),
        "{}",
        error_message(&patches[0])
    );
    assert!(calls(&server, &Method::GET).is_empty());
    let _ = &caches.policies;
}

#[tokio::test]
async fn gfd_churn_on_nodes_wakes_nothing_and_a_new_gpu_node_is_labelled_alone() {
    use k8s_openapi::api::core::v1::Node;
    use kiln_core::labels::LabelPolicy;
    use kiln_operator::nodes::{NodeWatch, follow_nodes};
    let server = server_with(&[], 0);
    let node = |name: &str, ts: &str| -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {
            "feature.node.kubernetes.io/pci-10de.present": "true",
            "nvidia.com/gpu.present": "true", "nvidia.com/gfd.timestamp": ts}}}))
        .unwrap()
    };
    // Two labelled nodes at the start (no patch needed), then a minute of GFD rewriting their
    // timestamps, then a new GPU node that needs its labels.
    let rules = LabelPolicy::from_spec(&kiln_core::spec::ClusterPolicySpec::default());
    let mut start: Vec<Node> = vec![node("a", "1"), node("b", "1")];
    for n in &mut start {
        let labels = n.metadata.labels.as_mut().unwrap();
        let patch = kiln_core::labels::plan_node_labels(labels, &rules);
        *labels = kiln_core::labels::apply_patch(labels, &patch);
    }
    let mut events = vec![watcher::Event::Init];
    let slim = kiln_operator::node::SlimNode::from;
    events.extend(
        start
            .iter()
            .cloned()
            .map(slim)
            .map(watcher::Event::InitApply),
    );
    events.push(watcher::Event::InitDone);
    for ts in ["2", "3"] {
        for n in &start {
            let mut n = n.clone();
            n.metadata
                .labels
                .as_mut()
                .unwrap()
                .insert("nvidia.com/gfd.timestamp".into(), ts.into());
            events.push(watcher::Event::Apply(slim(n)));
        }
    }
    events.push(watcher::Event::Apply(slim(node("c", "1"))));
    // A node moved to another NVIDIADriver pool: a label outside `nvidia.com/`.
    let mut moved = start[0].clone();
    moved
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("pool".into(), "b".into());
    events.push(watcher::Event::Apply(slim(moved)));
    let (wake, mut wakes) = Wake::channel();
    let (pools_tx, mut pools_rx) = futures::channel::mpsc::unbounded();
    let writer = NamedWriter::<kiln_operator::node::SlimNode>::default();
    let (timeline_tx, mut timeline_rx) = futures::channel::mpsc::channel(64);
    let store = writer.as_reader();
    let w = NodeWatch {
        client: client(server.clone()),
        wake,
        labels: Arc::new(Mutex::new(Some(rules))),
        metrics: Arc::new(Metrics::new()),
        timeline: Some(timeline_tx),
        pools: Some(pools_tx),
    };
    follow_nodes(w, writer, futures::stream::iter(events.into_iter().map(Ok))).await;
    // The readiness timeline hears the list and the new node, not GFD's timestamps.
    let mut heard = Vec::new();
    while let Ok(ev) = timeline_rx.try_recv() {
        heard.push(match ev {
            watcher::Event::Init => "init".to_string(),
            watcher::Event::InitApply(f) => format!("listed {}", f.name),
            watcher::Event::InitDone => "listed".to_string(),
            watcher::Event::Apply(f) => format!("changed {} gpu={}", f.name, f.gpu),
            watcher::Event::Delete(f) => format!("deleted {}", f.name),
        });
    }
    assert_eq!(
        heard,
        [
            "init",
            "listed a",
            "listed b",
            "listed",
            "changed c gpu=true"
        ]
    );
    let mut woke = 0;
    while let Ok(()) = wakes.try_recv() {
        woke += 1;
    }
    assert_eq!(
        woke, 2,
        "the first list, then the new node; the GFD churn and the pool label none"
    );
    let mut pools = 0;
    while let Ok(()) = pools_rx.try_recv() {
        pools += 1;
    }
    assert_eq!(
        pools, 3,
        "NVIDIADriver pools: the first list, the new node, the pool label; the GFD churn none"
    );
    let sent: Vec<String> = server
        .lock()
        .unwrap()
        .calls
        .iter()
        .map(|c| format!("{} {}", c.method, c.path))
        .collect();
    assert_eq!(
        sent,
        ["PATCH /api/v1/nodes/c"],
        "only the new node is labelled"
    );
    assert_eq!(store.state().len(), 3);
    assert!(
        store.state().iter().all(|n| n
            .labels()
            .iter()
            .all(|(k, _)| k != "nvidia.com/gfd.timestamp")),
        "GFD's labels are not kept"
    );
}

/// Driver upgrade (issue 33), the sequence an operator reported: a job's pod (`app=trainer`,
/// one GPU, owned by a Job) is created on `gpu-node-1` seconds before the driver version
/// changes, so it is still `Pending` (its image pulling) when the node reaches
/// `wait-for-jobs-required`; it then runs, its status is written a few times (conditions,
/// restarts), and at last it succeeds. `waitForCompletion.podSelector: app=trainer`, no
/// timeout. Passes of the real [`kiln_operator::upgrade::Upgrader`] over the in-memory API
/// (node store fed from the server's nodes after each pass, as the node watch would):
/// the node stays in `wait-for-jobs-required` while the pod is Pending or Running, nothing
/// evicts it, and the driver pod is deleted only after the pod has succeeded. The node's
/// Events, in order, are the record the test prints and asserts.
#[tokio::test]
async fn a_driver_upgrade_waits_for_a_job_pod_pending_then_running() {
    use kiln_core::upgrade::{STATE_LABEL as UPGRADE_STATE, UpgradeState};
    use kiln_operator::upgrade::{UpgradeConfig, UpgradeScope, Upgrader};

    const NODE: &str = "gpu-node-1";
    const TRAINER: &str = "/api/v1/namespaces/jobs/pods/trainer-7kq2x";
    const DRIVER: &str = "/api/v1/namespaces/gpu-operator/pods/nvidia-driver-daemonset-a";
    let server = Arc::new(Mutex::new(Server::default()));
    let driver_env = |digest: &str| json!([{"name": "DRIVER_CONFIG_DIGEST", "value": digest}]);
    let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "nvidia-driver-daemonset", "namespace": NS, "uid": "ds1",
            "generation": 2},
        "spec": {"selector": {"matchLabels": {"app": "nvidia-driver-daemonset"}},
            "template": {"metadata": {"labels": {"app": "nvidia-driver-daemonset"}},
                "spec": {"nodeSelector": {"nvidia.com/gpu.deploy.driver": "true"},
                    "containers": [{"name": "nvidia-driver-ctr", "env": driver_env("new")}]}}},
        "status": {"observedGeneration": 2, "currentNumberScheduled": 1,
            "desiredNumberScheduled": 1, "numberMisscheduled": 0, "numberReady": 1}
    }))
    .unwrap();
    {
        let mut s = server.lock().unwrap();
        s.insert(
            node(NODE)
                .resource_version("1")
                .label("nvidia.com/gpu.deploy.driver", "true")
                .label(UPGRADE_STATE, "upgrade-done")
                .ready()
                .json(),
        );
        for (rev, hash) in [(1, "old"), (2, "new")] {
            s.objects.insert(
                format!("/apis/apps/v1/namespaces/{NS}/controllerrevisions/nvidia-driver-daemonset-{hash}"),
                json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
                    "metadata": {"name": format!("nvidia-driver-daemonset-{hash}"), "namespace": NS,
                        "resourceVersion": "1",
                        "labels": {"app": "nvidia-driver-daemonset", "controller-revision-hash": hash},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                            "name": "nvidia-driver-daemonset", "uid": "ds1", "controller": true}]},
                    "revision": rev}),
            );
        }
        s.insert(
            pod(NS, "nvidia-driver-daemonset-a")
                .resource_version("1")
                .label("app", "nvidia-driver-daemonset")
                .label("controller-revision-hash", "old")
                .owned_by_daemon_set("nvidia-driver-daemonset", "ds1")
                .on(NODE)
                .container(json!({"name": "nvidia-driver-ctr", "env": driver_env("old")}))
                .phase("Running", true, "driver:old")
                .json(),
        );
        // Created seconds before the version change: scheduled, not started yet.
        s.objects.insert(
            TRAINER.into(),
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "trainer-7kq2x", "namespace": "jobs", "resourceVersion": "1",
                    "labels": {"app": "trainer", "batch.kubernetes.io/job-name": "trainer"},
                    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                        "name": "trainer", "uid": "job1", "controller": true}]},
                "spec": {"nodeName": NODE, "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "train", "image": "registry.example/train:1",
                        "resources": {"requests": {"nvidia.com/gpu": "1"},
                            "limits": {"nvidia.com/gpu": "1"}}}]},
                "status": {"phase": "Pending",
                    "conditions": [{"type": "PodScheduled", "status": "True"}]}}),
        );
    }
    let (wake, _wakes) = Wake::channel();
    let mock = client(server.clone());
    let (feed, view) = Feed::view(&server, &mock, LiveCache::from_stores(vec![]), wake);
    let upgrader = Upgrader::start(mock, UpgradeConfig::default(), Arc::new(view));
    let scope = UpgradeScope {
        namespace: NS.into(),
        daemonset: "nvidia-driver-daemonset".into(),
        policy: Some(
            serde_json::from_value(json!({"autoUpgrade": true, "maxParallelUpgrades": 2,
                "waitForCompletion": {"podSelector": "app=trainer", "timeoutSeconds": 0},
                "podDeletion": {"force": false, "timeoutSeconds": 300}}))
            .unwrap(),
        ),
        owner: Default::default(),
        validator_selector: kiln_core::upgrade::VALIDATOR_SELECTOR.into(),
    };
    let mut nodes = feed;
    // One pass, then the node watch's view of the server's node; returns the node's state.
    let pass = async |feed: &mut Feed| {
        upgrader.pass(&scope, &ds).await.unwrap();
        feed.sync();
        let s = server.lock().unwrap();
        let label = s.objects[&format!("/api/v1/nodes/{NODE}")]["metadata"]["labels"]
            [UPGRADE_STATE]
            .as_str()
            .map(str::to_string);
        UpgradeState::from_label(label.as_deref())
    };
    let set_trainer = |status: Value| {
        let mut s = server.lock().unwrap();
        s.objects.get_mut(TRAINER).unwrap()["status"] = status;
    };
    // The node's Events so far (the seconds of a progress note as `N`).
    let notes = || -> Vec<String> {
        calls(&server, &Method::POST)
            .into_iter()
            .filter(|c| c.body["regarding"]["kind"] == "Node")
            .filter_map(|c| c.body["note"].as_str().map(str::to_string))
            .map(|n| match n.strip_suffix("s so far") {
                Some(head) => format!(
                    "{}Ns so far",
                    head.trim_end_matches(|c: char| c.is_ascii_digit())
                ),
                None => n,
            })
            .collect()
    };
    // Evictions of the trainer and deletions of the driver pod, so far.
    let touched = || {
        let s = server.lock().unwrap();
        let evicted = s.calls.iter().any(|c| c.path.starts_with(TRAINER));
        let restarted = s
            .calls
            .iter()
            .any(|c| c.method == Method::DELETE && c.path == DRIVER);
        (evicted, restarted)
    };
    // The version changed: upgrade-done -> upgrade-required -> cordon-required ->
    // wait-for-jobs-required, the trainer still Pending.
    let mut states = Vec::new();
    for _ in 0..3 {
        states.push(pass(&mut nodes).await);
    }
    assert_eq!(
        states,
        [
            UpgradeState::UpgradeRequired,
            UpgradeState::CordonRequired,
            UpgradeState::WaitForJobsRequired
        ]
    );
    // Pending, then Running with its status written a few times: the node waits.
    let running = |ready: &str, restarts: i32| {
        json!({"phase": "Running", "podIP": "10.0.0.7",
            "conditions": [{"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": ready}],
            "containerStatuses": [{"name": "train", "ready": ready == "True",
                "restartCount": restarts, "image": "registry.example/train:1", "imageID": ""}]})
    };
    let statuses = [
        None,
        None,
        Some(running("False", 0)),
        Some(running("True", 0)),
        Some(running("False", 1)),
        Some(running("True", 1)),
    ];
    for (i, status) in statuses.into_iter().enumerate() {
        if let Some(status) = status {
            set_trainer(status);
        }
        let state = pass(&mut nodes).await;
        assert_eq!(
            state,
            UpgradeState::WaitForJobsRequired,
            "pass {i}: the node left wait-for-jobs-required while its job pod is live; \
             Events:\n  {}",
            notes().join("\n  ")
        );
        assert_eq!(touched(), (false, false), "pass {i}: {:?}", notes());
    }
    // The job succeeds: nothing left to wait for or delete, then the driver pod restarts.
    set_trainer(json!({"phase": "Succeeded",
        "conditions": [{"type": "Ready", "status": "False"}]}));
    let mut states = Vec::new();
    for _ in 0..3 {
        states.push(pass(&mut nodes).await);
    }
    assert_eq!(
        states,
        [
            UpgradeState::PodDeletionRequired,
            UpgradeState::PodRestartRequired,
            UpgradeState::PodRestartRequired
        ]
    );
    assert_eq!(
        touched(),
        (false, true),
        "the driver pod restarts, the job pod stays"
    );
    let notes = notes();
    eprintln!("{NODE} Events:\n  {}", notes.join("\n  "));
    assert_eq!(
        notes,
        [
            "upgrade-done -> upgrade-required: driver pod runs an old template",
            "upgrade-required -> cordon-required",
            "cordon-required -> wait-for-jobs-required: cordoned",
            "waiting for 1 pod(s) matching app=trainer to complete (no timeout)",
            "waiting for 1 pod(s) matching app=trainer, Ns so far",
            "wait-for-jobs-required -> pod-deletion-required: no pod matching app=trainer \
             pending or running (1 finished: jobs/trainer-7kq2x)",
            "pod-deletion-required -> pod-restart-required: no GPU pods on the node",
            "restarting driver pod nvidia-driver-daemonset-a",
        ]
    );
}

/// The managed-fields entry of `intruder`'s apply that owns `fields_v1`.
fn intruder(fields_v1: Value) -> Value {
    json!([{"manager": "intruder", "operation": "Apply", "apiVersion": "v1",
        "fieldsType": "FieldsV1", "fieldsV1": fields_v1}])
}

/// Additive drift (issue 40): fields another manager added and kiln does not render are
/// removed within one reconcile, read off the objects' managed fields with no GET: from the
/// DaemonSet cache (whose generation did not move, so nothing is applied) and from the answer
/// of an apply (a ServiceAccount's label); each `DriftRemoved` Event names what went and who
/// set it. A reconcile after changes nothing.
#[tokio::test]
async fn fields_another_manager_added_are_removed_in_one_reconcile_with_an_event() {
    let mut spec = sample_spec();
    // No OnDelete DaemonSet (the driver's): its pods would be listed without pod watches.
    spec["driver"]["enabled"] = json!(false);
    let p = policy("cluster-policy", "2026-01-01T00:00:00Z", spec);
    let server = server_with(std::slice::from_ref(&p), 2);
    let (ctx, mut caches) = cached_context(&server);
    reconcile(typed(&p), ctx.clone()).await.unwrap();
    sync_caches(&server, &mut caches, 2);
    reconcile(typed(&p), ctx.clone()).await.unwrap();
    // A clean reconcile: nothing is sent for any DaemonSet.
    server.lock().unwrap().calls.clear();
    sync_caches(&server, &mut caches, 2);
    reconcile(typed(&p), ctx.clone()).await.unwrap();
    assert!(server.lock().unwrap().calls.is_empty());

    let ds_path = format!("/apis/apps/v1/namespaces/{NS}/daemonsets/nvidia-dcgm-exporter");
    let sa_path = format!("/api/v1/namespaces/{NS}/serviceaccounts/nvidia-dcgm-exporter");
    let rendered = {
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
            .expect("the exporter has env");
        let n = env.len();
        env.push(json!({"name": "INJECTED", "value": "1"}));
        containers.push(json!({"name": "sidecar", "image": "busybox",
            "securityContext": {"privileged": true}}));
        // kiln's apply owns its container (the fake records no managed fields of its own).
        let kiln = json!({"manager": "kiln", "operation": "Apply", "apiVersion": "apps/v1",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:template": {"f:spec": {
                "f:containers": {format!("k:{{\"name\":\"{main}\"}}"): {
                    ".": {}, "f:name": {}}}}}}}});
        ds["metadata"]["managedFields"] = intruder(json!({"f:spec": {"f:template": {"f:spec": {
            "f:containers": {
                format!("k:{{\"name\":\"{main}\"}}"): {".": {}, "f:name": {},
                    "f:env": {"k:{\"name\":\"INJECTED\"}": {".": {}, "f:name": {}, "f:value": {}}}},
                "k:{\"name\":\"sidecar\"}": {".": {}, "f:name": {}, "f:image": {},
                    "f:securityContext": {"f:privileged": {}}}}}}}}));
        ds["metadata"]["managedFields"]
            .as_array_mut()
            .unwrap()
            .insert(0, kiln);
        let sa = s.objects.get_mut(&sa_path).unwrap();
        sa["metadata"]["labels"]["team"] = json!("ml");
        sa["metadata"]["resourceVersion"] = json!("8");
        sa["metadata"]["managedFields"] =
            intruder(json!({"f:metadata": {"f:labels": {"f:team": {}}}}));
        (rendered, n)
    };
    let (rendered, n) = rendered;
    sync_caches(&server, &mut caches, 2);
    server.lock().unwrap().calls.clear();
    reconcile(typed(&p), ctx.clone()).await.unwrap();

    assert!(calls(&server, &Method::GET).is_empty(), "no read");
    let ds_patches: Vec<Call> = calls(&server, &Method::PATCH)
        .into_iter()
        .filter(|c| c.path == ds_path)
        .collect();
    assert_eq!(
        ds_patches.iter().map(|c| &c.body).collect::<Vec<_>>(),
        [&json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
            {"op": "remove", "path": "/spec/template/spec/containers/1"},
            {"op": "remove", "path": format!("/spec/template/spec/containers/0/env/{n}")},
        ])],
        "one JSON patch, no apply: the DaemonSet's generation did not move"
    );
    let sa_patches: Vec<Value> = calls(&server, &Method::PATCH)
        .into_iter()
        .filter(|c| c.path == sa_path && c.body.is_array())
        .map(|c| c.body)
        .collect();
    assert_eq!(
        sa_patches,
        [json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "8"},
            {"op": "remove", "path": "/metadata/labels/team"},
        ])]
    );
    {
        let s = server.lock().unwrap();
        assert_eq!(
            s.objects[&ds_path]["spec"], rendered,
            "exactly kiln's render"
        );
        assert!(
            s.objects[&sa_path]["metadata"]["labels"]
                .get("team")
                .is_none()
        );
    }
    let events: Vec<Value> = calls(&server, &Method::POST)
        .into_iter()
        .map(|c| c.body)
        .filter(|b| b["reason"] == "DriftRemoved")
        .collect();
    let on = |name: &str, kind: &str| {
        events
            .iter()
            .find(|e| e["regarding"]["name"] == name && e["regarding"]["kind"] == kind)
            .map(|e| {
                (
                    e["type"].clone(),
                    e["note"].as_str().unwrap_or_default().to_string(),
                )
            })
    };
    let (type_, note) = on("nvidia-dcgm-exporter", "DaemonSet").expect("an Event on the DaemonSet");
    assert_eq!(type_, "Warning");
    assert_eq!(
        note,
        format!(
            "removed what kiln does not render, set by intruder: \
             spec.template.spec.containers[name=sidecar], \
             spec.template.spec.containers[name={}].env[name=INJECTED]",
            rendered["template"]["spec"]["containers"][0]["name"]
                .as_str()
                .unwrap()
        )
    );
    let (_, note) = on("nvidia-dcgm-exporter", "ServiceAccount").expect("an Event on the SA");
    assert!(
        note.ends_with("set by intruder: metadata.labels.team"),
        "{note}"
    );
    assert_eq!(events.len(), 2, "{events:?}");

    // The next reconcile finds nothing to remove (the fake keeps the intruder's stale
    // managed fields, which now name nothing the objects hold) and sends nothing.
    sync_caches(&server, &mut caches, 2);
    server.lock().unwrap().calls.clear();
    reconcile(typed(&p), ctx).await.unwrap();
    let sent: Vec<String> = server
        .lock()
        .unwrap()
        .calls
        .iter()
        .map(|c| format!("{} {}", c.method, c.path))
        .collect();
    assert!(sent.is_empty(), "{sent:?}");
}
