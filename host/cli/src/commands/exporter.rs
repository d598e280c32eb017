//! `kiln exporter`: DCGM-compatible GPU metrics with stable pod attribution
//! (flags and metrics: `host/exporter/README.md`).

use std::process::ExitCode;

use anyhow::Context as _;

/// Flags of `kiln exporter`; each also reads a `KILN_EXPORTER_*` env var.
#[derive(Debug, clap::Args)]
#[command(mut_arg("gpu_backend", |a| a.help(super::GPU_BACKEND_HELP)))]
pub struct ExporterArgs {
    #[command(flatten)]
    config: kiln_exporter::Config,
}

impl ExporterArgs {
    /// Serves `/metrics` until SIGINT or SIGTERM.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kiln-exporter")
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        rt.block_on(kiln_exporter::run(self.config, super::termination()))?;
        Ok(ExitCode::SUCCESS)
    }
}
