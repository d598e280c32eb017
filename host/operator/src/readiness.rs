//! DaemonSet readiness with IO: fetch what [`kiln_core::readiness::daemonset_readiness`] needs
//! (pods and ControllerRevisions only for `OnDelete` DaemonSets) and judge; a DaemonSet ready by
//! upstream's rules is still not ready while it covers fewer nodes than its selector matches
//! ([`kiln_core::plan::uncovered_nodes`]).

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

use kiln_core::plan::uncovered_nodes;
use kiln_core::readiness::{Readiness, daemonset_readiness, is_on_delete};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};

use crate::{Error, Result};

/// Pods per list request when judging an `OnDelete` DaemonSet (one per GPU node): bounds one
/// response body however large the cluster is.
pub const POD_PAGE: u32 = 100;

/// A pod reduced to what the `OnDelete` rule reads: name, namespace, labels, owner references,
/// phase and container statuses (spec, managed fields and conditions are dropped).
pub fn slim_pod(pod: Pod) -> Pod {
    let status = pod.status.map(|s| PodStatus {
        phase: s.phase,
        container_statuses: s.container_statuses,
        ..PodStatus::default()
    });
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name,
            namespace: pod.metadata.namespace,
            labels: pod.metadata.labels,
            owner_references: pod.metadata.owner_references,
            ..ObjectMeta::default()
        },
        spec: None,
        status,
    }
}

/// Judge the live DaemonSet `live` (as returned by apply; `None` when missing) against the
/// labels of every node (`nodes`). Returns `None` when ready, else the reason text
/// (`nvidia-driver-daemonset: 2 pod(s) unavailable`, `…: scheduled on 461 of 500 matching
/// nodes`).
///
/// # Errors
/// [`Error::Json`] when the object is not a DaemonSet; [`Error::Kube`] when listing pods or
/// revisions fails.
pub async fn daemonset_not_ready(
    client: &Client,
    name: &str,
    live: Option<&DynamicObject>,
    nodes: &[BTreeMap<String, String>],
) -> Result<Option<String>> {
    let ds: Option<DaemonSet> = live
        .map(|o| {
            serde_json::to_value(o)
                .and_then(serde_json::from_value)
                .map_err(|e| Error::Json {
                    action: format!("read DaemonSet {name}"),
                    source: e,
                })
        })
        .transpose()?;
    let (mut pods, mut revisions) = (Vec::new(), Vec::new());
    if let Some(ds) = ds.as_ref().filter(|d| is_on_delete(d)) {
        let ns = ds.metadata.namespace.clone().unwrap_or_default();
        let selector = ds
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.clone())
            .unwrap_or_default()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let lp = ListParams::default().labels(&selector);
        let api = Api::<Pod>::namespaced(client.clone(), &ns);
        let mut page_params = lp.clone().limit(POD_PAGE);
        loop {
            let page = api
                .list(&page_params)
                .await
                .map_err(|e| Error::kube(format!("list pods of {name}"), e))?;
            pods.extend(page.items.into_iter().map(slim_pod));
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => {
                    page_params = page_params.continue_token(&token);
                }
                _ => break,
            }
        }
        revisions = Api::<ControllerRevision>::namespaced(client.clone(), &ns)
            .list(&lp)
            .await
            .map_err(|e| Error::kube(format!("list revisions of {name}"), e))?
            .items;
    }
    Ok(match daemonset_readiness(ds.as_ref(), &pods, &revisions) {
        Readiness::NotReady(why) => Some(format!("{name}: {why}")),
        Readiness::Ready => {
            ds.as_ref()
                .and_then(|d| uncovered_nodes(d, nodes))
                .map(|(matching, desired)| {
                    format!("{name}: scheduled on {desired} of {matching} matching nodes")
                })
        }
    })
}
