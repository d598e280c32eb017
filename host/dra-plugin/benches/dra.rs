//! `cargo bench -p kiln-dra-plugin --features kube --bench dra`: prints
//!
//! 1. NodePrepareResources latency per claim over the plugin's real Unix socket (an 8-GPU
//!    fake node, claims of one GPU each from an in-memory claim source, each prepared —
//!    time-slicing config, CDI spec, checkpoint — and unprepared again): p50, p99, max;
//! 2. the API requests the node's ResourceSlice costs: at start, at rest (many health
//!    intervals without a change), on one device change (a GPU turns unhealthy) and on its
//!    recovery, counted at an in-memory API server that answers like the real one.
//!
//! Figures, not assertions (the tests check behaviour); recorded in docs/benchmarks.md.

use std::{
    collections::BTreeSet,
    convert::Infallible,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use axum::http::{Request, Response, StatusCode};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kiln_device_plugin::{config::Config, settings::Overrides, settings::Settings};
use kiln_dra_plugin::{
    checkpoint,
    config::Recorder,
    metrics::Metrics,
    proto::dra::{
        Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
        dra_plugin_client::DraPluginClient,
    },
    publish::Publisher,
    runtime::device_health,
    server::{self, DraService, HealthService, RegistrationService, Served, StaticClaims},
    slices,
    state::{DeviceState, StateOptions},
};
use kiln_gpu::{FakeBackend, GpuInventory};
use serde_json::json;

const NODE: &str = "bench-node";
const CLAIMS: usize = 500;

fn fixture() -> FakeBackend {
    let gpus: Vec<String> = (0..8)
        .map(|i| {
            format!(
                "  - {{uuid: GPU-{i}0000000-0000-0000-0000-000000000000, name: NVIDIA H100 80GB HBM3, \
                 pci_bus_id: \"00000000:{:02X}:00.0\", memory_total_mib: 81559, compute_capability: \"9.0\"}}",
                0x18 + i
            )
        })
        .collect();
    let yaml = format!(
        "driver_version: \"570.86.15\"\ncuda_version: \"12.8\"\ngpus:\n{}\n",
        gpus.join("\n")
    );
    FakeBackend::new(serde_yaml_ng::from_str(&yaml).unwrap())
}

fn claim(i: usize) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": format!("c{i}"), "namespace": "bench", "uid": format!("uid-{i}")},
        "spec": {},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": format!("gpu-{}", i % 8)}],
            "config": [{"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}}}}]
        }}}
    }))
    .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

async fn prepare_latency() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let fake = fixture();
    let sys = fake.system().unwrap();
    let all = slices::allocatable(&fake.devices().unwrap(), &sys);
    let plugin_dir = server::plugin_dir(&root.join("plugins"));
    let state = DeviceState::new(
        StateOptions {
            node: NODE.into(),
            checkpoint: plugin_dir.join(checkpoint::FILE_NAME),
            cdi_root: root.join("cdi"),
            settings: Settings::resolve(&Overrides::default(), &Config::default()).unwrap(),
            container_driver_root: root.join("driver-root"),
            applier: Arc::new(Recorder::default()),
        },
        all.clone(),
        sys.driver_version,
    )
    .unwrap();
    let claims = Arc::new(StaticClaims::default());
    for i in 0..CLAIMS {
        claims.insert(claim(i));
    }
    let (_h, health_rx) = tokio::sync::watch::channel(Arc::new(device_health(
        &all,
        &[],
        NODE,
        std::time::SystemTime::now(),
    )));
    let dra_socket = plugin_dir.join(server::DRA_SOCKET);
    let (registration, _s) = RegistrationService::new(&dra_socket);
    let served = Served::start(
        server::registration_socket(&root.join("registry")),
        dra_socket.clone(),
        registration,
        DraService::new(
            Arc::new(Mutex::new(state)),
            claims,
            Arc::new(Metrics::default()),
        ),
        HealthService::new(health_rx),
    )
    .unwrap();
    let ch = tonic::transport::Endpoint::from_shared(format!("unix://{}", dra_socket.display()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = DraPluginClient::new(ch);
    let mut took = Vec::with_capacity(CLAIMS);
    for i in 0..CLAIMS {
        let c = Claim {
            namespace: "bench".into(),
            uid: format!("uid-{i}"),
            name: format!("c{i}"),
        };
        let start = Instant::now();
        let resp = client
            .node_prepare_resources(NodePrepareResourcesRequest {
                claims: vec![c.clone()],
            })
            .await
            .unwrap()
            .into_inner();
        took.push(start.elapsed());
        assert_eq!(resp.claims[&c.uid].error, "");
        client
            .node_unprepare_resources(NodeUnprepareResourcesRequest { claims: vec![c] })
            .await
            .unwrap();
    }
    took.sort();
    println!(
        "prepare (one claim, 1 GPU, time-slicing config, over the socket), {CLAIMS} claims: \
         p50 {:?}, p99 {:?}, max {:?}",
        percentile(&took, 0.5),
        percentile(&took, 0.99),
        took[took.len() - 1]
    );
    served.stop().await;
}

/// An API server that knows one Node and stores the slice it is sent.
fn api(requests: Arc<AtomicU64>) -> kube::Client {
    let stored: Arc<Mutex<Option<serde_json::Value>>> = Arc::default();
    let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
        let requests = requests.clone();
        let stored = stored.clone();
        async move {
            requests.fetch_add(1, Ordering::Relaxed);
            let path = req.uri().path().to_owned();
            let method = req.method().clone();
            let body = axum::body::to_bytes(axum::body::Body::new(req.into_body()), usize::MAX)
                .await
                .unwrap_or_default();
            let (status, out) = if path.ends_with(&format!("/nodes/{NODE}")) {
                (
                    StatusCode::OK,
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid"}}),
                )
            } else if method == axum::http::Method::POST || method == axum::http::Method::PUT {
                let mut v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let n = requests.load(Ordering::Relaxed);
                v["metadata"]["resourceVersion"] = json!(n.to_string());
                *stored.lock().unwrap() = Some(v.clone());
                (StatusCode::OK, v)
            } else {
                match stored.lock().unwrap().clone() {
                    Some(v) => (StatusCode::OK, v),
                    None => (
                        StatusCode::NOT_FOUND,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "reason": "NotFound", "code": 404, "message": "not found"}),
                    ),
                }
            };
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(serde_json::to_vec(&out).unwrap()))
                    .unwrap(),
            )
        }
    });
    kube::Client::new(svc, "default")
}

async fn slice_requests() {
    let fake = fixture();
    let all = slices::allocatable(&fake.devices().unwrap(), &fake.system().unwrap());
    let requests = Arc::new(AtomicU64::new(0));
    let mut p = Publisher::new(api(requests.clone()), NODE).await;
    p.publish(slices::published(&all, &BTreeSet::new()))
        .await
        .unwrap();
    let start = requests.load(Ordering::Relaxed);
    let intervals = 3600;
    for _ in 0..intervals {
        p.publish(slices::published(&all, &BTreeSet::new()))
            .await
            .unwrap();
    }
    let rest = requests.load(Ordering::Relaxed) - start;
    p.publish(slices::published(&all, &[3].into()))
        .await
        .unwrap();
    let change = requests.load(Ordering::Relaxed) - start - rest;
    p.publish(slices::published(&all, &BTreeSet::new()))
        .await
        .unwrap();
    let recovery = requests.load(Ordering::Relaxed) - start - rest - change;
    println!(
        "ResourceSlice API requests (8 GPUs): start {start} (Node read, slice read, create); \
         at rest {rest} over {intervals} health intervals; one GPU unhealthy {change}; \
         its recovery {recovery}"
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        prepare_latency().await;
        slice_requests().await;
    });
}
