//! Standard plugin of the `mig-manager` state: the MIG manager DaemonSet `nvidia-mig-manager`
//! (upstream `TransformMIGManager`, gpu-operator.md §3.8) and its default ConfigMaps (§2.4).

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::k8s_openapi::api::core::v1::{ConfigMapVolumeSource, KeyToPath, PodSpec};
use kiln_plugin_std::monitoring::default_config_map_gate;
use kiln_plugin_std::pod::{
    apply_component_basics, apply_host_network, ds_name, first_container, pod_spec,
    set_nri_annotation, set_runtime_class, transform_validation_init_containers,
};
use kiln_plugin_std::serde_json::Value;
use kiln_plugin_std::{
    ClusterPolicySpec, Decision, Operand, TransformContext, TransformError, env, image,
};

/// The mig-parted ConfigMap shipped with the state (upstream `MigPartedDefaultConfigMapName`).
pub const DEFAULT_MIG_PARTED_CONFIG: &str = "default-mig-parted-config";

/// The GPU clients ConfigMap shipped with the state (upstream `MigDefaultGPUClientsConfigMapName`).
pub const DEFAULT_GPU_CLIENTS: &str = "default-gpu-clients";

/// `toolkit-validation`'s wait loop on a non-kiln validator image (NVIDIA's asset text).
pub const TOOLKIT_WAIT: &str = "until [ -f /run/nvidia/validations/toolkit-ready ]; do echo waiting for nvidia container toolkit to be setup; sleep 5; done";

/// The `mig-manager` operand.
pub struct MigManager;

impl Operand for MigManager {
    const NAME: &'static str = "mig-manager";
    const OBJECT_KINDS: &'static [&'static str] = &["ConfigMap"];

    /// Upstream order, on container[0]: validation init containers; image (`migManager.*`,
    /// fallback `MIG_MANAGER_IMAGE`), pull policy, secrets, resources, args; runtime class; NRI
    /// annotation; the `mig-parted-config` volume (default: items remap and
    /// `DEFAULT_CONFIG_FILE`; custom: `CONFIG_FILE`); the `gpu-clients` volume; CDI env;
    /// `migManager.env`; hostNetwork. No MIG_STRATEGY env.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let mm = &spec.mig_manager;
        let pod = pod_spec(ds);
        transform_validation_init_containers(pod, spec, ctx)?;
        // NVIDIA's MIG manager asset words its toolkit wait differently from the others.
        for c in pod.init_containers.iter_mut().flatten() {
            if c.name == "toolkit-validation" && c.command.as_deref().is_some_and(|c| c[0] == "sh")
            {
                c.args = Some(vec![TOOLKIT_WAIT.into()]);
            }
        }
        let img = image::resolve_image(
            "spec.migManager",
            (&mm.common).into(),
            "MIG_MANAGER_IMAGE",
            ctx,
        )?;
        apply_component_basics(pod, &name, None, &img, &mm.common)?;
        set_runtime_class(pod, spec, ctx);
        let main_name = first_container(pod, &name)?.name.clone();
        set_nri_annotation(ds, spec, &main_name);
        let pod = pod_spec(ds);
        apply_mig_parted_config(pod, &name, spec)?;
        let clients = custom_name(&mm.gpu_clients_config.name).unwrap_or(DEFAULT_GPU_CLIENTS);
        if let Some(cm) = config_map_volume(pod, |n| n == "gpu-clients") {
            cm.name = clients.to_string();
        }
        let main = first_container(pod, &name)?;
        if spec.cdi.enabled() {
            env::set_env(main, "CDI_ENABLED", "true");
            if spec.toolkit.common.enabled_or(true) {
                env::set_env(
                    main,
                    "NVIDIA_CDI_HOOK_PATH",
                    kiln_plugin_std::pod::cdi_hook_path(spec.toolkit.install_dir()),
                );
            }
        }
        env::apply_env(main, &mm.common.env);
        apply_host_network(pod, mm.common.host_network);
        Ok(())
    }

    /// §2.4: `default-mig-parted-config` / `default-gpu-clients` are omitted when the matching
    /// `config.name` names a different ConfigMap (the default is not deleted upstream; kiln
    /// leaves it out of the state).
    fn object(
        obj: &mut Value,
        spec: &ClusterPolicySpec,
        _ctx: &TransformContext,
    ) -> Result<Decision, TransformError> {
        let mig_cfg = spec
            .mig_manager
            .config
            .as_ref()
            .map_or("", |c| c.name.as_str());
        let clients = spec.mig_manager.gpu_clients_config.name.as_str();
        if default_config_map_gate(obj, DEFAULT_MIG_PARTED_CONFIG, mig_cfg) == Decision::Omit
            || default_config_map_gate(obj, DEFAULT_GPU_CLIENTS, clients) == Decision::Omit
        {
            return Ok(Decision::Omit);
        }
        Ok(Decision::Keep)
    }
}

/// The volume whose name contains `mig-parted-config`: ConfigMap `migManager.config.name`
/// (custom → `CONFIG_FILE=/mig-parted-config/config.yaml`) or `default-mig-parted-config` with
/// items `config.yaml` → `config-default.yaml` and
/// `DEFAULT_CONFIG_FILE=/mig-parted-config/config-default.yaml` on container[0].
fn apply_mig_parted_config(
    pod: &mut PodSpec,
    ds: &str,
    spec: &ClusterPolicySpec,
) -> Result<(), TransformError> {
    let custom = spec
        .mig_manager
        .config
        .as_ref()
        .and_then(|c| custom_name(&c.name));
    let Some(cm) = config_map_volume(pod, |n| n.contains("mig-parted-config")) else {
        return Ok(());
    };
    let (env_name, value) = match custom {
        Some(n) => {
            cm.name = n.to_string();
            ("CONFIG_FILE", "/mig-parted-config/config.yaml")
        }
        None => {
            cm.name = DEFAULT_MIG_PARTED_CONFIG.to_string();
            cm.items = Some(vec![KeyToPath {
                key: "config.yaml".into(),
                path: "config-default.yaml".into(),
                mode: None,
            }]);
            (
                "DEFAULT_CONFIG_FILE",
                "/mig-parted-config/config-default.yaml",
            )
        }
    };
    env::set_env(first_container(pod, ds)?, env_name, value);
    Ok(())
}

/// A non-empty configured name.
fn custom_name(name: &str) -> Option<&str> {
    (!name.is_empty()).then_some(name)
}

/// The ConfigMap source of the first volume whose name satisfies `pred` (created if the volume
/// has none).
fn config_map_volume(
    pod: &mut PodSpec,
    pred: impl Fn(&str) -> bool,
) -> Option<&mut ConfigMapVolumeSource> {
    let vol = pod.volumes.as_mut()?.iter_mut().find(|v| pred(&v.name))?;
    Some(vol.config_map.get_or_insert_with(Default::default))
}

kiln_plugin_std::export_operand!(MigManager);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<MigManager>(env!("CARGO_MANIFEST_DIR"), 7);
    }
}
