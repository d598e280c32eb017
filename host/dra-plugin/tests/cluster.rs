//! kiln's DRA plugin against a real control plane (testcluster): the plugin's run loop for a
//! simulated node with the fake GPU backend publishes the node's ResourceSlice, without the GPU
//! that reports a fatal XID at start and with it again once it recovered (generation 2), and
//! leaves the slice alone while nothing changes; a pod with a
//! ResourceClaim for NVIDIA's DeviceClass `gpu.nvidia.com` (created here as NVIDIA's chart
//! does) is scheduled by the real scheduler, which allocates a device of that slice; the test
//! then plays the node's kubelet (kwok nodes run none) and calls NodePrepareResources over the
//! plugin's socket: the CDI ids it returns are devices of the spec written for the claim.

use std::{path::Path, time::Duration};

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{DeviceClass, ResourceClaim, ResourceSlice},
};
use kiln_device_plugin::{
    config::Config,
    health::XidFilter,
    settings::{Overrides, Settings},
};
use kiln_dra_plugin::{
    proto::{
        dra::{Claim, NodePrepareResourcesRequest, dra_plugin_client::DraPluginClient},
        registration::{InfoRequest, registration_client::RegistrationClient},
    },
    runtime::{Options, run},
    slices::slice_name,
};
use kiln_testcluster::{namespace, shared, shared_access};
use kube::api::{Api, PostParams};
use serde_json::json;

const NODE: &str = "dra-node";
const FIXTURE: &str = r#"
driver_version: "570.86.15"
cuda_version: "12.8"
gpus:
  - {uuid: GPU-d0000000-0000-0000-0000-000000000000, name: NVIDIA H100 80GB HBM3, pci_bus_id: "00000000:8D:00.0", memory_total_mib: 81559, compute_capability: "9.0"}
  - {uuid: GPU-d1000000-0000-0000-0000-000000000000, name: NVIDIA H100 80GB HBM3, pci_bus_id: "00000000:9D:00.0", memory_total_mib: 81559, compute_capability: "9.0", xid_events: [79]}
"#;

async fn dial(path: &Path) -> anyhow::Result<tonic::transport::Channel> {
    Ok(
        tonic::transport::Endpoint::from_shared(format!("unix://{}", path.display()))?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await?,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_allocates_from_kilns_slice_and_prepare_returns_defined_cdi_ids()
-> anyhow::Result<()> {
    let cluster = shared()?;
    let _guard = shared_access().await;
    let client = cluster.client().await?;
    cluster.add_node(NODE, 0)?;
    cluster.label_node(NODE, &[("kiln.test/dra", Some("true"))])?;
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let class: DeviceClass = serde_yaml_ng::from_str(include_str!(
        "../../../assets/state-dra-driver/1800_deviceclass_gpu-nvidia-com.yaml"
    ))?;
    match classes.create(&PostParams::default(), &class).await {
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        other => {
            other?;
        }
    }

    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    let fixture = root.join("gpus.yaml");
    std::fs::write(&fixture, FIXTURE)?;
    let opts = Options {
        node_name: NODE.into(),
        registrar_dir: root.join("registry"),
        plugins_dir: root.join("plugins"),
        cdi_root: root.join("cdi"),
        backend: kiln_gpu::BackendSpec::Fake(fixture),
        settings: Settings::resolve(&Overrides::default(), &Config::default())
            .map_err(|e| anyhow::anyhow!("{e}"))?,
        container_driver_root: root.join("driver-root"),
        nvidia_smi: None,
        health_interval: Duration::from_millis(100),
        recovery_after: Duration::from_secs(2),
        xid_filter: XidFilter::default(),
        http_endpoint: None,
        metrics_path: "/metrics".into(),
        claim_wait: Duration::from_secs(20),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let plugin = tokio::spawn(run(opts, client.clone(), async {
        let _ = stopped.await;
    }));

    // The slice: GPU 1 reported XID 79, so only gpu-0 at generation 1; after the quiet time
    // GPU 1 answers again and is back at generation 2.
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let devices = |s: &ResourceSlice| -> Vec<String> {
        s.spec
            .devices
            .iter()
            .flatten()
            .map(|d| d.name.clone())
            .collect()
    };
    let first = cluster
        .wait_for("the node's ResourceSlice", Duration::from_secs(20), || {
            let slices = slices.clone();
            async move {
                Ok(slices
                    .get_opt(&slice_name(NODE))
                    .await?
                    .ok_or_else(|| "no slice yet".to_owned()))
            }
        })
        .await?;
    assert_eq!(first.spec.driver, "gpu.nvidia.com");
    assert_eq!(first.spec.pool.name, NODE);
    assert_eq!(first.spec.pool.generation, 1);
    assert_eq!(devices(&first), ["gpu-0"]);
    let slice = cluster
        .wait_for("GPU 1 back in the slice", Duration::from_secs(20), || {
            let slices = slices.clone();
            async move {
                let s = slices.get(&slice_name(NODE)).await?;
                Ok(if s.spec.pool.generation == 2 {
                    Ok(s)
                } else {
                    Err(format!("generation {}", s.spec.pool.generation))
                })
            }
        })
        .await?;
    assert_eq!(devices(&slice), ["gpu-0", "gpu-1"]);
    // At rest (a dozen health intervals) the slice is not written again.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let again = slices.get(&slice_name(NODE)).await?;
    assert_eq!(
        again.metadata.resource_version,
        slice.metadata.resource_version
    );

    // A pod with a claim for one GPU of class gpu.nvidia.com.
    let ns = namespace(&client, "dra").await?;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "one-gpu"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression":
                "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3' && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('79Gi')) >= 0"}}]
        }}]}}
    }))?;
    let claim = claims.create(&PostParams::default(), &claim).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "trainer"},
        "spec": {
            "nodeSelector": {"kiln.test/dra": "true"},
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}],
            "containers": [{"name": "c", "image": "busybox",
                "resources": {"claims": [{"name": "gpu"}]}}]
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let allocated = cluster
        .wait_for("the claim's allocation", Duration::from_secs(30), || {
            let claims = claims.clone();
            let pods = pods.clone();
            async move {
                let c = claims.get("one-gpu").await?;
                let allocated = c
                    .status
                    .as_ref()
                    .and_then(|s| s.allocation.as_ref())
                    .is_some();
                Ok(if allocated {
                    Ok(c)
                } else {
                    let pod = pods.get("trainer").await?;
                    Err(format!(
                        "not allocated: {:?}; pod: {:?}",
                        c.status,
                        pod.status.and_then(|s| s.conditions)
                    ))
                })
            }
        })
        .await?;
    let result = allocated
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap();
    assert_eq!(result.len(), 1);
    assert_eq!(result[0].driver, "gpu.nvidia.com");
    assert_eq!(result[0].pool, NODE);
    let scheduled = cluster
        .wait_for("the pod's node", Duration::from_secs(30), || {
            let pods = pods.clone();
            async move {
                Ok(pods
                    .get("trainer")
                    .await?
                    .spec
                    .and_then(|s| s.node_name)
                    .ok_or_else(|| "not scheduled".to_owned()))
            }
        })
        .await?;
    assert_eq!(scheduled, NODE);

    // The kubelet's part: registration, then prepare over the socket.
    let mut reg =
        RegistrationClient::new(dial(&root.join("registry/gpu.nvidia.com-reg.sock")).await?);
    let info = reg.get_info(InfoRequest {}).await?.into_inner();
    let mut dra = DraPluginClient::new(dial(Path::new(&info.endpoint)).await?);
    let uid = claim.metadata.uid.clone().unwrap();
    let resp = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![Claim {
                namespace: ns.clone(),
                uid: uid.clone(),
                name: "one-gpu".into(),
            }],
        })
        .await?
        .into_inner();
    let prepared = &resp.claims[&uid];
    assert_eq!(prepared.error, "");
    assert_eq!(prepared.devices.len(), 1);
    assert_eq!(prepared.devices[0].device_name, result[0].device);
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(
        root.join(format!("cdi/k8s.gpu.nvidia.com-claim_{uid}.json")),
    )?)?;
    let kind = spec["kind"].as_str().unwrap();
    let defined: Vec<String> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| format!("{kind}={}", d["name"].as_str().unwrap()))
        .collect();
    assert!(!prepared.devices[0].cdi_device_ids.is_empty());
    for id in &prepared.devices[0].cdi_device_ids {
        assert!(defined.contains(id), "{id} not in {defined:?}");
    }

    let _ = stop.send(());
    plugin.await?.map_err(|e| anyhow::anyhow!("{e}"))?;
    pods.delete("trainer", &Default::default()).await?;
    slices
        .delete(&slice_name(NODE), &Default::default())
        .await?;
    Ok(())
}
