//! `kiln render`: a ClusterPolicy file → the objects of every enabled state.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use kiln_core::context::{ConfigMapKeys, ContainerRuntime, NodeOs, TransformContext};
use kiln_render::{Policy, Renderer, defaults, output};

/// Output format.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    /// A YAML stream, one document per object.
    Yaml,
    /// A JSON `v1 List`.
    Json,
}

/// Render a ClusterPolicy offline: every object of every enabled state, in state order, each
/// passed through its state's Wasm plugin chain. Disabled states are omitted.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The ClusterPolicy YAML file.
    #[arg(long)]
    policy: PathBuf,
    /// Drop-in directory searched for `<name>.wasm` before the bundled plugins.
    #[arg(long, env = "KILN_PLUGINS_DIR")]
    plugins_dir: Option<PathBuf>,
    /// Container runtime of the GPU nodes: containerd, crio or docker.
    #[arg(long, default_value = "containerd", value_parser = parse_runtime)]
    runtime: ContainerRuntime,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "yaml")]
    output: Format,
    /// Operator namespace.
    #[arg(long, default_value = "gpu-operator")]
    namespace: String,
    /// OS of the GPU nodes as ID:VERSION_ID (NFD `system-os_release`), e.g. `ubuntu:22.04`.
    #[arg(long, default_value = "ubuntu:22.04", value_parser = parse_os)]
    os: NodeOs,
    /// Kubernetes server version.
    #[arg(long, default_value = "v1.36.3")]
    kubernetes_version: String,
    /// Render for OpenShift MAJOR.MINOR (includes OpenShift-only objects; runtime CRI-O).
    #[arg(long)]
    openshift_version: Option<String>,
    /// Override a fallback image, as ENV=IMAGE (e.g. `DRIVER_IMAGE=registry/driver:1`).
    #[arg(long = "image", value_name = "ENV=IMAGE")]
    images: Vec<String>,
    /// A referenced ConfigMap that exists, as NAME=KEY1,KEY2.
    #[arg(long = "config-map", value_name = "NAME=KEYS")]
    config_maps: Vec<String>,
    /// A referenced Secret that exists.
    #[arg(long = "secret", value_name = "NAME")]
    secrets: Vec<String>,
    /// Render as if the ServiceMonitor CRD were absent (ServiceMonitors are left out).
    #[arg(long)]
    no_service_monitors: bool,
}

fn parse_runtime(s: &str) -> Result<ContainerRuntime, String> {
    s.parse()
}

fn parse_os(s: &str) -> Result<NodeOs, String> {
    let (id, version) = s
        .split_once(':')
        .ok_or("expected ID:VERSION_ID, e.g. ubuntu:22.04")?;
    Ok(NodeOs {
        id: id.into(),
        version_id: version.into(),
    })
}

impl RenderArgs {
    fn context(&self) -> anyhow::Result<TransformContext> {
        let mut ctx = defaults::render_context();
        ctx.runtime = if self.openshift_version.is_some() {
            ContainerRuntime::Crio
        } else {
            self.runtime
        };
        ctx.operator_namespace = self.namespace.clone();
        ctx.gpu_node_os = Some(self.os.clone());
        ctx.kubernetes_version = self.kubernetes_version.clone();
        ctx.openshift_version = self.openshift_version.clone();
        ctx.has_service_monitor_crd = !self.no_service_monitors;
        for spec in &self.images {
            let (env, image) = spec
                .split_once('=')
                .with_context(|| format!("--image {spec:?}: expected ENV=IMAGE"))?;
            ctx.fallback_images.retain(|(k, _)| k != env);
            ctx.fallback_images
                .push((env.to_string(), image.to_string()));
        }
        for spec in &self.config_maps {
            let (name, keys) = spec.split_once('=').unwrap_or((spec, ""));
            let mut keys: Vec<String> = keys
                .split(',')
                .filter(|k| !k.is_empty())
                .map(str::to_string)
                .collect();
            keys.sort();
            ctx.config_maps.push(ConfigMapKeys {
                name: name.to_string(),
                keys,
            });
        }
        ctx.secrets = self.secrets.clone();
        Ok(ctx)
    }

    /// Render and print; exit 1 (printing nothing on stdout) when any state fails.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let file = self.policy.display().to_string();
        let text = std::fs::read_to_string(&self.policy)
            .with_context(|| format!("{file}: cannot read"))?;
        let doc: serde_json::Value =
            serde_yaml_ng::from_str(&text).with_context(|| format!("{file}: invalid YAML"))?;
        let policy = Policy::from_object(&doc).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        for key in kiln_render::policy::unknown_spec_keys(&policy.spec_json) {
            eprintln!(
                "warning: {file}: spec.{key} is not a ClusterPolicy field kiln knows; it is passed to plugins unread"
            );
        }
        let ctx = self.context()?;
        let renderer = Renderer::new(super::plugin_host(self.plugins_dir.clone())?);
        let mut objects = Vec::new();
        let mut failed = 0;
        for (state, result) in renderer.render(&policy, &ctx) {
            match result {
                Ok(r) => objects.extend(r.objects),
                Err(e) => {
                    failed += 1;
                    eprintln!("error: {file}: {e}");
                    tracing::debug!(%state, "state failed");
                }
            }
        }
        if failed > 0 {
            bail!("{failed} state(s) failed to render");
        }
        let text = match self.output {
            Format::Yaml => output::yaml_stream(&objects)?,
            Format::Json => output::json_list(&objects),
        };
        super::write_stdout(&text)?;
        Ok(ExitCode::SUCCESS)
    }
}
