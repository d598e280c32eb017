//! Watches this node's config label (`nvidia.com/device-plugin.config`) with a kube watcher on
//! the single Node (`metadata.name=<node>`) and sends its value on every change. The first
//! value is sent only after the watch has listed the node (upstream issues #1540, #1645:
//! deciding before the informer synced applied the wrong config first).

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, watcher},
};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;

/// Sends `labels[label]` of node `node` to `tx`: once after the initial list, then whenever it
/// changes (`None` when unset or the node is deleted). `base` is the watcher configuration
/// (kiln's is `kiln_operator::watch::config()`: hour-long watches); this adds the
/// `metadata.name` field selector. Returns when `tx` is closed; watch errors are retried with
/// kube's default backoff.
///
/// # Errors
/// None in practice; the signature keeps room for a fatal watch error.
pub async fn watch_node_label(
    client: Client,
    base: watcher::Config,
    node: &str,
    label: &str,
    tx: mpsc::Sender<Option<String>>,
) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client);
    let cfg = base.fields(&format!("metadata.name={node}"));
    let stream = watcher(api, cfg).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut synced = false;
    let mut pending: Option<String> = None;
    let mut last: Option<Option<String>> = None;
    let value = |n: &Node| {
        n.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(label).cloned())
    };
    while let Some(ev) = stream.next().await {
        let next = match ev {
            Ok(watcher::Event::Init) => {
                pending = None;
                continue;
            }
            Ok(watcher::Event::InitApply(n)) => {
                pending = value(&n);
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                synced = true;
                pending.take()
            }
            Ok(watcher::Event::Apply(n)) => value(&n),
            Ok(watcher::Event::Delete(_)) => None,
            Err(e) => {
                tracing::warn!("watching node {node}: {e}");
                continue;
            }
        };
        if synced && last.as_ref() != Some(&next) {
            last = Some(next.clone());
            if tx.send(next).await.is_err() {
                return Ok(());
            }
        }
    }
    Ok(())
}
