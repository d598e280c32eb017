//! `kiln discover`: GPU node discovery without Node Feature Discovery — labels this node with
//! the `feature.node.kubernetes.io/*` labels kiln's states read and GFD's `nvidia.com/*` labels
//! from the host's features.d files (see `kiln_discover`). The chart runs it on every node
//! under NVIDIA's `nfd.enabled`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use kiln_discover::HostPaths;

/// Flags of `kiln discover`.
#[derive(Debug, clap::Args)]
pub struct DiscoverArgs {
    /// This node (downward API `spec.nodeName`): the only node labelled.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Where sysfs is mounted (PCI devices).
    #[arg(long, env = "KILN_DISCOVER_SYS_DIR", default_value = "/sys")]
    sys_dir: PathBuf,
    /// Where procfs is mounted (`sys/kernel/osrelease`).
    #[arg(long, env = "KILN_DISCOVER_PROC_DIR", default_value = "/proc")]
    proc_dir: PathBuf,
    /// The host's root as mounted in the pod (`etc/os-release`, `usr/lib/os-release`).
    #[arg(long, env = "KILN_DISCOVER_HOST_ROOT", default_value = "/host")]
    host_root: PathBuf,
    /// PCI class prefixes whose devices get a `pci-<vendor>.present` label, comma-separated
    /// (NFD's `deviceClassWhitelist`; default NVIDIA's).
    #[arg(
        long,
        env = "KILN_DISCOVER_PCI_CLASSES",
        value_delimiter = ',',
        default_value = "02,0200,0207,0300,0302"
    )]
    pci_classes: Vec<String>,
    /// How often to look again, as a Go duration (nfd-worker's 60 s: GFD's labels in the
    /// features.d files reach the node within it); labels are written only when they change.
    #[arg(long, env = "KILN_DISCOVER_INTERVAL", default_value = "60s", value_parser = parse_interval)]
    interval: Duration,
    /// Label once and exit.
    #[arg(long)]
    oneshot: bool,
    /// A kubeconfig file (default: in-cluster configuration).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

/// A Go duration of at most a day, at least a second.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let d =
        kiln_input::parse_go_duration(s, Duration::from_secs(86_400)).map_err(|e| e.to_string())?;
    if d < Duration::from_secs(1) {
        return Err(format!("interval {s} is under a second"));
    }
    Ok(d)
}

impl DiscoverArgs {
    /// Labels this node until SIGINT/SIGTERM (or once with `--oneshot`).
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let paths = HostPaths {
            sys: self.sys_dir,
            proc: self.proc_dir,
            host_root: self.host_root,
            pci_classes: self.pci_classes,
        };
        let interval = (!self.oneshot).then_some(self.interval);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        rt.block_on(async {
            let client = super::kube_client(self.kubeconfig.as_deref())
                .await
                .context("connecting to the API server")?;
            kiln_discover::run(
                &client,
                &self.node_name,
                &paths,
                interval,
                super::termination(),
            )
            .await?;
            anyhow::Ok(())
        })?;
        Ok(ExitCode::SUCCESS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Top {
        #[command(flatten)]
        discover: DiscoverArgs,
    }

    #[test]
    fn defaults_are_nvidias_classes_and_nfds_minute() {
        let a = Top::try_parse_from(["discover", "--node-name", "n1"])
            .unwrap()
            .discover;
        assert_eq!(a.pci_classes, ["02", "0200", "0207", "0300", "0302"]);
        assert_eq!(a.interval, Duration::from_secs(60));
        let a = Top::try_parse_from([
            "discover",
            "--node-name",
            "n1",
            "--pci-classes",
            "0302,0680",
        ])
        .unwrap()
        .discover;
        assert_eq!(a.pci_classes, ["0302", "0680"]);
        let err = Top::try_parse_from(["discover", "--node-name", "n", "--interval", "10ms"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("under a second"), "{err}");
    }
}
