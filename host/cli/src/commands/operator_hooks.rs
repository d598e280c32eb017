//! `kiln operator apply-crds` and `kiln operator cleanup`: what the Helm chart's hook Jobs run
//! on upgrade and after uninstall (see `kiln_operator::lifecycle`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};

/// The chart-hook subcommands of `kiln operator`.
#[derive(Debug, Subcommand)]
pub enum OperatorHook {
    /// Server-side apply the CRDs built into this binary, ClusterPolicy and NVIDIADriver (the
    /// chart's pre-upgrade hook with `operator.upgradeCRD`).
    ApplyCrds(ApplyCrdsArgs),
    /// After uninstall: wait for the operator's pods to be gone, remove the node labels it
    /// wrote (`nvidia.com/gpu.present`, `nvidia.com/gpu.deploy.<component>`) and, with
    /// `--delete-crd`, the ClusterPolicy and NVIDIADriver CRDs (the chart's post-delete hook).
    Cleanup(CleanupArgs),
}

/// Arguments of `kiln operator apply-crds`.
#[derive(Debug, Args)]
pub struct ApplyCrdsArgs {
    /// Kubeconfig to use (out of cluster); default: `$KUBECONFIG` or `~/.kube/config` when
    /// there is one, else the in-cluster config.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

/// Arguments of `kiln operator cleanup`.
#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// Kubeconfig to use (out of cluster); default: `$KUBECONFIG` or `~/.kube/config` when
    /// there is one, else the in-cluster config.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Namespace of the operator's pods.
    #[arg(long, env = "OPERATOR_NAMESPACE", default_value = "gpu-operator")]
    namespace: String,
    /// Also delete the ClusterPolicy and NVIDIADriver CRDs (each when present, waiting until it
    /// is gone), and with them every ClusterPolicy and NVIDIADriver (`operator.cleanupCRD`).
    #[arg(long)]
    delete_crd: bool,
    /// Seconds to wait for the operator's pods, and for each CRD, to be gone.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    super::kube_client(kubeconfig.map(PathBuf::as_path)).await
}

impl OperatorHook {
    /// Run the hook to completion.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        rt.block_on(async {
            match self {
                OperatorHook::ApplyCrds(a) => {
                    let c = client(a.kubeconfig.as_ref()).await?;
                    let generation = kiln_operator::lifecycle::apply_crds(&c).await?;
                    super::write_stdout(&format!(
                        "applied {} (generation {generation}), {} and {}\n",
                        kiln_operator::lifecycle::CRD_NAME,
                        kiln_operator::lifecycle::NVIDIA_DRIVER_CRD_NAME,
                        kiln_operator::lifecycle::GPU_CLUSTER_CRD_NAME
                    ))?;
                }
                OperatorHook::Cleanup(a) => {
                    let c = client(a.kubeconfig.as_ref()).await?;
                    let opts = kiln_operator::lifecycle::CleanupOptions {
                        delete_crd: a.delete_crd,
                        timeout: Duration::from_secs(a.timeout),
                        ..kiln_operator::lifecycle::CleanupOptions::new(&a.namespace)
                    };
                    let report = kiln_operator::lifecycle::cleanup(&c, &opts).await?;
                    let crds = if report.crds_deleted.is_empty() {
                        "none".to_string()
                    } else {
                        report.crds_deleted.join(", ")
                    };
                    super::write_stdout(&format!(
                        "labels removed from {} node(s); CRDs deleted: {crds}\n",
                        report.nodes_relabelled
                    ))?;
                }
            }
            Ok(ExitCode::SUCCESS)
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    /// The args the chart's hook Jobs pass (`templates/hooks.yaml`) parse; a parent flag next
    /// to a hook does not.
    #[test]
    fn the_chart_hook_args_parse() {
        for args in [
            &["kiln", "operator", "apply-crds"][..],
            &["kiln", "operator", "cleanup", "--namespace", "gpu-operator"],
            &[
                "kiln",
                "operator",
                "cleanup",
                "--namespace",
                "gpu-operator",
                "--delete-crd",
            ],
        ] {
            let parsed = crate::commands::Cli::try_parse_from(args);
            assert!(parsed.is_ok(), "{args:?}: {parsed:?}");
        }
        let mixed = ["kiln", "operator", "--leader-elect", "cleanup"];
        assert!(crate::commands::Cli::try_parse_from(mixed).is_err());
    }
}
