//! Bindings generated from `wit/operand.wit`, and the conversion of kiln-core's
//! [`TransformContext`] into the WIT `context` record.
#![allow(missing_docs)]

use kiln_core::context::{ContainerRuntime as CoreRuntime, TransformContext};

wasmtime::component::bindgen!({
    world: "operand-transform",
    path: "../../wit",
});

use kiln::operand::types::{ConfigMapKeys, ContainerRuntime, FallbackImage, NodeOs};

/// The WIT record for `ctx`.
pub(crate) fn make_context(ctx: &TransformContext) -> Context {
    Context {
        state: ctx.state.clone(),
        runtime: match ctx.runtime {
            CoreRuntime::Containerd => ContainerRuntime::Containerd,
            CoreRuntime::Crio => ContainerRuntime::Crio,
            CoreRuntime::Docker => ContainerRuntime::Docker,
        },
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

impl From<kiln::operand::types::TransformError> for crate::error::GuestError {
    fn from(e: kiln::operand::types::TransformError) -> Self {
        use crate::text::{MAX_GUEST_TEXT_BYTES, MAX_NAME_BYTES, bounded_owned};
        use kiln::operand::types::TransformError as E;
        // Guest text is bounded and escaped here, once, before anything prints it.
        let text = |m: String| bounded_owned(m, MAX_GUEST_TEXT_BYTES);
        match e {
            E::InvalidField(f) => crate::error::GuestError::InvalidField {
                path: bounded_owned(f.path, MAX_NAME_BYTES),
                message: text(f.message),
            },
            E::InvalidObject(m) => crate::error::GuestError::InvalidObject(text(m)),
            E::Failed(m) => crate::error::GuestError::Failed(text(m)),
        }
    }
}
