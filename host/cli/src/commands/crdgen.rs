//! `kiln crdgen`: print the ClusterPolicy CRD generated from the Rust types (the file committed
//! as `deploy/crds/clusterpolicies.nvidia.com.yaml`).

use std::process::ExitCode;

use clap::Args;

/// Arguments of `kiln crdgen` (none).
#[derive(Debug, Args)]
pub struct CrdgenArgs {}

impl CrdgenArgs {
    /// Print the CRD as YAML to stdout.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        print!("{}", kiln_operator::crd::crd_yaml());
        Ok(ExitCode::SUCCESS)
    }
}
