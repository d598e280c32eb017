//! Bindings generated from the WIT packages the host loads — `kiln:operand@0.2.0`
//! (`wit/operand.wit`, [`v2`]) and `kiln:operand@0.1.0` (`wit/v0.1.0/operand.wit`, [`v1`]) — and
//! the conversion of kiln-core's [`TransformContext`] into their `context` records.
#![allow(missing_docs)]

use kiln_core::context::{ContainerRuntime as CoreRuntime, TransformContext};

use crate::meta::PolicyMeta;

/// `kiln:operand@0.1.0`: `transform(objects, spec, ctx)`, no settings, no policy metadata.
pub(crate) mod v1 {
    wasmtime::component::bindgen!({
        world: "operand-transform",
        path: "../../wit/v0.1.0",
    });
}

/// `kiln:operand@0.2.0`: settings, the policy's name and annotations, the plugin's own name,
/// and the optional `validate-settings` export (looked up by name: [`VALIDATE_SETTINGS`]).
pub(crate) mod v2 {
    wasmtime::component::bindgen!({
        world: "operand-transform",
        path: "../../wit",
    });
}

/// The optional export of `kiln:operand@0.2.0`'s `operand-transform-validated` world.
pub(crate) const VALIDATE_SETTINGS: &str = "validate-settings";

/// The runtime, as both packages spell it (the two enums are equal case by case).
macro_rules! runtime {
    ($m:ident, $r:expr) => {
        match $r {
            CoreRuntime::Containerd => $m::kiln::operand::types::ContainerRuntime::Containerd,
            CoreRuntime::Crio => $m::kiln::operand::types::ContainerRuntime::Crio,
            CoreRuntime::Docker => $m::kiln::operand::types::ContainerRuntime::Docker,
        }
    };
}

/// The 0.1.0 `context` record for `ctx`.
pub(crate) fn make_context_v1(ctx: &TransformContext) -> v1::Context {
    use v1::kiln::operand::types::{ConfigMapKeys, FallbackImage, NodeOs};
    v1::Context {
        state: ctx.state.clone(),
        runtime: runtime!(v1, ctx.runtime),
        openshift_version: ctx.openshift_version.clone(),
        kubernetes_version: ctx.kubernetes_version.clone(),
        operator_namespace: ctx.operator_namespace.clone(),
        gpu_node_os: ctx.gpu_node_os.as_ref().map(|os| NodeOs {
            id: os.id.clone(),
            version_id: os.version_id.clone(),
        }),
        kernel_version: ctx.kernel_version.clone(),
        config_maps: ctx
            .config_maps
            .iter()
            .map(|c| ConfigMapKeys {
                name: c.name.clone(),
                keys: c.keys.clone(),
            })
            .collect(),
        secrets: ctx.secrets.clone(),
        fallback_images: ctx
            .fallback_images
            .iter()
            .map(|(env, image)| FallbackImage {
                env: env.clone(),
                image: image.clone(),
            })
            .collect(),
        default_workload: ctx.default_workload.clone(),
        has_service_monitor_crd: ctx.has_service_monitor_crd,
    }
}

/// The 0.2.0 `context` record for `ctx`, plugin `plugin` and the policy `meta`.
pub(crate) fn make_context_v2(
    ctx: &TransformContext,
    plugin: &str,
    meta: &PolicyMeta,
) -> v2::Context {
    use v2::kiln::operand::types::{Annotation, ConfigMapKeys, FallbackImage, NodeOs};
    v2::Context {
        state: ctx.state.clone(),
        plugin: plugin.to_string(),
        runtime: runtime!(v2, ctx.runtime),
        openshift_version: ctx.openshift_version.clone(),
        kubernetes_version: ctx.kubernetes_version.clone(),
        operator_namespace: ctx.operator_namespace.clone(),
        gpu_node_os: ctx.gpu_node_os.as_ref().map(|os| NodeOs {
            id: os.id.clone(),
            version_id: os.version_id.clone(),
        }),
        kernel_version: ctx.kernel_version.clone(),
        config_maps: ctx
            .config_maps
            .iter()
            .map(|c| ConfigMapKeys {
                name: c.name.clone(),
                keys: c.keys.clone(),
            })
            .collect(),
        secrets: ctx.secrets.clone(),
        fallback_images: ctx
            .fallback_images
            .iter()
            .map(|(env, image)| FallbackImage {
                env: env.clone(),
                image: image.clone(),
            })
            .collect(),
        default_workload: ctx.default_workload.clone(),
        has_service_monitor_crd: ctx.has_service_monitor_crd,
        policy_name: meta.name.clone(),
        policy_annotations: meta
            .annotations
            .iter()
            .map(|(key, value)| Annotation {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
    }
}

/// A guest's `transform-error`, as both packages spell it.
macro_rules! guest_error {
    ($m:ident) => {
        impl From<$m::kiln::operand::types::TransformError> for crate::error::GuestError {
            fn from(e: $m::kiln::operand::types::TransformError) -> Self {
                use $m::kiln::operand::types::TransformError as E;
                match e {
                    E::InvalidField(f) => {
                        crate::error::GuestError::invalid_field(f.path, f.message)
                    }
                    E::InvalidObject(m) => crate::error::GuestError::InvalidObject(
                        crate::text::bounded_owned(m, crate::text::MAX_GUEST_TEXT_BYTES),
                    ),
                    E::Failed(m) => crate::error::GuestError::Failed(crate::text::bounded_owned(
                        m,
                        crate::text::MAX_GUEST_TEXT_BYTES,
                    )),
                }
            }
        }
    };
}
guest_error!(v1);
guest_error!(v2);
