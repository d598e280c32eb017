//! `kiln dra-plugin`: kiln's DRA kubelet plugin for driver `gpu.nvidia.com`, in place of the
//! `gpus` container of NVIDIA's k8s-dra-driver-gpu kubelet plugin. Flag names, env vars and
//! defaults are NVIDIA's `gpu-kubelet-plugin`'s (see kiln_dra_plugin::runtime::Options);
//! `--gpu-backend` and the health timings are the other kiln agents'.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use kiln_device_plugin::{config::Config, health::XidFilter, settings::Overrides};
use kiln_dra_plugin::runtime::{Options, run};

/// Flags of `kiln dra-plugin`.
#[derive(Debug, clap::Args)]
pub struct DraPluginArgs {
    /// The node this plugin serves (the ResourceSlice's node and pool).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Directory where the kubelet looks for plugin registration sockets.
    #[arg(
        long,
        env = "KUBELET_REGISTRAR_DIRECTORY_PATH",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    kubelet_registrar_directory_path: PathBuf,
    /// Directory of the kubelet's plugin data (the plugin socket and the checkpoint go in
    /// `gpu.nvidia.com/` below it).
    #[arg(
        long,
        env = "KUBELET_PLUGINS_DIRECTORY_PATH",
        default_value = "/var/lib/kubelet/plugins"
    )]
    kubelet_plugins_directory_path: PathBuf,
    /// Directory where the per-claim CDI specs are written.
    #[arg(long, env = "CDI_ROOT", default_value = "/etc/cdi")]
    cdi_root: PathBuf,
    /// The NVIDIA driver's root on the host (`/` or `/run/nvidia/driver`); unset: from the
    /// driver-ready file, else `/`.
    #[arg(long, env = "NVIDIA_DRIVER_ROOT")]
    nvidia_driver_root: Option<String>,
    /// Where the driver root is mounted in this container (libraries are looked up there);
    /// unset: from the driver-ready file, else `/driver-root`.
    #[arg(long, env = "DRIVER_ROOT_CTR_PATH")]
    container_driver_root: Option<String>,
    /// The nvidia-cdi-hook executable on the host, named in the CDI specs.
    #[arg(
        long,
        env = "NVIDIA_CDI_HOOK_PATH",
        default_value = "/usr/bin/nvidia-cdi-hook"
    )]
    nvidia_cdi_hook_path: String,
    /// The validator's `driver-ready` file: when it exists, its driver root and driver root in
    /// this container fill the ones no flag or env var sets (NVIDIA's DaemonSet sources it in a
    /// shell; kiln's image runs no shell). Empty: not read.
    #[arg(
        long,
        env = "KILN_DRIVER_READY_FILE",
        default_value = "/run/nvidia/validations/driver-ready"
    )]
    driver_ready_file: String,
    /// XIDs ignored in addition to the default application XIDs (comma-separated).
    #[arg(long, env = "ADDITIONAL_XIDS_TO_IGNORE", default_value = "")]
    additional_xids_to_ignore: String,
    /// Where metrics are served (`:8080`, `0.0.0.0:8080`); empty: not served.
    #[arg(long, env = "HTTP_ENDPOINT", default_value = "")]
    http_endpoint: String,
    /// The HTTP path of the metrics.
    #[arg(long, env = "METRICS_PATH", default_value = "/metrics")]
    metrics_path: String,
    #[arg(long, help = super::GPU_BACKEND_HELP, env = "KILN_GPU_BACKEND", default_value = "nvml")]
    gpu_backend: kiln_gpu::BackendSpec,
    /// `nvidia-smi` for time-slicing claims; unset: the driver's, `usr/bin/nvidia-smi` under
    /// the container's driver root (with `--gpu-backend fake:…` time-slicing is only recorded).
    #[arg(long, env = "KILN_NVIDIA_SMI")]
    nvidia_smi: Option<PathBuf>,
    /// How often XIDs and the driver version are checked, milliseconds (10 to 31622400000).
    #[arg(long, env = "KILN_HEALTH_INTERVAL_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..=kiln_input::MAX_DURATION_MS))]
    health_interval_ms: u64,
    /// Seconds without a new critical XID before a responding GPU is published again (at most
    /// 31622400).
    #[arg(long, env = "KILN_HEALTH_RECOVERY_AFTER_S", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(0..=kiln_input::MAX_DURATION_SECS))]
    health_recovery_after_s: u64,
    /// Seconds prepare waits for an allocated claim to reach the watch cache (at most 3600).
    #[arg(long, env = "KILN_CLAIM_WAIT_S", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    claim_wait_s: u64,
    /// Kubeconfig (out of cluster).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
}

/// `:8080` (all interfaces, as Go's listener takes it) or a full socket address.
fn endpoint(s: &str) -> anyhow::Result<Option<SocketAddr>> {
    if s.is_empty() {
        return Ok(None);
    }
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_owned()
    };
    full.parse()
        .map(Some)
        .with_context(|| format!("--http-endpoint {s:?} is not HOST:PORT or :PORT"))
}

impl DraPluginArgs {
    /// Runs the plugin until SIGINT/SIGTERM.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        rt.block_on(self.serve())
    }

    async fn serve(self) -> anyhow::Result<ExitCode> {
        let mut overrides = Overrides {
            driver_root: self.nvidia_driver_root.clone(),
            driver_root_ctr_path: self.container_driver_root.clone(),
            nvidia_cdi_hook_path: Some(self.nvidia_cdi_hook_path.clone()),
            ..Overrides::default()
        };
        if !self.driver_ready_file.is_empty()
            && let Ok(text) = kiln_input::read_bounded(
                std::path::Path::new(&self.driver_ready_file),
                kiln_input::MAX_FILE_BYTES,
            )
        {
            let filled = overrides.fill_from_driver_ready(&text);
            tracing::info!(file = %self.driver_ready_file, ?filled, "driver roots from driver-ready");
        }
        let settings =
            kiln_device_plugin::settings::Settings::resolve(&overrides, &Config::default())
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        let container_driver_root = PathBuf::from(&settings.container_driver_root);
        let xid_filter = XidFilter::from_env_values(
            Some(&self.additional_xids_to_ignore),
            std::env::var("DP_ENABLE_HEALTHCHECKS").ok().as_deref(),
        );
        let opts = Options {
            node_name: self.node_name,
            registrar_dir: self.kubelet_registrar_directory_path,
            plugins_dir: self.kubelet_plugins_directory_path,
            cdi_root: self.cdi_root,
            nvidia_smi: matches!(self.gpu_backend, kiln_gpu::BackendSpec::Nvml).then(|| {
                self.nvidia_smi
                    .unwrap_or_else(|| container_driver_root.join("usr/bin/nvidia-smi"))
            }),
            backend: self.gpu_backend,
            settings,
            container_driver_root,
            health_interval: Duration::from_millis(self.health_interval_ms),
            recovery_after: Duration::from_secs(self.health_recovery_after_s),
            xid_filter,
            http_endpoint: endpoint(&self.http_endpoint)?,
            metrics_path: self.metrics_path,
            claim_wait: Duration::from_secs(self.claim_wait_s),
        };
        let client = super::kube_client(self.kubeconfig.as_deref()).await?;
        run(opts, client, super::termination())
            .await
            .map_err(|e| anyhow::anyhow!("{}", kiln_gpu::error_chain(e.as_ref())))?;
        Ok(ExitCode::SUCCESS)
    }
}

#[cfg(test)]
mod tests {
    use super::endpoint;

    #[test]
    fn http_endpoints_take_gos_forms() {
        assert_eq!(endpoint("").unwrap(), None);
        assert_eq!(
            endpoint(":8080").unwrap().unwrap().to_string(),
            "0.0.0.0:8080"
        );
        assert!(endpoint("localhost").is_err());
    }
}
