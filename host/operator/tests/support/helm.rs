//! Running `testcluster/bin/helm` against a testcluster, shared by the chart tests.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail, ensure};
use kiln_testcluster::TestCluster;

pub use super::repo;

/// `testcluster/bin/helm`, or an error saying how to build it.
pub fn helm_bin() -> anyhow::Result<PathBuf> {
    let bin = repo().join("testcluster/bin/helm");
    if !bin.is_file() {
        bail!(
            "{} not found: `testcluster/build.sh` builds it",
            bin.display()
        );
    }
    Ok(bin)
}

/// Runs helm `args` in the repository root with its cache/config/data under `home` and, with
/// a cluster, `--kubeconfig` of it; returns stdout, fails with helm's output.
pub fn helm_command(
    cluster: Option<&TestCluster>,
    home: &Path,
    args: &[&str],
) -> anyhow::Result<std::process::Command> {
    let mut cmd = std::process::Command::new(helm_bin()?);
    cmd.args(args).current_dir(repo());
    if let Some(cluster) = cluster {
        cmd.arg("--kubeconfig").arg(cluster.kubeconfig_path());
    }
    for (var, sub) in [
        ("HELM_CACHE_HOME", "cache"),
        ("HELM_CONFIG_HOME", "config"),
        ("HELM_DATA_HOME", "data"),
    ] {
        cmd.env(var, home.join(sub));
    }
    Ok(cmd)
}

/// [`helm_command`] run to completion off the async runtime; stdout on success.
pub async fn helm(cluster: &TestCluster, home: &Path, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = helm_command(Some(cluster), home, args)?;
    let what = format!("helm {}", args.join(" "));
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await?
        .with_context(|| what.clone())?;
    ensure!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}
