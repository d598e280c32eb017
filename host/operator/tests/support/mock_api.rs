//! An in-memory API server behind a real `kube::Client` (a `tower` service, in the style of
//! controller-rs's mock API tests), shared by the reconciler scenarios and the NVIDIADriver
//! controller tests. It serves discovery for the kinds the operator applies, GET (one object,
//! or a list of a collection's direct children filtered by equality `labelSelector` terms and a
//! `spec.nodeName` `fieldSelector`; a namespaced kind's collection without a namespace lists
//! every namespace's, as `/api/v1/pods` does), merge PATCH (creating the object when absent, as
//! server-side apply does), JSON PATCH (RFC 6902, `test` failures answered 422 as the API server
//! does), DELETE and POST; a watch (`watch=true`) and everything else is 404, so a watcher keeps
//! what its first list held. Every request is recorded for the tests to assert on.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

/// One recorded request: method, path (no query) and JSON body (`Null` when none).
#[derive(Debug, Clone)]
pub struct Call {
    pub method: Method,
    pub path: String,
    pub body: Value,
}

/// The fake API server's state: objects by path (`/api/v1/nodes/n1`, no subresource), and
/// every request seen, in order.
#[derive(Default)]
pub struct Server {
    pub objects: BTreeMap<String, Value>,
    pub calls: Vec<Call>,
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
            ("namespaces", "Namespace", false),
        ],
        "apps/v1" => &[
            ("daemonsets", "DaemonSet", true),
            ("deployments", "Deployment", true),
            ("controllerrevisions", "ControllerRevision", true),
        ],
        "resource.k8s.io/v1" => &[
            ("deviceclasses", "DeviceClass", false),
            ("resourceclaimtemplates", "ResourceClaimTemplate", true),
        ],
        "admissionregistration.k8s.io/v1" => &[
            (
                "validatingadmissionpolicies",
                "ValidatingAdmissionPolicy",
                false,
            ),
            (
                "validatingadmissionpolicybindings",
                "ValidatingAdmissionPolicyBinding",
                false,
            ),
        ],
        "rbac.authorization.k8s.io/v1" => &[
            ("roles", "Role", true),
            ("rolebindings", "RoleBinding", true),
            ("clusterroles", "ClusterRole", false),
            ("clusterrolebindings", "ClusterRoleBinding", false),
        ],
        "node.k8s.io/v1" => &[("runtimeclasses", "RuntimeClass", false)],
        "nvidia.com/v1" => &[("clusterpolicies", "ClusterPolicy", false)],
        "nvidia.com/v1alpha1" => &[
            ("nvidiadrivers", "NVIDIADriver", false),
            ("gpuclusters", "GPUCluster", false),
        ],
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

/// RFC 7386 merge of `patch` into `target` (how the fake applies every PATCH).
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

/// `k=v,k2=v2` of a `labelSelector` query parameter (equality terms only).
fn selector(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter_map(|kv| kv.strip_prefix("labelSelector="))
        .flat_map(|s| {
            let s = s
                .replace("%3D", "=")
                .replace("%2C", ",")
                .replace("%2F", "/");
            s.split(',')
                .filter_map(|t| {
                    t.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The node a `fieldSelector=spec.nodeName=…` query parameter names (the only field selector
/// the operator sends: the driver upgrade's pods of one node).
fn node_field(query: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|kv| kv.strip_prefix("fieldSelector="))
        .find_map(|s| {
            s.replace("%3D", "=")
                .strip_prefix("spec.nodeName=")
                .map(str::to_string)
        })
}

/// Whether the stored object `key` is a direct child of the collection `path`, or, for a
/// collection without a namespace (`/api/v1/pods`), of that collection in any namespace.
fn in_collection(key: &str, path: &str) -> bool {
    if let Some(name) = key.strip_prefix(&format!("{path}/")) {
        return !name.contains('/');
    }
    let Some((base, resource)) = path.rsplit_once('/') else {
        return false;
    };
    let Some(rest) = key.strip_prefix(&format!("{base}/namespaces/")) else {
        return false;
    };
    matches!(rest.split('/').collect::<Vec<_>>().as_slice(), [_, r, _] if *r == resource)
}

impl Server {
    /// Stores `obj` at its path, found from its `apiVersion`, `kind`, namespace and name
    /// through the served kinds; panics on a kind the server does not serve.
    pub fn insert(&mut self, obj: Value) {
        let gv = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        let listed = discovery(gv).unwrap_or_else(|| panic!("{gv} is not served"));
        let resource = listed["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["kind"] == kind)
            .unwrap_or_else(|| panic!("{gv} {kind} is not served"));
        let root = if gv == "v1" {
            "/api/v1".to_string()
        } else {
            format!("/apis/{gv}")
        };
        let ns = match obj["metadata"]["namespace"].as_str() {
            Some(ns) if resource["namespaced"] == true => format!("/namespaces/{ns}"),
            _ => String::new(),
        };
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let plural = resource["name"].as_str().unwrap_or_default();
        self.objects
            .insert(format!("{root}{ns}/{plural}/{name}"), obj);
    }

    fn handle(
        &mut self,
        method: &Method,
        path: &str,
        query: &str,
        body: &Value,
    ) -> (StatusCode, Value) {
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
        let (name, sub) = match segs.as_slice() {
            [] => return discovery(&gv).map_or_else(not_found, |d| (StatusCode::OK, d)),
            ["namespaces", _, _] | [_] => (None, None),
            ["namespaces", _, _, name] | [_, name] => (Some(*name), None),
            ["namespaces", _, _, name, sub] | [_, name, sub] => (Some(*name), Some(*sub)),
            _ => return not_found(),
        };
        let key = match (name, sub) {
            (Some(_), Some(sub)) => path.trim_end_matches(&format!("/{sub}")).to_string(),
            _ => path.to_string(),
        };
        match (method, name) {
            (&Method::GET, None) if query.split('&').any(|kv| kv == "watch=true") => not_found(),
            (&Method::GET, None) => {
                let want = selector(query);
                let node = node_field(query);
                let items: Vec<Value> = self
                    .objects
                    .iter()
                    .filter(|(k, _)| in_collection(k, path))
                    .filter(|(_, v)| {
                        want.iter()
                            .all(|(k, val)| v["metadata"]["labels"][k].as_str() == Some(val))
                    })
                    .filter(|(_, v)| {
                        node.as_deref()
                            .is_none_or(|n| v["spec"]["nodeName"].as_str() == Some(n))
                    })
                    .map(|(_, v)| v.clone())
                    .collect();
                (
                    StatusCode::OK,
                    json!({"apiVersion": "v1", "kind": "List",
                        "metadata": {"resourceVersion": "1"}, "items": items}),
                )
            }
            (&Method::GET, Some(_)) => self
                .objects
                .get(&key)
                .map_or_else(not_found, |o| (StatusCode::OK, o.clone())),
            // A JSON patch (RFC 6902: a list of operations), `test` operations included.
            (&Method::PATCH, Some(_)) if body.is_array() => {
                let Some(obj) = self.objects.get_mut(&key) else {
                    return not_found();
                };
                let ops: json_patch::Patch = match serde_json::from_value(body.clone()) {
                    Ok(p) => p,
                    Err(e) => return (StatusCode::BAD_REQUEST, json!({"message": e.to_string()})),
                };
                let mut patched = obj.clone();
                match json_patch::patch(&mut patched, &ops) {
                    Ok(()) => {
                        *obj = patched;
                        (StatusCode::OK, obj.clone())
                    }
                    Err(e) => (
                        StatusCode::UNPROCESSABLE_ENTITY,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "Invalid", "code": 422, "message": e.to_string()}),
                    ),
                }
            }
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

/// A `kube::Client` over the fake server; every request is recorded in `server.calls`.
pub fn client(server: Arc<Mutex<Server>>) -> Client {
    let svc = tower::service_fn(move |req: Request<Body>| {
        let server = server.clone();
        async move {
            let method = req.method().clone();
            let path = req.uri().path().to_string();
            let query = req.uri().query().unwrap_or_default().to_string();
            let bytes = req.into_body().collect_bytes().await?;
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let (status, out) = {
                let mut s = server.lock().unwrap();
                s.calls.push(Call {
                    method: method.clone(),
                    path: path.clone(),
                    body: body.clone(),
                });
                s.handle(&method, &path, &query, &body)
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

/// The recorded `method` requests, in order.
pub fn calls(server: &Arc<Mutex<Server>>, method: &Method) -> Vec<Call> {
    let s = server.lock().unwrap();
    s.calls
        .iter()
        .filter(|c| c.method == method)
        .cloned()
        .collect()
}
