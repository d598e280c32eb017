//! Takeover without disruption (issue 12, item 6), on testcluster: a cluster as NVIDIA GPU
//! Operator v26.7.0 leaves it — the sample's objects exactly as NVIDIA's reconcile created
//! them (the goldens of `host/render/tests/data/nvidia-v26.7.0/`), owned by the ClusterPolicy
//! `cluster-policy`, with NVIDIA's labels and annotations, its node labels, the DaemonSet
//! controller's ControllerRevisions and the operand pods — then kiln's operator starts on
//! that policy. kiln adopts every object (its state label, its field manager) and changes no
//! DaemonSet: the same generations, pod templates, ControllerRevisions and pods, so no
//! rollout and no driver pod deleted. NVIDIA's hash annotation, which kiln does not render, is
//! removed from every DaemonSet as drift, each removal named in an Event.
//!
//! The variant is `ix-nvidia-images`: NVIDIA's sample with kiln given NVIDIA's images for the
//! operands it also implements (the operator's `Config::images`, `--image` on the command
//! line). With kiln's own image (the plain sample) the validator, device plugin, GFD and
//! exporter containers run kiln's commands, so those templates differ by design and a
//! takeover rolls those four DaemonSets (never the driver, whose image is NVIDIA's in both).

use crate::support;
use crate::support::nvidia;

use kiln_testcluster::{Options, TestCluster};
use kube::api::PostParams;
use serde_json::json;

const POLICY: &str = "cluster-policy";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kiln_takes_over_nvidias_objects_without_a_rollout() -> anyhow::Result<()> {
    let turn = crate::support::cluster::start(Options::default()).await?;
    let cluster = turn.cluster();
    cluster.with_logs(scenario(cluster).await)
}

async fn scenario(cluster: &TestCluster) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let client = cluster.client().await?;
    support::cluster::install_crd(
        cluster,
        &client,
        &serde_json::to_value(kiln_operator::crd::crd())?,
        nvidia::TIMEOUT,
    )
    .await?;
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": nvidia::NS}}))?,
        )
        .await?;

    // NVIDIA's state: the policy, node labels, every operand object.
    let policy = nvidia::raw_policies(&client)
        .create(
            &PostParams::default(),
            &serde_json::from_value(nvidia::policy(POLICY)?)?,
        )
        .await?;
    let uid = policy.metadata.uid.clone().unwrap_or_default();
    let gpu_nodes = nvidia::label_gpu_nodes(&client).await?;
    let objs = nvidia::objects(POLICY, &uid)?;
    nvidia::create_all(&client, &objs).await?;
    let names = nvidia::daemonset_names(&objs);
    let before = nvidia::settled(cluster, &client, &names, gpu_nodes.len()).await?;
    println!(
        "NVIDIA's {} objects created ({} DaemonSets, {} pods); ControllerRevisions before:\n{}",
        objs.len(),
        names.len(),
        before.pods.len(),
        before.revision_lines()
    );

    // kiln starts on that policy and adopts everything.
    let operator = nvidia::start_operator(client.clone())?;
    nvidia::adopted(cluster, &client, POLICY, &objs).await?;
    // The DaemonSet controller writes a new ControllerRevision within moments of a template
    // change; give it those moments before comparing.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let after = nvidia::snapshot(&client).await?;
    println!("ControllerRevisions after:\n{}", after.revision_lines());
    nvidia::assert_undisturbed(&before, &after);
    let notes = |evs: &[k8s_openapi::api::events::v1::Event]| -> Vec<String> {
        evs.iter()
            .filter(|e| e.reason.as_deref() == Some("DriftRemoved"))
            .map(|e| {
                let r = e.regarding.clone().unwrap_or_default();
                format!(
                    "{} {}: {}",
                    r.kind.unwrap_or_default(),
                    r.name.unwrap_or_default(),
                    e.note.clone().unwrap_or_default()
                )
            })
            .collect()
    };
    // What NVIDIA's operator wrote and kiln does not render is drift, removed with an Event
    // naming it: its hash annotation on the DaemonSets' metadata (no template changed above).
    let dss: kube::Api<k8s_openapi::api::apps::v1::DaemonSet> =
        kube::Api::namespaced(client.clone(), nvidia::NS);
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(client.clone(), nvidia::NS);
    cluster
        .wait_for(
            "NVIDIA's hash annotations removed",
            std::time::Duration::from_secs(30),
            || async {
                let mut left = Vec::new();
                for d in dss.list(&Default::default()).await?.items {
                    let a = d.metadata.annotations.unwrap_or_default();
                    if a.contains_key("nvidia.com/last-applied-hash") {
                        left.push(d.metadata.name.unwrap_or_default());
                    }
                }
                let all = notes(&events.list(&Default::default()).await?.items);
                let named = all
                    .iter()
                    .filter(|n| n.contains("metadata.annotations.nvidia.com/last-applied-hash"))
                    .count();
                Ok(if left.is_empty() && named >= names.len() {
                    Ok(())
                } else {
                    Err(format!(
                        "still annotated: {left:?}; {named} Events name it: {all:#?}"
                    ))
                })
            },
        )
        .await?;
    for n in notes(&events.list(&Default::default()).await?.items) {
        println!("{n}");
    }
    println!(
        "takeover: {} objects adopted, 0 templates changed, {} pods kept ({:.1} s)",
        objs.len(),
        after.pods.len(),
        started.elapsed().as_secs_f64()
    );
    operator.abort();
    Ok(())
}
