//! Writing the labels on the agent's own node: one server-side apply of `metadata.labels` with
//! field manager [`FIELD_MANAGER`], again every interval.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use crate::Error;
use crate::features::{self, HostPaths, Labels};
use crate::local;

/// The field manager of the agent's node writes; a label it stops sending is removed.
pub const FIELD_MANAGER: &str = "kiln-discover";

/// Apply `labels` as the node's labels owned by [`FIELD_MANAGER`] (forcing ownership of keys
/// another manager, such as NFD, set before): keys this manager applied before and `labels`
/// lacks are removed. Needs node `patch`; the chart's admission policy lets the agent's
/// ServiceAccount change only `feature.node.kubernetes.io/` labels of the node its pod runs on.
///
/// # Errors
/// [`Error::Kube`] when the API server refuses or fails the patch.
pub async fn apply(client: &kube::Client, node: &str, labels: &Labels) -> Result<(), Error> {
    let body = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "labels": labels},
    });
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|e| Error::Kube {
            node: node.to_string(),
            error: Box::new(e),
        })?;
    Ok(())
}

/// Every label the agent writes on its node: the labels of NFD's local feature files under the
/// host root ([`local::local_labels`]: GFD's `nvidia.com/*`), with the computed ones
/// ([`features::discover`]) over them (a computed key wins over a file's).
///
/// # Errors
/// [`features::discover`]'s.
pub fn node_labels(paths: &HostPaths) -> Result<Labels, Error> {
    let mut labels = local::local_labels(&paths.host_root.join(local::FEATURES_DIR));
    labels.extend(features::discover(paths)?);
    Ok(labels)
}

/// Discover and label `node` now, then look again every `interval` until `shutdown` resolves
/// (`None`: once) and apply only when the labels changed (a kernel or OS update without a
/// reboot, a device hot-plugged), so that an idle cluster gets no writes. A failed round is
/// logged and retried at the next one, except the first, whose error is returned (a pod that
/// cannot label its node should show it in its restarts).
///
/// # Errors
/// The first round's [`Error`].
pub async fn run(
    client: &kube::Client,
    node: &str,
    paths: &HostPaths,
    interval: Option<Duration>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    let mut last = node_labels(paths)?;
    apply(client, node, &last).await?;
    tracing::info!(
        node,
        labels = last.len(),
        gpu = last.contains_key(&gpu_key()),
        "node labelled"
    );
    let Some(interval) = interval else {
        return Ok(());
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = tokio::time::sleep(interval) => {}
        }
        let labels = match node_labels(paths) {
            Ok(l) if l == last => continue,
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(node, error = %e, "discovery failed; retrying next round");
                continue;
            }
        };
        match apply(client, node, &labels).await {
            Ok(()) => {
                tracing::info!(node, labels = labels.len(), "node labels changed");
                last = labels;
            }
            Err(e) => tracing::warn!(node, error = %e, "labelling failed; retrying next round"),
        }
    }
}

/// The NVIDIA PCI label key.
fn gpu_key() -> String {
    format!(
        "{}pci-{}.present",
        features::PREFIX,
        features::NVIDIA_VENDOR
    )
}
