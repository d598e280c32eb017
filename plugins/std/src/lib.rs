//! The standard plugins' helpers (internal, not published): upstream GPU Operator transform
//! semantics over kiln's own types (`kiln_core`'s ClusterPolicy spec and transform context), on
//! top of the publishable guest SDK (`kiln-plugin-sdk`, which knows only the WIT contract).
//!
//! A standard plugin implements [`Operand`] and calls [`export_operand!`]; the SDK's typed
//! DaemonSet edits ([`kiln_plugin_sdk::transform_typed`]) answer the host. The edit helpers
//! ([`env`], [`image`], [`pod`], [`common`], [`validator`], [`driver_family`], [`monitoring`])
//! follow the upstream transform semantics (v26.7, `shared/reference/gpu-operator.md` §3.0 and
//! §4) and are plain Rust, so every plugin also unit-tests natively ([`testing`]).
//!
//! Plugins import everything through this crate (it re-exports the SDK items they use), so a
//! standard plugin depends on `kiln-plugin-std` alone.

pub mod common;
pub mod driver_family;
pub mod env;
pub mod image;
mod macros;
pub mod monitoring;
pub mod pod;
mod run;
pub mod validator;

#[doc(hidden)]
pub use kiln_plugin_sdk as __sdk;

pub use k8s_openapi;
pub use kiln_core;
pub use kiln_core::context::{STANDARD_BUNDLE_NAME, TransformContext};
pub use kiln_core::spec::ClusterPolicySpec;
pub use kiln_plugin_sdk::{
    Call, Decision, FieldError, Outcome, Plugin, TransformError, log_info, log_warn, settings,
};
pub use run::{Operand, apply_native, run_operand};
pub use serde_json;

use kiln_core::context::{ConfigMapKeys, ContainerRuntime, NodeOs};
use kiln_plugin_sdk::context as sdk;

/// The SDK's context as kiln's [`TransformContext`], with `state` as given (the policy's
/// metadata and the plugin's name, which `TransformContext` does not carry, are dropped).
pub fn core_context(ctx: &sdk::Context, state: &str) -> TransformContext {
    TransformContext {
        state: state.to_string(),
        runtime: match ctx.runtime {
            sdk::ContainerRuntime::Containerd => ContainerRuntime::Containerd,
            sdk::ContainerRuntime::Crio => ContainerRuntime::Crio,
            sdk::ContainerRuntime::Docker => ContainerRuntime::Docker,
        },
        openshift_version: ctx.openshift_version.clone(),
        kubernetes_version: ctx.kubernetes_version.clone(),
        operator_namespace: ctx.operator_namespace.clone(),
        gpu_node_os: ctx.gpu_node_os.as_ref().map(|o| NodeOs {
            id: o.id.clone(),
            version_id: o.version_id.clone(),
        }),
        kernel_version: ctx.kernel_version.clone(),
        config_maps: ctx
            .config_maps
            .iter()
            .map(|m| ConfigMapKeys {
                name: m.name.clone(),
                keys: m.keys.clone(),
            })
            .collect(),
        secrets: ctx.secrets.clone(),
        fallback_images: ctx.fallback_images.clone(),
        default_workload: ctx.default_workload.clone(),
        has_service_monitor_crd: ctx.has_service_monitor_crd,
    }
}

/// kiln's [`TransformContext`] as the SDK's context, for a plugin loaded as `plugin` (no
/// policy name or annotations): how native tests call an SDK [`Plugin`].
pub fn sdk_context(ctx: &TransformContext, plugin: &str) -> sdk::Context {
    sdk::Context {
        state: ctx.state.clone(),
        plugin: plugin.to_string(),
        runtime: match ctx.runtime {
            ContainerRuntime::Containerd => sdk::ContainerRuntime::Containerd,
            ContainerRuntime::Crio => sdk::ContainerRuntime::Crio,
            ContainerRuntime::Docker => sdk::ContainerRuntime::Docker,
        },
        openshift_version: ctx.openshift_version.clone(),
        kubernetes_version: ctx.kubernetes_version.clone(),
        operator_namespace: ctx.operator_namespace.clone(),
        gpu_node_os: ctx.gpu_node_os.as_ref().map(|o| sdk::NodeOs {
            id: o.id.clone(),
            version_id: o.version_id.clone(),
        }),
        kernel_version: ctx.kernel_version.clone(),
        config_maps: ctx
            .config_maps
            .iter()
            .map(|m| sdk::ConfigMapKeys {
                name: m.name.clone(),
                keys: m.keys.clone(),
            })
            .collect(),
        secrets: ctx.secrets.clone(),
        fallback_images: ctx.fallback_images.clone(),
        default_workload: ctx.default_workload.clone(),
        has_service_monitor_crd: ctx.has_service_monitor_crd,
        policy_name: String::new(),
        policy_annotations: Vec::new(),
    }
}

/// What a standard operand answers to settings: it takes none (`null`).
pub fn operand_settings(settings: &str) -> Vec<FieldError> {
    if settings.trim() == "null" {
        Vec::new()
    } else {
        vec![FieldError::new("", "a standard plugin takes no settings")]
    }
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

    /// [`assert_cases`] for an SDK [`Plugin`] configured by settings: each case's `settings`
    /// are validated first (a refusal is the error kind `invalid-settings`, path
    /// `settings.<field>`), then the plugin runs natively.
    pub fn assert_plugin_cases<P: Plugin>(manifest_dir: &str, min: usize) {
        let dir = Path::new(manifest_dir).join("cases");
        let files = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
        let ran = each_case(&dir, |case| {
            let settings = case.settings.to_string();
            if let Some(e) = kiln_plugin_sdk::settings::validate_plugin::<P>(&settings).first() {
                let path = if e.path.is_empty() {
                    "settings".to_string()
                } else {
                    format!("settings.{}", e.path)
                };
                return case.check_error("invalid-settings", Some(&path), &e.message);
            }
            let texts: Vec<String> = case.objects.iter().map(Value::to_string).collect();
            let result = kiln_plugin_sdk::settings::run_plugin::<P>(
                &texts,
                &case.spec.to_string(),
                &settings,
                &crate::sdk_context(&case.context, P::NAME),
            )
            .and_then(|outcomes| kiln_plugin_sdk::apply_outcomes(&case.objects, outcomes));
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
