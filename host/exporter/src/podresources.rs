//! Kubelet pod-resources v1 client: one kept connection, `List` at most once per interval.
//!
//! dcgm-exporter dials the socket and lists every pod on every scrape (reference §3.1); here a
//! background task owns one lazily-connecting tonic channel (it redials by itself after a
//! kubelet restart) and calls `List` once per `--pod-resources-interval`. Failures count in
//! `kiln_exporter_pod_resources_errors_total`; the last good answer is kept for
//! [`STALE_AFTER_INTERVALS`] intervals, then dropped, so GPUs lose their pod labels rather than
//! keep those of pods that may be gone.

use std::{path::Path, sync::Arc, sync::atomic::Ordering, time::Duration};

use tonic::transport::{Channel, Endpoint};

use crate::{attribution::Allocation, devid::is_gpu_resource, state::Shared};

/// Code generated from the vendored `podresources/v1/api.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("v1");
}

use proto::{
    ListPodResourcesRequest, ListPodResourcesResponse,
    pod_resources_lister_client::PodResourcesListerClient,
};

/// A last good answer older than this many intervals is dropped.
pub const STALE_AFTER_INTERVALS: u32 = 3;
/// Largest accepted `List` response (dcgm-exporter's 4 MiB default fails on busy nodes, its
/// issue #509).
pub const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// Why pod-resources could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// The socket path does not form a valid endpoint.
    #[error("invalid pod-resources socket path {0}")]
    BadPath(String),
    /// The kubelet did not answer (socket missing, kubelet restarting, timeout, or an error).
    #[error("pod-resources List failed")]
    List(#[from] tonic::Status),
}

/// A pod-resources client over one kept channel to the kubelet's Unix socket.
#[derive(Debug, Clone)]
pub struct PodResourcesClient {
    client: PodResourcesListerClient<Channel>,
}

impl PodResourcesClient {
    /// Prepares the channel without dialing: a missing socket is not an error until `list`.
    ///
    /// # Errors
    /// [`PodResourcesError::BadPath`] for a path tonic cannot turn into an endpoint.
    pub fn new(socket: &Path, timeout: Duration) -> Result<Self, PodResourcesError> {
        let uri = format!("unix://{}", socket.display());
        let channel = Endpoint::from_shared(uri.clone())
            .map_err(|_| PodResourcesError::BadPath(uri))?
            .connect_timeout(timeout)
            .timeout(timeout)
            .connect_lazy();
        let client =
            PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES);
        Ok(Self { client })
    }

    /// Calls `List` and keeps the GPU allocations (see [`gpu_allocations`]).
    ///
    /// # Errors
    /// [`PodResourcesError::List`] with the gRPC status.
    pub async fn list(
        &mut self,
        extra_resources: &[String],
    ) -> Result<Vec<Allocation>, PodResourcesError> {
        let resp = self
            .client
            .list(ListPodResourcesRequest {})
            .await?
            .into_inner();
        Ok(gpu_allocations(resp, extra_resources))
    }
}

/// Flattens a `List` answer into one [`Allocation`] per container and GPU resource.
#[must_use]
pub fn gpu_allocations(
    resp: ListPodResourcesResponse,
    extra_resources: &[String],
) -> Vec<Allocation> {
    let mut out = Vec::new();
    for pod in resp.pod_resources {
        for c in pod.containers {
            for d in c
                .devices
                .into_iter()
                .filter(|d| is_gpu_resource(&d.resource_name, extra_resources))
            {
                out.push(Allocation {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: c.name.clone(),
                    resource_name: d.resource_name,
                    device_ids: d.device_ids,
                });
            }
        }
    }
    out
}

/// Refreshes `shared`'s pod state forever: one `List` per `interval` (ticks missed while a
/// call is slow are skipped, never bunched).
pub async fn refresh_forever(
    mut client: PodResourcesClient,
    shared: Arc<Shared>,
    interval: Duration,
    extra_resources: Vec<String>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stale_after = interval * STALE_AFTER_INTERVALS;
    // The first failure of a run of them is a warning (a missing socket, a kubelet without the
    // API); the rest are debug lines, and the first success after them says so.
    let mut failing = false;
    loop {
        tick.tick().await;
        shared
            .metrics
            .pod_resources_lists
            .fetch_add(1, Ordering::Relaxed);
        match client.list(&extra_resources).await {
            Ok(allocs) => {
                if std::mem::take(&mut failing) {
                    tracing::info!("pod-resources List answers again");
                }
                shared.set_allocations(allocs);
            }
            Err(e) => {
                shared
                    .metrics
                    .pod_resources_errors
                    .fetch_add(1, Ordering::Relaxed);
                if std::mem::replace(&mut failing, true) {
                    tracing::debug!(error = %crate::error_chain(&e), "pod-resources List failed");
                } else {
                    tracing::warn!(error = %crate::error_chain(&e), "pod-resources List failed; GPUs are not attributed to pods until it answers (later failures are logged at debug)");
                }
                let stale = shared
                    .pods()
                    .last_success
                    .is_none_or(|t| t.elapsed() >= stale_after);
                if stale {
                    shared.clear_allocations();
                }
            }
        }
    }
}
