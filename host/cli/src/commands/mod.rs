//! Subcommands, one module each; every one is a clap struct with `run`.

mod check_args;
mod completion;
mod crdgen;
mod device_plugin;
mod discover;
mod dra_plugin;
mod exporter;
mod gfd;
mod operator;
mod operator_hooks;
mod plugin;
mod plugin_author;
mod plugin_oci;
mod render;
mod validator;
mod version;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Help of every agent's `--gpu-backend`: the choices and where the fixture format is.
pub(crate) const GPU_BACKEND_HELP: &str = "GPU backend: `nvml`, or `fake:<fixture.yaml>` for a \
machine without a GPU (fixture format: host/gpu/src/fake.rs module docs; example: \
host/exporter/tests/data/gpus.yaml; see README \"Node agents without a GPU\")";

/// kiln: a Kubernetes GPU operator whose operand transforms are sandboxed Wasm plugins.
#[derive(Debug, Parser)]
#[command(name = "kiln", version = version::LONG_VERSION, about)]
pub struct Cli {
    /// Log format on stderr, for every command: `text` (default; colours on a terminal) or
    /// `json` (one object per line: `timestamp`, `level`, `target`, `message` and the event's
    /// fields). The level filter is `KILN_LOG` (e.g. `debug`, `kiln=debug,warn`).
    #[arg(
        long,
        global = true,
        env = "KILN_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// The `--log-format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The tracing target of progress lines on long first-time work (plugin compilation); shown
/// at `info` by the one-shot commands, whose default level is `warn`.
pub const PROGRESS_TARGET: &str = "kiln::progress";

#[derive(Debug, Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once at start-up; boxing the flags buys nothing"
)]
enum Command {
    /// Render a ClusterPolicy into every object the operator would apply, offline.
    Render(render::RenderArgs),
    /// Write, test, run and check plugins; list the bundled ones, or precompile them into the
    /// cache (to try one in a render: `kiln render --plugins-dir DIR`).
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Print the version, git commit and image of this binary.
    Version(version::VersionArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion(completion::CompletionArgs),
    /// Run the ClusterPolicy and NVIDIADriver reconcilers (`--kubeconfig FILE` out of cluster).
    Operator(operator::OperatorArgs),
    /// Print the ClusterPolicy CRD generated from the Rust types (`--nvidia-driver`: the NVIDIADriver CRD).
    Crdgen(crdgen::CrdgenArgs),
    /// Serve DCGM-compatible GPU metrics from NVML, with stable pod attribution.
    Exporter(exporter::ExporterArgs),
    /// Kubelet device plugin for nvidia.com/gpu (time-slicing, CDI, per-node config).
    DevicePlugin(device_plugin::DevicePluginArgs),
    /// DRA kubelet plugin for driver gpu.nvidia.com (ResourceSlices, CDI per claim, XID health).
    DraPlugin(dra_plugin::DraPluginArgs),
    /// Validate the node's GPU stack step by step, writing /run/nvidia/validations/*-ready.
    Validator(validator::ValidatorArgs),
    /// GPU feature discovery: nvidia.com/* GPU labels on this node.
    Gfd(gfd::GfdArgs),
    /// GPU node discovery without NFD: this node's PCI, kernel and OS labels
    /// (feature.node.kubernetes.io/*), on this node only.
    Discover(discover::DiscoverArgs),
}

impl Cli {
    /// The log filter when `KILN_LOG` is unset: `info` for the long-running agents (operator,
    /// exporter, device-plugin, gfd, validator) so that they say what they started, `warn` for
    /// the one-shot tools (render, plugin, crdgen, version, completion) whose output is on
    /// stdout, with their progress lines ([`PROGRESS_TARGET`]) at `info`.
    #[must_use]
    pub fn default_log_filter(&self) -> &'static str {
        match self.command {
            Command::Operator(_)
            | Command::Exporter(_)
            | Command::DevicePlugin(_)
            | Command::DraPlugin(_)
            | Command::Gfd(_)
            | Command::Discover(_)
            | Command::Validator(_) => "info",
            Command::Render(_)
            | Command::Plugin(_)
            | Command::Crdgen(_)
            | Command::Version(_)
            | Command::Completion(_) => "warn,kiln::progress=info",
        }
    }

    /// The allocator settings the subcommand runs with ([`crate::alloc`]): the operator's for
    /// the operator, the small profile for the node agents and the one-shot tools.
    #[must_use]
    pub fn allocator_profile(&self) -> crate::alloc::Profile {
        match self.command {
            Command::Operator(_) => crate::alloc::Profile::Operator,
            Command::Exporter(_)
            | Command::DevicePlugin(_)
            | Command::DraPlugin(_)
            | Command::Gfd(_)
            | Command::Validator(_)
            | Command::Discover(_)
            | Command::Render(_)
            | Command::Plugin(_)
            | Command::Crdgen(_)
            | Command::Version(_)
            | Command::Completion(_) => crate::alloc::Profile::Small,
        }
    }

    /// Run the chosen subcommand; errors are printed to stderr with their causes. With
    /// `KILN_CHECK_ARGS` set, print the subcommand path and the env vars it reads as JSON
    /// instead (arguments and env were already parsed; see `check_args`).
    pub fn run(self) -> ExitCode {
        if std::env::var_os(check_args::CHECK_ARGS_ENV).is_some() {
            let args: Vec<String> = std::env::args().skip(1).collect();
            let report = check_args::report(&args);
            return match write_stdout(&(report.to_json() + "\n")) {
                Ok(()) => ExitCode::SUCCESS,
                Err(_) => ExitCode::FAILURE,
            };
        }
        let result = match self.command {
            Command::Render(a) => a.run(),
            Command::Version(v) => v.run(),
            Command::Completion(c) => c.run(),
            Command::Plugin(p) => p.run(),
            Command::Operator(o) => o.run(),
            Command::Crdgen(c) => c.run(),
            Command::Exporter(e) => e.run(),
            Command::DevicePlugin(d) => d.run(),
            Command::DraPlugin(d) => d.run(),
            Command::Validator(v) => v.run(),
            Command::Gfd(g) => g.run(),
            Command::Discover(d) => d.run(),
        };
        match result {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {}", kiln_gpu::error_chain(e.as_ref()));
                ExitCode::FAILURE
            }
        }
    }
}

/// A plugin host over the bundled plugins and a drop-in directory (`plugins_dir`, default
/// `/etc/kiln/plugins`), keeping `keep_resident_bytes` of each plugin memory slot mapped
/// between calls (see `HostConfig::keep_resident_bytes`), with the site-plugin settings of
/// `policy`. A directory given explicitly that does not exist is reported.
pub(crate) fn plugin_host(
    plugins_dir: Option<std::path::PathBuf>,
    keep_resident_bytes: usize,
    policy: &plugin::HostPolicyArgs,
) -> anyhow::Result<std::sync::Arc<kiln_plugin_host::PluginHost>> {
    if let Some(dir) = plugins_dir.as_ref().filter(|d| !d.is_dir()) {
        eprintln!(
            "warning: plugins directory {} does not exist; only bundled plugins are available",
            dir.display()
        );
    }
    let drop_in_dir = plugins_dir.or_else(|| Some(kiln_plugin_host::DEFAULT_DROP_IN_DIR.into()));
    let cfg = kiln_plugin_host::HostConfig {
        drop_in_dir,
        keep_resident_bytes,
        site_pod_privileges: policy.site_pod_privileges,
        refuse_shadowing: policy.refuse_shadowing,
        ..Default::default()
    };
    let host = kiln_plugin_host::PluginHost::new(cfg, kiln_bundled_plugins::BUNDLED)?
        .with_bundled_digests(kiln_bundled_plugins::BUNDLED_SHA256)
        .with_oci_fetch(std::sync::Arc::new(policy.registry.registry()?));
    Ok(std::sync::Arc::new(host))
}

/// A Kubernetes client from `kubeconfig` (a kubeconfig file) or, without one, kube's own
/// inference: `$KUBECONFIG`, else `~/.kube/config`, else the in-cluster configuration (a
/// pod's service account). Every kiln command that talks to the API server builds its client
/// here, with the read timeout that finds dead watch connections
/// ([`kiln_operator::watch::tune_client`]).
///
/// # Errors
/// One line saying which configuration could not be used and why (kube's error text once, not
/// its cause chain again), with what to pass instead.
pub(crate) async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
) -> anyhow::Result<kube::Client> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let (cfg, source) = match kubeconfig {
        None => (
            kube::Config::infer().await.map_err(|e| {
                anyhow::anyhow!(
                    "no Kubernetes configuration: {e}; pass --kubeconfig FILE or set KUBECONFIG \
                     (in a pod, the in-cluster configuration is used)"
                )
            })?,
            "the inferred configuration".to_string(),
        ),
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| anyhow::anyhow!("cannot read --kubeconfig {}: {e}", path.display()))?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| anyhow::anyhow!("cannot use --kubeconfig {}: {e}", path.display()))?;
            (cfg, path.display().to_string())
        }
    };
    kube::Client::try_from(kiln_operator::watch::tune_client(cfg))
        .map_err(|e| anyhow::anyhow!("cannot build a client from {source}: {e}"))
}

/// `println!` for command output, through [`write_stdout`] (a closed pipe is not an error,
/// where `println!` panics); `?`s the write error, so the caller returns `anyhow::Result`.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::commands::write_stdout(&format!("{}\n", format_args!($($arg)*)))?
    };
}
pub(crate) use outln;

/// Write `text` to stdout; a closed pipe (`kiln render … | head`) is not an error.
pub(crate) fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Resolves on SIGTERM (what the kubelet sends on pod deletion) or SIGINT; the shutdown signal
/// of the long-running agents (exporter, gfd, validator hold). Where SIGTERM cannot be watched,
/// SIGINT alone.
pub(crate) async fn termination() {
    kiln_operator::run::shutdown_signal().await;
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    /// `--log-format` is global: every command at every depth accepts it.
    #[test]
    fn every_command_takes_log_format() {
        fn walk(cmd: &clap::Command, path: &str, seen: &mut usize) {
            assert!(
                cmd.get_arguments().any(|a| a.get_id() == "log_format"),
                "{path} has no --log-format"
            );
            *seen += 1;
            for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
                walk(sub, &format!("{path} {}", sub.get_name()), seen);
            }
        }
        let mut cmd = super::Cli::command();
        cmd.build();
        let mut seen = 0;
        walk(&cmd, "kiln", &mut seen);
        assert!(seen > 20, "{seen} commands");
    }
}
