//! Running `testcluster/bin/helm` against a testcluster, shared by the chart tests.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail, ensure};
use kiln_testcluster::TestCluster;
use serde::Deserialize as _;
use serde_json::Value;

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

/// The objects of a multi-document YAML text (empty documents skipped); panics on bad YAML.
pub fn docs(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .filter_map(|d| Option::<Value>::deserialize(d).expect("YAML"))
        .collect()
}

/// `helm template kiln deploy/helm/kiln --namespace gpu-operator ARGS` (`--set …`, `-f …`,
/// `--api-versions …`), with helm's cache/config/data in a fresh directory: the objects, or
/// helm's error text when it fails; `None` (said on stderr) when `testcluster/bin/helm` is
/// not built, so the chart tests pass without it.
pub fn template(args: &[&str]) -> Option<Result<Vec<Value>, String>> {
    if helm_bin().is_err() {
        eprintln!("testcluster/bin/helm not built; skipping");
        return None;
    }
    let home = tempfile::tempdir().expect("a temporary directory");
    let base = [
        "template",
        "kiln",
        "deploy/helm/kiln",
        "--namespace",
        "gpu-operator",
    ];
    let all: Vec<&str> = base.iter().chain(args).copied().collect();
    let out = helm_command(None, home.path(), &all)
        .and_then(|mut cmd| Ok(cmd.output()?))
        .expect("helm runs");
    if !out.status.success() {
        return Some(Err(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    Some(Ok(docs(&String::from_utf8_lossy(&out.stdout))))
}
