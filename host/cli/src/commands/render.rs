//! `kiln render`: a ClusterPolicy file → the objects of every enabled state.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, ValueEnum};
use kiln_core::context::{ContainerRuntime, NodeOs, TransformContext};
use kiln_render::{Policy, Renderer, defaults, output};

/// Output format.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    /// A YAML stream, one document per object.
    Yaml,
    /// A JSON `v1 List`.
    Json,
}

/// Render a ClusterPolicy (or, with `--gpu-cluster`, a GPUCluster) offline: every object of
/// every enabled state, in state order, each passed through its state's Wasm plugin chain.
/// Disabled states are omitted.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The ClusterPolicy YAML file.
    #[arg(long, required_unless_present = "gpu_cluster")]
    policy: Option<PathBuf>,
    /// A GPUCluster YAML file (`nvidia.com/v1alpha1`, named `gpu-cluster`) to render instead of
    /// a ClusterPolicy: every DRA state it enables (docs/gpucluster.md).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["policy", "nvidia_drivers"])]
    gpu_cluster: Option<PathBuf>,
    /// The `resource.k8s.io` version the cluster serves DeviceClasses at (with
    /// `--gpu-cluster`; the operator reads it from discovery).
    #[arg(
        long,
        default_value = kiln_render::gpucluster::DEVICE_CLASS_API,
        value_name = "GROUP/VERSION",
        value_parser = ["resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1"],
        requires = "gpu_cluster"
    )]
    device_class_api: String,
    /// Drop-in directory searched for `<name>.wasm` before the bundled plugins.
    #[arg(long, env = "KILN_PLUGINS_DIR")]
    plugins_dir: Option<PathBuf>,
    #[command(flatten)]
    host_policy: super::plugin::HostPolicyArgs,
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
    /// Kubernetes server version, vMAJOR.MINOR[.PATCH] (what `kubectl version` prints).
    #[arg(long, default_value = "v1.36.3", value_parser = parse_kubernetes_version)]
    kubernetes_version: String,
    /// Render for OpenShift MAJOR.MINOR (includes OpenShift-only objects; runtime CRI-O).
    #[arg(long, value_parser = parse_openshift_version)]
    openshift_version: Option<String>,
    /// Override a fallback image, as ENV=IMAGE (see `image_help` for the text).
    #[arg(long = "image", value_name = "ENV=IMAGE", help = image_help(), value_parser = parse_image)]
    images: Vec<(String, String)>,
    /// A referenced ConfigMap that exists, as NAME=KEY1,KEY2.
    #[arg(long = "config-map", value_name = "NAME=KEYS")]
    config_maps: Vec<String>,
    /// A referenced Secret that exists.
    #[arg(long = "secret", value_name = "NAME")]
    secrets: Vec<String>,
    /// Render as if the ServiceMonitor CRD were absent (ServiceMonitors are left out).
    #[arg(long)]
    no_service_monitors: bool,
    /// An NVIDIADriver YAML file (`nvidia.com/v1alpha1`): also print its driver objects, as
    /// the operator applies them with this policy for GPU nodes of `--os` that its
    /// `nodeSelector` selects (the DaemonSet name hashes `metadata.uid`, empty when the file has
    /// none). The policy must set `driver.useNvidiaDriverCRD: true`. Repeatable.
    #[arg(long = "nvidia-driver", value_name = "FILE")]
    nvidia_drivers: Vec<PathBuf>,
    /// Kernel of the GPU nodes (NFD `kernel-version.full`), for NVIDIADrivers with
    /// `usePrecompiled: true`.
    #[arg(long)]
    kernel: Option<String>,
}

/// The env-var names `--image` accepts: those of [`defaults::fallback_images`].
fn image_names() -> Vec<String> {
    defaults::fallback_images()
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// `--image`'s help, listing the names it accepts.
fn image_help() -> String {
    format!(
        "Override a fallback image, as ENV=IMAGE (e.g. `DRIVER_IMAGE=registry/driver:1`); ENV is one of: {}",
        image_names().join(", ")
    )
}

/// `ENV=IMAGE` with ENV one of [`image_names`]; any other name would be ignored.
fn parse_image(s: &str) -> Result<(String, String), String> {
    let (env, image) = s
        .split_once('=')
        .ok_or("expected ENV=IMAGE, e.g. DRIVER_IMAGE=registry/driver:1")?;
    let names = image_names();
    if !names.iter().any(|n| n == env) {
        return Err(format!(
            "unknown image name `{env}` (valid: {})",
            names.join(", ")
        ));
    }
    Ok((env.to_owned(), image.to_owned()))
}

/// True when `s` is MAJOR.MINOR or MAJOR.MINOR.PATCH, each part digits; a patch may carry a
/// suffix (`1.36.3-gke.100`, `4.17.0-rc.1`).
fn is_dotted_version(s: &str) -> bool {
    let mut parts = s.splitn(3, '.');
    let digits =
        |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let (major, minor, patch) = (parts.next(), parts.next(), parts.next());
    digits(major)
        && digits(minor)
        && patch.is_none_or(|p| p.bytes().next().is_some_and(|b| b.is_ascii_digit()))
}

/// `v1.36.3` (or without the `v`), kept as given.
fn parse_kubernetes_version(s: &str) -> Result<String, String> {
    if is_dotted_version(s.strip_prefix('v').unwrap_or(s)) {
        Ok(s.to_owned())
    } else {
        Err("expected vMAJOR.MINOR[.PATCH], e.g. v1.36.3".into())
    }
}

/// `4.17` (a patch is accepted too).
fn parse_openshift_version(s: &str) -> Result<String, String> {
    if is_dotted_version(s) {
        Ok(s.to_owned())
    } else {
        Err("expected MAJOR.MINOR, e.g. 4.17".into())
    }
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
        for (env, image) in &self.images {
            kiln_render::defaults::set_fallback_image(&mut ctx, env, image);
        }
        ctx.config_maps.extend(
            self.config_maps
                .iter()
                .map(|s| kiln_render::defaults::config_map_keys(s)),
        );
        ctx.secrets = self.secrets.clone();
        Ok(ctx)
    }

    /// Render and print; exit 1 (printing nothing on stdout) when any state fails.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        if let Some(path) = &self.gpu_cluster {
            return self.run_gpu_cluster(path);
        }
        let path = self
            .policy
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("--policy or --gpu-cluster is required"))?;
        let file = path.display().to_string();
        // kiln's one loader: a regular file of at most 1 MiB, nesting at most 64 deep, duplicate
        // keys refused; errors name the file and the field.
        let doc: serde_json::Value = kiln_input::load_file(path)?;
        let policy = Policy::from_object(&doc).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        for key in &policy.pruned {
            eprintln!(
                "warning: {file}: spec.{key} is not a ClusterPolicy field; it is ignored (the API server prunes it)"
            );
        }
        // The operator runs NVIDIADriver CRs only when the policy hands the driver to them
        // (it marks them Disabled otherwise): rendering both drivers would show what no
        // cluster applies.
        if let Some(cr) = self.nvidia_drivers.first()
            && !kiln_core::plan::hands_off(kiln_core::State::Driver, &policy.spec)
        {
            bail!(
                "{}: an NVIDIADriver runs only when the ClusterPolicy sets \
                 driver.useNvidiaDriverCRD: true (the operator marks it Disabled otherwise, \
                 and runs the policy's own driver); set it in {file}",
                cr.display()
            );
        }
        let ctx = self.context()?;
        let renderer = Renderer::new(super::plugin_host(
            self.plugins_dir.clone(),
            kiln_plugin_host::DEFAULT_KEEP_RESIDENT_BYTES,
            &self.host_policy,
        )?);
        let pending = uncompiled_plugins(&renderer, &policy);
        let started = std::time::Instant::now();
        if !pending.is_empty() {
            // The bundled plugins are one component (the standard bundle), compiled once.
            let components: std::collections::BTreeSet<&str> =
                pending.iter().map(|(_, d)| d.as_str()).collect();
            let names: Vec<&str> = pending.iter().map(|(n, _)| n.as_str()).collect();
            tracing::info!(
                target: super::PROGRESS_TARGET,
                plugins = pending.len(),
                components = components.len(),
                "compiling {} component(s) on first use, for plugin(s) {} (the bundled plugins' \
                 one takes a few seconds; later runs load them from the cache; `kiln plugin \
                 precompile` fills it ahead of time)",
                components.len(),
                names.join(", ")
            );
        }
        // Each object with the `# Source:` text of its state: `state-driver via driver, site-x`;
        // a drop-in replacing a bundled plugin is named as such: `via device-plugin (drop-in
        // /etc/kiln/plugins/device-plugin.wasm, shadows bundled)`.
        let mut objects = Vec::new();
        let mut failed = 0;
        for (state, result) in renderer.render(&policy, &ctx) {
            match result {
                Ok(r) => {
                    let chain: Vec<String> = policy
                        .plugins
                        .chain(state)
                        .into_iter()
                        .map(|p| {
                            renderer
                                .host()
                                .loaded(&p.name)
                                .map_or(p.name, |l| l.describe_source())
                        })
                        .collect();
                    let source = format!("state-{state} via {}", chain.join(", "));
                    objects.extend(r.objects.into_iter().map(|o| (source.clone(), o)));
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("error: {file}: {e}");
                    tracing::debug!(%state, "state failed");
                }
            }
        }
        if !pending.is_empty() {
            tracing::info!(
                target: super::PROGRESS_TARGET,
                plugins = pending.len(),
                seconds = started.elapsed().as_secs_f64(),
                "compiled and rendered in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        for path in &self.nvidia_drivers {
            match self.render_nvidia_driver(path, &renderer, &policy, &ctx) {
                Ok(objs) => objects.extend(objs),
                Err(e) => {
                    failed += 1;
                    eprintln!("error: {e:#}");
                }
            }
        }
        if failed > 0 {
            bail!("{failed} state(s) failed to render");
        }
        self.print(objects)?;
        Ok(ExitCode::SUCCESS)
    }
}

impl RenderArgs {
    /// Render the GPUCluster in `path` and print its objects (each with its `# Source:` text,
    /// `state-<name> via <plugin>`); exit 1, printing nothing on stdout, when a state fails.
    fn run_gpu_cluster(&self, path: &std::path::Path) -> anyhow::Result<ExitCode> {
        use kiln_render::gpucluster::{GpuClusterDoc, render};
        let file = path.display().to_string();
        let doc: serde_json::Value = kiln_input::load_file(path)?;
        let cr = GpuClusterDoc::from_object(&doc).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        for key in &cr.pruned {
            eprintln!(
                "warning: {file}: spec.{key} is not a GPUCluster field; it is ignored (the API server prunes it)"
            );
        }
        let ctx = self.context()?;
        let renderer = Renderer::new(super::plugin_host(
            self.plugins_dir.clone(),
            kiln_plugin_host::DEFAULT_KEEP_RESIDENT_BYTES,
            &self.host_policy,
        )?);
        let mut objects = Vec::new();
        let mut failed = 0;
        for (state, result) in render(&renderer, &cr, &ctx, &self.device_class_api) {
            match result {
                Ok(objs) => {
                    let via = renderer
                        .host()
                        .loaded(state.name())
                        .map_or(state.name().to_string(), |l| l.describe_source());
                    let source = format!("state-{state} via {via}");
                    objects.extend(objs.into_iter().map(|o| (source.clone(), o)));
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("error: {file}: {e}");
                }
            }
        }
        if failed > 0 {
            bail!("{failed} state(s) failed to render");
        }
        self.print(objects)?;
        Ok(ExitCode::SUCCESS)
    }

    /// Print `(source, object)` pairs to stdout in the `--output` format.
    fn print(&self, objects: Vec<(String, serde_json::Value)>) -> anyhow::Result<()> {
        let text = match self.output {
            Format::Yaml => {
                output::yaml_stream_with_sources(objects.iter().map(|(s, o)| (s.as_str(), o)))?
            }
            Format::Json => {
                let objects: Vec<serde_json::Value> = objects.into_iter().map(|(_, o)| o).collect();
                output::json_list(&objects)
            }
        };
        super::write_stdout(&text)?;
        Ok(())
    }

    /// The objects of the NVIDIADriver in `path` (with their `# Source` text) for one node pool:
    /// a GPU node of `--os` (and `--kernel`) carrying the labels the CR selects.
    fn render_nvidia_driver(
        &self,
        path: &std::path::Path,
        renderer: &Renderer,
        policy: &Policy,
        ctx: &TransformContext,
    ) -> anyhow::Result<Vec<(String, serde_json::Value)>> {
        use kiln_core::context::{OS_ID_LABEL, OS_VERSION_LABEL};
        use kiln_core::spec::nvidiadriver::{KERNEL_LABEL, node_pools};
        use kiln_render::nvidiadriver::{NvidiaDriverDoc, derived_policy, render_pools};
        let file = path.display().to_string();
        let doc: serde_json::Value = kiln_input::load_file(path)?;
        let cr = NvidiaDriverDoc::from_object(&doc).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        for key in &cr.pruned {
            eprintln!(
                "warning: {file}: spec.{key} is not an NVIDIADriver field; it is ignored (the API server prunes it)"
            );
        }
        if let Some(why) = kiln_render::nvidiadriver::unsupported(&cr.spec) {
            bail!("{file}: NVIDIADriver {}: {why}", cr.name);
        }
        let mut node = cr.spec.effective_selector();
        node.insert(OS_ID_LABEL.into(), self.os.id.clone());
        node.insert(OS_VERSION_LABEL.into(), self.os.version_id.clone());
        if let Some(k) = &self.kernel {
            node.insert(KERNEL_LABEL.into(), k.clone());
        }
        let pools = node_pools(&cr.spec, [&node]);
        if pools.is_empty() {
            bail!(
                "{file}: NVIDIADriver {} selects no node here (usePrecompiled needs --kernel)",
                cr.name
            );
        }
        let derived = derived_policy(policy, &cr.name, &cr.spec)
            .map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        let rendered = render_pools(renderer, &derived, &cr.name, &cr.uid, &cr.spec, &pools, ctx)
            .map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        let source = format!("nvidiadriver/{} state-driver via driver", cr.name);
        Ok(rendered
            .into_iter()
            .flat_map(|(_, objs)| objs)
            .map(|o| (source.clone(), o))
            .collect())
    }
}

/// The plugins of the enabled states' chains that have no precompiled artifact (so this run
/// compiles them), sorted, each with its digest: a drop-in `<name>.wasm` by the digest of its
/// file, a bundled plugin by its build-time digest; every plugin when there is no disk cache.
fn uncompiled_plugins(renderer: &Renderer, policy: &Policy) -> Vec<(String, String)> {
    let host = renderer.host();
    let drop_in_dir = host.config().drop_in_dir.clone();
    let mut names: Vec<String> = kiln_core::plan::enabled_states(&policy.spec)
        .into_iter()
        .flat_map(|state| policy.plugins.chain(state))
        .map(|p| p.name)
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|name| {
            let drop_in = drop_in_dir
                .as_ref()
                .map(|d| d.join(format!("{name}.wasm")))
                .and_then(|f| std::fs::read(f).ok());
            let digest = match drop_in {
                Some(bytes) => Some(kiln_plugin_host::sha256_hex(&bytes)),
                None => kiln_bundled_plugins::BUNDLED_SHA256
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, d)| (*d).to_string()),
            };
            // A plugin that exists nowhere fails later with its own error; it compiles nothing.
            digest
                .filter(|d| host.artifact_path(d).is_none_or(|p| !p.is_file()))
                .map(|d| (name, d))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[test]
    fn versions_are_checked() {
        assert_eq!(parse_kubernetes_version("v1.36.3").unwrap(), "v1.36.3");
        assert_eq!(parse_kubernetes_version("1.30").unwrap(), "1.30");
        assert!(parse_kubernetes_version("v1.31.2-gke.100").is_ok());
        for bad in ["garbage", "v1", "v1.x", "", "v.1.2"] {
            assert!(parse_kubernetes_version(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_openshift_version("4.17").unwrap(), "4.17");
        for bad in ["4", "four.17", "4."] {
            assert!(parse_openshift_version(bad).is_err(), "{bad}");
        }
    }

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: RenderArgs,
    }

    fn parse(args: &[&str]) -> Result<RenderArgs, clap::Error> {
        Cli::try_parse_from([&["kiln-render", "--policy", "p.yaml"], args].concat()).map(|c| c.args)
    }

    #[test]
    fn a_known_image_name_overrides_its_fallback() {
        let a = parse(&["--image", "DRIVER_IMAGE=registry/driver:1"]).unwrap();
        let ctx = a.context().unwrap();
        let driver: Vec<_> = ctx
            .fallback_images
            .iter()
            .filter(|(k, _)| k == "DRIVER_IMAGE")
            .collect();
        assert_eq!(
            driver,
            [&("DRIVER_IMAGE".to_owned(), "registry/driver:1".to_owned())]
        );
    }

    #[test]
    fn an_unknown_image_name_is_rejected_with_the_valid_ones() {
        let err = parse(&["--image", "FOO_IMAGE=x/y:1"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("invalid value 'FOO_IMAGE=x/y:1' for '--image <ENV=IMAGE>'")
                && err.contains("unknown image name `FOO_IMAGE` (valid: VALIDATOR_IMAGE, ")
                && err.contains("DRIVER_IMAGE, ")
                && err.contains("CC_MANAGER_IMAGE"),
            "{err}"
        );
        let err = parse(&["--image", "DRIVER_IMAGE"]).unwrap_err().to_string();
        assert!(err.contains("expected ENV=IMAGE"), "{err}");
    }

    #[test]
    fn image_help_lists_every_name() {
        let help = image_help();
        for name in image_names() {
            assert!(help.contains(&name), "{name} missing from {help}");
        }
        assert!(help.contains("VGPU_DEVICE_MANAGER_IMAGE"));
    }
}
