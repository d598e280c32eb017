//! `kiln operator`: run the ClusterPolicy reconciler (in a cluster, or out of it with
//! `--kubeconfig FILE`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

/// Arguments of `kiln operator`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct OperatorArgs {
    /// A chart hook (`apply-crds`, `cleanup`) instead of the reconciler.
    #[command(subcommand)]
    hook: Option<super::operator_hooks::OperatorHook>,
    /// Kubeconfig to use (out of cluster); default: `$KUBECONFIG` or `~/.kube/config` when
    /// there is one, else the in-cluster config.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Namespace the operands go into.
    #[arg(long, env = "OPERATOR_NAMESPACE", default_value = "gpu-operator")]
    namespace: String,
    /// Drop-in directory searched for `<name>.wasm` before the bundled plugins.
    #[arg(long, env = "KILN_PLUGINS_DIR")]
    plugins_dir: Option<PathBuf>,
    #[command(flatten)]
    host_policy: super::plugin::HostPolicyArgs,
    /// Listen address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: String,
    /// Who may read `/metrics`: `kubernetes` (a bearer token the API server authenticates and
    /// authorizes for `get` on the non-resource URL `/metrics`; bind the ClusterRole
    /// `kiln-metrics-reader`) or `none` (anyone reaching the address: use a loopback address).
    /// `/healthz` and `/readyz` are always open.
    #[arg(long, default_value = "kubernetes")]
    metrics_auth: kiln_operator::metrics::MetricsAuth,
    /// Take part in leader election on the Lease `kiln-operator` (for more than one replica).
    #[arg(long)]
    leader_elect: bool,
    /// Override a fallback operand image, as ENV=IMAGE (e.g. `DRIVER_IMAGE=registry/driver:1`).
    #[arg(long = "image", value_parser = parse_image)]
    images: Vec<(String, String)>,
}

fn parse_image(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected ENV=IMAGE, got {s:?}"))
}

impl OperatorArgs {
    /// Run until a shutdown signal.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        if let Some(hook) = self.hook {
            return hook.run();
        }
        let rt = kiln_operator::runtime().context("starting the async runtime")?;
        rt.block_on(self.run_async())?;
        Ok(ExitCode::SUCCESS)
    }

    async fn run_async(self) -> anyhow::Result<()> {
        let client = super::kube_client(self.kubeconfig.as_deref()).await?;
        let host = super::plugin_host(
            self.plugins_dir.clone(),
            kiln_operator::PLUGIN_KEEP_RESIDENT_BYTES,
            &self.host_policy,
        )?;
        let renderer = kiln_render::Renderer::new(host);
        let config = kiln_operator::Config {
            namespace: self.namespace,
            plugins_dir: self.plugins_dir,
            metrics_addr: self.metrics_addr,
            metrics_auth: self.metrics_auth,
            leader_election: self.leader_elect,
            images: self.images,
            ..kiln_operator::Config::default()
        };
        kiln_operator::run(client, renderer, config).await?;
        Ok(())
    }
}
