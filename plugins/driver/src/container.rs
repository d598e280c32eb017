//! The `nvidia-driver-ctr` container (upstream `transformDriverContainer`, gpu-operator.md §3.1
//! step 2).

use kiln_plugin_std::env::{apply_env, set_env};
use kiln_plugin_std::k8s_openapi::api::core::v1::{PodSpec, Probe, VolumeMount};
use kiln_plugin_std::kiln_core::spec::{ClusterPolicySpec, KernelModuleType, ProbeSpec};
use kiln_plugin_std::pod::{
    add_pull_secrets, add_volume, host_path_volume, set_host_path, set_main_image,
    set_resources_all,
};
use kiln_plugin_std::{TransformContext, TransformError};

use crate::image::precompiled;
use crate::volumes::{self, Mounts};

/// The driver's main container.
pub const MAIN: &str = "nvidia-driver-ctr";

/// Each set (non-zero) field of `p` replaces the probe's field; a probe the asset lacks is
/// left absent (a probe needs a handler, which the spec cannot give).
pub fn apply_probe(probe: Option<&mut Probe>, p: Option<&ProbeSpec>) {
    let (Some(probe), Some(p)) = (probe, p) else {
        return;
    };
    let set = |dst: &mut Option<i32>, v: Option<i32>| {
        if let Some(v) = v.filter(|v| *v != 0) {
            *dst = Some(v);
        }
    };
    set(&mut probe.initial_delay_seconds, p.initial_delay_seconds);
    set(&mut probe.timeout_seconds, p.timeout_seconds);
    set(&mut probe.period_seconds, p.period_seconds);
    set(&mut probe.success_threshold, p.success_threshold);
    set(&mut probe.failure_threshold, p.failure_threshold);
}

fn kernel_module_type(t: KernelModuleType) -> &'static str {
    match t {
        KernelModuleType::Auto => "auto",
        KernelModuleType::Open => "open",
        KernelModuleType::Proprietary => "proprietary",
    }
}

/// Append `mounts` to `ctr` (nothing, not even an empty list, when there are none).
pub fn push_mounts(
    ctr: &mut kiln_plugin_std::k8s_openapi::api::core::v1::Container,
    mounts: Vec<VolumeMount>,
) {
    if !mounts.is_empty() {
        ctr.volume_mounts
            .get_or_insert_with(Vec::new)
            .extend(mounts);
    }
}

/// Append `m` to container `idx` and the pod (volumes replace a volume of the same name).
pub fn attach(pod: &mut PodSpec, idx: usize, m: Mounts) {
    push_mounts(&mut pod.containers[idx], m.mounts);
    for v in m.volumes {
        add_volume(pod, v);
    }
}

/// Upstream `transformDriverContainer` (26.7 order): image, pull policy, `driver.imagePullSecrets`,
/// `driver.resources` (all containers), `driver.args`; `KERNEL_MODULE_TYPE` (+
/// `OPEN_KERNEL_MODULES_ENABLED`); probe overrides; `GDRCOPY_ENABLED`, `GDS_ENABLED`; RDMA;
/// licensing, topology and kernelModuleConfig mounts; `driver.env` on containers[0]; then,
/// precompiled, the SLES `/lib/modules` mount, otherwise repoConfig and certConfig mounts,
/// `secretEnv`, `OPENSHIFT_VERSION` and subscription mounts. (The OpenShift cluster proxy and
/// trusted CA are not in the context and are not applied.)
pub fn transform(
    pod: &mut PodSpec,
    ds: &str,
    image: &str,
    spec: &ClusterPolicySpec,
    ctx: &TransformContext,
) -> Result<(), TransformError> {
    let d = &spec.driver;
    let c = &d.common;
    let idx = pod
        .containers
        .iter()
        .position(|x| x.name == MAIN)
        .ok_or_else(|| TransformError::missing_container(ds, MAIN))?;
    set_main_image(&mut pod.containers[idx], image, &c.image_pull_policy);
    add_pull_secrets(pod, &c.image_pull_secrets);
    set_resources_all(pod, c.resources.as_ref());
    let ctr = &mut pod.containers[idx];
    if !c.args.is_empty() {
        ctr.args = Some(c.args.clone());
    }
    if let Some(t) = d.kernel_module_type {
        set_env(ctr, "KERNEL_MODULE_TYPE", kernel_module_type(t));
        if t == KernelModuleType::Open {
            set_env(ctr, "OPEN_KERNEL_MODULES_ENABLED", "true");
        }
    }
    apply_probe(ctr.startup_probe.as_mut(), d.startup_probe.as_ref());
    apply_probe(ctr.liveness_probe.as_mut(), d.liveness_probe.as_ref());
    apply_probe(ctr.readiness_probe.as_mut(), d.readiness_probe.as_ref());
    if spec.gdrcopy.enabled == Some(true) {
        set_env(ctr, "GDRCOPY_ENABLED", "true");
    }
    if spec.gds.enabled == Some(true) {
        set_env(ctr, "GDS_ENABLED", "true");
    }
    let mut m = Mounts::default();
    if d.rdma.enabled == Some(true) {
        set_env(ctr, "GPU_DIRECT_RDMA_ENABLED", "true");
        if d.rdma.use_host_mofed == Some(true) {
            let has_mount = ctr
                .volume_mounts
                .iter()
                .flatten()
                .any(|v| v.name == "mlnx-ofed-usr-src");
            if !has_mount {
                m.mounts.push(VolumeMount {
                    name: "mlnx-ofed-usr-src".into(),
                    mount_path: "/run/mellanox/drivers/usr/src".into(),
                    mount_propagation: Some("HostToContainer".into()),
                    ..Default::default()
                });
            }
            set_env(ctr, "USE_HOST_MOFED", "true");
            if !set_host_path(pod, "mlnx-ofed-usr-src", "/usr/src") {
                m.volumes.push(host_path_volume(
                    "mlnx-ofed-usr-src",
                    "/usr/src",
                    Some("DirectoryOrCreate"),
                ));
            }
        }
    }
    volumes::licensing(spec, &mut m);
    volumes::topology(spec, &mut m);
    volumes::config_map(
        ctx,
        &d.kernel_module_config.name,
        "/drivers",
        "spec.driver.kernelModuleConfig.name",
        true,
        &mut m,
    )?;
    attach(pod, idx, std::mem::take(&mut m));
    if let Some(first) = pod.containers.first_mut() {
        apply_env(first, &c.env);
    }
    if precompiled(spec) {
        volumes::precompiled_lib_modules(ctx, &mut m);
        attach(pod, idx, m);
        return Ok(());
    }
    let repo = &d.repo_config.config_map_name;
    if !repo.is_empty() {
        let dir = volumes::repo_dir(ctx)?;
        let field = "spec.driver.repoConfig.configMapName";
        volumes::config_map(ctx, repo, dir, field, true, &mut m)?;
    }
    let cert = &d.cert_config.name;
    if !cert.is_empty() {
        let dir = volumes::cert_dir(ctx)?;
        volumes::config_map(ctx, cert, dir, "spec.driver.certConfig.name", true, &mut m)?;
    }
    attach(pod, idx, std::mem::take(&mut m));
    let ctr = &mut pod.containers[idx];
    volumes::secret_env(ctr, spec, ctx)?;
    if let Some(v) = ctx.openshift_version.as_deref() {
        set_env(ctr, "OPENSHIFT_VERSION", v);
    }
    volumes::subscriptions(spec, ctx, &mut m);
    attach(pod, idx, m);
    Ok(())
}
