//! `kiln crdgen`: print a CRD generated from the Rust types: the ClusterPolicy's (the file
//! committed as `deploy/crds/clusterpolicies.nvidia.com.yaml`) or, with `--nvidia-driver`, the
//! NVIDIADriver's (`deploy/crds/nvidiadrivers.nvidia.com.yaml`).

use std::process::ExitCode;

use clap::Args;

/// Arguments of `kiln crdgen`.
#[derive(Debug, Args)]
pub struct CrdgenArgs {
    /// Print the NVIDIADriver CRD (`nvidiadrivers.nvidia.com`) instead of the ClusterPolicy's.
    #[arg(long)]
    pub nvidia_driver: bool,
}

impl CrdgenArgs {
    /// Print the CRD as YAML to stdout.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let yaml = if self.nvidia_driver {
            kiln_operator::crd::nvidia_driver_crd_yaml()
        } else {
            kiln_operator::crd::crd_yaml()
        };
        super::write_stdout(&yaml)?;
        Ok(ExitCode::SUCCESS)
    }
}
