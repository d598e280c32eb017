//! Flags (every one also an env var `KILN_EXPORTER_*`) and the `run` entry point.
//!
//! Flag names follow dcgm-exporter where the meaning is the same (reference §2); its env vars
//! have three prefixes, kiln's have one.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use kiln_gpu::{BackendSpec, GpuError};

use crate::{
    catalogue::{Catalogue, CatalogueError},
    podmeta::PodMetaOptions,
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
    /// One copy of each GPU sample per container and replica using the GPU, instead of one
    /// series per GPU; `DCGM_FI_DEV_GPU_UTIL` and `DCGM_FI_DEV_FB_USED` per pod come from its
    /// own processes (NVML's process lists; with `--kubernetes`, these are read every poll and
    /// need `hostPID: true` and the kubelet's pod log directory, as the process metrics do).
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
    /// `hostname` label value; the machine's host name if unset (set it from `spec.nodeName`).
    /// Also the node whose pods `--kubernetes-enable-pod-labels` / `-pod-uid` watch.
    #[arg(long, env = "KILN_EXPORTER_NODE_NAME")]
    pub node_name: Option<String>,
    /// Leave out the `hostname` label.
    #[arg(short = 'n', long, env = "KILN_EXPORTER_NO_HOSTNAME")]
    pub no_hostname: bool,
    /// Name the host label `Hostname`, as dcgm-exporter did before 4.8.3 (NVIDIA/dcgm-exporter
    /// #655), for dashboards and relabelings written for the old name.
    #[arg(long, env = "KILN_EXPORTER_LEGACY_HOSTNAME_LABEL")]
    pub legacy_hostname_label: bool,
    /// Add the pod's labels to its series (names sanitised to `[a-zA-Z0-9_]`), read from the
    /// API server with a watch on this node's pods. The env var is dcgm-exporter's, which the
    /// ClusterPolicy's `dcgmExporter.enablePodLabels` sets.
    #[arg(
        long,
        env = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS",
        value_parser = clap::builder::FalseyValueParser::new(),
        default_value = "false"
    )]
    pub kubernetes_enable_pod_labels: bool,
    /// Add a `pod_uid` label to pod-attributed series (from the same watch). The env var is
    /// dcgm-exporter's (`dcgmExporter.enablePodUID`).
    #[arg(
        long,
        env = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID",
        value_parser = clap::builder::FalseyValueParser::new(),
        default_value = "false"
    )]
    pub kubernetes_enable_pod_uid: bool,
    /// Regular expressions (comma-separated) a pod label's name must match one of to be added;
    /// empty adds all. The env var is dcgm-exporter's (`dcgmExporter.podLabelAllowlistRegex`).
    #[arg(
        long,
        env = "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX",
        value_delimiter = ','
    )]
    pub kubernetes_pod_label_allowlist_regex: Vec<String>,
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
    /// A `--kubernetes-pod-label-allowlist-regex` pattern is not a regular expression.
    #[error("pod label allowlist pattern {pattern:?}")]
    Allowlist {
        /// The pattern.
        pattern: String,
        /// The regex error.
        #[source]
        source: regex::Error,
    },
    /// Pod labels or UIDs were asked for but no Kubernetes client could be configured.
    #[error("pod labels/UIDs need the API server")]
    Kube(#[source] kube::Error),
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
        cat.warn_skipped();
        Ok(cat)
    }

    /// Presentation options derived from the flags.
    #[must_use]
    pub fn render_options(&self) -> RenderOptions {
        let hostname =
            (!self.no_hostname).then(|| self.node_name.clone().unwrap_or_else(local_hostname));
        RenderOptions {
            hostname,
            legacy_hostname_label: self.legacy_hostname_label,
            replace_blanks_in_model_name: self.replace_blanks_in_model_name,
            per_pod: self.kubernetes_virtual_gpus,
            process_metrics: self.kubernetes_process_metrics,
        }
    }

    /// Whether each poll reads NVML's process lists: for the process metrics, and for the
    /// per-pod values of virtual-GPU mode when pods are attributed (`--kubernetes`).
    #[must_use]
    pub fn reads_processes(&self) -> bool {
        self.kubernetes_process_metrics || (self.kubernetes && self.kubernetes_virtual_gpus)
    }

    /// The pod metadata to attach (pod UID, pod labels and the allowlist).
    ///
    /// # Errors
    /// [`ExporterError::Allowlist`] for a pattern that does not compile.
    pub fn pod_meta_options(&self) -> Result<PodMetaOptions, ExporterError> {
        PodMetaOptions::new(
            self.kubernetes_enable_pod_uid,
            self.kubernetes_enable_pod_labels,
            &self.kubernetes_pod_label_allowlist_regex,
        )
        .map_err(|(pattern, source)| ExporterError::Allowlist { pattern, source })
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
    let meta_opts = cfg.pod_meta_options()?;
    let inventory = kiln_gpu::open(&cfg.gpu_backend)?;
    let shared = Arc::new(Shared::new(
        catalogue,
        cfg.render_options(),
        cfg.nvidia_resource_names.clone(),
    ));
    let interval = Duration::from_millis(cfg.collect_interval.max(100));
    let mapper = cfg.reads_processes().then(|| ProcessMapper {
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
    let watch = if cfg.kubernetes && meta_opts.enabled() {
        let client = kube::Client::try_default()
            .await
            .map_err(ExporterError::Kube)?;
        let node = cfg.node_name.clone().unwrap_or_else(local_hostname);
        Some(tokio::spawn(crate::podmeta::watch_forever(
            client,
            node,
            meta_opts,
            shared.clone(),
        )))
    } else {
        if meta_opts.enabled() {
            tracing::warn!("pod labels/UIDs need --kubernetes; not attached");
        }
        None
    };
    if cfg.kubernetes_virtual_gpus && !cfg.kubernetes {
        tracing::warn!(
            "--kubernetes-virtual-gpus needs --kubernetes (pods come from the kubelet's pod-resources API); series are not copied per pod"
        );
    }
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
    for task in [refresher, watch].into_iter().flatten() {
        task.abort();
    }
    drop(poller);
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        config: super::Config,
    }

    fn parse(args: &[&str]) -> super::Config {
        Cli::try_parse_from(std::iter::once("kiln-exporter").chain(args.iter().copied()))
            .unwrap()
            .config
    }

    #[test]
    fn process_lists_are_read_for_process_metrics_and_for_attributed_virtual_gpus() {
        assert!(!parse(&[]).reads_processes());
        assert!(!parse(&["--kubernetes-virtual-gpus"]).reads_processes());
        assert!(parse(&["-k", "--kubernetes-virtual-gpus"]).reads_processes());
        assert!(parse(&["--kubernetes-process-metrics"]).reads_processes());
        let virt = parse(&["-k", "--kubernetes-virtual-gpus"]).render_options();
        assert!(
            virt.per_pod && !virt.process_metrics,
            "kiln's own families stay opt-in"
        );
        assert!(
            parse(&["--kubernetes-process-metrics"])
                .render_options()
                .process_metrics
        );
    }
}
