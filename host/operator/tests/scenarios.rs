//! Reconciler scenarios against an in-memory API server (a `tower` service behind a real
//! `kube::Client`, in the style of controller-rs's mock API tests): no cluster, no timing.
//! Each scenario calls [`reconcile`] once or twice on a fresh [`Context`] and asserts on the
//! requests the fake server recorded:
//! - a newer ClusterPolicy is `ignored`, and nothing but its status is written;
//! - every applied object carries `kiln.dev/state=<state>` and the policy as owner;
//! - a disabled state's labelled objects are deleted;
//! - after a restart (fresh context, no memory), an object labelled with a state that the
//!   render no longer produces (a site plugin's leftover) is deleted; one not owned by a
//!   ClusterPolicy is not.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::http::{Method, Request, Response, StatusCode};
use kiln_core::plan::STATE_LABEL;
use kiln_core::spec::ClusterPolicy;
use kiln_operator::live::{LiveCache, Meta};
use kiln_operator::metrics::Metrics;
use kiln_operator::reconcile::reconcile;
use kiln_operator::{Config, Context};
use kube::Client;
use kube::api::ApiResource;
use kube::client::Body;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde_json::{Value, json};

const NS: &str = "gpu-operator";

/// One recorded request: method, path (no query) and JSON body (`Null` when none).
#[derive(Debug, Clone)]
struct Call {
    method: Method,
    path: String,
    body: Value,
}

/// The fake API server's state: objects by path, and every request seen.
#[derive(Default)]
struct Server {
    objects: BTreeMap<String, Value>,
    calls: Vec<Call>,
}

/// The served kinds (resource, kind, namespaced) per group/version; other groups are 404.
fn discovery(gv: &str) -> Option<Value> {
    let r: &[(&str, &str, bool)] = match gv {
        "v1" => &[
            ("configmaps", "ConfigMap", true),
            ("serviceaccounts", "ServiceAccount", true),
            ("services", "Service", true),
            ("secrets", "Secret", true),
            ("pods", "Pod", true),
            ("nodes", "Node", false),
        ],
        "apps/v1" => &[
            ("daemonsets", "DaemonSet", true),
            ("controllerrevisions", "ControllerRevision", true),
        ],
        "rbac.authorization.k8s.io/v1" => &[
            ("roles", "Role", true),
            ("rolebindings", "RoleBinding", true),
            ("clusterroles", "ClusterRole", false),
            ("clusterrolebindings", "ClusterRoleBinding", false),
        ],
        "node.k8s.io/v1" => &[("runtimeclasses", "RuntimeClass", false)],
        "nvidia.com/v1" => &[("clusterpolicies", "ClusterPolicy", false)],
        _ => return None,
    };
    let resources: Vec<Value> = r
        .iter()
        .map(|(name, kind, ns)| {
            json!({"name": name, "singularName": "", "kind": kind, "namespaced": ns,
                "verbs": ["get", "list", "watch", "create", "patch", "delete"]})
        })
        .collect();
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
        "resources": resources}),
    )
}

/// RFC 7386 merge of `patch` into `target` (test helper for merge-patch requests).
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

fn not_found() -> (StatusCode, Value) {
    (
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

impl Server {
    fn handle(&mut self, method: &Method, path: &str, body: &Value) -> (StatusCode, Value) {
        let (gv, rest) = if let Some(r) = path.strip_prefix("/api/v1") {
            ("v1".to_string(), r)
        } else if let Some(r) = path.strip_prefix("/apis/") {
            let mut it = r.splitn(3, '/');
            let (g, v) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
            (
                format!("{g}/{v}"),
                &r[(g.len() + v.len() + 1).min(r.len())..],
            )
        } else {
            return not_found();
        };
        let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
        let (_resource, name, sub) = match segs.as_slice() {
            [] => return discovery(&gv).map_or_else(not_found, |d| (StatusCode::OK, d)),
            ["namespaces", _, res] | [res] => (*res, None, None),
            ["namespaces", _, res, name] | [res, name] => (*res, Some(*name), None),
            ["namespaces", _, res, name, sub] | [res, name, sub] => (*res, Some(*name), Some(*sub)),
            _ => return not_found(),
        };
        let key = match name {
            Some(_) => path
                .trim_end_matches(&format!("/{}", sub.unwrap_or("")))
                .to_string(),
            None => path.to_string(),
        };
        match (method, name) {
            (&Method::GET, None) => {
                let prefix = format!("{path}/");
                let items: Vec<Value> = self
                    .objects
                    .iter()
                    .filter(|(k, _)| k.starts_with(&prefix))
                    .map(|(_, v)| v.clone())
                    .collect();
                (
                    StatusCode::OK,
                    json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items}),
                )
            }
            (&Method::GET, Some(_)) => self
                .objects
                .get(&key)
                .map_or_else(not_found, |o| (StatusCode::OK, o.clone())),
            (&Method::PATCH, Some(_)) => {
                let obj = self.objects.entry(key).or_insert_with(
                    || json!({"metadata": {"uid": "uid", "generation": 1, "resourceVersion": "1"}}),
                );
                merge(obj, body);
                (StatusCode::OK, obj.clone())
            }
            (&Method::DELETE, Some(_)) => match self.objects.remove(&key) {
                Some(_) => (
                    StatusCode::OK,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                ),
                None => not_found(),
            },
            (&Method::POST, None) => (StatusCode::CREATED, body.clone()),
            _ => not_found(),
        }
    }
}

/// A `kube::Client` over the fake server.
fn client(server: Arc<Mutex<Server>>) -> Client {
    let svc = tower::service_fn(move |req: Request<Body>| {
        let server = server.clone();
        async move {
            let method = req.method().clone();
            let path = req.uri().path().to_string();
            let bytes = req.into_body().collect_bytes().await?;
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let (status, out) = {
                let mut s = server.lock().unwrap();
                s.calls.push(Call {
                    method: method.clone(),
                    path: path.clone(),
                    body: body.clone(),
                });
                s.handle(&method, &path, &body)
            };
            Ok::<_, kube::Error>(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&out).unwrap()))
                    .unwrap(),
            )
        }
    });
    Client::new(svc, "default")
}

fn policy(name: &str, created: &str, spec: Value) -> Value {
    json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "generation": 1,
            "creationTimestamp": created},
        "spec": spec})
}

/// The repository's sample policy spec.
fn sample_spec() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/samples/clusterpolicy.yaml"
    );
    let doc: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    doc["spec"].clone()
}

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
    let host = kiln_plugin_host::PluginHost::new(config, kiln_bundled_plugins::BUNDLED).unwrap();
    let renderer = kiln_render::Renderer::new(Arc::new(host));
    let config = Config {
        namespace: NS.into(),
        ..Config::default()
    };
    let ctx = Context::new(
        client(server.clone()),
        renderer,
        Arc::new(Metrics::new()),
        config,
        "v1.36.0".into(),
    );
    assert!(ctx.set_live(live));
    Arc::new(ctx)
}

fn server_with(policies: &[Value], gpu_nodes: usize) -> Arc<Mutex<Server>> {
    let mut s = Server::default();
    for p in policies {
        let name = p["metadata"]["name"].as_str().unwrap();
        s.objects.insert(
            format!("/apis/nvidia.com/v1/clusterpolicies/{name}"),
            p.clone(),
        );
    }
    for i in 0..gpu_nodes {
        let name = format!("gpu-node-{i}");
        s.objects.insert(
            format!("/api/v1/nodes/{name}"),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                "labels": {"feature.node.kubernetes.io/pci-10de.present": "true"}},
                "status": {"nodeInfo": {"containerRuntimeVersion": "containerd://2.0.0",
                    "architecture": "amd64", "bootID": "", "kernelVersion": "6.8.0",
                    "kubeProxyVersion": "", "kubeletVersion": "", "machineID": "",
                    "operatingSystem": "linux", "osImage": "", "systemUUID": ""}}}),
        );
    }
    Arc::new(Mutex::new(s))
}

fn typed(p: &Value) -> Arc<ClusterPolicy> {
    Arc::new(serde_json::from_value(p.clone()).unwrap())
}

fn calls(server: &Arc<Mutex<Server>>, method: &Method) -> Vec<Call> {
    let s = server.lock().unwrap();
    s.calls
        .iter()
        .filter(|c| c.method == method)
        .cloned()
        .collect()
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
    assert!(ds_gets > 0, "DaemonSets are still read for their status");
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
