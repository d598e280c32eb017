//! Helpers shared by the driver-family transforms (driver, vGPU manager, VFIO manager), after
//! upstream `transformDriverManagerInitContainer`, `resolveDriverTag` and
//! `createConfigMapVolumeMounts` (gpu-operator.md §3.1, §3.11).

use k8s_openapi::api::core::v1::{ConfigMapVolumeSource, KeyToPath, PodSpec, Volume, VolumeMount};
use kiln_core::context::TransformContext;
use kiln_core::spec::{DriverManagerSpec, RdmaSpec, ResourcesSpec};

use crate::TransformError;
use crate::env::{apply_env, set_env};
use crate::image::{ImageFields, resolve_image};
use crate::pod::{add_pull_secrets, init_container, set_resources, set_side_image};

/// Name of the driver-manager init container in the driver, vGPU and VFIO manager assets.
pub const DRIVER_MANAGER: &str = "k8s-driver-manager";

/// Upstream `transformDriverManagerInitContainer`: the `k8s-driver-manager` init container (an
/// error naming it and the DaemonSet when missing) gets the image of `m` (fallback
/// `DRIVER_MANAGER_IMAGE`, errors naming `path`), its pull policy when set, `resources` when set
/// (26.7), `GPU_DIRECT_RDMA_ENABLED=true` (+ `USE_HOST_MOFED=true`) when `rdma` is enabled, then
/// `m.env`; `m.imagePullSecrets` go to the pod.
pub fn transform_driver_manager(
    pod: &mut PodSpec,
    ds: &str,
    path: &str,
    m: &DriverManagerSpec,
    rdma: Option<&RdmaSpec>,
    resources: Option<&ResourcesSpec>,
    ctx: &TransformContext,
) -> Result<(), TransformError> {
    let image = resolve_image(path, ImageFields::from(m), "DRIVER_MANAGER_IMAGE", ctx)?;
    let ctr = init_container(pod, DRIVER_MANAGER).ok_or_else(|| {
        TransformError::InvalidObject(format!(
            "init container {DRIVER_MANAGER:?} not found in DaemonSet {ds:?}"
        ))
    })?;
    set_side_image(ctr, &image, &m.image_pull_policy);
    set_resources(ctr, resources);
    if let Some(r) = rdma.filter(|r| r.enabled == Some(true)) {
        set_env(ctr, "GPU_DIRECT_RDMA_ENABLED", "true");
        if r.use_host_mofed == Some(true) {
            set_env(ctr, "USE_HOST_MOFED", "true");
        }
    }
    apply_env(ctr, &m.env);
    add_pull_secrets(pod, &m.image_pull_secrets);
    Ok(())
}

/// The GPU nodes' OS tag (`ubuntu22.04`), or an error naming the missing context fact.
pub fn os_tag(ctx: &TransformContext, what: &str) -> Result<String, TransformError> {
    ctx.gpu_node_os.as_ref().map(|os| os.tag()).ok_or_else(|| {
        TransformError::Failed(format!(
            "context.gpuNodeOs is not set: the {what} image tag needs the GPU nodes' OS \
             (no GPU node with NFD os-release labels is known)"
        ))
    })
}

/// Upstream `resolveDriverTag` for non-precompiled images: `image-<osTag>`, unless the
/// reference is a digest (contains `sha256:`), which is used verbatim.
pub fn with_os_tag(image: &str, os_tag: &str) -> String {
    if image.contains("sha256:") {
        image.to_string()
    } else {
        format!("{image}-{os_tag}")
    }
}

/// Upstream `createConfigMapVolumeMounts`: one read-only subPath mount per key of ConfigMap
/// `cm` (sorted) at `<dir>/<key>`, and the matching `items` for its volume. The key list comes
/// from [`TransformContext::config_maps`]; a ConfigMap that does not exist is an error at
/// `field`.
pub fn config_map_mounts(
    ctx: &TransformContext,
    cm: &str,
    dir: &str,
    field: &str,
) -> Result<(Vec<VolumeMount>, Vec<KeyToPath>), TransformError> {
    let keys = ctx.config_map_keys(cm).ok_or_else(|| {
        TransformError::field(
            field,
            format!("ConfigMap {cm:?} not found in the operator namespace"),
        )
    })?;
    let mut keys = keys.to_vec();
    keys.sort();
    let dir = dir.trim_end_matches('/');
    let mounts = keys
        .iter()
        .map(|k| VolumeMount {
            name: cm.to_string(),
            mount_path: format!("{dir}/{k}"),
            sub_path: Some(k.clone()),
            read_only: Some(true),
            ..Default::default()
        })
        .collect();
    let items = keys
        .iter()
        .map(|k| KeyToPath {
            key: k.clone(),
            path: k.clone(),
            mode: None,
        })
        .collect();
    Ok((mounts, items))
}

/// Upstream `createConfigMapVolume`: a ConfigMap volume named after the ConfigMap with `items`.
pub fn config_map_volume(cm: &str, items: Vec<KeyToPath>) -> Volume {
    Volume {
        name: cm.to_string(),
        config_map: Some(ConfigMapVolumeSource {
            name: cm.to_string(),
            items: Some(items),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_core::context::ConfigMapKeys;

    #[test]
    fn os_tag_suffix_and_config_map_mounts() {
        assert_eq!(with_os_tag("r/d:1", "ubuntu22.04"), "r/d:1-ubuntu22.04");
        assert_eq!(with_os_tag("r/d@sha256:ab", "ubuntu22.04"), "r/d@sha256:ab");
        let ctx = TransformContext {
            config_maps: vec![ConfigMapKeys {
                name: "kmod".into(),
                keys: vec!["nvidia.conf".into(), "a.conf".into()],
            }],
            ..Default::default()
        };
        let (m, items) = config_map_mounts(&ctx, "kmod", "/drivers", "spec.x").unwrap();
        assert_eq!(m[0].mount_path, "/drivers/a.conf");
        assert_eq!(m[1].sub_path.as_deref(), Some("nvidia.conf"));
        assert_eq!(items[0].key, "a.conf");
        let e = config_map_mounts(&ctx, "nope", "/drivers", "spec.x").unwrap_err();
        assert!(matches!(e, TransformError::InvalidField { ref path, .. } if path == "spec.x"));
        let no_os = TransformContext {
            gpu_node_os: None,
            ..Default::default()
        };
        assert!(
            os_tag(&no_os, "driver")
                .unwrap_err()
                .to_string()
                .contains("gpuNodeOs")
        );
    }
}
