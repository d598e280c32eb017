//! Standard plugin of the `container-toolkit` state: the NVIDIA container toolkit DaemonSet
//! (upstream `TransformToolkit`, gpu-operator.md §3.2).

use kiln_plugin_std::env::{apply_env, set_env};
use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::kiln_core::context::ContainerRuntime;
use kiln_plugin_std::pod::{
    add_pull_secrets, apply_host_network, ds_name, pod_spec, set_host_path, set_main_image,
    set_resources_all, transform_validation_init_containers,
};
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError, image};

pub mod runtime;

/// The toolkit's main container.
pub const MAIN: &str = "nvidia-container-toolkit-ctr";
/// The toolkit's default install directory on the host.
pub const DEFAULT_INSTALL_DIR: &str = "/usr/local/nvidia";
/// CRI-O's OCI hooks directory on plain Kubernetes.
pub const CRIO_HOOKS_DIR: &str = "/usr/share/containers/oci/hooks.d";

/// The `container-toolkit` operand.
pub struct ContainerToolkit;

impl Operand for ContainerToolkit {
    const NAME: &'static str = "container-toolkit";

    /// Upstream `TransformToolkit`, in order: main container `nvidia-container-toolkit-ctr` (an
    /// error if missing); validation init containers; image (`toolkit.*`, fallback
    /// `CONTAINER_TOOLKIT_IMAGE`), pull policy, pull secrets, resources (all containers); the CDI
    /// env (`CRIO_CONFIG_MODE=hook` for CRI-O without CDI); `toolkit.installDir`; the CRI-O hooks
    /// directory off OpenShift; `toolkit.env`; the runtime step; `toolkit.hostNetwork`. No
    /// runtime class.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let t = &spec.toolkit.common;
        let pod = pod_spec(ds);
        let idx = pod
            .containers
            .iter()
            .position(|c| c.name == MAIN)
            .ok_or_else(|| TransformError::missing_container(&name, MAIN))?;
        transform_validation_init_containers(pod, spec, ctx)?;
        let img = image::resolve_image("spec.toolkit", t.into(), "CONTAINER_TOOLKIT_IMAGE", ctx)?;
        set_main_image(&mut pod.containers[idx], &img, &t.image_pull_policy);
        add_pull_secrets(pod, &t.image_pull_secrets);
        set_resources_all(pod, t.resources.as_ref());

        let ctr = &mut pod.containers[idx];
        if spec.cdi.enabled() {
            set_env(ctr, "CDI_ENABLED", "true");
            set_env(ctr, "NVIDIA_RUNTIME_SET_AS_DEFAULT", "false");
            set_env(ctr, "NVIDIA_CONTAINER_RUNTIME_MODE", "cdi");
            set_env(ctr, "CRIO_CONFIG_MODE", "config");
            if spec.cdi.nri_plugin_enabled() {
                set_env(ctr, "ENABLE_NRI_PLUGIN", "true");
            }
        } else if ctx.runtime == ContainerRuntime::Crio {
            set_env(ctr, "CRIO_CONFIG_MODE", "hook");
        }

        let dir = spec.toolkit.install_dir();
        if dir != DEFAULT_INSTALL_DIR {
            set_env(ctr, "ROOT", dir);
            if let Some(m) = ctr
                .volume_mounts
                .iter_mut()
                .flatten()
                .find(|m| m.name == "toolkit-install-dir")
            {
                m.mount_path = dir.to_string();
            }
            set_host_path(pod, "toolkit-install-dir", dir);
        }
        if ctx.runtime == ContainerRuntime::Crio && ctx.openshift_version.is_none() {
            set_host_path(pod, "crio-hooks", CRIO_HOOKS_DIR);
        }
        apply_env(&mut pod.containers[idx], &t.env);
        runtime::transform_for_runtime(pod, idx, spec, ctx.runtime);
        apply_host_network(pod, t.host_network);
        Ok(())
    }
}

kiln_plugin_std::export_operand!(ContainerToolkit);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<ContainerToolkit>(env!("CARGO_MANIFEST_DIR"), 41);
    }

    #[test]
    fn user_config_override_moves_the_mount() {
        let ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "t", "namespace": "n"},
            "spec": {"selector": {"matchLabels": {"app": "t"}},
                     "template": {"metadata": {"labels": {"app": "t"}},
                                  "spec": {"containers": [{"name": MAIN}]}}}});
        let spec = json!({"toolkit": {"image": "tk:1",
            "env": [{"name": "CONTAINERD_CONFIG", "value": "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"}]}});
        let out = kiln_plugin_std::apply_native::<ContainerToolkit>(
            &[ds],
            &spec,
            &TransformContext::default(),
        )
        .unwrap();
        let pod = &out[0].as_ref().unwrap()["spec"]["template"]["spec"];
        let env = pod["containers"][0]["env"].as_array().unwrap();
        let get = |n: &str| env.iter().find(|e| e["name"] == n).unwrap()["value"].clone();
        assert_eq!(get("CONTAINERD_CONFIG"), "/runtime/config-dir/config.toml");
        assert_eq!(get("RUNTIME_CONFIG"), "/runtime/config-dir/config.toml");
        assert_eq!(
            pod["volumes"][0]["hostPath"]["path"],
            "/var/lib/rancher/k3s/agent/etc/containerd"
        );
    }
}
