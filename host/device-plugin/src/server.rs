//! The `DevicePlugin` gRPC service of one resource, served on `nvidia-<name>.sock`, and the
//! `Register` call to the kubelet (reference §1.1–§1.4, §1.6).
//!
//! Each resource's state is a [`Snapshot`] in a `tokio::sync::watch` channel (§9.3): health
//! updates and config reloads replace it, every ListAndWatch stream sends the full, sorted list
//! whenever it changes, and Allocate reads the latest one. Nothing ever blocks on a stream.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
};

use tokio::{net::UnixListener, sync::watch, task::JoinHandle};
use tokio_stream::{Stream, wrappers::UnixListenerStream};
use tonic::{Request, Response, Status, transport::Endpoint};

use crate::{
    allocate::{allocate_container, preferred_allocation, random_uuid},
    devices::Resource,
    proto::{
        AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse, Device,
        DevicePluginOptions, Empty, ListAndWatchResponse, NumaNode, PreStartContainerRequest,
        PreStartContainerResponse, PreferredAllocationRequest, PreferredAllocationResponse,
        RegisterRequest, TopologyInfo,
        device_plugin_server::{DevicePlugin, DevicePluginServer},
        registration_client::RegistrationClient,
    },
    settings::Settings,
};

/// Device-plugin API version sent in `RegisterRequest`.
pub const API_VERSION: &str = "v1beta1";
/// Health strings of the API.
pub const HEALTHY: &str = "Healthy";
/// See [`HEALTHY`].
pub const UNHEALTHY: &str = "Unhealthy";

/// What one resource serves at a moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The resource and its sorted units.
    pub resource: Resource,
    /// Settings in force.
    pub settings: Arc<Settings>,
    /// NVML indexes of unhealthy GPUs; all units on them are unhealthy.
    pub unhealthy_gpus: BTreeSet<u32>,
}

impl Snapshot {
    /// True when unit `id` is healthy (unknown ids are not).
    #[must_use]
    pub fn is_healthy(&self, id: &str) -> bool {
        self.resource
            .unit(id)
            .is_some_and(|u| !self.unhealthy_gpus.contains(&u.physical.gpu_index))
    }

    /// The ListAndWatch list: every unit in sorted order with its health.
    #[must_use]
    pub fn devices(&self) -> Vec<Device> {
        self.resource
            .units
            .iter()
            .map(|u| Device {
                id: u.id.clone(),
                health: if self.unhealthy_gpus.contains(&u.physical.gpu_index) {
                    UNHEALTHY
                } else {
                    HEALTHY
                }
                .into(),
                // The GPU's NUMA node, for the kubelet's Topology Manager (upstream sets it the
                // same way; none where NVML knows no node).
                topology: u.physical.numa_node.map(|id| TopologyInfo {
                    nodes: vec![NumaNode { id }],
                }),
            })
            .collect()
    }
}

/// The gRPC service of one resource.
#[derive(Debug, Clone)]
pub struct PluginService {
    snapshot: watch::Receiver<Arc<Snapshot>>,
}

impl PluginService {
    /// A service reading `snapshot`.
    #[must_use]
    pub fn new(snapshot: watch::Receiver<Arc<Snapshot>>) -> Self {
        Self { snapshot }
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut rx = self.snapshot.clone();
        let (tx, out) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let mut last: Option<Vec<Device>> = None;
            loop {
                let devices = rx.borrow_and_update().devices();
                if last.as_ref() != Some(&devices) {
                    let msg = ListAndWatchResponse {
                        devices: devices.clone(),
                    };
                    if tx.send(Ok(msg)).await.is_err() {
                        return;
                    }
                    last = Some(devices);
                }
                if rx.changed().await.is_err() {
                    return; // The resource was stopped: the stream ends with OK.
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let snap = self.snapshot.borrow().clone();
        let mut container_responses = Vec::new();
        for c in req.into_inner().container_requests {
            let size = usize::try_from(c.allocation_size).unwrap_or(0);
            let ids = preferred_allocation(
                &snap.resource,
                &|id| snap.is_healthy(id),
                &c.available_device_i_ds,
                &c.must_include_device_i_ds,
                size,
                snap.settings.shared_devices_allocation_policy,
            )
            .map_err(|e| {
                Status::unknown(format!(
                    "error getting list of preferred allocation devices: {e}"
                ))
            })?;
            container_responses.push(ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let snap = self.snapshot.borrow().clone();
        let exists = |p: &str| Path::new(p).exists();
        let mut container_responses = Vec::new();
        for c in req.into_inner().container_requests {
            let resp = allocate_container(
                &snap.resource,
                &snap.settings,
                &c.devices_ids,
                &random_uuid(),
                &exists,
            )
            .map_err(Status::unknown)?;
            container_responses.push(resp);
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// The options kiln registers with and reports: preferred allocation on, no PreStart.
#[must_use]
pub fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// A running server of one resource.
#[derive(Debug)]
pub struct Served {
    /// Socket path.
    pub socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: JoinHandle<()>,
}

impl Served {
    /// Removes a stale socket, binds `socket` and serves `svc` on it.
    ///
    /// # Errors
    /// The bind error.
    pub fn start(socket: PathBuf, svc: PluginService) -> std::io::Result<Self> {
        match std::fs::remove_file(&socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(&socket)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let path = socket.clone();
        let join = tokio::spawn(async move {
            let res = tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(svc))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = res {
                tracing::error!(socket = %path.display(), "gRPC server failed: {e}");
            }
        });
        Ok(Self {
            socket,
            stop: Some(stop),
            join,
        })
    }

    /// Stops serving and removes the socket file.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.join.abort();
        let _ = (&mut self.join).await;
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Why registering failed.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The kubelet socket could not be dialed.
    #[error("dialing the kubelet at {path}")]
    Dial {
        /// Kubelet socket.
        path: PathBuf,
        /// Cause.
        #[source]
        source: tonic::transport::Error,
    },
    /// The kubelet refused.
    #[error("kubelet refused registration of {resource}")]
    Refused {
        /// Resource name.
        resource: String,
        /// The status.
        #[source]
        source: Status,
    },
}

/// Sends `RegisterRequest{version: v1beta1, endpoint: <socket file name>, resource_name,
/// options}` to the kubelet socket (5 s dial timeout, as upstream).
///
/// # Errors
/// [`RegisterError`].
pub async fn register(
    kubelet_socket: &Path,
    endpoint: &str,
    resource_name: &str,
) -> Result<(), RegisterError> {
    let dial = |source| RegisterError::Dial {
        path: kubelet_socket.to_owned(),
        source,
    };
    let channel = Endpoint::from_shared(format!("unix://{}", kubelet_socket.display()))
        .map_err(dial)?
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .map_err(dial)?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: API_VERSION.into(),
            endpoint: endpoint.into(),
            resource_name: resource_name.into(),
            options: Some(options()),
        })
        .await
        .map_err(|source| RegisterError::Refused {
            resource: resource_name.into(),
            source,
        })?;
    Ok(())
}
