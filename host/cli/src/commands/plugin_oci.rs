//! `kiln plugin push/pull` and the registry settings of `kiln render` and `kiln operator`:
//! plugins distributed through OCI registries by digest (`kiln_plugin_oci`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use kiln_core::oci_ref::{OciRef, OciTarget};

/// How plugins named `oci://…` are pulled (and pushed).
#[derive(Debug, Clone, clap::Args)]
pub struct RegistryArgs {
    /// A registry (host[:port], as references name it) reached over plain HTTP instead of
    /// HTTPS, e.g. a test registry; repeat or separate with commas.
    #[arg(
        long = "insecure-registry",
        env = "KILN_INSECURE_REGISTRIES",
        value_delimiter = ',',
        value_name = "HOST[:PORT]"
    )]
    pub insecure_registries: Vec<String>,
    /// Registry credentials: a Docker `config.json` (the `.dockerconfigjson` key of a
    /// `kubernetes.io/dockerconfigjson` Secret). Registries it does not name are pulled from
    /// anonymously.
    #[arg(long, env = "KILN_REGISTRY_AUTH", value_name = "FILE")]
    pub registry_auth: Option<PathBuf>,
}

impl RegistryArgs {
    /// The registry client these settings describe.
    ///
    /// # Errors
    /// The credentials file cannot be read or parsed.
    pub fn registry(&self) -> anyhow::Result<kiln_plugin_oci::Registry> {
        let credentials = match &self.registry_auth {
            Some(path) => {
                let json = std::fs::read(path)
                    .with_context(|| format!("registry credentials {}", path.display()))?;
                kiln_plugin_oci::Credentials::from_docker_config(&json)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
            }
            None => kiln_plugin_oci::Credentials::default(),
        };
        Ok(kiln_plugin_oci::Registry::new(
            self.insecure_registries.clone(),
            credentials,
        ))
    }
}

/// `kiln plugin push FILE oci://REGISTRY/REPOSITORY:TAG`: prints the reference to pin.
pub(crate) fn push(file: &Path, target: &str, args: &RegistryArgs) -> anyhow::Result<ExitCode> {
    let target = OciTarget::parse(target)?;
    let bytes = std::fs::read(file).with_context(|| file.display().to_string())?;
    let name = target
        .repository
        .rsplit('/')
        .next()
        .unwrap_or(&target.repository);
    check_name(&bytes, name).with_context(|| {
        format!(
            "{} cannot be pushed to {target}: the repository's last path segment ({name:?}) \
             is the name the operator calls it by, and the plugin must answer to it",
            file.display()
        )
    })?;
    let pinned = args
        .registry()?
        .push_blocking(&bytes, &target)
        .map_err(|e| anyhow::anyhow!("pushing {} to {target}: {e}", file.display()))?;
    super::outln!("{pinned}");
    Ok(ExitCode::SUCCESS)
}

/// Loads `bytes` as the drop-in plugin `name` (audit, compile, link and the `name()` check the
/// operator makes when it pulls it), so a push never publishes what a pull would refuse.
fn check_name(bytes: &[u8], name: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("scratch directory")?;
    std::fs::write(dir.path().join(format!("{name}.wasm")), bytes)?;
    let host = kiln_plugin_host::PluginHost::new(
        kiln_plugin_host::HostConfig {
            drop_in_dir: Some(dir.path().to_path_buf()),
            ..kiln_plugin_host::HostConfig::default()
        },
        kiln_bundled_plugins::BUNDLED,
    )?
    .with_bundled_digests(kiln_bundled_plugins::BUNDLED_SHA256);
    host.load(name, None)?;
    Ok(())
}

/// `kiln plugin pull oci://…@sha256:… [-o FILE]`: writes the verified component (default
/// `<plugin name>.wasm`) and prints its path and sha256.
pub(crate) fn pull(
    reference: &str,
    output: Option<&Path>,
    args: &RegistryArgs,
) -> anyhow::Result<ExitCode> {
    let reference = OciRef::parse(reference)?;
    let artifact = args
        .registry()?
        .pull_blocking(&reference, kiln_plugin_host::DEFAULT_MAX_COMPONENT_BYTES)
        .map_err(|e| anyhow::anyhow!("pulling {reference}: {e}"))?;
    kiln_plugin_host::oci::verify_artifact(&reference, &artifact)
        .map_err(|e| anyhow::anyhow!("pulling {reference}: refused: {e}"))?;
    let default = PathBuf::from(format!("{}.wasm", reference.plugin_name()));
    let path = output.unwrap_or(&default);
    std::fs::write(path, &artifact.component).with_context(|| path.display().to_string())?;
    super::outln!(
        "{}\tsha256:{}",
        path.display(),
        kiln_plugin_host::sha256_hex(&artifact.component)
    );
    Ok(ExitCode::SUCCESS)
}
