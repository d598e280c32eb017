//! The plugin step with `WITH_WORKLOAD=true` against an in-process API server (plain HTTP on
//! loopback, answering the few requests the step makes): the earlier workload pod on the node
//! is deleted, the new one has upstream's shape on this node requesting one GPU, the step
//! waits for it to succeed, and a failing pod is reported with its container and reason.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::serde_json::{self, Value, json};
use kiln_validator::workload::WorkloadSpec;
use kiln_validator::{ExpectedResource, KubeNodes, NodeSource};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const NS: &str = "gpu-operator";
const NODE: &str = "gpu-node-1";

/// What the fake API server saw and how the workload pod's reads answer.
#[derive(Default)]
struct Api {
    /// `METHOD path` of each request.
    calls: Vec<String>,
    /// The pod as created.
    created: Option<Value>,
    /// The statuses the created pod's reads return, in turn (the last one repeats).
    statuses: Vec<Value>,
    reads: usize,
}

fn respond(api: &Mutex<Api>, method: &str, path: &str, body: &str) -> (u16, Value) {
    let mut a = api.lock().unwrap();
    a.calls
        .push(format!("{method} {}", path.split('?').next().unwrap()));
    let pods = format!("/api/v1/namespaces/{NS}/pods");
    match (method, path) {
        ("GET", p) if p.starts_with(&format!("/api/v1/nodes/{NODE}")) => (
            200,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                "status": {"allocatable": {"nvidia.com/gpu": "2", "cpu": "8"}}}),
        ),
        ("GET", p) if p.starts_with(&format!("/apis/apps/v1/namespaces/{NS}/daemonsets/")) => (
            200,
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": "nvidia-operator-validator", "namespace": NS,
                    "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                        "name": "cluster-policy", "uid": "u1", "controller": true}]},
                "spec": {"selector": {}, "template": {"spec": {"containers": [],
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                        "effect": "NoSchedule"}]}}}}),
        ),
        ("GET", p) if p.starts_with(&format!("{pods}?")) => {
            assert!(
                p.contains("labelSelector=app%3Dnvidia-device-plugin-validator")
                    && p.contains("fieldSelector=spec.nodeName%3Dgpu-node-1"),
                "{p}"
            );
            (
                200,
                json!({"apiVersion": "v1", "kind": "PodList", "metadata": {},
                    "items": [{"metadata": {"name": "nvidia-device-plugin-validator-old"}}]}),
            )
        }
        ("DELETE", _) => (
            200,
            json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}),
        ),
        ("POST", p) if p.starts_with(&pods) => {
            let mut pod: Value = serde_json::from_str(body).unwrap();
            pod["metadata"]["name"] = "nvidia-device-plugin-validator-abcde".into();
            a.created = Some(pod.clone());
            (201, pod)
        }
        ("GET", p) if p.starts_with(&format!("{pods}/nvidia-device-plugin-validator-abcde")) => {
            let mut pod = a.created.clone().unwrap();
            let i = a.reads.min(a.statuses.len() - 1);
            pod["status"] = a.statuses[i].clone();
            a.reads += 1;
            (200, pod)
        }
        _ => (
            404,
            json!({"kind": "Status", "code": 404, "message": "not here"}),
        ),
    }
}

/// Serves `api` on a loopback port until the runtime ends; returns the port.
async fn serve(api: Arc<Mutex<Api>>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let api = api.clone();
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                let mut r = BufReader::new(r);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let mut parts = line.split_whitespace();
                    let (method, path) = (
                        parts.next().unwrap_or("").to_owned(),
                        parts.next().unwrap_or("").to_owned(),
                    );
                    let mut length = 0;
                    loop {
                        let mut h = String::new();
                        r.read_line(&mut h).await.unwrap();
                        if h.trim().is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':')
                            && k.eq_ignore_ascii_case("content-length")
                        {
                            length = v.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; length];
                    r.read_exact(&mut body).await.unwrap();
                    let (code, answer) =
                        respond(&api, &method, &path, &String::from_utf8_lossy(&body));
                    let text = answer.to_string();
                    let head = format!(
                        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                        text.len()
                    );
                    if w.write_all(head.as_bytes()).await.is_err()
                        || w.write_all(text.as_bytes()).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    port
}

fn spec() -> WorkloadSpec {
    WorkloadSpec::from_env(NODE, |k| {
        match k {
            "OPERATOR_NAMESPACE" => Some(NS),
            "VALIDATOR_IMAGE" => Some("ghcr.io/kiln-dev/kiln:0.1.0"),
            "VALIDATOR_IMAGE_PULL_POLICY" => Some("Always"),
            _ => None,
        }
        .map(str::to_owned)
    })
    .unwrap()
}

/// Runs the plugin step with the workload against a fake API whose pod reads return
/// `statuses`; returns the step's result and the fake's record.
fn run(statuses: Vec<Value>) -> (Result<u64, String>, Arc<Mutex<Api>>) {
    let api = Arc::new(Mutex::new(Api {
        statuses,
        ..Api::default()
    }));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let port = rt.block_on(serve(api.clone()));
    let mut config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
    config.default_namespace = NS.into();
    let step_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The client's buffer task lives on the runtime the step drives.
    let client = step_rt.block_on(async { kube::Client::try_from(config).unwrap() });
    let nodes = KubeNodes::with_client(client, step_rt).workload_poll(Duration::from_millis(1), 5);
    let dir = tempfile::tempdir().unwrap();
    let v = kiln_validator::Validator {
        layout: kiln_validator::Layout::new(dir.path()),
        host: kiln_validator::HostPaths::default(),
        retry: kiln_validator::RetryPolicy {
            attempts: 1,
            interval: Duration::ZERO,
            sleeper: Arc::new(|_| {}),
        },
        open_gpu: Box::new(|_| Err(kiln_gpu::GpuError::NoSuchDevice(0))),
        make_node: Box::new(|_, _, _| Ok(())),
        cuda: Box::new(kiln_validator::DynamicCuda),
    };
    let r = v
        .plugin_with_workload(&nodes, NODE, ExpectedResource::Gpu, &spec())
        .map_err(|e| format!("{:#}", anyhow_chain(&e)));
    drop(nodes);
    drop(rt);
    (r, api)
}

fn anyhow_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[test]
fn the_workload_pod_replaces_the_earlier_one_requests_one_gpu_and_must_succeed() {
    let (r, api) = run(vec![
        json!({"phase": "Pending"}),
        json!({"phase": "Succeeded"}),
    ]);
    assert_eq!(r, Ok(2));
    let a = api.lock().unwrap();
    assert_eq!(
        a.calls,
        [
            "GET /api/v1/nodes/gpu-node-1",
            "GET /api/v1/nodes/gpu-node-1",
            "GET /apis/apps/v1/namespaces/gpu-operator/daemonsets/nvidia-operator-validator",
            "GET /api/v1/namespaces/gpu-operator/pods",
            "DELETE /api/v1/namespaces/gpu-operator/pods/nvidia-device-plugin-validator-old",
            "POST /api/v1/namespaces/gpu-operator/pods",
            "GET /api/v1/namespaces/gpu-operator/pods/nvidia-device-plugin-validator-abcde",
            "GET /api/v1/namespaces/gpu-operator/pods/nvidia-device-plugin-validator-abcde",
        ]
    );
    let pod = a.created.as_ref().unwrap();
    assert_eq!(pod["spec"]["nodeName"], NODE);
    assert_eq!(
        pod["metadata"]["ownerReferences"][0]["kind"],
        "ClusterPolicy"
    );
    assert_eq!(pod["spec"]["tolerations"][0]["key"], "nvidia.com/gpu");
    let init = &pod["spec"]["initContainers"][0];
    assert_eq!(init["imagePullPolicy"], "Always");
    assert_eq!(init["resources"]["limits"], json!({"nvidia.com/gpu": "1"}));
}

#[test]
fn a_failing_workload_pod_is_reported_with_its_container_and_reason() {
    let (r, _) = run(vec![json!({"phase": "Pending", "initContainerStatuses": [{
        "name": "plugin-validation", "ready": false, "restartCount": 1, "image": "", "imageID": "",
        "state": {"waiting": {"reason": "PodInitializing"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
            "message": "cuda: NVML lists no GPU"}}}]})]);
    let e = r.unwrap_err();
    assert!(
        e.contains(
            "GPU workload pod: nvidia-device-plugin-validator-abcde (requesting one nvidia.com/gpu): \
             container plugin-validation exited 1: Error: cuda: NVML lists no GPU"
        ),
        "{e}"
    );
    let (r, _) = run(vec![json!({"phase": "Pending"})]);
    let e = r.unwrap_err();
    assert!(e.contains("still Pending after 5 reads"), "{e}");
}

#[test]
fn without_an_api_server_the_workload_is_refused() {
    let alloc: BTreeMap<String, String> = [("nvidia.com/gpu".to_owned(), "1".to_owned())].into();
    assert!(alloc.run_workload(&spec(), "nvidia.com/gpu").is_err());
}
