//! A stand-in kubelet over the plugin's real Unix sockets: it registers the plugin the way the
//! kubelet's plugin manager does (GetInfo on `<registrar>/gpu.nvidia.com-reg.sock`, then
//! NotifyRegistrationStatus), dials the endpoint it was given, watches device health, prepares
//! claims, restarts the plugin mid-way (sockets gone, checkpoint kept) and unprepares.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::resource::v1::ResourceClaim;
use kiln_device_plugin::{config::Config, settings::Overrides, settings::Settings};
use kiln_dra_plugin::{
    checkpoint,
    config::Recorder,
    metrics::Metrics,
    proto::{
        dra::{
            Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
            dra_plugin_client::DraPluginClient,
        },
        health::{
            HealthStatus, NodeWatchResourcesRequest,
            dra_resource_health_client::DraResourceHealthClient,
        },
        registration::{InfoRequest, RegistrationStatus, registration_client::RegistrationClient},
    },
    runtime::device_health,
    server::{self, DraService, HealthService, RegistrationService, Served, StaticClaims},
    slices,
    state::{DeviceState, StateOptions},
};
use kiln_gpu::{FakeBackend, GpuInventory};
use serde_json::json;
use tonic::transport::Channel;

const NODE: &str = "node-a";
const FIXTURE: &str = r#"
driver_version: "550.144.03"
cuda_version: "12.4"
gpus:
  - {uuid: GPU-0, name: NVIDIA H100 80GB HBM3, memory_total_mib: 81559, compute_capability: "9.0"}
  - {uuid: GPU-1, name: NVIDIA H100 80GB HBM3, memory_total_mib: 81559, compute_capability: "9.0"}
"#;

async fn channel(path: &Path) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("unix://{}", path.display()))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("dialing {}: {e}", path.display()))
}

fn claim(uid: &str, name: &str, device: &str, config: Option<serde_json::Value>) -> ResourceClaim {
    let mut alloc = json!({"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": device}]}});
    if let Some(c) = config {
        alloc["devices"]["config"] = json!([{"source": "FromClaim", "opaque": {
            "driver": "gpu.nvidia.com", "parameters": c}}]);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "team", "uid": uid},
        "spec": {},
        "status": {"allocation": alloc}
    }))
    .unwrap()
}

struct Plugin {
    served: Served,
    status: tokio::sync::watch::Receiver<Option<RegistrationStatus>>,
    health: tokio::sync::watch::Sender<Arc<Vec<kiln_dra_plugin::proto::health::DeviceHealth>>>,
    recorder: Arc<Recorder>,
}

fn start(root: &Path, claims: Arc<StaticClaims>) -> Plugin {
    let fake = FakeBackend::new(serde_yaml_ng::from_str(FIXTURE).unwrap());
    let sys = fake.system().unwrap();
    let all = slices::allocatable(&fake.devices().unwrap(), &sys);
    let plugin_dir = server::plugin_dir(&root.join("plugins"));
    let recorder = Arc::new(Recorder::default());
    let state = DeviceState::new(
        StateOptions {
            node: NODE.into(),
            checkpoint: plugin_dir.join(checkpoint::FILE_NAME),
            cdi_root: root.join("cdi"),
            settings: Settings::resolve(&Overrides::default(), &Config::default()).unwrap(),
            container_driver_root: root.join("driver-root"),
            applier: recorder.clone(),
        },
        all.clone(),
        sys.driver_version,
    )
    .unwrap();
    let (health, health_rx) = tokio::sync::watch::channel(Arc::new(device_health(
        &all,
        &[],
        NODE,
        std::time::SystemTime::now(),
    )));
    let dra_socket = plugin_dir.join(server::DRA_SOCKET);
    let (registration, status) = RegistrationService::new(&dra_socket);
    let served = Served::start(
        server::registration_socket(&root.join("registry")),
        dra_socket,
        registration,
        DraService::new(
            Arc::new(Mutex::new(state)),
            claims,
            Arc::new(Metrics::default()),
        ),
        HealthService::new(health_rx),
    )
    .unwrap();
    Plugin {
        served,
        status,
        health,
        recorder,
    }
}

/// The kubelet's registration handshake; returns the DRA endpoint it was given.
async fn register(root: &Path, plugin: &mut Plugin) -> PathBuf {
    let reg = root.join("registry/gpu.nvidia.com-reg.sock");
    let mut client = RegistrationClient::new(channel(&reg).await);
    let info = client.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.nvidia.com");
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    client
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    let s = plugin
        .status
        .wait_for(Option::is_some)
        .await
        .unwrap()
        .clone()
        .unwrap();
    assert!(s.plugin_registered);
    PathBuf::from(info.endpoint)
}

fn req(uids: &[(&str, &str)]) -> Vec<Claim> {
    uids.iter()
        .map(|(uid, name)| Claim {
            namespace: "team".into(),
            uid: (*uid).into(),
            name: (*name).into(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_prepare_restart_midway_and_unprepare() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let claims = Arc::new(StaticClaims::default());
    let ts = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}});
    claims.insert(claim("uid-a", "a", "gpu-0", None));
    claims.insert(claim("uid-b", "b", "gpu-1", Some(ts)));
    let mps = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS"}});
    claims.insert(claim("uid-m", "m", "gpu-1", Some(mps)));

    let mut plugin = start(root, claims.clone());
    let endpoint = register(root, &mut plugin).await;
    assert_eq!(endpoint, root.join("plugins/gpu.nvidia.com/dra.sock"));

    // Health: the full list at once, then a change.
    let mut health = DraResourceHealthClient::new(channel(&endpoint).await)
        .node_watch_resources(NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = health.message().await.unwrap().unwrap();
    assert_eq!(first.devices.len(), 2);
    assert!(
        first
            .devices
            .iter()
            .all(|d| d.health == i32::from(HealthStatus::Healthy))
    );

    let mut dra = DraPluginClient::new(channel(&endpoint).await);
    let resp = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: req(&[
                ("uid-a", "a"),
                ("uid-b", "b"),
                ("uid-m", "m"),
                ("uid-x", "x"),
            ]),
        })
        .await
        .unwrap()
        .into_inner();
    let a = &resp.claims["uid-a"];
    assert_eq!(a.error, "");
    assert_eq!(a.devices[0].device_name, "gpu-0");
    assert_eq!(a.devices[0].pool_name, NODE);
    assert_eq!(a.devices[0].request_names, ["gpu"]);
    assert_eq!(
        a.devices[0].cdi_device_ids,
        ["k8s.gpu.nvidia.com/claim=uid-a-gpu-0"]
    );
    assert_eq!(resp.claims["uid-b"].error, "");
    assert!(
        resp.claims["uid-m"]
            .error
            .contains("MPS sharing is not supported")
    );
    assert_eq!(
        resp.claims["uid-x"].error,
        "claim team/x (uid uid-x) not found"
    );
    assert_eq!(
        *plugin.recorder.calls.lock().unwrap(),
        [("GPU-1".to_owned(), kiln_dra_plugin::config::TimeSlice::Long)]
    );
    // The returned ids are defined by the written spec.
    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.join("cdi/k8s.gpu.nvidia.com-claim_uid-a.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(spec["kind"], "k8s.gpu.nvidia.com/claim");
    assert_eq!(spec["devices"][0]["name"], "uid-a-gpu-0");

    // A device turns unhealthy: the stream says so.
    let fake = FakeBackend::new(serde_yaml_ng::from_str(FIXTURE).unwrap());
    let all = slices::allocatable(&fake.devices().unwrap(), &fake.system().unwrap());
    plugin.health.send_replace(Arc::new(device_health(
        &all,
        &[(1, 79)],
        NODE,
        std::time::SystemTime::now(),
    )));
    let second = health.message().await.unwrap().unwrap();
    assert_eq!(second.devices[1].health, i32::from(HealthStatus::Unhealthy));

    // Restart mid-way: the sockets go, the checkpoint stays.
    plugin.served.stop().await;
    assert!(!endpoint.exists());
    let mut plugin = start(root, claims.clone());
    let endpoint = register(root, &mut plugin).await;
    let mut dra = DraPluginClient::new(channel(&endpoint).await);
    let again = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: req(&[("uid-a", "a"), ("uid-b", "b")]),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims["uid-a"], resp.claims["uid-a"]);
    assert_eq!(again.claims["uid-b"], resp.claims["uid-b"]);
    // Not prepared twice: the time-slice was not set again.
    assert!(plugin.recorder.calls.lock().unwrap().is_empty());

    let un = dra
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: req(&[("uid-a", "a"), ("uid-b", "b"), ("uid-x", "x")]),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(un.claims.values().all(|c| c.error.is_empty()), "{un:?}");
    assert!(
        !root
            .join("cdi/k8s.gpu.nvidia.com-claim_uid-a.json")
            .exists()
    );
    assert_eq!(
        *plugin.recorder.calls.lock().unwrap(),
        [(
            "GPU-1".to_owned(),
            kiln_dra_plugin::config::TimeSlice::Default
        )]
    );
    let on_disk = checkpoint::load(&root.join("plugins/gpu.nvidia.com/checkpoint.json")).unwrap();
    assert!(on_disk.is_empty());
    plugin.served.stop().await;
}
