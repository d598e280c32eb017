//! Config mounts of the driver and its sidecars (gpu-operator.md §3.1 step 2): licensing,
//! topology, kernel module parameters, package repositories, CA certificates, subscriptions.

use kiln_plugin_std::driver_family::{config_map_mounts, config_map_volume};
use kiln_plugin_std::k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, EnvFromSource, KeyToPath, SecretEnvSource,
    SecretVolumeSource, Volume, VolumeMount,
};
use kiln_plugin_std::kiln_core::spec::ClusterPolicySpec;
use kiln_plugin_std::pod::host_path_volume;
use kiln_plugin_std::{TransformContext, TransformError};

/// Mounts for one container and the volumes they need.
#[derive(Default)]
pub struct Mounts {
    /// Mounts, appended to the container in order.
    pub mounts: Vec<VolumeMount>,
    /// Volumes, appended to the pod in order.
    pub volumes: Vec<Volume>,
}

fn ro_sub(name: &str, path: &str, sub: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        sub_path: Some(sub.into()),
        read_only: Some(true),
        ..Default::default()
    }
}

fn items(keys: &[&str]) -> Vec<KeyToPath> {
    keys.iter()
        .map(|k| KeyToPath {
            key: (*k).into(),
            path: (*k).into(),
            mode: None,
        })
        .collect()
}

/// vGPU licensing (`licensingConfig.secretName` preferred over `configMapName`): volume
/// `licensing-config` with `gridd.conf` at `/drivers/gridd.conf`, plus the NLS client token
/// at `/drivers/ClientConfigToken/client_configuration_token.tok` when `nlsEnabled` (nil = true,
/// as upstream's `IsNLSEnabled`).
pub fn licensing(spec: &ClusterPolicySpec, out: &mut Mounts) {
    let l = &spec.driver.licensing_config;
    if l.secret_name.is_empty() && l.config_map_name.is_empty() {
        return;
    }
    let mut keys = vec!["gridd.conf"];
    out.mounts.push(ro_sub(
        "licensing-config",
        "/drivers/gridd.conf",
        "gridd.conf",
    ));
    if l.nls_enabled.unwrap_or(true) {
        keys.push("client_configuration_token.tok");
        out.mounts.push(ro_sub(
            "licensing-config",
            "/drivers/ClientConfigToken/client_configuration_token.tok",
            "client_configuration_token.tok",
        ));
    }
    let mut vol = Volume {
        name: "licensing-config".into(),
        ..Default::default()
    };
    if !l.secret_name.is_empty() {
        vol.secret = Some(SecretVolumeSource {
            secret_name: Some(l.secret_name.clone()),
            items: Some(items(&keys)),
            ..Default::default()
        });
    } else {
        vol.config_map = Some(ConfigMapVolumeSource {
            name: l.config_map_name.clone(),
            items: Some(items(&keys)),
            ..Default::default()
        });
    }
    out.volumes.push(vol);
}

/// `virtualTopology.config` → ConfigMap volume `topology-config` (key `nvidia-topologyd.conf`)
/// mounted at `/etc/nvidia/nvidia-topologyd.conf`.
pub fn topology(spec: &ClusterPolicySpec, out: &mut Mounts) {
    let cm = &spec.driver.virtual_topology.config;
    if cm.is_empty() {
        return;
    }
    let key = "nvidia-topologyd.conf";
    out.mounts.push(ro_sub(
        "topology-config",
        "/etc/nvidia/nvidia-topologyd.conf",
        key,
    ));
    out.volumes.push(Volume {
        name: "topology-config".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: cm.clone(),
            items: Some(items(&[key])),
            ..Default::default()
        }),
        ..Default::default()
    });
}

/// Per-key subPath mounts of ConfigMap `cm` under `dir` (and its volume when `with_volume`).
pub fn config_map(
    ctx: &TransformContext,
    cm: &str,
    dir: &str,
    field: &str,
    with_volume: bool,
    out: &mut Mounts,
) -> Result<(), TransformError> {
    if cm.is_empty() {
        return Ok(());
    }
    let (mounts, items) = config_map_mounts(ctx, cm, dir, field)?;
    out.mounts.extend(mounts);
    if with_volume {
        out.volumes.push(config_map_volume(cm, items));
    }
    Ok(())
}

fn os_id(ctx: &TransformContext) -> &str {
    ctx.gpu_node_os.as_ref().map_or("", |o| o.id.as_str())
}

/// The OS package repository directory for `driver.repoConfig` (upstream `RepoConfigPathMap`).
pub fn repo_dir(ctx: &TransformContext) -> Result<&'static str, TransformError> {
    match os_id(ctx) {
        "ubuntu" | "debian" => Ok("/etc/apt/sources.list.d"),
        "rhel" | "rhcos" | "centos" | "rocky" | "ol" => Ok("/etc/yum.repos.d"),
        "sles" | "sl-micro" => Ok("/etc/zypp/repos.d"),
        other => Err(TransformError::field(
            "spec.driver.repoConfig.configMapName",
            format!("no package repository directory is known for GPU node OS {other:?}"),
        )),
    }
}

/// The CA certificate directory for `driver.certConfig` (upstream `CertConfigPathMap`).
pub fn cert_dir(ctx: &TransformContext) -> Result<&'static str, TransformError> {
    match os_id(ctx) {
        "ubuntu" | "debian" => Ok("/usr/local/share/ca-certificates"),
        "rhel" | "rhcos" | "centos" | "rocky" | "ol" => Ok("/etc/pki/ca-trust/extracted/pem"),
        "sles" | "sl-micro" => Ok("/etc/pki/trust/anchors"),
        other => Err(TransformError::field(
            "spec.driver.certConfig.name",
            format!("no CA certificate directory is known for GPU node OS {other:?}"),
        )),
    }
}

/// Upstream `createSecretEnvReference`: `envFrom.secretRef` to `driver.secretEnv`, which must
/// exist (an error at `spec.driver.secretEnv` otherwise).
pub fn secret_env(
    ctr: &mut Container,
    spec: &ClusterPolicySpec,
    ctx: &TransformContext,
) -> Result<(), TransformError> {
    let name = &spec.driver.secret_env;
    if name.is_empty() {
        return Ok(());
    }
    if !ctx.has_secret(name) {
        return Err(TransformError::field(
            "spec.driver.secretEnv",
            format!(
                "Secret {name:?} not found in namespace {:?}",
                ctx.operator_namespace
            ),
        ));
    }
    ctr.env_from
        .get_or_insert_with(Vec::new)
        .push(EnvFromSource {
            secret_ref: Some(SecretEnvSource {
                name: name.clone(),
                optional: None,
            }),
            ..Default::default()
        });
    Ok(())
}

/// Upstream `SubscriptionPathMap` mounts (`subscription-config-N`, read-only, sorted by mount
/// path): rhel off OpenShift with a non-CRI-O runtime and no repoConfig; sles and sl-micro.
pub fn subscriptions(spec: &ClusterPolicySpec, ctx: &TransformContext, out: &mut Mounts) {
    use kiln_plugin_std::kiln_core::context::ContainerRuntime;
    let paths: &[(&str, &str, &str)] = match os_id(ctx) {
        "rhel"
            if ctx.openshift_version.is_none()
                && ctx.runtime != ContainerRuntime::Crio
                && spec.driver.repo_config.config_map_name.is_empty() =>
        {
            &[
                (
                    "/run/secrets/etc-pki-entitlement",
                    "/etc/pki/entitlement",
                    "Directory",
                ),
                (
                    "/run/secrets/redhat.repo",
                    "/etc/yum.repos.d/redhat.repo",
                    "File",
                ),
                ("/run/secrets/rhsm", "/etc/rhsm", "Directory"),
            ]
        }
        "sles" | "sl-micro" => &[
            ("/etc/SUSEConnect", "/etc/SUSEConnect", "FileOrCreate"),
            (
                "/etc/zypp/credentials.d",
                "/etc/zypp/credentials.d",
                "Directory",
            ),
        ],
        _ => &[],
    };
    for (i, (mount_path, host, type_)) in paths.iter().enumerate() {
        let name = format!("subscription-config-{i}");
        out.mounts.push(VolumeMount {
            name: name.clone(),
            mount_path: (*mount_path).into(),
            read_only: Some(true),
            ..Default::default()
        });
        out.volumes.push(host_path_volume(&name, host, Some(type_)));
    }
}

/// Precompiled drivers on SLES / SL-Micro: `/lib/modules` read-only at `/run/host/lib/modules`.
pub fn precompiled_lib_modules(ctx: &TransformContext, out: &mut Mounts) {
    if matches!(os_id(ctx), "sles" | "sl-micro") {
        out.mounts.push(VolumeMount {
            name: "lib-modules".into(),
            mount_path: "/run/host/lib/modules".into(),
            read_only: Some(true),
            ..Default::default()
        });
        out.volumes
            .push(host_path_volume("lib-modules", "/lib/modules", None));
    }
}
