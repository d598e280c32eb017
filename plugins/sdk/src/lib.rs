//! Guest-side SDK for kiln operand plugins.
//!
//! A plugin is a `cdylib` crate built for `wasm32-wasip2` that implements [`Operand`] and calls
//! [`export_operand!`]. The SDK parses the state's objects and the ClusterPolicy spec, hands the
//! plugin typed objects to edit, and answers the host with one RFC 6902 patch per object
//! (the changed sections of a DaemonSet, a `json_patch::diff` of any other object), so plugin
//! code never writes patches by hand.
//!
//! ```text
//! host ──objects, spec, ctx──► SDK (parse) ──► Operand::daemonset / Operand::object ──► SDK (patch) ──patches──► host
//! ```
//!
//! The edit helpers ([`env`], [`image`], [`pod`], [`common`]) follow the upstream GPU Operator's
//! transform semantics (v26.7, `shared/reference/gpu-operator.md` §3.0 and §4) and are plain Rust,
//! so every plugin also unit-tests natively.

pub mod common;
pub mod driver_family;
pub mod env;
pub mod error;
pub mod image;
mod macros;
pub mod monitoring;
pub mod pod;
mod run;
pub mod settings;
pub mod validator;
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod wasm;

pub mod bump;

/// With the `leaking-allocator` feature, on wasm32: the plugin's global allocator is a
/// [`bump::Bump`] that (almost) never frees, since the host discards each call's instance.
#[cfg(all(target_arch = "wasm32", feature = "leaking-allocator"))]
#[global_allocator]
static ALLOCATOR: bump::Bump<bump::WasmMemory> = bump::Bump::new(bump::WasmMemory);

pub use error::TransformError;
pub use k8s_openapi;
pub use kiln_core;
pub use kiln_core::context::{STANDARD_BUNDLE_NAME, TransformContext};
pub use kiln_core::spec::ClusterPolicySpec;
pub use run::{Decision, Operand, Outcome, apply_native, run_operand, transform_each};
pub use serde_json;
pub use settings::{Call, FieldError, Plugin};

/// Write a line to the host's log (the `log` import); a no-op natively.
pub fn log_info(message: &str) {
    #[cfg(target_arch = "wasm32")]
    wasm::log(wasm::LogLevel::Info, message);
    #[cfg(not(target_arch = "wasm32"))]
    let _ = message;
}

/// Write a warning to the host's log; a no-op natively.
pub fn log_warn(message: &str) {
    #[cfg(target_arch = "wasm32")]
    wasm::log(wasm::LogLevel::Warn, message);
    #[cfg(not(target_arch = "wasm32"))]
    let _ = message;
}

#[cfg(not(target_arch = "wasm32"))]
/// Native runner for the case files under `plugins/<name>/cases/` (see `kiln_core::testcase`).
pub mod testing {
    use std::path::Path;

    use kiln_core::testcase::Case;

    use serde_json::Value;

    use crate::{Operand, Plugin, TransformError, apply_native};

    /// The standard `cases()` test of a plugin crate: run every case file of
    /// `<manifest_dir>/cases` natively, assert that each ran and that there are at least `min`.
    pub fn assert_cases<O: Operand>(manifest_dir: &str, min: usize) {
        let dir = Path::new(manifest_dir).join("cases");
        let files = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
        assert_eq!(
            run_cases::<O>(&dir),
            files,
            "every file in {} is a case",
            dir.display()
        );
        assert!(
            files >= min,
            "{} has {files} cases, expected at least {min}",
            dir.display()
        );
    }

    /// Run every `*.yaml` case in `dir` through `O` natively; panics listing every failing case.
    /// Returns how many cases ran (callers assert it is non-zero).
    pub fn run_cases<O: Operand>(dir: &Path) -> usize {
        each_case(dir, |case| {
            let mut ctx = case.context.clone();
            ctx.state = O::NAME.to_string();
            match apply_native::<O>(&case.objects, &case.spec, &ctx) {
                Ok(out) => case.check(&out),
                Err(e) => check_transform_error(case, &e),
            }
        })
    }

    /// [`assert_cases`] for a [`Plugin`] configured by settings: each case's `settings` are
    /// validated first (a refusal is the error kind `invalid-settings`, path
    /// `settings.<field>`), then the plugin runs natively.
    pub fn assert_plugin_cases<P: Plugin>(manifest_dir: &str, min: usize) {
        let dir = Path::new(manifest_dir).join("cases");
        let files = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
        let ran = each_case(&dir, |case| {
            let settings = case.settings.to_string();
            if let Some(e) = crate::settings::validate_plugin::<P>(&settings).first() {
                let path = if e.path.is_empty() {
                    "settings".to_string()
                } else {
                    format!("settings.{}", e.path)
                };
                return case.check_error("invalid-settings", Some(&path), &e.message);
            }
            let texts: Vec<String> = case.objects.iter().map(Value::to_string).collect();
            let result = crate::settings::run_plugin::<P>(
                &texts,
                &case.spec.to_string(),
                &settings,
                &case.context,
                "",
                &[],
            )
            .and_then(|outcomes| crate::run::apply_outcomes(&case.objects, outcomes));
            match result {
                Ok(out) => case.check(&out),
                Err(e) => check_transform_error(case, &e),
            }
        });
        assert_eq!(ran, files, "every file in {} is a case", dir.display());
        assert!(
            files >= min,
            "{} has {files} cases, expected at least {min}",
            dir.display()
        );
    }

    fn check_transform_error(case: &Case, e: &TransformError) -> Result<(), String> {
        let (kind, path) = match e {
            TransformError::InvalidField { path, .. } => ("invalid-field", Some(path.as_str())),
            TransformError::InvalidObject(_) => ("invalid-object", None),
            TransformError::Failed(_) => ("failed", None),
        };
        case.check_error(kind, path, &e.to_string())
    }

    /// Runs `check` on every `*.yaml` case of `dir`; panics listing every failure; how many ran.
    fn each_case(dir: &Path, mut check: impl FnMut(&Case) -> Result<(), String>) -> usize {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        let mut failures = Vec::new();
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            let raw: serde_json::Value =
                serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let case = Case::from_value(raw).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            if let Err(msg) = check(&case) {
                failures.push(format!("{} ({}): {msg}", f.display(), case.name));
            }
        }
        assert!(
            failures.is_empty(),
            "failing cases:\n{}",
            failures.join("\n")
        );
        files.len()
    }
}
