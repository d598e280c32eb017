//! Defaults for facts `kiln render` cannot read from a cluster: fallback images and the
//! render context.

use kiln_core::context::{ConfigMapKeys, TransformContext};

/// The repository of kiln's image (`<registry>/<path>`, no tag): the one place it is named.
/// The chart's `kiln.repository`/`kiln.image` and `deploy/operator/deployment.yaml` must agree
/// (checked by `host/cli/tests/image_name.rs`); `scripts/build-image.sh` asks
/// `kiln version --only image` for it.
macro_rules! kiln_repository {
    () => {
        "ghcr.io/kiln-dev/kiln"
    };
}

/// [`KILN_IMAGE`] without its tag.
pub const KILN_IMAGE_REPOSITORY: &str = kiln_repository!();

/// kiln's own image, `ghcr.io/kiln-dev/kiln:<workspace version>` (tag = the crate version, no
/// `v`, as the chart's `appVersion`): the operator runs it, and the validator, device plugin,
/// GFD and exporter operands run its subcommands unless a policy names another image.
pub const KILN_IMAGE: &str = concat!(kiln_repository!(), ":", env!("CARGO_PKG_VERSION"));

/// NVIDIA's device plugin image (GPU Operator v26.7 chart default `devicePlugin`), which the
/// MPS control daemon falls back to when the device plugin runs kiln's image: kiln has no
/// `mps-control-daemon`, so that DaemonSet runs NVIDIA's (see [`fallback_images`]).
pub const NVIDIA_DEVICE_PLUGIN_IMAGE: &str = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0";

/// NVIDIA's validator image (GPU Operator v26.7 chart default `validator`), which the node
/// status exporter falls back to when its image is kiln's: the exporter is NVIDIA's
/// `nvidia-validator`, which kiln's image does not have.
pub const NVIDIA_VALIDATOR_IMAGE: &str = "nvcr.io/nvidia/gpu-operator:v26.7.0";

/// Fallback images by upstream operator env-var name: kiln's image for the operands kiln
/// provides, NVIDIA's GPU Operator v26.7 chart defaults for the rest. A component whose
/// repository/image/version are all empty in the policy uses these (upstream reads the same
/// names from the operator's environment). Two names are kiln's own, for operands kiln does
/// not implement whose upstream image would otherwise be kiln's: `MPS_CONTROL_DAEMON_IMAGE`
/// (the MPS control daemon, upstream on the device plugin image) and
/// `NODE_STATUS_EXPORTER_IMAGE` (the node status exporter, upstream on the validator image).
pub fn fallback_images() -> Vec<(String, String)> {
    const NV: &str = "nvcr.io/nvidia";
    const CN: &str = "nvcr.io/nvidia/cloud-native";
    [
        ("VALIDATOR_IMAGE", KILN_IMAGE.to_string()),
        ("DEVICE_PLUGIN_IMAGE", KILN_IMAGE.to_string()),
        ("GFD_IMAGE", KILN_IMAGE.to_string()),
        ("DCGM_EXPORTER_IMAGE", KILN_IMAGE.to_string()),
        (
            "MPS_CONTROL_DAEMON_IMAGE",
            NVIDIA_DEVICE_PLUGIN_IMAGE.to_string(),
        ),
        (
            "NODE_STATUS_EXPORTER_IMAGE",
            NVIDIA_VALIDATOR_IMAGE.to_string(),
        ),
        ("DRIVER_IMAGE", format!("{NV}/driver:595.91.07")),
        (
            "DRIVER_MANAGER_IMAGE",
            format!("{CN}/k8s-driver-manager:v0.12.0"),
        ),
        (
            "CONTAINER_TOOLKIT_IMAGE",
            format!("{NV}/k8s/container-toolkit:v1.20.0"),
        ),
        ("DCGM_IMAGE", format!("{CN}/dcgm:4.6.0-1-ubuntu24.04")),
        ("MIG_MANAGER_IMAGE", format!("{CN}/k8s-mig-manager:v0.15.0")),
        ("GDS_IMAGE", format!("{CN}/nvidia-fs:2.29.4")),
        ("GDRCOPY_IMAGE", format!("{CN}/gdrdrv:v2.6")),
        (
            "VGPU_DEVICE_MANAGER_IMAGE",
            format!("{CN}/vgpu-device-manager:v0.5.0"),
        ),
        (
            "VFIO_MANAGER_IMAGE",
            format!("{CN}/k8s-driver-manager:v0.12.0"),
        ),
        (
            "SANDBOX_DEVICE_PLUGIN_IMAGE",
            format!("{NV}/kubevirt-gpu-device-plugin:v1.6.0"),
        ),
        (
            "KATA_SANDBOX_DEVICE_PLUGIN_IMAGE",
            format!("{CN}/nvidia-sandbox-device-plugin:v0.0.5"),
        ),
        ("CC_MANAGER_IMAGE", format!("{CN}/k8s-cc-manager:v0.4.3")),
        // A GPUCluster's DRA driver (NVIDIA's chart default `draDriver`).
        (
            "DRA_DRIVER_IMAGE",
            format!("{NV}/dra-driver-nvidia-gpu:v0.5.0"),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The context `kiln render` uses unless flags say otherwise: containerd, Kubernetes v1.36,
/// namespace `gpu-operator`, Ubuntu 22.04 GPU nodes, the ServiceMonitor CRD present, and
/// [`fallback_images`].
pub fn render_context() -> TransformContext {
    TransformContext {
        has_service_monitor_crd: true,
        fallback_images: fallback_images(),
        ..TransformContext::default()
    }
}

/// Sets the fallback image for component env `env` (e.g. `VALIDATOR_IMAGE`) to `image`,
/// replacing an earlier one: what `kiln render --image ENV=IMAGE` and the operator's `--image`
/// do.
pub fn set_fallback_image(ctx: &mut TransformContext, env: &str, image: &str) {
    ctx.fallback_images.retain(|(k, _)| k != env);
    ctx.fallback_images
        .push((env.to_string(), image.to_string()));
}

/// A ConfigMap that exists, from `NAME=KEY1,KEY2` (`kiln render --config-map`): its name and
/// its data keys, sorted; `NAME` alone is a ConfigMap without keys.
pub fn config_map_keys(spec: &str) -> ConfigMapKeys {
    let (name, keys) = spec.split_once('=').unwrap_or((spec, ""));
    let mut keys: Vec<String> = keys
        .split(',')
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect();
    keys.sort();
    ConfigMapKeys {
        name: name.to_string(),
        keys,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_map_keys_sorts_and_allows_no_keys() {
        let c = config_map_keys("plugin-config=b,a,");
        assert_eq!(
            (c.name.as_str(), c.keys),
            ("plugin-config", vec!["a".to_string(), "b".to_string()])
        );
        assert!(config_map_keys("empty").keys.is_empty());
    }

    #[test]
    fn a_fallback_image_replaces_the_earlier_one() {
        let mut ctx = render_context();
        set_fallback_image(&mut ctx, "VALIDATOR_IMAGE", "a/b:1");
        set_fallback_image(&mut ctx, "VALIDATOR_IMAGE", "a/b:2");
        let v: Vec<_> = ctx
            .fallback_images
            .iter()
            .filter(|(k, _)| k == "VALIDATOR_IMAGE")
            .collect();
        assert_eq!(v, [&("VALIDATOR_IMAGE".to_string(), "a/b:2".to_string())]);
    }
}
