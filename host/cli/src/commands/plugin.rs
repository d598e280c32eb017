//! `kiln plugin …`: tools for plugin authors.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

/// What site plugins (drop-ins, not bundled with kiln) may do: the settings of
/// `kiln_plugin_host::HostConfig` that `kiln render` and `kiln operator` take as flags and env
/// vars, documented in `wit/README.md` ("Output policy", "Shadowing").
#[derive(Debug, Clone, clap::Args)]
pub struct HostPolicyArgs {
    /// Whether site plugins may widen operand pods' privileges (hostPID/hostNetwork/hostIPC,
    /// privileged containers, added capabilities, hostPath volumes) beyond what the object had:
    /// `deny` (default) or `allow`. Standard plugins are not restricted.
    #[arg(
        long,
        env = kiln_plugin_host::SITE_POD_PRIVILEGES_ENV,
        default_value = "deny",
        value_name = "deny|allow"
    )]
    pub site_pod_privileges: kiln_plugin_host::PodPrivileges,
    /// Refuse a drop-in plugin named like a bundled one (by default it replaces the bundled
    /// plugin, with a warning, and the `# Source` line says so).
    /// The env var takes true/false, yes/no, on/off or 1/0.
    #[arg(long, env = kiln_plugin_host::REFUSE_SHADOWING_ENV,
          value_parser = clap::builder::BoolishValueParser::new(),
          action = clap::ArgAction::SetTrue)]
    pub refuse_shadowing: bool,
    #[command(flatten)]
    pub registry: super::plugin_oci::RegistryArgs,
}

/// Plugin tools.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Report a plugin's name, sha256, exports and imports, and whether the host accepts it
    /// under its file name. Exits 1 when it would be refused (also when its `name()` differs
    /// from the file name, which the host refuses). An accepted plugin is compiled into the
    /// cache directory (`$KILN_PLUGIN_CACHE_DIR`, else `~/.cache/kiln/plugins`), as `kiln
    /// render` compiles it, so neither compiles it again.
    Check {
        /// The component (`.wasm`).
        file: PathBuf,
    },
    /// List the bundled plugins with their sha256 (what a pin must say).
    List,
    /// Write a new plugin project NAME (kiln:operand@0.2.0) that builds as it stands and ships
    /// its own case files (`kiln plugin test`).
    New {
        /// The plugin's name: its file name without `.wasm`, and the crate's name.
        name: String,
        /// The project's language: rust (cargo), python (componentize-py) or js
        /// (componentize-js); each template builds with its toolchain's default command.
        #[arg(long, default_value = "rust", value_parser = ["rust", "python", "js"])]
        lang: String,
        /// Directory to create the project in.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Run case files (`*.yaml` in CASES_DIR; format in wit/README.md, "Testing a plugin")
    /// through kiln's plugin host; exits 1 when an expectation is wrong.
    Test {
        /// The component (`.wasm`).
        plugin: PathBuf,
        /// Directory of case files.
        cases_dir: PathBuf,
    },
    /// Show what a plugin does to a state's objects as the policy's own chain renders them:
    /// one line per object with the plugin's JSON Patch (or omit), then its log (`kiln render`
    /// prints the objects).
    Run {
        /// The component (`.wasm`).
        plugin: PathBuf,
        /// The state, e.g. `device-plugin`.
        #[arg(long, value_parser = kiln_render::site::parse_state)]
        state: kiln_core::State,
        /// The ClusterPolicy (YAML).
        #[arg(long)]
        policy: PathBuf,
        /// The plugin's settings (YAML), as a `then:` entry's `settings` would give them.
        #[arg(long)]
        settings: Option<PathBuf>,
    },
    /// Compile every bundled plugin (and every `<name>.wasm` in the drop-in directory) into
    /// the precompiled-artifact cache, so that a later `kiln operator` or `kiln render` loads
    /// them without compiling. The operator Deployment runs this as an init container.
    Precompile {
        /// Cache directory (default `$KILN_PLUGIN_CACHE_DIR`, else `~/.cache/kiln/plugins`).
        #[arg(long, env = kiln_plugin_host::CACHE_DIR_ENV)]
        cache_dir: Option<PathBuf>,
        /// Drop-in directory whose `*.wasm` files are compiled too.
        #[arg(long, env = "KILN_PLUGINS_DIR")]
        plugins_dir: Option<PathBuf>,
        /// Afterwards delete every other `*.cwasm` in the cache directory (artifacts of earlier
        /// builds; the bundled plugins are one artifact of about 8 MiB per build).
        #[arg(long)]
        prune: bool,
    },
    /// Push a component to a registry as a Wasm OCI artifact (the layout `wkg` uses) and print
    /// the reference to pin in a chain: `oci://REGISTRY/REPOSITORY@sha256:…`. The repository's
    /// last path component must be the plugin's `name()`.
    Push {
        /// The component (`.wasm`).
        file: PathBuf,
        /// `oci://REGISTRY/REPOSITORY:TAG`.
        target: String,
        #[command(flatten)]
        registry: super::plugin_oci::RegistryArgs,
    },
    /// Pull a component by digest (`oci://REGISTRY/REPOSITORY@sha256:…`), verify the manifest
    /// and layer digests, and write it.
    Pull {
        /// `oci://REGISTRY/REPOSITORY@sha256:<64 hex>` (a tag is refused).
        reference: String,
        /// Where to write it (default `<plugin name>.wasm`).
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        registry: super::plugin_oci::RegistryArgs,
    },
    /// Write the WIT package plugins are written against (`kiln:operand`) as a binary WIT
    /// package, what `wasm-tools component wit --wasm` and `wkg wit build` write, for component
    /// tooling to depend on; prints its name, worlds and sha256.
    Wit {
        /// The package version: 0.2.0 (current) or 0.1.0 (still loaded).
        #[arg(long, default_value = "0.2.0")]
        version: String,
        /// Where to write it (default `kiln-operand-VERSION.wasm`; `-` for stdout, the summary
        /// then on stderr).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

impl PluginCommand {
    /// Run it.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            PluginCommand::Check { file } => check(&file),
            PluginCommand::List => {
                // Every bundled plugin is the standard bundle (one component, one digest): the
                // build-time digests spare hashing it once per name.
                for ((name, bytes), (_, digest)) in kiln_bundled_plugins::BUNDLED
                    .iter()
                    .zip(kiln_bundled_plugins::BUNDLED_SHA256)
                {
                    super::outln!("{name}\t{digest}\t{} bytes", bytes.len());
                }
                Ok(ExitCode::SUCCESS)
            }
            PluginCommand::New { name, lang, dir } => {
                super::plugin_author::new_project(&name, &lang, &dir)
            }
            PluginCommand::Test { plugin, cases_dir } => {
                super::plugin_author::test(&plugin, &cases_dir)
            }
            PluginCommand::Run {
                plugin,
                state,
                policy,
                settings,
            } => super::plugin_author::run(&plugin, state, &policy, settings.as_deref()),
            PluginCommand::Precompile {
                cache_dir,
                plugins_dir,
                prune,
            } => precompile(cache_dir, plugins_dir, prune),
            PluginCommand::Push {
                file,
                target,
                registry,
            } => super::plugin_oci::push(&file, &target, &registry),
            PluginCommand::Pull {
                reference,
                output,
                registry,
            } => super::plugin_oci::pull(&reference, output.as_deref(), &registry),
            PluginCommand::Wit { version, output } => wit(&version, output),
        }
    }
}

/// `kiln plugin wit`: writes the binary WIT package and says what it declares.
fn wit(version: &str, output: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    use kiln_plugin_host::wit_package::{decode_wit_package, encode_wit_package};
    let bytes = encode_wit_package(version).map_err(anyhow::Error::msg)?;
    let info = decode_wit_package(&bytes).map_err(anyhow::Error::msg)?;
    let path = output.unwrap_or_else(|| PathBuf::from(format!("kiln-operand-{version}.wasm")));
    let summary = |to: &str| {
        format!(
            "{to}: {} (worlds {}), {} bytes, sha256:{}",
            info.package,
            info.worlds.join(", "),
            bytes.len(),
            kiln_plugin_host::sha256_hex(&bytes)
        )
    };
    if path.as_os_str() == "-" {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        out.write_all(&bytes)
            .and_then(|()| out.flush())
            .context("writing the package to stdout")?;
        eprintln!("{}", summary("stdout"));
        return Ok(ExitCode::SUCCESS);
    }
    std::fs::write(&path, &bytes).with_context(|| format!("writing {}", path.display()))?;
    super::outln!("{}", summary(&path.display().to_string()));
    Ok(ExitCode::SUCCESS)
}

fn precompile(
    cache_dir: Option<PathBuf>,
    plugins_dir: Option<PathBuf>,
    prune: bool,
) -> anyhow::Result<ExitCode> {
    let cache_dir = cache_dir
        .or_else(kiln_plugin_host::default_cache_dir)
        .context("no cache directory: pass --cache-dir or set KILN_PLUGIN_CACHE_DIR")?;
    std::fs::create_dir_all(&cache_dir)
        .with_context(|| format!("cache directory {} cannot be created", cache_dir.display()))?;
    let cfg = kiln_plugin_host::HostConfig {
        cache_dir: Some(cache_dir.clone()),
        drop_in_dir: plugins_dir.clone(),
        ..kiln_plugin_host::HostConfig::default()
    };
    let host = kiln_plugin_host::PluginHost::new(cfg, kiln_bundled_plugins::BUNDLED)?
        .with_bundled_digests(kiln_bundled_plugins::BUNDLED_SHA256);
    let mut names: Vec<String> = kiln_bundled_plugins::BUNDLED
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    if let Some(dir) = plugins_dir.as_ref().filter(|d| d.is_dir()) {
        for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "wasm")
                && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
                && !names.iter().any(|n| n == stem)
            {
                names.push(stem.to_string());
            }
        }
    }
    let started = std::time::Instant::now();
    let (mut compiled, mut failed) = (0, 0);
    let mut current = std::collections::BTreeSet::new();
    for name in &names {
        match host.load(name, None) {
            Ok(p) => {
                current.extend(host.artifact_path(p.sha256()));
                let how = if p.cache_hit() == kiln_plugin_host::CacheHit::Compiled {
                    compiled += 1;
                    "compiled"
                } else {
                    "cached"
                };
                let from = match p.source() {
                    kiln_plugin_host::PluginSource::Bundled => "bundled".to_string(),
                    kiln_plugin_host::PluginSource::DropIn(path) => path.display().to_string(),
                    kiln_plugin_host::PluginSource::Oci(reference) => reference.clone(),
                };
                super::outln!("{name}\t{how}\t{from}\t{}", p.sha256());
            }
            Err(e) => {
                failed += 1;
                eprintln!("error: {e}");
            }
        }
    }
    super::outln!(
        "{} plugins in {}: {compiled} compiled, {} already cached, {failed} refused ({:.1} s)",
        names.len(),
        cache_dir.display(),
        names.len() - compiled - failed,
        started.elapsed().as_secs_f64()
    );
    if prune {
        prune_artifacts(&cache_dir, &current)?;
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn check(file: &PathBuf) -> anyhow::Result<ExitCode> {
    let bytes = std::fs::read(file).with_context(|| format!("{}: cannot read", file.display()))?;
    let stem = file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    // Compiled through the default cache directory, as `kiln render` and `kiln plugin
    // test/run` compile a plugin: what is checked here is compiled once.
    let host = kiln_plugin_host::PluginHost::new(
        kiln_plugin_host::HostConfig {
            drop_in_dir: None,
            ..kiln_plugin_host::HostConfig::default()
        },
        &[],
    )?;
    let started = std::time::Instant::now();
    let report = host
        .inspect_as(&bytes, stem)
        .with_context(|| file.display().to_string())?;
    let took = started.elapsed().as_secs_f64();
    super::outln!("file:    {}", file.display());
    super::outln!("name:    {}", report.name.as_deref().unwrap_or("(unknown)"));
    super::outln!("sha256:  {}", report.sha256);
    let cache = host
        .config()
        .cache_dir
        .as_ref()
        .filter(|_| host.has_disk_cache());
    let compiled = match (report.cache_hit, cache) {
        (None, _) => "not compiled (refused before compiling)".to_string(),
        (Some(kiln_plugin_host::CacheHit::Compiled), _) if !report.accepted() => {
            format!("compiled in {took:.1} s, not cached (refused)")
        }
        (Some(kiln_plugin_host::CacheHit::Compiled), Some(dir)) => {
            format!("compiled in {took:.1} s, cached in {}", dir.display())
        }
        (Some(kiln_plugin_host::CacheHit::Compiled), None) => {
            format!("compiled in {took:.1} s (no cache directory)")
        }
        (Some(_), dir) => format!(
            "from the cache in {}",
            dir.map_or_else(|| "memory".into(), |d| d.display().to_string())
        ),
    };
    super::outln!("compile: {compiled}");
    super::outln!(
        "wit:     {}{}",
        report
            .interface
            .map_or("(not a kiln:operand plugin)", |i| i.package()),
        if report.validates_settings {
            ", validate-settings"
        } else {
            ""
        }
    );
    super::outln!("bounds:");
    for b in &report.bounds {
        let mark = if b.exceeded() { "OVER" } else { "ok" };
        super::outln!("  {}: {} (limit {}, {mark})", b.what, b.actual, b.limit);
    }
    super::outln!("host limits:");
    for (what, value) in kiln_plugin_host::HostConfig::default().limits() {
        super::outln!("  {what}: {value}");
    }
    super::outln!("exports:");
    for e in &report.exports {
        super::outln!("  {e}");
    }
    super::outln!("imports:");
    for i in &report.imports {
        let interface = i.split_once('@').map_or(i.as_str(), |(n, _)| n);
        let mark = if kiln_plugin_host::DENIED_INTERFACES.contains(&interface) {
            "linked, calls denied"
        } else if kiln_plugin_host::is_allowed_import(i) {
            "allowed"
        } else {
            "FORBIDDEN"
        };
        super::outln!("  {i} ({mark})");
    }
    if let Some(name) = report.name.as_deref() {
        // The host finds a drop-in by file name and refuses one whose `name()` differs, so a
        // build output (`site_node_pool.wasm`, `kiln_plugin_driver.wasm`) must be renamed.
        if name == kiln_core::context::STANDARD_BUNDLE_NAME {
            super::outln!(
                "install: as <plugin>.wasm in the drop-in directory, once per plugin it carries (a standard bundle: the host tells it the name it was loaded by)"
            );
        } else if name == stem {
            super::outln!("install: as {name}.wasm in the drop-in directory");
        } else {
            super::outln!(
                "install: as {name}.wasm in the drop-in directory (the host looks a plugin up by file name; this file would be looked up as {stem:?})"
            );
        }
    }
    if let Some(name) = report.name.as_deref()
        && kiln_bundled_plugins::get(name).is_some()
    {
        super::outln!(
            "note:    installed as a drop-in, it shadows the bundled standard plugin {name:?} (logged when loaded; refused under --refuse-shadowing)"
        );
    }
    match &report.refusal {
        None => {
            super::outln!("verdict: accepted");
            Ok(ExitCode::SUCCESS)
        }
        Some(why) => {
            super::outln!("verdict: refused: {why}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Deletes the `*.cwasm` files in `dir` that are not in `keep`, with their digest records
/// (`*.cwasm.sha256`), and reports what it freed.
fn prune_artifacts(
    dir: &std::path::Path,
    keep: &std::collections::BTreeSet<PathBuf>,
) -> anyhow::Result<()> {
    let (mut files, mut bytes) = (0u64, 0u64);
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "cwasm") && !keep.contains(&path) {
            let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            let mut record = path.clone().into_os_string();
            record.push(".sha256");
            let _ = std::fs::remove_file(record);
            files += 1;
            bytes += len;
        }
    }
    super::outln!(
        "pruned {files} stale artifacts ({:.1} MiB)",
        bytes as f64 / (1 << 20) as f64
    );
    Ok(())
}
