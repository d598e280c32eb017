//! `kiln gfd`: GPU feature discovery — publishes the `nvidia.com/*` GPU labels as NVIDIA's GFD
//! does, for Node Feature Discovery to put on the node: a NodeFeature object (default), the
//! features.d file (`USE_NODE_FEATURE_API=false`), or stdout; once or every
//! `GFD_SLEEP_INTERVAL` (see `kiln_gfd`).

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use kiln_device_plugin::config::{MigStrategy, SleepInterval};
use kiln_gfd::{NodeFeatureTarget, Options, Output};
use kiln_gpu::BackendSpec;

/// Where `kiln gfd` writes labels, when `--output` overrides NVIDIA's choice (NodeFeature
/// unless `--use-node-feature-api=false`, then `--output-file`, stdout when that is empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OutputKind {
    /// This node's NodeFeature `nvidia-features-for-<node>` in `--namespace` (needs NODE_NAME).
    NodeFeature,
    /// An NFD features.d file (`--output-file`).
    File,
    /// `key=value` lines on stdout.
    Stdout,
}

/// Flags of `kiln gfd`, with upstream GFD's env vars.
#[derive(Debug, clap::Args)]
pub struct GfdArgs {
    /// Where labels go; without it, NVIDIA's rule: a NodeFeature, or with
    /// `--use-node-feature-api=false` the `--output-file` (stdout when empty).
    #[arg(long, env = "GFD_OUTPUT", value_enum)]
    output: Option<OutputKind>,
    /// Publish a NodeFeature object (NFD's Node Feature API; NVIDIA's default since v0.19).
    /// Also read from `USE_NODE_FEATURE_API` (what the operator sets on OpenShift), as upstream.
    #[arg(long, env = "GFD_USE_NODE_FEATURE_API", action = clap::ArgAction::Set)]
    use_node_feature_api: Option<bool>,
    /// Upstream's second env var for `--use-node-feature-api`.
    #[arg(long = "use-node-feature-api-env", env = "USE_NODE_FEATURE_API", hide = true, action = clap::ArgAction::Set)]
    use_node_feature_api_env: Option<bool>,
    /// The features.d file nfd-worker reads (an empty value means stdout, as upstream).
    #[arg(
        long,
        short = 'o',
        env = "GFD_OUTPUT_FILE",
        default_value = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
    )]
    output_file: String,
    /// This node (downward API); required for the NodeFeature.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// The namespace of the NodeFeature (GFD's own, downward API).
    #[arg(long, env = "NAMESPACE", default_value = "default")]
    namespace: String,
    /// This pod (downward API): the NodeFeature is owned by it and its DaemonSet.
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// The device-plugin config file (written by config-manager); a file named here must
    /// exist. Also read from `CONFIG_FILE` (what the operator sets), as upstream; default
    /// `/config/config.yaml`, where an absent file means the default config.
    #[arg(long, env = "GFD_CONFIG_FILE")]
    config_file: Option<PathBuf>,
    /// Upstream's second env var for `--config-file`.
    #[arg(long = "config-file-env", env = "CONFIG_FILE", hide = true)]
    config_file_env: Option<PathBuf>,
    /// `none`, `single` or `mixed`; overrides the config file's `flags.migStrategy`. Also read
    /// from `MIG_STRATEGY` (what the operator sets), as upstream.
    #[arg(long, env = "GFD_MIG_STRATEGY")]
    mig_strategy: Option<MigStrategy>,
    /// Upstream's second env var for `--mig-strategy`; kept raw so that a bad value is
    /// reported under the env var's name, and empty (the operator's `MIG_STRATEGY: ''` when
    /// `spec.mig` is absent) means unset.
    #[arg(long = "mig-strategy-env", env = "MIG_STRATEGY", hide = true)]
    mig_strategy_env: Option<String>,
    /// Label once and exit.
    #[arg(long, env = "GFD_ONESHOT", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    oneshot: Option<bool>,
    /// Omit `nvidia.com/gfd.timestamp`.
    #[arg(long, env = "GFD_NO_TIMESTAMP", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    no_timestamp: Option<bool>,
    /// Relabel interval as a Go duration (`60s`, `1m30s`) or `infinite`.
    #[arg(long, env = "GFD_SLEEP_INTERVAL")]
    sleep_interval: Option<SleepInterval>,
    /// Exit with an error when NVML cannot be opened (else label only the timestamp). Also
    /// read from `FAIL_ON_INIT_ERROR`, as upstream; default true.
    #[arg(long, env = "GFD_FAIL_ON_INIT_ERROR", action = clap::ArgAction::Set)]
    fail_on_init_error: Option<bool>,
    /// Upstream's second env var for `--fail-on-init-error`.
    #[arg(long = "fail-on-init-error-env", env = "FAIL_ON_INIT_ERROR", hide = true, action = clap::ArgAction::Set)]
    fail_on_init_error_env: Option<bool>,
    /// The machine-type file for `nvidia.com/gpu.machine`.
    #[arg(long, env = "GFD_MACHINE_TYPE_FILE")]
    machine_type_file: Option<PathBuf>,
    /// Where sysfs is mounted (PCI classes for `nvidia.com/gpu.mode`).
    #[arg(long, env = "KILN_GFD_SYS_DIR", default_value = "/sys")]
    sys_dir: PathBuf,
    #[arg(long, help = super::GPU_BACKEND_HELP, env = "KILN_GFD_GPU_BACKEND", default_value = "nvml")]
    gpu_backend: BackendSpec,
}

/// Default of `--config-file`: where config-manager writes this node's config.
const DEFAULT_CONFIG_FILE: &str = "/config/config.yaml";

impl GfdArgs {
    /// The config file: `--config-file`/`GFD_CONFIG_FILE`, then `CONFIG_FILE`, then
    /// `/config/config.yaml` (upstream's env order).
    fn config_file(&self) -> PathBuf {
        self.named_config_file()
            .unwrap_or_else(|| DEFAULT_CONFIG_FILE.into())
    }

    /// The config file named by a flag or env var (which then must exist), `None` for the
    /// built-in default (which may be absent: the default config).
    fn named_config_file(&self) -> Option<PathBuf> {
        self.config_file
            .clone()
            .or_else(|| self.config_file_env.clone())
    }

    /// `--mig-strategy`/`GFD_MIG_STRATEGY`, then `MIG_STRATEGY` (empty = unset); `None`
    /// leaves it to the file. Errors name `MIG_STRATEGY` and the valid values.
    fn mig_strategy(&self) -> anyhow::Result<Option<MigStrategy>> {
        if let Some(s) = self.mig_strategy {
            return Ok(Some(s));
        }
        match self.mig_strategy_env.as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                anyhow::anyhow!(
                    "invalid value '{v}' for env var MIG_STRATEGY (valid: none, single, mixed)"
                )
            }),
        }
    }

    /// `--fail-on-init-error`/`GFD_FAIL_ON_INIT_ERROR`, then `FAIL_ON_INIT_ERROR`, then true.
    fn fail_on_init_error(&self) -> bool {
        self.fail_on_init_error
            .or(self.fail_on_init_error_env)
            .unwrap_or(true)
    }

    /// Where labels go: `--output`, else a NodeFeature unless the Node Feature API is off
    /// (`--use-node-feature-api`, then `USE_NODE_FEATURE_API`, default true), else the
    /// features.d file, or stdout when `--output-file` is empty (NVIDIA's rule).
    fn output_kind(&self) -> OutputKind {
        if let Some(k) = self.output {
            return k;
        }
        if self
            .use_node_feature_api
            .or(self.use_node_feature_api_env)
            .unwrap_or(true)
        {
            OutputKind::NodeFeature
        } else if self.output_file.is_empty() {
            OutputKind::Stdout
        } else {
            OutputKind::File
        }
    }

    /// Labels until SIGINT/SIGTERM (or once with `--oneshot`).
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let mig_strategy = self.mig_strategy()?;
        let gpu = match kiln_gpu::open(&self.gpu_backend) {
            Ok(g) => Some(g),
            Err(e) if !self.fail_on_init_error() => {
                tracing::warn!(error = %kiln_validator::chain(&e), "no GPU inventory; labelling the timestamp only");
                None
            }
            Err(e) => return Err(e).context("opening the GPU backend"),
        };
        let output_kind = self.output_kind();
        let opts = Options {
            config_file: Some(self.config_file()),
            config_file_optional: self.named_config_file().is_none(),
            mig_strategy,
            oneshot: self.oneshot,
            no_timestamp: self.no_timestamp,
            sleep_interval: self.sleep_interval,
            machine_type_file: self.machine_type_file,
            sys_dir: self.sys_dir,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        rt.block_on(async {
            let output = match output_kind {
                OutputKind::Stdout => Output::Stdout,
                OutputKind::File => Output::File(self.output_file.into()),
                OutputKind::NodeFeature => {
                    let node = self.node_name.context(
                        "the NodeFeature output needs --node-name / NODE_NAME (or USE_NODE_FEATURE_API=false for the features.d file)",
                    )?;
                    let client = super::kube_client(None)
                        .await
                        .context("connecting to the API server")?;
                    Output::NodeFeature(NodeFeatureTarget {
                        client,
                        node,
                        namespace: self.namespace,
                        pod: self.pod_name,
                    })
                }
            };
            kiln_gfd::run(&opts, gpu, &output, super::termination()).await?;
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
        gfd: GfdArgs,
    }

    fn parse(args: &[&str]) -> GfdArgs {
        Top::try_parse_from([&["gfd"], args].concat()).unwrap().gfd
    }

    #[test]
    fn upstream_second_env_names_fill_in_after_the_gfd_ones() {
        // Env vars are process-wide; flags stand in for them here (same fields, same merge).
        let a = parse(&[]);
        assert_eq!(a.config_file(), PathBuf::from("/config/config.yaml"));
        assert_eq!(a.mig_strategy().unwrap(), None);
        assert!(a.fail_on_init_error());
        let a = parse(&[
            "--config-file-env",
            "/cfg/a.yaml",
            "--mig-strategy-env",
            "mixed",
            "--fail-on-init-error-env",
            "false",
        ]);
        assert_eq!(a.config_file(), PathBuf::from("/cfg/a.yaml"));
        assert_eq!(a.mig_strategy().unwrap(), Some(MigStrategy::Mixed));
        assert!(!a.fail_on_init_error());
        let a = parse(&[
            "--config-file",
            "/cfg/b.yaml",
            "--config-file-env",
            "/cfg/a.yaml",
            "--mig-strategy",
            "single",
            "--mig-strategy-env",
            "mixed",
            "--fail-on-init-error",
            "true",
            "--fail-on-init-error-env",
            "false",
        ]);
        assert_eq!(a.config_file(), PathBuf::from("/cfg/b.yaml"));
        assert_eq!(a.mig_strategy().unwrap(), Some(MigStrategy::Single));
        assert!(a.fail_on_init_error());
    }

    #[test]
    fn output_follows_nvidias_rule_unless_named() {
        assert_eq!(parse(&[]).output_kind(), OutputKind::NodeFeature);
        let a = parse(&["--use-node-feature-api-env", "false"]);
        assert_eq!(a.output_kind(), OutputKind::File);
        assert_eq!(
            a.output_file,
            "/etc/kubernetes/node-feature-discovery/features.d/gfd"
        );
        let a = parse(&["--use-node-feature-api", "false", "--output-file", ""]);
        assert_eq!(a.output_kind(), OutputKind::Stdout);
        let a = parse(&[
            "--use-node-feature-api",
            "true",
            "--use-node-feature-api-env",
            "false",
        ]);
        assert_eq!(a.output_kind(), OutputKind::NodeFeature);
        let a = parse(&["--output", "stdout"]);
        assert_eq!(a.output_kind(), OutputKind::Stdout);
    }

    #[test]
    fn an_empty_mig_strategy_env_is_unset_and_a_bad_one_names_the_env_var() {
        assert_eq!(
            parse(&["--mig-strategy-env", ""]).mig_strategy().unwrap(),
            None
        );
        let err = parse(&["--mig-strategy-env", "bogus"])
            .mig_strategy()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid value 'bogus' for env var MIG_STRATEGY (valid: none, single, mixed)"
        );
        let a = parse(&["--mig-strategy", "none", "--mig-strategy-env", "bogus"]);
        assert_eq!(a.mig_strategy().unwrap(), Some(MigStrategy::None));
    }
}
