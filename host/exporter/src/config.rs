//! Flags (every one also an env var `KILN_EXPORTER_*`) and the `run` entry point.
//!
//! Flag names follow dcgm-exporter where the meaning is the same (reference §2); its env vars
//! have three prefixes, kiln's have one.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use kiln_gpu::{BackendSpec, GpuError};

use crate::{
    catalogue::{Catalogue, CatalogueError},
    podresources::{PodResourcesClient, PodResourcesError, refresh_forever},
    poller::Poller,
    process::ProcessMapper,
    render::RenderOptions,
    server::router,
    state::Shared,
};

/// `kiln exporter` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Metrics CSV in dcgm-exporter's format (field, type, help); the embedded default list if
    /// unset.
    #[arg(short = 'f', long, env = "KILN_EXPORTER_COLLECTORS")]
    pub collectors: Option<PathBuf>,
    /// Listen address; `:PORT` means all interfaces.
    #[arg(
        short = 'a',
        long,
        env = "KILN_EXPORTER_LISTEN",
        default_value = ":9400"
    )]
    pub address: String,
    /// How often NVML is read, in milliseconds (1 to 31622400000, i.e. 366 days; below 100
    /// counts as 100).
    #[arg(
        short = 'c',
        long,
        env = "KILN_EXPORTER_INTERVAL",
        default_value_t = 30_000,
        value_parser = clap::value_parser!(u64).range(1..=kiln_input::MAX_DURATION_MS)
    )]
    pub collect_interval: u64,
    /// GPU backend: `nvml`, or `fake:<fixture.yaml>` for a machine without a GPU.
    #[arg(long, env = "KILN_EXPORTER_GPU_BACKEND", default_value = "nvml")]
    pub gpu_backend: BackendSpec,
    /// Attribute GPUs to pods through the kubelet's pod-resources API.
    #[arg(short = 'k', long, env = "KILN_EXPORTER_KUBERNETES")]
    pub kubernetes: bool,
    /// One copy of each GPU sample per container using the GPU, instead of one series per GPU.
    #[arg(long, env = "KILN_EXPORTER_KUBERNETES_VIRTUAL_GPUS")]
    pub kubernetes_virtual_gpus: bool,
    /// The kubelet's pod-resources socket.
    #[arg(
        long,
        env = "KILN_EXPORTER_POD_RESOURCES_KUBELET_SOCKET",
        default_value = "/var/lib/kubelet/pod-resources/kubelet.sock"
    )]
    pub pod_resources_kubelet_socket: PathBuf,
    /// Least time between two pod-resources `List` calls, in milliseconds (1 to
    /// 31622400000; below 100 counts as 100).
    #[arg(
        long,
        env = "KILN_EXPORTER_POD_RESOURCES_INTERVAL",
        default_value_t = 10_000,
        value_parser = clap::value_parser!(u64).range(1..=kiln_input::MAX_DURATION_MS)
    )]
    pub pod_resources_interval: u64,
    /// Extra GPU resource names besides `nvidia.com/gpu`, `nvidia.com/gpu.shared` and
    /// `nvidia.com/mig-*` (comma-separated).
    #[arg(
        long,
        env = "KILN_EXPORTER_NVIDIA_RESOURCE_NAMES",
        value_delimiter = ','
    )]
    pub nvidia_resource_names: Vec<String>,
    /// Per-pod GPU memory and SM utilisation from NVML's process lists (needs `hostPID: true`
    /// and the kubelet's pod log directory mounted).
    #[arg(long, env = "KILN_EXPORTER_KUBERNETES_PROCESS_METRICS")]
    pub kubernetes_process_metrics: bool,
    /// The host's `/proc` (process metrics).
    #[arg(long, env = "KILN_EXPORTER_PROC_ROOT", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// The kubelet's pod log directory, `<namespace>_<pod>_<uid>` entries (process metrics).
    #[arg(
        long,
        env = "KILN_EXPORTER_POD_LOGS_DIR",
        default_value = "/var/log/pods"
    )]
    pub pod_logs_dir: PathBuf,
    /// `Hostname` label value; the machine's host name if unset (set it from `spec.nodeName`).
    #[arg(long, env = "KILN_EXPORTER_NODE_NAME")]
    pub node_name: Option<String>,
    /// Leave out the `Hostname` label.
    #[arg(short = 'n', long, env = "KILN_EXPORTER_NO_HOSTNAME")]
    pub no_hostname: bool,
    /// Replace blanks in `modelName` with `-`.
    #[arg(long, env = "KILN_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME")]
    pub replace_blanks_in_model_name: bool,
}

/// Why the exporter could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExporterError {
    /// The GPU backend could not be opened.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// The metrics CSV could not be read.
    #[error("reading metrics CSV {path}")]
    ReadCollectors {
        /// The CSV path.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The metrics CSV is invalid.
    #[error("metrics CSV {path}")]
    Collectors {
        /// The CSV path.
        path: PathBuf,
        /// What is wrong, with the line.
        #[source]
        source: CatalogueError,
    },
    /// `--address` is not `host:port` or `:port`.
    #[error("invalid listen address {0:?}")]
    BadAddress(String),
    /// The pod-resources socket path is unusable.
    #[error(transparent)]
    PodResources(#[from] PodResourcesError),
    /// Binding, serving or spawning failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
}

impl Config {
    /// Reads the catalogue (the file or the embedded default), reporting unavailable fields.
    ///
    /// # Errors
    /// [`ExporterError::ReadCollectors`] or [`ExporterError::Collectors`].
    pub fn catalogue(&self) -> Result<Catalogue, ExporterError> {
        let cat = match &self.collectors {
            None => Catalogue::default_list(),
            Some(path) => {
                // A regular file of at most 1 MiB (kiln's bounded reader).
                let text =
                    kiln_input::read_bounded(path, kiln_input::MAX_FILE_BYTES).map_err(|e| {
                        ExporterError::ReadCollectors {
                            path: path.clone(),
                            source: match e {
                                kiln_input::InputError::Read { error, .. } => error,
                                other => std::io::Error::new(
                                    std::io::ErrorKind::InvalidInput,
                                    other.to_string(),
                                ),
                            },
                        }
                    })?;
                Catalogue::parse(&text).map_err(|source| ExporterError::Collectors {
                    path: path.clone(),
                    source,
                })?
            }
        };
        if !cat.unavailable.is_empty() {
            tracing::warn!(fields = ?cat.unavailable, "NVML cannot provide these DCGM fields; they are skipped");
        }
        Ok(cat)
    }

    /// Presentation options derived from the flags.
    #[must_use]
    pub fn render_options(&self) -> RenderOptions {
        let hostname =
            (!self.no_hostname).then(|| self.node_name.clone().unwrap_or_else(local_hostname));
        RenderOptions {
            hostname,
            replace_blanks_in_model_name: self.replace_blanks_in_model_name,
            per_pod: self.kubernetes_virtual_gpus,
        }
    }

    /// The socket address to bind.
    ///
    /// # Errors
    /// [`ExporterError::BadAddress`].
    pub fn listen_addr(&self) -> Result<SocketAddr, ExporterError> {
        let a = &self.address;
        let full = if a.starts_with(':') {
            format!("0.0.0.0{a}")
        } else {
            a.clone()
        };
        full.parse()
            .map_err(|_| ExporterError::BadAddress(a.clone()))
    }
}

fn local_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned())
}

/// Runs the exporter until `shutdown` resolves: binds `--address`, then [`serve`]s.
///
/// # Errors
/// Any [`ExporterError`] from start-up or serving.
pub async fn run(
    cfg: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ExporterError> {
    let addr = cfg.listen_addr()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ExporterError::Io {
            what: format!("binding {addr}"),
            source,
        })?;
    serve(cfg, listener, shutdown).await
}

/// Serves on an already bound `listener` until `shutdown` resolves: opens the GPU backend,
/// polls once, starts the pod-resources refresher (with `--kubernetes`) and answers HTTP.
/// Needs a multi-threaded tokio runtime (the first poll runs in `block_in_place`).
///
/// HTTP is served by [`kiln_httpd::serve`] with [`kiln_httpd::Limits::DEFAULT`]: 431 for a
/// request head over 16 KiB, header-read, request and idle timeouts, and a connection cap that
/// sheds the least recently active idle connection, so `/health` and `/metrics` stay reachable.
///
/// # Errors
/// [`ExporterError::Gpu`] (e.g. no NVML), [`ExporterError::Collectors`], or start-up failures.
pub async fn serve(
    cfg: Config,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ExporterError> {
    let catalogue = cfg.catalogue()?;
    let inventory = kiln_gpu::open(&cfg.gpu_backend)?;
    let shared = Arc::new(Shared::new(
        catalogue,
        cfg.render_options(),
        cfg.nvidia_resource_names.clone(),
    ));
    let interval = Duration::from_millis(cfg.collect_interval.max(100));
    let mapper = cfg.kubernetes_process_metrics.then(|| ProcessMapper {
        proc_root: cfg.proc_root.clone(),
        pod_logs_dir: cfg.pod_logs_dir.clone(),
    });
    let poller =
        tokio::task::block_in_place(|| Poller::start(inventory, shared.clone(), interval, mapper))
            .map_err(|source| ExporterError::Io {
                what: "starting the poller".into(),
                source,
            })?;
    let refresher = if cfg.kubernetes {
        let client =
            PodResourcesClient::new(&cfg.pod_resources_kubelet_socket, Duration::from_secs(10))?;
        let every = Duration::from_millis(cfg.pod_resources_interval.max(100));
        let extra = cfg.nvidia_resource_names.clone();
        Some(tokio::spawn(refresh_forever(
            client,
            shared.clone(),
            every,
            extra,
        )))
    } else {
        None
    };
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /metrics");
    }
    // Header cap, timeouts and a connection cap that keeps /health answered (kiln_httpd).
    kiln_httpd::serve(
        listener,
        router(shared),
        kiln_httpd::Limits::DEFAULT,
        shutdown,
    )
    .await;
    if let Some(r) = refresher {
        r.abort();
    }
    drop(poller);
    Ok(())
}
