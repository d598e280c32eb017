//! GPU health on the Node: applies kiln's rule ([`kiln_core::gpu_health`]) for the GPUs the
//! [`crate::health::HealthTracker`] holds unhealthy — the `GPUHealthy` condition (status
//! subresource), kiln's own `NoSchedule` taint when asked (the Node's taint list replaced with
//! its `resourceVersion` as precondition, so a concurrent edit by an administrator is never
//! overwritten), and an Event per transition. Needs `get`/`patch` on `nodes` and
//! `nodes/status`, and `create` on `events`.

use k8s_openapi::{
    api::{core::v1::Node, events::v1::Event},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time},
    jiff::Timestamp,
};
use kiln_core::gpu_health::{GpuFault, HealthPlan, UnhealthyGpu, plan};
use kiln_gpu::GpuDevice;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

/// The XID NVIDIA documents as "GPU has fallen off the bus": reported as a lost GPU.
pub const XID_LOST: u64 = 79;

/// The tracker's `(index, xid)` faults as the rule's input, with the GPUs' UUIDs.
#[must_use]
pub fn unhealthy_gpus(faults: &[(u32, u64)], gpus: &[GpuDevice]) -> Vec<UnhealthyGpu> {
    faults
        .iter()
        .map(|&(index, xid)| UnhealthyGpu {
            index,
            uuid: gpus
                .iter()
                .find(|g| g.index == index)
                .map(|g| g.uuid.clone())
                .unwrap_or_default(),
            fault: if xid == XID_LOST {
                GpuFault::Lost
            } else {
                GpuFault::FatalXid(xid)
            },
        })
        .collect()
}

/// Reads Node `node`, plans, and writes what changed: condition, taints (with `taint`), Event
/// (in `namespace`, from `component`). Returns the plan applied.
///
/// # Errors
/// The API error of the first request that failed (a taint conflict: retry on the next poll).
pub async fn apply(
    client: Client,
    node: &str,
    unhealthy: &[UnhealthyGpu],
    taint: bool,
    namespace: &str,
    component: &str,
) -> Result<HealthPlan, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.get(node).await?;
    let conditions = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let taints = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let now = Timestamp::now();
    let p = plan(&conditions, &taints, unhealthy, taint, Time(now));
    // The version the taint patch is conditional on: the Node as read, or as our own status
    // patch left it.
    let mut version = n.metadata.resource_version.clone();
    if let Some(c) = &p.condition {
        // Strategic merge: conditions merge by `type`, the others stay.
        let patch = json!({"status": {"conditions": [c]}});
        let after = nodes
            .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
            .await?;
        version = after.metadata.resource_version;
    }
    if let Some(t) = &p.taints {
        let patch = json!({
            "metadata": {"resourceVersion": version},
            "spec": {"taints": t},
        });
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    if let Some(e) = &p.event {
        let events: Api<Event> = Api::namespaced(client, namespace);
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{node}.gpu-health-")),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(e.type_.to_owned()),
            reason: Some(e.reason.to_owned()),
            note: Some(e.message.clone()),
            action: Some("GPUHealthCheck".into()),
            reporting_controller: Some(component.to_owned()),
            reporting_instance: Some(format!("{component}-{node}")),
            regarding: Some(k8s_openapi::api::core::v1::ObjectReference {
                kind: Some("Node".into()),
                api_version: Some("v1".into()),
                name: Some(node.to_owned()),
                uid: n.metadata.uid.clone(),
                ..Default::default()
            }),
            ..Event::default()
        };
        events.create(&PostParams::default(), &ev).await?;
    }
    Ok(p)
}
