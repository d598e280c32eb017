//! Standard plugin of the `device-plugin` state: the kubelet device plugin DaemonSet
//! `nvidia-device-plugin-daemonset` (upstream `TransformDevicePlugin`, gpu-operator.md §3.3).

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector,
};
use kiln_plugin_std::pod::{
    apply_component_basics, apply_host_network, apply_mig_env, device_plugin_image, ds_name,
    fit_command_args_to_image, handle_device_plugin_config, pod_spec, require_container,
    set_nri_annotation, set_runtime_class, transform_validation_init_containers,
};
use kiln_plugin_std::serde_json::Value;
use kiln_plugin_std::{
    ClusterPolicySpec, Decision, Operand, TransformContext, TransformError, env,
};

/// The main container of the device plugin DaemonSet.
pub const MAIN: &str = "nvidia-device-plugin";

/// Entrypoint of the main container on a non-kiln image (run as `/bin/sh -c`): the asset's
/// `nvidia-device-plugin-entrypoint` ConfigMap, mounted at `/bin/entrypoint.sh`, which picks the
/// driver root and `exec`s `nvidia-device-plugin` with the container args (upstream's entrypoint).
pub const UPSTREAM_ENTRYPOINT: &str = "/bin/entrypoint.sh";

/// Where kiln's own device plugin mounts the driver root (`DRIVER_ROOT_CTR_PATH` of the
/// validator's driver-ready file); NVIDIA's image mounts it at `/driver-root`.
pub const KILN_DRIVER_ROOT: &str = "/run/nvidia/driver";

/// The node kiln's device plugin reports GPU health on (`NODE_NAME`, from `spec.nodeName`).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// The RBAC rules of the state's ClusterRole that only kiln's own device plugin uses (GPU
/// health on its Node: the `GPUHealthy` condition, kiln's taint, an Event per transition in
/// `default`), as `(apiGroup, resource, verb)`. On NVIDIA's image, which writes no Node and
/// records no Event, they are dropped, so the roles are NVIDIA's.
pub const KILN_ONLY_RULES: [(&str, &str, &str); 3] = [
    ("", "nodes", "patch"),
    ("", "nodes/status", "patch"),
    ("events.k8s.io", "events", "create"),
];

/// The `device-plugin` operand.
pub struct DevicePlugin;

impl Operand for DevicePlugin {
    const NAME: &'static str = "device-plugin";
    const OBJECT_KINDS: &'static [&'static str] = &["ClusterRole"];

    /// Upstream order: main container lookup, validation init containers, image/policy/secrets/
    /// resources/args, GDS and GDRCopy env, device-plugin config, runtime class, NRI annotation,
    /// MIG env, CDI env, `mps.root` rewrite, `devicePlugin.env`, hostNetwork.
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
        let img = device_plugin_image(spec, ctx)?;
        apply_component_basics(pod, &name, Some(MAIN), &img, dp)?;
        let main = require_container(pod, &name, MAIN)?;
        if spec.gds.enabled_or(false) {
            env::set_env(main, "GDS_ENABLED", "true");
            env::set_env(main, "MOFED_ENABLED", "true");
        }
        if spec.gdrcopy.enabled_or(false) {
            env::set_env(main, "GDRCOPY_ENABLED", "true");
        }
        handle_device_plugin_config(pod, spec, ctx)?;
        set_runtime_class(pod, spec, ctx);
        set_nri_annotation(ds, spec, MAIN);
        let pod = pod_spec(ds);
        let main = require_container(pod, &name, MAIN)?;
        apply_mig_env(main, spec);
        apply_cdi_env(main, spec);
        if let Some(root) = spec.device_plugin.custom_mps_root() {
            env::set_env(require_container(pod, &name, MAIN)?, "MPS_ROOT", root);
            kiln_plugin_std::pod::rewrite_mps_volumes(pod, root);
        }
        let main = require_container(pod, &name, MAIN)?;
        env::apply_env(main, &dp.env);
        fit_command_args_to_image(main, &["/bin/sh", "-c"], &[UPSTREAM_ENTRYPOINT]);
        if main
            .image
            .as_deref()
            .is_some_and(kiln_plugin_std::image::is_kiln_image)
        {
            // kiln's plugin takes the driver root from the validator's driver-ready file,
            // which names it as operand pods see it (/run/nvidia/driver), not /driver-root.
            for m in main.volume_mounts.iter_mut().flatten() {
                if m.name == "driver-install-dir" {
                    m.mount_path = KILN_DRIVER_ROOT.into();
                }
            }
            set_node_name_env(main);
        }
        apply_host_network(pod, dp.host_network);
        Ok(())
    }

    /// The state's ClusterRole: [`KILN_ONLY_RULES`] dropped unless the plugin runs
    /// kiln's image. An unresolvable image keeps them (the DaemonSet reports the error).
    fn object(
        obj: &mut Value,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<Decision, TransformError> {
        let kiln = device_plugin_image(spec, ctx)
            .map_or(true, |img| kiln_plugin_std::image::is_kiln_image(&img));
        if !kiln {
            drop_kiln_only_rules(obj);
        }
        Ok(Decision::Keep)
    }
}

/// `NODE_NAME` from the pod's `spec.nodeName` (kiln's plugin reports GPU health on that Node;
/// a user's `devicePlugin.env` entry of that name, applied before, is replaced).
fn set_node_name_env(main: &mut Container) {
    env::remove_env(main, NODE_NAME_ENV);
    main.env.get_or_insert_with(Vec::new).push(EnvVar {
        name: NODE_NAME_ENV.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: "spec.nodeName".into(),
            }),
            ..Default::default()
        }),
    });
}

/// Removes each of [`KILN_ONLY_RULES`] from the role `obj`: the verb from a rule naming only
/// that group and resource, and a rule left without verbs.
fn drop_kiln_only_rules(obj: &mut Value) {
    let Some(rules) = obj.get_mut("rules").and_then(Value::as_array_mut) else {
        return;
    };
    let only = |rule: &Value, key: &str, want: &str| {
        rule[key]
            .as_array()
            .is_some_and(|a| a.len() == 1 && a[0] == want)
    };
    for rule in rules.iter_mut() {
        for (group, resource, verb) in KILN_ONLY_RULES {
            if only(rule, "apiGroups", group)
                && only(rule, "resources", resource)
                && let Some(verbs) = rule.get_mut("verbs").and_then(Value::as_array_mut)
            {
                verbs.retain(|v| v != verb);
            }
        }
    }
    rules.retain(|r| r["verbs"].as_array().is_none_or(|v| !v.is_empty()));
}

/// Upstream step 10 (CDI enabled): `CDI_ENABLED=true`, `DEVICE_LIST_STRATEGY=cdi-annotations,cdi-cri`,
/// `CDI_ANNOTATION_PREFIX=cdi.k8s.io/`, and `NVIDIA_CDI_HOOK_PATH` only when the toolkit is enabled.
fn apply_cdi_env(main: &mut Container, spec: &ClusterPolicySpec) {
    if !spec.cdi.enabled() {
        return;
    }
    env::set_env(main, "CDI_ENABLED", "true");
    env::set_env(main, "DEVICE_LIST_STRATEGY", "cdi-annotations,cdi-cri");
    env::set_env(main, "CDI_ANNOTATION_PREFIX", "cdi.k8s.io/");
    if spec.toolkit.common.enabled_or(true) {
        env::set_env(
            main,
            "NVIDIA_CDI_HOOK_PATH",
            kiln_plugin_std::pod::cdi_hook_path(spec.toolkit.install_dir()),
        );
    }
}

kiln_plugin_std::export_operand!(DevicePlugin);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<DevicePlugin>(env!("CARGO_MANIFEST_DIR"), 17);
    }
}
