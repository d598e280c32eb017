//! GPU health on a real API server (testcluster): an injected fatal XID on the fake GPUs sets
//! the Node's `GPUHealthy=False` condition, kiln's NoSchedule taint and a Warning Event, next to
//! an administrator's taint and cordon; recovery clears kiln's taint and condition and leaves
//! theirs.

use std::time::{Duration, Instant};

use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kiln_core::gpu_health::{CONDITION_TYPE, REASON_UNHEALTHY, TAINT_KEY};
use kiln_device_plugin::{
    health::{HealthTracker, XidFilter},
    node_health::{apply, unhealthy_gpus},
};
use kiln_gpu::{FakeBackend, GpuInventory};
use kiln_testcluster::{shared, shared_access};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const FIXTURE: &str = r#"
driver_version: "550.144.03"
cuda_version: "12.4"
gpus:
  - {uuid: GPU-11111111-2222-3333-4444-555555555555, name: NVIDIA H100 80GB HBM3, memory_total_mib: 81559, compute_capability: "9.0"}
  - {uuid: GPU-22222222-2222-3333-4444-555555555555, name: NVIDIA H100 80GB HBM3, memory_total_mib: 81559, compute_capability: "9.0"}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_xid_reaches_the_node_and_recovery_clears_only_kilns_marks()
-> anyhow::Result<()> {
    let cluster = shared()?;
    let _guard = shared_access().await;
    let client = cluster.client().await?;
    let name = "gpu-health-node";
    cluster.add_node(name, 2)?;
    let nodes: Api<Node> = Api::all(client.clone());
    // The administrator's own taint and cordon.
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true, "taints": [
                {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
            ]}})),
        )
        .await?;

    let fake = FakeBackend::new(serde_yaml_ng::from_str(FIXTURE)?);
    let gpus = fake.devices()?;
    let mut tracker = HealthTracker::new(XidFilter::default(), Duration::ZERO);
    fake.inject_xid(1, 48);
    fake.set_lost(1, true); // still failing: not recovered by the probe
    assert!(tracker.poll(&fake));
    let bad = unhealthy_gpus(&tracker.faults(), &gpus);
    let plan = apply(
        client.clone(),
        name,
        &bad,
        true,
        "default",
        "kiln-device-plugin",
    )
    .await?;
    assert!(plan.event.is_some());

    let n = nodes.get(name).await?;
    let cond = n.status.unwrap().conditions.unwrap();
    let c = cond.iter().find(|c| c.type_ == CONDITION_TYPE).unwrap();
    assert_eq!(c.status, "False");
    assert_eq!(
        c.message.as_deref(),
        Some("unhealthy: GPU 1 (GPU-22222222-2222-3333-4444-555555555555): XID 48")
    );
    let spec = n.spec.unwrap();
    // The node lifecycle controller taints a cordoned node (`node.kubernetes.io/unschedulable`)
    // when it gets to it; that taint is the cluster's, not the administrator's or kiln's.
    let keys: Vec<String> = spec
        .taints
        .unwrap()
        .into_iter()
        .map(|t| t.key)
        .filter(|k| !k.starts_with("node.kubernetes.io/"))
        .collect();
    assert_eq!(keys, ["dedicated", TAINT_KEY]);
    assert_eq!(spec.unschedulable, Some(true));
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let warned = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .any(|e| {
            e.reason.as_deref() == Some(REASON_UNHEALTHY)
                && e.regarding.and_then(|r| r.name).as_deref() == Some(name)
        });
    assert!(warned, "a Warning Event on the node");

    // Again with nothing new: no write.
    let again = apply(
        client.clone(),
        name,
        &bad,
        true,
        "default",
        "kiln-device-plugin",
    )
    .await?;
    assert!(again.condition.is_none() && again.taints.is_none() && again.event.is_none());

    // Recovery: the GPU answers again and the quiet time has passed.
    fake.set_lost(1, false);
    let started = Instant::now();
    assert!(
        tracker.poll(&fake),
        "recovered after {:?}",
        started.elapsed()
    );
    let good = unhealthy_gpus(&tracker.faults(), &gpus);
    assert!(good.is_empty());
    apply(
        client.clone(),
        name,
        &good,
        true,
        "default",
        "kiln-device-plugin",
    )
    .await?;
    let n = nodes.get(name).await?;
    let cond = n.status.unwrap().conditions.unwrap();
    assert_eq!(
        cond.iter()
            .find(|c| c.type_ == CONDITION_TYPE)
            .unwrap()
            .status,
        "True"
    );
    let spec = n.spec.unwrap();
    // The node lifecycle controller taints a cordoned node (`node.kubernetes.io/unschedulable`)
    // when it gets to it; that taint is the cluster's, not the administrator's or kiln's.
    let keys: Vec<String> = spec
        .taints
        .unwrap()
        .into_iter()
        .map(|t| t.key)
        .filter(|k| !k.starts_with("node.kubernetes.io/"))
        .collect();
    assert_eq!(keys, ["dedicated"], "only kiln's taint removed");
    assert_eq!(
        spec.unschedulable,
        Some(true),
        "the cordon is the administrator's"
    );
    cluster.delete_node(name)?;
    Ok(())
}
