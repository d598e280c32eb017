//! `kiln plugin new | test | run`: writing a plugin, running its case files through kiln's own
//! host, and showing what it does to a state's objects (`wit/README.md`, "Testing a plugin").

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use kiln_core::testcase::Case;
use kiln_plugin_host::{
    CallInput, GuestError, HostConfig, LoadedPlugin, PluginError, PluginHost, PolicyMeta, Rendered,
};
use serde_json::Value;

use super::outln;

/// The WIT package a new project is written against (`wit/operand.wit`).
const WIT: &str = include_str!("../../../../wit/operand.wit");

/// A template's file: (path in the project, text with `@NAME@`/`@CRATE@` placeholders).
type TemplateFile = (&'static str, &'static str);

/// What every template ships besides its own files: the case files (the same for every
/// language, so every template passes the same cases) and the WIT.
const COMMON_FILES: &[TemplateFile] = &[
    (
        "cases/labels.yaml",
        include_str!("../../templates/cases/labels.yaml"),
    ),
    (
        "cases/bad-settings.yaml",
        include_str!("../../templates/cases/bad-settings.yaml"),
    ),
    ("wit/operand.wit", WIT),
];

/// The Rust template's own files.
const RUST_TEMPLATE: &[TemplateFile] = &[
    (
        "Cargo.toml",
        include_str!("../../templates/rust/Cargo.toml.in"),
    ),
    (
        "Cargo.lock",
        include_str!("../../templates/rust/Cargo.lock.in"),
    ),
    (
        "src/lib.rs",
        include_str!("../../templates/rust/src/lib.rs"),
    ),
    ("README.md", include_str!("../../templates/rust/README.md")),
];

/// The Python template's own files (componentize-py, pinned in `requirements.txt`).
const PYTHON_TEMPLATE: &[TemplateFile] = &[
    ("app.py", include_str!("../../templates/python/app.py")),
    (
        "requirements.txt",
        include_str!("../../templates/python/requirements.txt"),
    ),
    (
        "README.md",
        include_str!("../../templates/python/README.md"),
    ),
];

/// The JavaScript template's own files (componentize-js, pinned in `package.json`).
const JS_TEMPLATE: &[TemplateFile] = &[
    ("plugin.js", include_str!("../../templates/js/plugin.js")),
    (
        "package.json",
        include_str!("../../templates/js/package.json"),
    ),
    ("README.md", include_str!("../../templates/js/README.md")),
];

/// The languages `kiln plugin new --lang` has a template for: (name, its files, the command
/// that builds `NAME.wasm` in the project; `@NAME@`/`@CRATE@` replaced).
pub(super) const LANGUAGES: &[(&str, &[TemplateFile], &str)] = &[
    (
        "rust",
        RUST_TEMPLATE,
        "cargo build --release --target wasm32-wasip2 && cp target/wasm32-wasip2/release/@CRATE@.wasm @NAME@.wasm",
    ),
    (
        "python",
        PYTHON_TEMPLATE,
        "pip install -r requirements.txt && componentize-py -d wit -w operand-transform-validated componentize app -o @NAME@.wasm",
    ),
    ("js", JS_TEMPLATE, "npm install && npm run build"),
];

/// `kiln plugin new`: writes a project under `dir/NAME` (which must not exist).
pub(super) fn new_project(name: &str, lang: &str, dir: &Path) -> anyhow::Result<ExitCode> {
    let valid = name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    if !valid {
        bail!(
            "plugin name {name:?}: use 1-63 lowercase letters, digits and '-', starting with a letter (it is the file name <name>.wasm and the crate name)"
        );
    }
    let Some((_, files, build)) = LANGUAGES.iter().find(|(l, ..)| *l == lang) else {
        let known: Vec<&str> = LANGUAGES.iter().map(|(l, ..)| *l).collect();
        bail!("--lang {lang}: expected one of {}", known.join(", "));
    };
    let root = dir.join(name);
    if root.exists() {
        bail!("{} exists", root.display());
    }
    let krate = name.replace('-', "_");
    let fill = |text: &str| text.replace("@NAME@", name).replace("@CRATE@", &krate);
    for (path, text) in files.iter().chain(COMMON_FILES) {
        let file = root.join(path);
        std::fs::create_dir_all(file.parent().unwrap_or(&root))
            .with_context(|| format!("creating {}", file.display()))?;
        std::fs::write(&file, fill(text)).with_context(|| format!("writing {}", file.display()))?;
    }
    outln!("created {} ({lang}, kiln:operand@0.2.0)", root.display());
    outln!(
        "next:    cd {} && {} && kiln plugin test {name}.wasm cases",
        root.display(),
        fill(build)
    );
    Ok(ExitCode::SUCCESS)
}

/// A host holding only the plugin in `file`, installed in a scratch drop-in directory under
/// the name its `name()` returns — or, for a standard bundle (which answers to the name it is
/// loaded by), under `file`'s stem, as `kiln render` would find it in a drop-in directory; the
/// plugin and the directory (kept alive with it).
///
/// It is first loaded under the file's stem, which is its name when the file is installed as
/// the host would find it: then it is compiled once (a Python or JavaScript component takes
/// seconds); only a file named otherwise is inspected for its name and loaded again.
fn load_file(file: &Path) -> anyhow::Result<(PluginHost, Arc<LoadedPlugin>, tempfile::TempDir)> {
    let bytes = std::fs::read(file).with_context(|| format!("{}: cannot read", file.display()))?;
    let dir = tempfile::tempdir().context("scratch directory")?;
    // The default cache directory keeps the bundled plugins (which `kiln plugin run` runs
    // first) compiled between runs; the scratch plugin is compiled once per digest.
    let host = PluginHost::new(
        HostConfig {
            drop_in_dir: Some(dir.path().to_path_buf()),
            ..HostConfig::default()
        },
        kiln_bundled_plugins::BUNDLED,
    )?
    .with_bundled_digests(kiln_bundled_plugins::BUNDLED_SHA256);
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let installed = dir.path().join(format!("{stem}.wasm"));
    if !stem.is_empty() && std::fs::write(&installed, &bytes).is_ok() {
        match host.load(stem, None) {
            Ok(plugin) => return Ok((host, plugin, dir)),
            Err(PluginError::NameMismatch { .. } | PluginError::InvalidName { .. }) => {
                std::fs::remove_file(&installed)?;
            }
            Err(why) => bail!("{}: refused: {why}", file.display()),
        }
    }
    let report = host
        .inspect(&bytes)
        .with_context(|| file.display().to_string())?;
    if let Some(why) = report.refusal {
        bail!("{}: refused: {why}", file.display());
    }
    let name = report
        .name
        .with_context(|| format!("{}: no name", file.display()))?;
    if name == kiln_core::context::STANDARD_BUNDLE_NAME {
        bail!(
            "{}: a standard bundle is run under its file name, which must be a plugin name",
            file.display()
        );
    }
    std::fs::write(dir.path().join(format!("{name}.wasm")), &bytes)?;
    let plugin = host.load(&name, None)?;
    Ok((host, plugin, dir))
}

/// Settings as JSON text: `None` for `null`.
fn settings_text(settings: &Value) -> Option<String> {
    (!settings.is_null()).then(|| settings.to_string())
}

/// `kiln plugin test`: every `*.yaml` case of `cases` through the plugin; exit 1 on a failure.
pub(super) fn test(file: &Path, cases: &Path) -> anyhow::Result<ExitCode> {
    let (host, plugin, _dir) = load_file(file)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(cases)
        .with_context(|| format!("{}: cannot read", cases.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("{}: no *.yaml case files", cases.display());
    }
    let mut failed = 0;
    for f in &files {
        let result = run_case_file(&host, &plugin, f);
        match result {
            Ok(name) => outln!("ok      {} ({name})", f.display()),
            Err(e) => {
                failed += 1;
                outln!("FAILED  {}: {e:#}", f.display());
            }
        }
    }
    outln!(
        "{} cases, {} passed, {failed} failed ({}, {})",
        files.len(),
        files.len() - failed,
        plugin.name(),
        plugin.interface().package()
    );
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs one case file; its name when it passes.
fn run_case_file(host: &PluginHost, plugin: &LoadedPlugin, file: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file)?;
    let raw: Value = kiln_input::yaml::from_str(&text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let case = Case::from_value(raw).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut ctx = case.context.clone();
    if ctx.state.is_empty() {
        ctx.state = plugin.name().to_string();
    }
    let spec = case.spec.to_string();
    let settings = settings_text(&case.settings);
    let meta = PolicyMeta::default();
    let input = CallInput {
        spec: &spec,
        settings: settings.as_deref(),
        policy: &meta,
    };
    let checked = match host.call_with(plugin, &case.objects, &input, &ctx) {
        Ok(out) => {
            let got: Vec<Option<Value>> = out
                .rendered
                .into_iter()
                .map(|r| match r {
                    Rendered::Keep(v) => Some(v),
                    Rendered::Omit => None,
                })
                .collect();
            case.check(&got)
        }
        Err(PluginError::Guest { error, .. }) => {
            let (kind, path) = match &error {
                GuestError::InvalidField { path, .. } => ("invalid-field", Some(path.as_str())),
                GuestError::InvalidObject(_) => ("invalid-object", None),
                GuestError::Failed(_) => ("failed", None),
            };
            case.check_error(kind, path, &error.to_string())
        }
        Err(PluginError::InvalidSettings { errors, .. }) => {
            let message: Vec<String> = errors.iter().map(|e| e.message.clone()).collect();
            case.check_error(
                "invalid-settings",
                errors.first().map(|e| e.path.as_str()),
                &message.join("; "),
            )
        }
        Err(other) => Err(other.to_string()),
    };
    checked.map_err(|e| anyhow::anyhow!("{} ({})", e, case.name))?;
    Ok(case.name)
}

/// `kiln plugin run`: the state's objects as the policy's own chain renders them, then what the
/// plugin does to each (a JSON Patch, `omit` or `unchanged`) and its log.
pub(super) fn run(
    file: &Path,
    state: kiln_core::State,
    policy: &Path,
    settings: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(policy)
        .with_context(|| format!("{}: cannot read", policy.display()))?;
    let doc: Value = kiln_input::yaml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", policy.display()))?;
    let policy = kiln_render::Policy::from_object(&doc)
        .map_err(|e| anyhow::anyhow!("{}: {e}", policy.display()))?;
    let settings = match settings {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("{}: cannot read", path.display()))?;
            let value: Value = kiln_input::yaml::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            settings_text(&value)
        }
    };
    let (host, plugin, _dir) = load_file(file)?;
    let mut ctx = kiln_render::defaults::render_context();
    ctx.state = state.name().to_string();
    ctx.default_workload = kiln_render::default_workload(&policy.spec).to_string();
    let objects: Vec<Value> = kiln_render::assets::load_state(state, false)?
        .into_iter()
        .map(|a| {
            let mut o = a.object;
            kiln_render::placeholders::fill(
                &mut o,
                &ctx.operator_namespace,
                policy.spec.runtime_class(),
            );
            o
        })
        .collect();
    let before = host
        .run_chain_for(
            &policy.plugins.chain(state),
            &kiln_plugin_host::ChainInput::new(objects),
            &policy.spec_text,
            &policy.meta,
            &ctx,
        )?
        .objects;
    let input = CallInput {
        spec: &policy.spec_text,
        settings: settings.as_deref(),
        policy: &policy.meta,
    };
    let out = host.call_with(&plugin, &before, &input, &ctx)?;
    outln!(
        "# {} ({}) on state {state}: {} objects",
        plugin.name(),
        plugin.interface().package(),
        before.len()
    );
    for (object, result) in before.iter().zip(&out.rendered) {
        let id = format!(
            "{}/{}",
            object["kind"].as_str().unwrap_or("?"),
            object["metadata"]["name"].as_str().unwrap_or("?")
        );
        match result {
            Rendered::Omit => outln!("{id}: omit"),
            Rendered::Keep(after) => {
                let patch = json_patch::diff(object, after);
                if patch.0.is_empty() {
                    outln!("{id}: unchanged");
                } else {
                    outln!("{id}: {}", serde_json::to_string(&patch)?);
                }
            }
        }
    }
    for line in &out.log.lines {
        outln!("log {:?}: {}", line.source, line.message);
    }
    if out.log.truncated {
        outln!("log truncated");
    }
    Ok(ExitCode::SUCCESS)
}
