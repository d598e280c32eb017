//! WIT export glue (wasm32 only), generated from the package's `wit/` (`kiln:operand@0.2.0`).
//! Plugin crates use [`crate::export_plugin!`] or [`crate::export_plugin_with_settings!`];
//! nothing here is meant to be called directly.
#![allow(missing_docs, unsafe_code)]

wit_bindgen::generate!({
    world: "operand-transform-validated",
    path: "wit",
    pub_export_macro: true,
    export_macro_name: "export_bindings",
    default_bindings_module: "kiln_plugin_sdk::wasm",
});

use self::kiln::operand::types::ContainerRuntime as WitRuntime;
/// The WIT `field-error` (generated).
pub type WitFieldError = FieldError;
/// The WIT `outcome` (generated).
pub type WitOutcome = Outcome;
/// The WIT `transform-error` (generated).
pub type WitError = TransformError;

use crate::context::{ConfigMapKeys, ContainerRuntime, Context as SdkContext, NodeOs};
use crate::{Outcome as SdkOutcome, TransformError as SdkError};

/// Convert the WIT context into the SDK's [`crate::Context`].
pub fn context_from_wit(c: Context) -> SdkContext {
    SdkContext {
        state: c.state,
        plugin: c.plugin,
        runtime: match c.runtime {
            WitRuntime::Containerd => ContainerRuntime::Containerd,
            WitRuntime::Crio => ContainerRuntime::Crio,
            WitRuntime::Docker => ContainerRuntime::Docker,
        },
        openshift_version: c.openshift_version,
        kubernetes_version: c.kubernetes_version,
        operator_namespace: c.operator_namespace,
        gpu_node_os: c.gpu_node_os.map(|o| NodeOs {
            id: o.id,
            version_id: o.version_id,
        }),
        kernel_version: c.kernel_version,
        config_maps: c
            .config_maps
            .into_iter()
            .map(|m| ConfigMapKeys {
                name: m.name,
                keys: m.keys,
            })
            .collect(),
        secrets: c.secrets,
        fallback_images: c
            .fallback_images
            .into_iter()
            .map(|f| (f.env, f.image))
            .collect(),
        default_workload: c.default_workload,
        has_service_monitor_crd: c.has_service_monitor_crd,
        policy_name: c.policy_name,
        policy_annotations: c
            .policy_annotations
            .into_iter()
            .map(|a| (a.key, a.value))
            .collect(),
    }
}

/// Convert settings field errors into the WIT answer of `validate-settings`.
pub fn settings_to_wit(errors: Vec<crate::settings::FieldError>) -> Result<(), Vec<FieldError>> {
    if errors.is_empty() {
        return Ok(());
    }
    Err(errors
        .into_iter()
        .map(|e| FieldError {
            path: e.path,
            message: e.message,
        })
        .collect())
}

/// Convert a run result into the WIT result.
pub fn result_to_wit(r: Result<Vec<SdkOutcome>, SdkError>) -> Result<Vec<WitOutcome>, WitError> {
    match r {
        Ok(list) => Ok(list
            .into_iter()
            .map(|o| match o {
                SdkOutcome::Patch(p) => WitOutcome::Patch(p),
                SdkOutcome::Omit => WitOutcome::Omit,
            })
            .collect()),
        Err(SdkError::InvalidField { path, message }) => {
            Err(WitError::InvalidField(FieldError { path, message }))
        }
        Err(SdkError::InvalidObject(m)) => Err(WitError::InvalidObject(m)),
        Err(SdkError::Failed(m)) => Err(WitError::Failed(m)),
    }
}
