//! The driver's sidecars (gpu-operator.md §3.1 steps 3–6): nvidia-peermem, nvidia-fs (GDS),
//! nvidia-gdrcopy and the OpenShift Driver Toolkit container.

use kiln_plugin_std::env::{apply_env, set_env};
use kiln_plugin_std::k8s_openapi::api::core::v1::PodSpec;
use kiln_plugin_std::kiln_core::spec::{ClusterPolicySpec, ComponentSpec};
use kiln_plugin_std::pod::{add_pull_secrets, remove_container, set_resources, set_side_image};
use kiln_plugin_std::{TransformContext, TransformError};

use crate::container::push_mounts;
use crate::image::{precompiled, sidecar_image};
use crate::volumes::{self, Mounts};

/// The OpenShift Driver Toolkit sidecar.
pub const DTK: &str = "openshift-driver-toolkit-ctr";

/// Index of the first container whose name starts with `prefix` (upstream matches sidecars by
/// prefix, so both `nvidia-fs` and `nvidia-fs-ctr` are found).
fn find(pod: &PodSpec, prefix: &str) -> Option<usize> {
    pod.containers
        .iter()
        .position(|c| c.name.starts_with(prefix))
}

/// Upstream `transformPeerMemoryContainer`: `nvidia-peermem*` is removed unless
/// `driver.rdma.enabled`; otherwise it gets the driver image, the driver pull policy when set,
/// `USE_HOST_MOFED=true` with host MOFED, the kernelModuleConfig mounts and `driver.resources`.
pub fn peermem(
    pod: &mut PodSpec,
    driver_image: &str,
    spec: &ClusterPolicySpec,
    ctx: &TransformContext,
) -> Result<(), TransformError> {
    let Some(i) = find(pod, "nvidia-peermem") else {
        return Ok(());
    };
    let d = &spec.driver;
    if d.rdma.enabled != Some(true) {
        pod.containers.remove(i);
        return Ok(());
    }
    let mut m = Mounts::default();
    let field = "spec.driver.kernelModuleConfig.name";
    volumes::config_map(
        ctx,
        &d.kernel_module_config.name,
        "/drivers",
        field,
        false,
        &mut m,
    )?;
    let ctr = &mut pod.containers[i];
    set_side_image(ctr, driver_image, &d.common.image_pull_policy);
    if d.rdma.use_host_mofed == Some(true) {
        set_env(ctr, "USE_HOST_MOFED", "true");
    }
    push_mounts(ctr, m.mounts);
    set_resources(ctr, d.common.resources.as_ref());
    Ok(())
}

/// One kernel-module sidecar: `nvidia-fs*` from `gds` (fallback `GDS_IMAGE`) or
/// `nvidia-gdrcopy*` from `gdrcopy` (fallback `GDRCOPY_IMAGE`).
pub struct ModuleSidecar<'a> {
    /// Container name prefix.
    pub prefix: &'static str,
    /// Spec path, e.g. `spec.gds`.
    pub path: &'static str,
    /// Operator fallback image env.
    pub fallback_env: &'static str,
    /// The component's spec block.
    pub spec: &'a ComponentSpec,
}

/// Upstream `transformGDSContainer` / `transformGDRCopyContainer`: removed unless enabled; an
/// error with precompiled drivers; otherwise image + `-<osTag>`, pull policy when set, pull
/// secrets, its env, the repoConfig and certConfig mounts (the driver container added their
/// volumes), `secretEnv`, and `driver.resources`.
pub fn module_sidecar(
    pod: &mut PodSpec,
    s: &ModuleSidecar<'_>,
    spec: &ClusterPolicySpec,
    ctx: &TransformContext,
) -> Result<(), TransformError> {
    let Some(i) = find(pod, s.prefix) else {
        return Ok(());
    };
    if s.spec.enabled != Some(true) {
        pod.containers.remove(i);
        return Ok(());
    }
    if precompiled(spec) {
        return Err(TransformError::field(
            format!("{}.enabled", s.path),
            format!(
                "{} is not supported with precompiled drivers (spec.driver.usePrecompiled)",
                s.prefix
            ),
        ));
    }
    let image = sidecar_image(s.spec, s.path, s.fallback_env, ctx)?;
    let d = &spec.driver;
    let mut m = Mounts::default();
    if !d.repo_config.config_map_name.is_empty() {
        let dir = volumes::repo_dir(ctx)?;
        let field = "spec.driver.repoConfig.configMapName";
        volumes::config_map(
            ctx,
            &d.repo_config.config_map_name,
            dir,
            field,
            false,
            &mut m,
        )?;
    }
    if !d.cert_config.name.is_empty() {
        let dir = volumes::cert_dir(ctx)?;
        let field = "spec.driver.certConfig.name";
        volumes::config_map(ctx, &d.cert_config.name, dir, field, false, &mut m)?;
    }
    add_pull_secrets(pod, &s.spec.image_pull_secrets);
    let ctr = &mut pod.containers[i];
    set_side_image(ctr, &image, &s.spec.image_pull_policy);
    apply_env(ctr, &s.spec.env);
    push_mounts(ctr, m.mounts);
    volumes::secret_env(ctr, spec, ctx)?;
    set_resources(ctr, d.common.resources.as_ref());
    Ok(())
}

/// The OpenShift Driver Toolkit sidecar is always removed: kiln's context carries no DTK
/// ImageStream facts, so the DTK variant is not rendered (a deliberate gap, see the crate docs).
pub fn remove_dtk(pod: &mut PodSpec) {
    remove_container(pod, DTK);
}
