//! The gRPC side: `pluginregistration.Registration` on the registration socket
//! (`<registrar dir>/gpu.nvidia.com-reg.sock`, NVIDIA's helper's name), and `DRAPlugin` with
//! `DRAResourceHealth` on the plugin socket (`<plugins dir>/gpu.nvidia.com/dra.sock`).
//!
//! The kubelet finds the registration socket, calls `GetInfo` (type `DRAPlugin`, name
//! `gpu.nvidia.com`, the plugin socket's path, versions `v1.DRAPlugin`) and reports the outcome
//! with `NotifyRegistrationStatus` (logged). `NodePrepareResources` reads each claim from a
//! [`ClaimSource`] (in the binary a watch cache of ResourceClaims, never a GET per call) and
//! prepares it through [`DeviceState`]; claims are prepared one at a time. Per-claim failures
//! are answered in the claim's `error`, as the protocol asks.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{Arc, Mutex},
    time::Instant,
};

use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::{net::UnixListener, sync::watch, task::JoinHandle};
use tokio_stream::{Stream, wrappers::UnixListenerStream};
use tonic::{Request, Response, Status};

use crate::{
    DRIVER_NAME,
    metrics::Metrics,
    proto::{
        dra::{
            Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
            NodePrepareResourcesResponse, NodeUnprepareResourceResponse,
            NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
            dra_plugin_server::{DraPlugin, DraPluginServer},
        },
        health::{
            DeviceHealth, NodeWatchResourcesRequest, NodeWatchResourcesResponse,
            dra_resource_health_server::{DraResourceHealth, DraResourceHealthServer},
        },
        registration::{
            InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
            registration_server::{Registration, RegistrationServer},
        },
    },
    state::DeviceState,
};

/// The plugin type the kubelet's plugin manager routes to its DRA handler.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA service version kiln serves.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["v1.DRAPlugin"];
/// The plugin socket's file name inside `<plugins dir>/gpu.nvidia.com/`.
pub const DRA_SOCKET: &str = "dra.sock";

/// The registration socket: `<dir>/gpu.nvidia.com-reg.sock`.
#[must_use]
pub fn registration_socket(registrar_dir: &Path) -> PathBuf {
    registrar_dir.join(format!("{DRIVER_NAME}-reg.sock"))
}

/// The plugin's own directory: `<plugins dir>/gpu.nvidia.com` (the plugin socket and the
/// checkpoint live there).
#[must_use]
pub fn plugin_dir(plugins_dir: &Path) -> PathBuf {
    plugins_dir.join(DRIVER_NAME)
}

/// Where prepare reads allocated claims from.
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync {
    /// The claim `namespace/name` with UID `uid`, allocated; waits a bounded time for a cache
    /// to catch up.
    ///
    /// # Errors
    /// Why it is not available (not found, another UID, not allocated in time).
    async fn claim(&self, namespace: &str, name: &str, uid: &str) -> Result<ResourceClaim, String>;
}

/// An in-memory [`ClaimSource`] (the stand-in kubelet tests and the benchmark).
#[derive(Debug, Default)]
pub struct StaticClaims(pub Mutex<BTreeMap<String, ResourceClaim>>);

impl StaticClaims {
    /// Adds or replaces a claim (keyed by its UID).
    pub fn insert(&self, claim: ResourceClaim) {
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        if let Ok(mut m) = self.0.lock() {
            m.insert(uid, claim);
        }
    }
}

#[tonic::async_trait]
impl ClaimSource for StaticClaims {
    async fn claim(&self, namespace: &str, name: &str, uid: &str) -> Result<ResourceClaim, String> {
        self.0
            .lock()
            .map_err(|e| e.to_string())?
            .get(uid)
            .cloned()
            .ok_or_else(|| format!("claim {namespace}/{name} (uid {uid}) not found"))
    }
}

/// `pluginregistration.Registration`.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    endpoint: String,
    status: watch::Sender<Option<RegistrationStatus>>,
}

impl RegistrationService {
    /// Answers `GetInfo` with `endpoint` (the plugin socket's path); the kubelet's last
    /// `NotifyRegistrationStatus` is published on the returned receiver.
    #[must_use]
    pub fn new(endpoint: &Path) -> (Self, watch::Receiver<Option<RegistrationStatus>>) {
        let (status, rx) = watch::channel(None);
        (
            Self {
                endpoint: endpoint.display().to_string(),
                status,
            },
            rx,
        )
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: DRIVER_NAME.into(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            tracing::info!("registered with the kubelet as {DRIVER_NAME}");
        } else {
            tracing::error!(error = %s.error, "the kubelet refused the registration");
        }
        self.status.send_replace(Some(s));
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// `DRAPlugin`: prepare and unprepare.
#[derive(Clone)]
pub struct DraService {
    state: Arc<Mutex<DeviceState>>,
    claims: Arc<dyn ClaimSource>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for DraService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraService").finish_non_exhaustive()
    }
}

impl DraService {
    /// The service over `state`, reading claims from `claims`.
    #[must_use]
    pub fn new(
        state: Arc<Mutex<DeviceState>>,
        claims: Arc<dyn ClaimSource>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            state,
            claims,
            metrics,
        }
    }

    async fn prepare_one(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
    ) -> (Result<Vec<Device>, String>, bool) {
        let claim = match self.claims.claim(ns, name, uid).await {
            Ok(c) => c,
            Err(e) => return (Err(e), false),
        };
        let mut state = match self.state.lock() {
            Ok(s) => s,
            Err(e) => return (Err(e.to_string()), false),
        };
        let new = !state.prepared().contains_key(uid);
        let result = state.prepare(&claim).map(|devices| {
            devices
                .into_iter()
                .map(|d| Device {
                    request_names: d.requests,
                    pool_name: d.pool,
                    device_name: d.device,
                    cdi_device_ids: d.cdi_ids,
                    share_id: None,
                })
                .collect()
        });
        self.metrics.set_prepared_claims(state.prepared().len());
        (result, new)
    }
}

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        req: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut claims = std::collections::HashMap::new();
        for c in req.into_inner().claims {
            let start = Instant::now();
            let (result, new) = self.prepare_one(&c.namespace, &c.name, &c.uid).await;
            self.metrics.prepare(start.elapsed(), result.is_ok(), new);
            let resp = match result {
                Ok(devices) => {
                    tracing::info!(claim = %format!("{}/{}", c.namespace, c.name), uid = %c.uid, "prepared");
                    NodePrepareResourceResponse {
                        devices,
                        error: String::new(),
                    }
                }
                Err(error) => {
                    tracing::warn!(uid = %c.uid, %error, "prepare failed");
                    NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    }
                }
            };
            claims.insert(c.uid, resp);
        }
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut claims = std::collections::HashMap::new();
        let mut state = self
            .state
            .lock()
            .map_err(|e| Status::internal(e.to_string()))?;
        for c in req.into_inner().claims {
            let error = match state.unprepare(&c.uid) {
                Ok(()) => {
                    tracing::info!(uid = %c.uid, "unprepared");
                    String::new()
                }
                Err(e) => e,
            };
            claims.insert(c.uid, NodeUnprepareResourceResponse { error });
        }
        self.metrics.set_prepared_claims(state.prepared().len());
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

/// `DRAResourceHealth`: every stream gets the full device list on start and whenever a device's
/// health changes.
#[derive(Debug, Clone)]
pub struct HealthService {
    rx: watch::Receiver<Arc<Vec<DeviceHealth>>>,
}

impl HealthService {
    /// A service streaming what `rx` holds.
    #[must_use]
    pub fn new(rx: watch::Receiver<Arc<Vec<DeviceHealth>>>) -> Self {
        Self { rx }
    }
}

type HealthStream = Pin<Box<dyn Stream<Item = Result<NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _: Request<NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        let mut rx = self.rx.clone();
        let (tx, out) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                let devices = rx.borrow_and_update().as_ref().clone();
                if tx
                    .send(Ok(NodeWatchResourcesResponse { devices }))
                    .await
                    .is_err()
                {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }
}

/// The two running servers.
#[derive(Debug)]
pub struct Served {
    /// The registration socket.
    pub registration_socket: PathBuf,
    /// The plugin socket.
    pub dra_socket: PathBuf,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    joins: Vec<JoinHandle<()>>,
}

fn bind(socket: &Path) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    UnixListener::bind(socket)
}

impl Served {
    /// Binds both sockets (replacing stale ones) and serves: `registration` on
    /// `registration_socket`, `dra` and `health` on `dra_socket`.
    ///
    /// # Errors
    /// A bind error.
    pub fn start(
        registration_socket: PathBuf,
        dra_socket: PathBuf,
        registration: RegistrationService,
        dra: DraService,
        health: HealthService,
    ) -> std::io::Result<Self> {
        // The plugin socket first: the kubelet dials it as soon as registration answers.
        let dra_listener = bind(&dra_socket)?;
        let reg_listener = bind(&registration_socket)?;
        let (stop_dra, dra_stopped) = tokio::sync::oneshot::channel::<()>();
        let (stop_reg, reg_stopped) = tokio::sync::oneshot::channel::<()>();
        let dra_join = tokio::spawn(async move {
            let res = tonic::transport::Server::builder()
                .add_service(DraPluginServer::new(dra))
                .add_service(DraResourceHealthServer::new(health))
                .serve_with_incoming_shutdown(UnixListenerStream::new(dra_listener), async {
                    let _ = dra_stopped.await;
                })
                .await;
            if let Err(e) = res {
                tracing::error!("DRA plugin gRPC server failed: {e}");
            }
        });
        let reg_join = tokio::spawn(async move {
            let res = tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(registration))
                .serve_with_incoming_shutdown(UnixListenerStream::new(reg_listener), async {
                    let _ = reg_stopped.await;
                })
                .await;
            if let Err(e) = res {
                tracing::error!("registration gRPC server failed: {e}");
            }
        });
        Ok(Self {
            registration_socket,
            dra_socket,
            stops: vec![stop_dra, stop_reg],
            joins: vec![dra_join, reg_join],
        })
    }

    /// Stops both servers and removes the socket files (the kubelet then deregisters the
    /// plugin).
    pub async fn stop(mut self) {
        for s in self.stops.drain(..) {
            let _ = s.send(());
        }
        for j in self.joins.drain(..) {
            j.abort();
            let _ = j.await;
        }
        let _ = std::fs::remove_file(&self.registration_socket);
        let _ = std::fs::remove_file(&self.dra_socket);
    }
}
