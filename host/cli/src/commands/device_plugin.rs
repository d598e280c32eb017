//! `kiln device-plugin`: the kubelet device plugin; `kiln device-plugin config-manager`: picks
//! this node's config by its `nvidia.com/device-plugin.config` label (flags and env vars as
//! upstream's, see assets/state-device-plugin/0500_daemonset.yaml).

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{ArgAction, Subcommand};
use kiln_device_plugin::{
    config_manager::ManagerOptions,
    health::XidFilter,
    runtime::{self, ConfigSource, Control, Options},
    selection::{ConfigDir, NODE_LABEL},
    settings::Overrides,
};
use tokio::{signal::unix::SignalKind, sync::mpsc};

/// `kiln device-plugin [config-manager]`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DevicePluginArgs {
    #[command(subcommand)]
    command: Option<DevicePluginCommand>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum DevicePluginCommand {
    /// Copy the config named by the node label into CONFIG_FILE_DST (init container with
    /// --oneshot, or sidecar that signals the plugin).
    ConfigManager(ConfigManagerArgs),
}

/// Flags of the plugin itself.
#[derive(Debug, clap::Args)]
struct RunArgs {
    #[command(flatten)]
    overrides: Overrides,
    #[arg(long, help = super::GPU_BACKEND_HELP, env = "KILN_GPU_BACKEND", default_value = "nvml")]
    gpu_backend: kiln_gpu::BackendSpec,
    /// Config file (re-read on SIGHUP and when its content changes).
    #[arg(long, env = "CONFIG_FILE")]
    config_file: Option<PathBuf>,
    /// The kubelet's registration socket; empty skips registration.
    #[arg(
        long,
        env = "KUBELET_SOCKET",
        default_value = "/var/lib/kubelet/device-plugins/kubelet.sock"
    )]
    kubelet_socket: String,
    /// Directory of the plugin sockets (the kubelet's device-plugins directory).
    #[arg(
        long,
        env = "KILN_DEVICE_PLUGIN_DIR",
        default_value = "/var/lib/kubelet/device-plugins"
    )]
    plugin_dir: PathBuf,
    /// The validator's `driver-ready` file; when it exists, its driver root, driver root in
    /// this container and dev root fill the ones no flag/env var sets (upstream's
    /// entrypoint does the same). Empty: not read.
    #[arg(
        long,
        env = "KILN_DRIVER_READY_FILE",
        default_value = "/run/nvidia/validations/driver-ready",
        value_parser = path_or_empty
    )]
    driver_ready_file: PathBuf,
    /// Directory of the CDI spec.
    #[arg(long, env = "KILN_CDI_ROOT", default_value = "/var/run/cdi")]
    cdi_root: PathBuf,
    /// With --config-dir: watch this node's label and pick the config key built in. Also the
    /// Node GPU health is reported on (`GPUHealthy` condition, Events).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Taint the Node `nvidia.com/gpu-unhealthy:NoSchedule` while a GPU has a fatal XID or is
    /// lost (removed on recovery; other taints and cordons are never touched).
    #[arg(long, env = "KILN_GPU_HEALTH_TAINT")]
    gpu_health_taint: bool,
    /// The mounted ConfigMap (one file per key) for the built-in label watch.
    #[arg(long, env = "KILN_DEVICE_PLUGIN_CONFIG_DIR")]
    config_dir: Option<PathBuf>,
    #[command(flatten)]
    selection: SelectionArgs,
    /// How often XIDs, the driver version and the config file are checked, milliseconds
    /// (10 to 31622400000, i.e. 366 days).
    #[arg(long, env = "KILN_HEALTH_INTERVAL_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..=kiln_input::MAX_DURATION_MS))]
    health_interval_ms: u64,
    /// Seconds without a new critical XID before a responding GPU is healthy again (at most
    /// 31622400, i.e. 366 days).
    #[arg(long, env = "KILN_HEALTH_RECOVERY_AFTER_S", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(0..=kiln_input::MAX_DURATION_SECS))]
    health_recovery_after_s: u64,
    /// How often kubelet.sock is checked for a kubelet restart, milliseconds (10 to
    /// 31622400000).
    #[arg(long, env = "KILN_KUBELET_POLL_MS", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(10..=kiln_input::MAX_DURATION_MS))]
    kubelet_poll_ms: u64,
}

/// How a config key is chosen (shared by both commands).
#[derive(Debug, clap::Args)]
struct SelectionArgs {
    /// The node label naming the config key.
    #[arg(long, env = "NODE_LABEL", default_value = NODE_LABEL)]
    node_label: String,
    /// Key used when the label is unset.
    #[arg(long, env = "DEFAULT_CONFIG")]
    default_config: Option<String>,
    /// Fallbacks without label and default: `named` (key `default`), `single`, `empty`.
    #[arg(long, env = "FALLBACK_STRATEGIES", default_value = "named,single")]
    fallback_strategies: String,
}

impl SelectionArgs {
    fn dir(&self, dir: PathBuf) -> ConfigDir {
        ConfigDir {
            dir,
            default_config: self.default_config.clone(),
            fallbacks: self
                .fallback_strategies
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect(),
        }
    }
}

/// Flags of config-manager (upstream names and env vars).
#[derive(Debug, clap::Args)]
struct ConfigManagerArgs {
    /// This node.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The mounted ConfigMap.
    #[arg(long, env = "CONFIG_FILE_SRCDIR")]
    config_file_srcdir: PathBuf,
    /// The file the plugin reads.
    #[arg(long, env = "CONFIG_FILE_DST")]
    config_file_dst: PathBuf,
    #[command(flatten)]
    selection: SelectionArgs,
    /// Apply the current label once and exit (init container).
    #[arg(long, env = "ONESHOT", action = ArgAction::Set, num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    oneshot: bool,
    /// Signal the consumer after a change.
    #[arg(long, env = "SEND_SIGNAL", action = ArgAction::Set, num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    send_signal: bool,
    /// Signal number.
    #[arg(long, env = "SIGNAL", default_value_t = 1)]
    signal: i32,
    /// Process to signal.
    #[arg(
        long,
        env = "PROCESS_TO_SIGNAL",
        default_value = "nvidia-device-plugin"
    )]
    process_to_signal: String,
    /// Kubeconfig (out of cluster).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
}

impl DevicePluginArgs {
    /// Runs the plugin until SIGINT/SIGTERM/SIGQUIT, or config-manager.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        match self.command {
            Some(DevicePluginCommand::ConfigManager(a)) => rt.block_on(a.run()),
            None => rt.block_on(self.run.run()),
        }
    }
}

impl RunArgs {
    async fn run(mut self) -> anyhow::Result<ExitCode> {
        read_driver_ready(&mut self);
        let dir_mode = self.node_name.clone().zip(self.config_dir.clone());
        let source = match (&dir_mode, &self.config_file) {
            (Some((_, dir)), _) => ConfigSource::Dir(self.selection.dir(dir.clone())),
            (None, Some(f)) => ConfigSource::File(f.clone()),
            (None, None) => ConfigSource::None,
        };
        let fail_on_init = self.overrides.fail_on_init_error.unwrap_or(true);
        let inv = match kiln_gpu::open(&self.gpu_backend) {
            Ok(i) => i,
            Err(e) if fail_on_init => return Err(e).context("nvml init failed"),
            Err(e) => {
                tracing::error!("nvml init failed: {e}; failOnInitError=false, idling");
                wait_for_exit().await?;
                return Ok(ExitCode::SUCCESS);
            }
        };
        let (labels_tx, mut labels_rx) = mpsc::channel(4);
        let mut initial = None;
        if let Some((node, _)) = &dir_mode {
            let client = super::kube_client(None)
                .await
                .context("connecting to the API server for the node label watch")?;
            spawn_label_watch(
                client,
                node.clone(),
                self.selection.node_label.clone(),
                labels_tx,
            );
            initial = labels_rx.recv().await.flatten();
        }
        let opts = Options {
            overrides: self.overrides,
            source,
            plugin_dir: self.plugin_dir,
            kubelet_socket: Some(PathBuf::from(self.kubelet_socket))
                .filter(|p| !p.as_os_str().is_empty()),
            cdi_root: self.cdi_root,
            health_interval: Duration::from_millis(self.health_interval_ms.max(10)),
            recovery_after: Duration::from_secs(self.health_recovery_after_s),
            xid_filter: XidFilter::from_env(),
            kubelet_poll: Duration::from_millis(self.kubelet_poll_ms.max(10)),
        };
        let gpus = inv.devices().unwrap_or_default();
        let handle = runtime::start(opts, inv, initial).await?;
        if let Some(node) = self.node_name.clone() {
            spawn_health_reporter(handle.status.clone(), node, gpus, self.gpu_health_taint);
        }
        let control = handle.control.clone();
        let mut hup = tokio::signal::unix::signal(SignalKind::hangup())?;
        let exit = wait_for_exit();
        tokio::pin!(exit);
        loop {
            tokio::select! {
                r = &mut exit => { r?; break; }
                _ = hup.recv() => { let _ = control.send(Control::Reload).await; }
                Some(l) = labels_rx.recv() => { let _ = control.send(Control::Label(l)).await; }
            }
        }
        handle.shutdown().await;
        Ok(ExitCode::SUCCESS)
    }
}

/// Reports the runtime's unhealthy GPUs on Node `node` whenever they change
/// ([`kiln_device_plugin::node_health::apply`]): condition, Event and, with `taint`, kiln's
/// NoSchedule taint. Without API access it logs once and stops (health still reaches the
/// kubelet through ListAndWatch).
fn spawn_health_reporter(
    mut status: tokio::sync::watch::Receiver<kiln_device_plugin::runtime::Status>,
    node: String,
    gpus: Vec<kiln_gpu::GpuDevice>,
    taint: bool,
) {
    tokio::spawn(async move {
        let client = match super::kube_client(None).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("GPU health not reported on the Node (no API access): {e:#}");
                return;
            }
        };
        // A Node is cluster-scoped: the API server takes its Events in `default` only.
        let namespace = "default";
        let mut last = None;
        loop {
            let faults = status.borrow_and_update().unhealthy.clone();
            if last.as_ref() != Some(&faults) {
                let bad = kiln_device_plugin::node_health::unhealthy_gpus(&faults, &gpus);
                match kiln_device_plugin::node_health::apply(
                    client.clone(),
                    &node,
                    &bad,
                    taint,
                    namespace,
                    "kiln-device-plugin",
                )
                .await
                {
                    Ok(_) => last = Some(faults),
                    Err(kube::Error::Api(ae)) if ae.code == 403 => {
                        tracing::warn!(
                            "GPU health not reported on node {node}: the device plugin may not patch nodes, nodes/status or create events ({})",
                            ae.message
                        );
                        return;
                    }
                    Err(e) => {
                        // A conflict or an unreachable API server: try again shortly.
                        tracing::warn!("reporting GPU health on node {node}: {e}");
                        tokio::time::sleep(Duration::from_secs(10)).await;
                        continue;
                    }
                }
            }
            if status.changed().await.is_err() {
                return;
            }
        }
    });
}

/// Watch node `node`'s label `label` in a task (kiln's hour-long watches), sending its
/// values to `tx` ([`kiln_device_plugin::node_label::watch_node_label`]).
fn spawn_label_watch(
    client: kube::Client,
    node: String,
    label: String,
    tx: mpsc::Sender<Option<String>>,
) {
    tokio::spawn(async move {
        let _ = kiln_device_plugin::node_label::watch_node_label(
            client,
            kiln_operator::watch::config(),
            &node,
            &label,
            tx,
        )
        .await;
    });
}

impl ConfigManagerArgs {
    async fn run(self) -> anyhow::Result<ExitCode> {
        let client = super::kube_client(self.kubeconfig.as_deref()).await?;
        let mgr = ManagerOptions {
            dir: self.selection.dir(self.config_file_srcdir),
            dst: self.config_file_dst,
            send_signal: self.send_signal,
            signal: self.signal,
            process_to_signal: self.process_to_signal,
        };
        let (tx, rx) = mpsc::channel(4);
        spawn_label_watch(client, self.node_name, self.selection.node_label, tx);
        tokio::select! {
            r = mgr.run(rx, self.oneshot) => r?,
            r = wait_for_exit() => r?,
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Fills the driver roots no flag/env var set from `--driver-ready-file`; returns the names
/// filled, or `None` when the file was not read (empty path, absent, unreadable: logged).
fn read_driver_ready(args: &mut RunArgs) -> Option<Vec<&'static str>> {
    let file = &args.driver_ready_file;
    if file.as_os_str().is_empty() {
        return None;
    }
    match kiln_input::read_bounded(file, kiln_input::MAX_FILE_BYTES) {
        Ok(text) => {
            let filled = args.overrides.fill_from_driver_ready(&text);
            tracing::info!(file = %file.display(), ?filled, "driver roots from driver-ready");
            Some(filled)
        }
        Err(kiln_input::InputError::Read { error, .. })
            if error.kind() == std::io::ErrorKind::NotFound =>
        {
            None
        }
        Err(e) => {
            tracing::warn!(file = %file.display(), "not reading driver-ready: {e}");
            None
        }
    }
}

/// A path where an empty value is allowed and means "none" (clap's `PathBuf` parser rejects
/// empty values with "a value is required").
fn path_or_empty(s: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(s))
}

/// Resolves on SIGINT, SIGTERM or SIGQUIT.
async fn wait_for_exit() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(SignalKind::terminate())?;
    let mut quit = tokio::signal::unix::signal(SignalKind::quit())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
        _ = quit.recv() => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: DevicePluginArgs,
    }

    fn driver_ready_file(args: &[&str]) -> Result<PathBuf, clap::Error> {
        let cli = Cli::try_parse_from([&["kiln-device-plugin"], args].concat())?;
        Ok(cli.args.run.driver_ready_file)
    }

    #[test]
    fn an_empty_driver_ready_file_parses_and_means_not_read() {
        assert_eq!(
            driver_ready_file(&["--driver-ready-file", ""]).unwrap(),
            PathBuf::new()
        );
        assert_eq!(
            driver_ready_file(&["--driver-ready-file=/tmp/x"]).unwrap(),
            PathBuf::from("/tmp/x")
        );
    }

    #[test]
    fn an_empty_driver_ready_file_is_not_read() {
        let mut args = Cli::try_parse_from(["kiln-device-plugin", "--driver-ready-file", ""])
            .unwrap()
            .args
            .run;
        assert_eq!(read_driver_ready(&mut args), None);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("driver-ready");
        std::fs::write(
            &file,
            "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\n",
        )
        .unwrap();
        args.driver_ready_file = file;
        assert_eq!(read_driver_ready(&mut args), Some(vec!["driver_root"]));
    }
}
