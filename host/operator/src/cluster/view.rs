//! Reads of the shared view that both controllers and the upgrade make: the ClusterPolicies
//! and the active one, the nodes, the NVIDIADrivers. Each reads its store when one is set and
//! lists the API server otherwise.

use std::sync::Arc;

use kiln_core::spec::nvidiadriver::NVIDIADriver;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::reflector::Store;

use crate::cluster::node::SlimNode;
use crate::cluster::store::NamedStore;
use crate::{Error, Result};

/// Every ClusterPolicy: from `store` when set (the policy controller's), else listed. Used by
/// the ClusterPolicy and the NVIDIADriver reconcilers alike.
///
/// # Errors
/// [`crate::Error::Kube`] when listing fails (no store only).
pub async fn policies_from(
    store: Option<&Store<DynamicObject>>,
    client: &Client,
) -> crate::Result<Vec<Arc<DynamicObject>>> {
    if let Some(store) = store {
        return Ok(store.state());
    }
    Ok(
        Api::<DynamicObject>::all_with(client.clone(), &crate::cluster::watch::policy_resource())
            .list(&ListParams::default())
            .await
            .map_err(|e| crate::Error::kube("list clusterpolicies", e))?
            .items
            .into_iter()
            .map(Arc::new)
            .collect(),
    )
}

/// The active ClusterPolicy among `all` ([`kiln_core::singleton::active_policy`]: the oldest).
pub fn active_of(all: &[Arc<DynamicObject>]) -> Option<&Arc<DynamicObject>> {
    let active = kiln_core::singleton::active_policy(all.iter().map(|p| &p.metadata))?;
    all.iter()
        .find(|p| p.metadata.name.as_deref() == Some(active))
}

/// Every node (slimmed): from `store` when set (waiting at most
/// [`crate::cluster::watch::LIVE_READY_LIMIT`] once for its first list), else listed in pages
/// ([`list_nodes`]). Used by the ClusterPolicy and the NVIDIADriver reconcilers.
///
/// # Errors
/// [`crate::Error::Kube`] when listing fails (no store only).
pub async fn nodes_from(
    store: Option<&NamedStore<SlimNode>>,
    client: &Client,
) -> crate::Result<Vec<Arc<SlimNode>>> {
    match store {
        Some(store) => {
            let _ = tokio::time::timeout(
                crate::cluster::watch::LIVE_READY_LIMIT,
                store.wait_until_ready(),
            )
            .await;
            Ok(store.state())
        }
        None => Ok(list_nodes(client)
            .await?
            .into_iter()
            .map(Arc::new)
            .collect()),
    }
}

/// Nodes per list request: bounds the size of one response body (and so the process's peak
/// heap) however large the cluster is.
pub const NODE_PAGE: u32 = 100;

/// List every node, [`NODE_PAGE`] at a time, keeping of each only what the operator reads
/// ([`SlimNode`]); the caller labels them and derives cluster facts from them.
///
/// # Errors
/// [`Error::Kube`] when a page fails.
pub async fn list_nodes(client: &Client) -> Result<Vec<SlimNode>> {
    let api: Api<crate::cluster::node::WatchedNode> = Api::all(client.clone());
    let mut nodes = Vec::new();
    let mut params = ListParams::default().limit(NODE_PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| Error::kube("list nodes", e))?;
        nodes.extend(page.items.into_iter().map(|w| w.object));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(nodes),
        }
    }
}

/// Every NVIDIADriver: from `store` (the controller's, [`crate::controllers::driver::DriverCaches::drivers`]) once it has
/// listed — before that it would show none — else listed. Used by both reconcilers.
///
/// # Errors
/// The listing's error (no listed store only).
pub async fn drivers_from(
    store: Option<&Store<NVIDIADriver>>,
    client: &Client,
) -> kube::Result<Vec<Arc<NVIDIADriver>>> {
    if let Some(store) = store
        && futures::FutureExt::now_or_never(store.wait_until_ready()).is_some_and(|r| r.is_ok())
    {
        return Ok(store.state());
    }
    Ok(Api::<NVIDIADriver>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(Arc::new)
        .collect())
}
