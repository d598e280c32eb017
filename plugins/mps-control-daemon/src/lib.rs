//! Standard plugin of the `mps-control-daemon` state: the CUDA MPS control daemon DaemonSet
//! `nvidia-device-plugin-mps-control-daemon` (upstream `TransformMPSControlDaemon`,
//! gpu-operator.md §3.4). It runs the device plugin's image, except when that is kiln's: kiln
//! has no `mps-control-daemon`, so the daemon then runs the operator's
//! `MPS_CONTROL_DAEMON_IMAGE` (NVIDIA's device plugin image). `devicePlugin.env` and
//! `devicePlugin.args` are not applied.

use kiln_plugin_std::image::{is_kiln_image, pull_policy};
use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::k8s_openapi::api::core::v1::PodSpec;
use kiln_plugin_std::pod::{
    add_pull_secrets, apply_host_network, apply_mig_env, device_plugin_image, ds_name,
    handle_device_plugin_config, init_container, pod_spec, require_container, set_main_image,
    set_nri_annotation, set_resources, set_resources_all, set_runtime_class,
    transform_validation_init_containers,
};
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError};

/// The main container.
pub const MAIN: &str = "mps-control-daemon-ctr";

/// The init container that mounts the MPS shared memory.
pub const MOUNTS_INIT: &str = "mps-control-daemon-mounts";

/// The operator's fallback image for the daemon when the device plugin image is kiln's.
pub const MPS_IMAGE_ENV: &str = "MPS_CONTROL_DAEMON_IMAGE";

/// The `mps-control-daemon` operand.
pub struct MpsControlDaemon;

impl Operand for MpsControlDaemon {
    const NAME: &'static str = "mps-control-daemon";

    /// Upstream order: validation init containers; `mps-control-daemon-mounts` gets the
    /// device-plugin image (see [`daemon_image`]), the resolved pull policy (always, unlike other init containers) and
    /// `devicePlugin.resources`; the main container gets image and pull policy; secrets;
    /// resources on all containers; device-plugin config; runtime class; NRI annotation; MIG env;
    /// the `mps.root` volume rewrite (no `MPS_ROOT` env); hostNetwork.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let dp = &spec.device_plugin.common;
        let pod = pod_spec(ds);
        require_container(pod, &name, MAIN)?;
        transform_validation_init_containers(pod, spec, ctx)?;
        let img = daemon_image(spec, ctx)?;
        if let Some(init) = init_container(pod, MOUNTS_INIT) {
            init.image = Some(img.clone());
            init.image_pull_policy = Some(pull_policy(&dp.image_pull_policy));
            set_resources(init, dp.resources.as_ref());
        }
        set_main_image(
            require_container(pod, &name, MAIN)?,
            &img,
            &dp.image_pull_policy,
        );
        add_pull_secrets(pod, &dp.image_pull_secrets);
        set_resources_all(pod, dp.resources.as_ref());
        handle_device_plugin_config(pod, spec, ctx)?;
        set_runtime_class(pod, spec, ctx);
        set_nri_annotation(ds, spec, MAIN);
        let pod = pod_spec(ds);
        apply_mig_env(require_container(pod, &name, MAIN)?, spec);
        rewrite_mps_root(pod, spec);
        apply_host_network(pod, dp.host_network);
        Ok(())
    }
}

/// The image of the daemon containers (`mps-control-daemon-mounts`, `mps-control-daemon-ctr`):
/// the device plugin's, or [`MPS_IMAGE_ENV`] when that is kiln's image, which has no
/// `mps-control-daemon`. The config-manager containers keep the device plugin's image (kiln's
/// config-manager signals the daemon by its command).
///
/// # Errors
/// The device plugin image does not resolve, or it is kiln's and the operator has no
/// [`MPS_IMAGE_ENV`].
pub fn daemon_image(
    spec: &ClusterPolicySpec,
    ctx: &TransformContext,
) -> Result<String, TransformError> {
    let img = device_plugin_image(spec, ctx)?;
    if !is_kiln_image(&img) {
        return Ok(img);
    }
    ctx.fallback_image(MPS_IMAGE_ENV)
        .map(str::to_string)
        .ok_or_else(|| {
            TransformError::field(
                "spec.devicePlugin",
                format!(
                    "{img} is kiln's image, which has no mps-control-daemon: set the operator's \
                     {MPS_IMAGE_ENV} (NVIDIA's device plugin image)"
                ),
            )
        })
}

/// `devicePlugin.mps.root` set and ≠ `/run/nvidia/mps`: hostPath `mps-root` → root and
/// `mps-shm` → `<root>/shm` (no `MPS_ROOT` env here, unlike the device plugin).
pub fn rewrite_mps_root(pod: &mut PodSpec, spec: &ClusterPolicySpec) {
    if let Some(root) = spec.device_plugin.custom_mps_root() {
        kiln_plugin_std::pod::rewrite_mps_volumes(pod, root);
    }
}

kiln_plugin_std::export_operand!(MpsControlDaemon);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<MpsControlDaemon>(env!("CARGO_MANIFEST_DIR"), 8);
    }

    #[test]
    fn default_root_leaves_volumes() {
        let mut pod = PodSpec {
            volumes: Some(vec![kiln_plugin_std::pod::host_path_volume(
                "mps-root",
                kiln_plugin_std::kiln_core::spec::DEFAULT_MPS_ROOT,
                None,
            )]),
            ..Default::default()
        };
        let mut spec = ClusterPolicySpec::default();
        spec.device_plugin.mps.root =
            Some(kiln_plugin_std::kiln_core::spec::DEFAULT_MPS_ROOT.into());
        rewrite_mps_root(&mut pod, &spec);
        let path = |p: &PodSpec| {
            p.volumes.as_ref().unwrap()[0]
                .host_path
                .clone()
                .unwrap()
                .path
        };
        assert_eq!(
            path(&pod),
            kiln_plugin_std::kiln_core::spec::DEFAULT_MPS_ROOT
        );
        spec.device_plugin.mps.root = Some("/var/mps/".into());
        rewrite_mps_root(&mut pod, &spec);
        assert_eq!(path(&pod), "/var/mps/");
    }
}
