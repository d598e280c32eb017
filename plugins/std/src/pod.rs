//! Pod-level edits shared by the operand transforms (upstream §3.0 helper semantics).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, EmptyDirVolumeSource, LocalObjectReference, PodSpec,
    ResourceRequirements, SecurityContext, Volume, VolumeMount,
};
use kiln_core::context::{ContainerRuntime, TransformContext};
use kiln_core::spec::{ClusterPolicySpec, ResourcesSpec};

use crate::TransformError;
use crate::env::set_env;
use crate::image::{ImageFields, is_kiln_image, pull_policy, resolve_image};

/// The DaemonSet's name (empty if unset).
pub fn ds_name(ds: &DaemonSet) -> String {
    ds.metadata.name.clone().unwrap_or_default()
}

/// The pod spec of `ds`, created empty where missing.
pub fn pod_spec(ds: &mut DaemonSet) -> &mut PodSpec {
    ds.spec
        .get_or_insert_with(Default::default)
        .template
        .spec
        .get_or_insert_with(Default::default)
}

/// Pod template annotations of `ds`, created where missing.
pub fn template_annotations(ds: &mut DaemonSet) -> &mut BTreeMap<String, String> {
    let tmpl = &mut ds.spec.get_or_insert_with(Default::default).template;
    tmpl.metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(BTreeMap::new)
}

/// Pod template labels of `ds`, created where missing.
pub fn template_labels(ds: &mut DaemonSet) -> &mut BTreeMap<String, String> {
    let tmpl = &mut ds.spec.get_or_insert_with(Default::default).template;
    tmpl.metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(BTreeMap::new)
}

/// The container called `name`.
pub fn container<'a>(pod: &'a mut PodSpec, name: &str) -> Option<&'a mut Container> {
    pod.containers.iter_mut().find(|c| c.name == name)
}

/// The init container called `name`.
pub fn init_container<'a>(pod: &'a mut PodSpec, name: &str) -> Option<&'a mut Container> {
    pod.init_containers
        .as_mut()?
        .iter_mut()
        .find(|c| c.name == name)
}

/// The container called `name`, or [`TransformError::InvalidObject`] naming it and the DaemonSet.
pub fn require_container<'a>(
    pod: &'a mut PodSpec,
    ds: &str,
    name: &str,
) -> Result<&'a mut Container, TransformError> {
    container(pod, name).ok_or_else(|| TransformError::missing_container(ds, name))
}

/// The first container, or an error naming the DaemonSet.
pub fn first_container<'a>(
    pod: &'a mut PodSpec,
    ds: &str,
) -> Result<&'a mut Container, TransformError> {
    pod.containers
        .first_mut()
        .ok_or_else(|| TransformError::InvalidObject(format!("DaemonSet {ds:?} has no containers")))
}

/// Remove the container and init container called `name`, if present.
pub fn remove_container(pod: &mut PodSpec, name: &str) {
    pod.containers.retain(|c| c.name != name);
    if let Some(init) = pod.init_containers.as_mut() {
        init.retain(|c| c.name != name);
    }
}

/// Append pull secrets to `pod.imagePullSecrets`, de-duplicated by name.
pub fn add_pull_secrets(pod: &mut PodSpec, secrets: &[String]) {
    if secrets.is_empty() {
        return;
    }
    let list = pod.image_pull_secrets.get_or_insert_with(Vec::new);
    for s in secrets {
        if !list.iter().any(|r| &r.name == s) {
            list.push(LocalObjectReference { name: s.clone() });
        }
    }
}

/// The spec's resources as Kubernetes `ResourceRequirements` (claims untouched).
pub fn resource_requirements(r: &ResourcesSpec) -> ResourceRequirements {
    ResourceRequirements {
        limits: r.limits.clone(),
        requests: r.requests.clone(),
        ..Default::default()
    }
}

/// Set requests/limits on one container when `r` is set.
pub fn set_resources(ctr: &mut Container, r: Option<&ResourcesSpec>) {
    if let Some(r) = r {
        let res = ctr.resources.get_or_insert_with(Default::default);
        res.limits = r.limits.clone();
        res.requests = r.requests.clone();
    }
}

/// Set requests/limits on every (non-init) container of the pod when `r` is set.
pub fn set_resources_all(pod: &mut PodSpec, r: Option<&ResourcesSpec>) {
    for c in &mut pod.containers {
        set_resources(c, r);
    }
}

/// Apply `hostNetwork`: only `true` has an effect, and it also sets
/// `dnsPolicy: ClusterFirstWithHostNet`.
pub fn apply_host_network(pod: &mut PodSpec, host_network: Option<bool>) {
    if host_network == Some(true) {
        pod.host_network = Some(true);
        pod.dns_policy = Some("ClusterFirstWithHostNet".into());
    }
}

/// Whether operands get `runtimeClassName`: not when (CDI is disabled and the runtime is CRI-O)
/// or the NRI plugin is enabled.
pub fn runtime_class_applies(spec: &ClusterPolicySpec, ctx: &TransformContext) -> bool {
    let crio_without_cdi = !spec.cdi.enabled() && ctx.runtime == ContainerRuntime::Crio;
    !(crio_without_cdi || spec.cdi.nri_plugin_enabled())
}

/// Set `runtimeClassName` to `operator.runtimeClass` where [`runtime_class_applies`].
pub fn set_runtime_class(pod: &mut PodSpec, spec: &ClusterPolicySpec, ctx: &TransformContext) {
    if runtime_class_applies(spec, ctx) {
        pod.runtime_class_name = Some(spec.runtime_class().to_string());
    }
}

/// With the NRI plugin enabled, annotate the pod template so NRI injects all GPUs into
/// container `ctr`: `nvidia.cdi.k8s.io/container.<ctr>: management.nvidia.com/gpu=all`.
pub fn set_nri_annotation(ds: &mut DaemonSet, spec: &ClusterPolicySpec, ctr: &str) {
    if spec.cdi.nri_plugin_enabled() {
        template_annotations(ds).insert(
            format!("nvidia.cdi.k8s.io/container.{ctr}"),
            "management.nvidia.com/gpu=all".into(),
        );
    }
}

/// MIG env for the device plugin, MPS and GFD: strategy unset → `NVIDIA_MIG_MONITOR_DEVICES=all`;
/// otherwise `MIG_STRATEGY=<s>` plus `NVIDIA_MIG_MONITOR_DEVICES=all` unless the strategy is `none`.
pub fn apply_mig_env(ctr: &mut Container, spec: &ClusterPolicySpec) {
    use kiln_core::spec::MigStrategy;
    match spec.mig.strategy {
        None => set_env(ctr, "NVIDIA_MIG_MONITOR_DEVICES", "all"),
        Some(s) => {
            set_env(ctr, "MIG_STRATEGY", s.as_str());
            if s != MigStrategy::None {
                set_env(ctr, "NVIDIA_MIG_MONITOR_DEVICES", "all");
            }
        }
    }
}

/// Set `securityContext.runAsUser = 0`, creating the security context if absent.
pub fn run_as_root(ctr: &mut Container) {
    ctr.security_context
        .get_or_insert_with(SecurityContext::default)
        .run_as_user = Some(0);
}

/// Set image and pull policy on a main container (the policy is always resolved).
pub fn set_main_image(ctr: &mut Container, image: &str, raw_policy: &str) {
    ctr.image = Some(image.to_string());
    ctr.image_pull_policy = Some(pull_policy(raw_policy));
}

/// Set image, and the pull policy only when the spec sets one (init containers and sidecars).
pub fn set_side_image(ctr: &mut Container, image: &str, raw_policy: &str) {
    ctr.image = Some(image.to_string());
    if !raw_policy.is_empty() {
        ctr.image_pull_policy = Some(pull_policy(raw_policy));
    }
}

/// Replace a `kiln …` command with `fallback` (or the image's own entrypoint when `None`) when
/// the container's image is not kiln's. kiln-provided operands (validator, device plugin, GFD,
/// exporter) default to kiln's image; a policy may point them at NVIDIA's images instead.
pub fn fit_command_to_image(ctr: &mut Container, fallback: Option<Vec<String>>) {
    if runs_kiln_on_another_image(ctr) {
        ctr.command = fallback;
    }
}

/// Whether `ctr`'s command is `kiln …` while its image is not kiln's (the case both
/// `fit_command*` helpers replace).
fn runs_kiln_on_another_image(ctr: &Container) -> bool {
    let runs_kiln = ctr
        .command
        .as_ref()
        .and_then(|c| c.first())
        .is_some_and(|c| c == "kiln");
    runs_kiln && !is_kiln_image(ctr.image.as_deref().unwrap_or_default())
}

/// Like [`fit_command_to_image`], for NVIDIA assets that split the entrypoint into `command`
/// and `args` (`sh -c` with the script as the argument): on an image other than kiln's, a
/// `kiln …` command becomes `command` + `args`.
pub fn fit_command_args_to_image(ctr: &mut Container, command: &[&str], args: &[&str]) {
    if runs_kiln_on_another_image(ctr) {
        ctr.command = Some(command.iter().map(|s| s.to_string()).collect());
        ctr.args = Some(args.iter().map(|s| s.to_string()).collect());
    }
}

/// The validator image (`validator.*`, fallback `VALIDATOR_IMAGE`).
pub fn validator_image(
    spec: &ClusterPolicySpec,
    ctx: &TransformContext,
) -> Result<String, TransformError> {
    resolve_image(
        "spec.validator",
        ImageFields::from(&spec.validator.common),
        "VALIDATOR_IMAGE",
        ctx,
    )
}

/// Upstream `transformValidationInitContainer`: every init container whose name contains
/// `validation` gets the validator image (pull policy if set), `validator.resources`,
/// `runAsUser: 0`, and `validator.driver.env` / `validator.toolkit.env` when its name starts with
/// `driver` / `toolkit`; then `validator.imagePullSecrets` are added to the pod. On a non-kiln
/// validator image, `kiln validator wait --for X` becomes a shell loop waiting for the file X.
pub fn transform_validation_init_containers(
    pod: &mut PodSpec,
    spec: &ClusterPolicySpec,
    ctx: &TransformContext,
) -> Result<(), TransformError> {
    let v = &spec.validator;
    let has_validation = pod
        .init_containers
        .iter()
        .flatten()
        .any(|c| c.name.contains("validation"));
    if !has_validation {
        return Ok(());
    }
    let image = validator_image(spec, ctx)?;
    for ctr in pod.init_containers.iter_mut().flatten() {
        if !ctr.name.contains("validation") {
            continue;
        }
        if ctr.name.starts_with("driver") {
            crate::env::apply_env(ctr, &v.driver.env);
        } else if ctr.name.starts_with("toolkit") {
            crate::env::apply_env(ctr, &v.toolkit.env);
        }
        set_side_image(ctr, &image, &v.common.image_pull_policy);
        set_resources(ctr, v.common.resources.as_ref());
        run_as_root(ctr);
        match wait_target(ctr).as_deref() {
            // NVIDIA's validator image waits for the driver itself (`WITH_WAIT=true`,
            // `COMPONENT=driver`, set by the asset).
            Some("driver-ready") => {
                fit_command_args_to_image(ctr, &["sh", "-c"], &["nvidia-validator"])
            }
            Some(file) => {
                let script = shell_wait(file);
                fit_command_args_to_image(ctr, &["sh", "-c"], &[script.as_str()]);
            }
            None => fit_command_to_image(ctr, None),
        }
    }
    add_pull_secrets(pod, &v.common.image_pull_secrets);
    Ok(())
}

/// The file a `kiln validator wait --for FILE` command waits for.
fn wait_target(ctr: &Container) -> Option<String> {
    let cmd = ctr.command.as_ref()?;
    let pos = cmd.iter().position(|a| a == "--for")?;
    (cmd.get(2).map(String::as_str) == Some("wait"))
        .then(|| cmd.get(pos + 1).cloned())
        .flatten()
}

/// NVIDIA's wait loop for a status file (its assets' text, so pod templates match):
/// - `vgpu-manager-ready`: also satisfied by `host-vgpu-manager-ready`, which NVIDIADriver's
///   vGPU host manager writes (upstream vgpu-device-manager);
/// - `vfio-pci-ready` / `vgpu-devices-ready`: first waits for the validator's `workload-type`
///   file and passes at once on a node whose workload is not `vm-passthrough` / `vm-vgpu`
///   (upstream sandbox-device-plugin);
/// - any other file: waits for it.
fn shell_wait(file: &str) -> String {
    const DIR: &str = "/run/nvidia/validations";
    let for_workload = |workload: &str, what: &str, waiting: &str| {
        format!(
            "until [ -f {DIR}/workload-type ]; do echo waiting for workload type status file; \
             sleep 5; done; if [ \"$(cat {DIR}/workload-type)\" != \"{workload}\" ]; then echo \
             {what} not needed, skipping validation; exit 0; fi; until [ -f {DIR}/{file} ]; do \
             echo waiting for {waiting}; sleep 5; done;"
        )
    };
    match file {
        "vgpu-manager-ready" => format!(
            "until [ -f {DIR}/{file} ] || [ -f {DIR}/host-{file} ]; do echo waiting for NVIDIA \
             vGPU Manager to be setup; sleep 5; done"
        ),
        "vfio-pci-ready" => for_workload("vm-passthrough", "vfio-pci", "vfio-pci driver ..."),
        "vgpu-devices-ready" => for_workload("vm-vgpu", "vgpu-devices", "vGPU devices..."),
        other => {
            let what = match other {
                "toolkit-ready" => "nvidia container stack to be setup",
                other => other,
            };
            format!("until [ -f {DIR}/{other} ]; do echo waiting for {what}; sleep 5; done")
        }
    }
}

/// Upstream `handleDevicePluginConfig` (device plugin, MPS, GFD). With no
/// `devicePlugin.config.name`, remove `config-manager-init` and `config-manager`. Otherwise mount
/// the config into the main containers (`CONFIG_FILE=/config/config.yaml`), share the process
/// namespace when not hostPID, add the ConfigMap and `config` emptyDir volumes, and set up the
/// config-manager containers with the device-plugin image, `DEFAULT_CONFIG` and
/// `FALLBACK_STRATEGIES=empty`. The init container's resources come from `gfd.resources` when the
/// pod has a `gpu-feature-discovery` container, else from `devicePlugin.resources`.
pub fn handle_device_plugin_config(
    pod: &mut PodSpec,
    spec: &ClusterPolicySpec,
    ctx: &TransformContext,
) -> Result<(), TransformError> {
    let cfg = &spec.device_plugin.config;
    if cfg.name.is_empty() {
        remove_container(pod, "config-manager-init");
        remove_container(pod, "config-manager");
        return Ok(());
    }
    let image = device_plugin_image(spec, ctx)?;
    let mounts = [
        mount("config", "/config"),
        mount(&cfg.name, "/available-configs"),
    ];
    let is_gfd = pod
        .containers
        .iter()
        .any(|c| c.name == "gpu-feature-discovery");
    for ctr in &mut pod.containers {
        if matches!(
            ctr.name.as_str(),
            "nvidia-device-plugin" | "gpu-feature-discovery" | "mps-control-daemon-ctr"
        ) {
            set_env(ctr, "CONFIG_FILE", "/config/config.yaml");
            add_mounts(ctr, &mounts);
        }
    }
    if pod.host_pid != Some(true) {
        pod.share_process_namespace = Some(true);
    }
    add_volume(
        pod,
        Volume {
            name: cfg.name.clone(),
            config_map: Some(ConfigMapVolumeSource {
                name: cfg.name.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    add_volume(
        pod,
        Volume {
            name: "config".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
    );
    let init_resources = if is_gfd {
        spec.gfd.resources.as_ref()
    } else {
        spec.device_plugin.common.resources.as_ref()
    };
    let policy = spec.device_plugin.common.image_pull_policy.clone();
    for (name, init) in [("config-manager-init", true), ("config-manager", false)] {
        let found = if init {
            init_container(pod, name)
        } else {
            container(pod, name)
        };
        if let Some(ctr) = found {
            set_side_image(ctr, &image, &policy);
            set_env(ctr, "DEFAULT_CONFIG", cfg.default.clone());
            set_env(ctr, "FALLBACK_STRATEGIES", "empty");
            add_mounts(ctr, &mounts);
            if init {
                set_resources(ctr, init_resources);
            }
            fit_command_to_image(ctr, Some(vec!["config-manager".into()]));
        }
    }
    Ok(())
}

/// The device plugin image (`devicePlugin.*`, fallback `DEVICE_PLUGIN_IMAGE`).
pub fn device_plugin_image(
    spec: &ClusterPolicySpec,
    ctx: &TransformContext,
) -> Result<String, TransformError> {
    resolve_image(
        "spec.devicePlugin",
        ImageFields::from(&spec.device_plugin.common),
        "DEVICE_PLUGIN_IMAGE",
        ctx,
    )
}

/// A volume mount `name` at `path`.
pub fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..Default::default()
    }
}

/// Add mounts to `ctr`, replacing a mount of the same name.
pub fn add_mounts(ctr: &mut Container, mounts: &[VolumeMount]) {
    let list = ctr.volume_mounts.get_or_insert_with(Vec::new);
    for m in mounts {
        match list.iter_mut().find(|x| x.name == m.name) {
            Some(x) => *x = m.clone(),
            None => list.push(m.clone()),
        }
    }
}

/// Add a volume to the pod, replacing a volume of the same name.
pub fn add_volume(pod: &mut PodSpec, v: Volume) {
    let list = pod.volumes.get_or_insert_with(Vec::new);
    match list.iter_mut().find(|x| x.name == v.name) {
        Some(x) => *x = v,
        None => list.push(v),
    }
}

/// The volume called `name`.
pub fn volume<'a>(pod: &'a mut PodSpec, name: &str) -> Option<&'a mut Volume> {
    pod.volumes.as_mut()?.iter_mut().find(|v| v.name == name)
}

/// Set the hostPath path of volume `name`, if it exists and is a hostPath volume.
pub fn set_host_path(pod: &mut PodSpec, name: &str, path: &str) -> bool {
    match volume(pod, name).and_then(|v| v.host_path.as_mut()) {
        Some(hp) => {
            hp.path = path.to_string();
            true
        }
        None => false,
    }
}

/// A hostPath volume with an optional type (e.g. `DirectoryOrCreate`).
pub fn host_path_volume(name: &str, path: &str, type_: Option<&str>) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(k8s_openapi::api::core::v1::HostPathVolumeSource {
            path: path.into(),
            type_: type_.map(str::to_string),
        }),
        ..Default::default()
    }
}

/// Apply image, pull policy, pull secrets, resources (all containers) and args of a component
/// to the main container `main` (the common first steps of most transforms).
pub fn apply_component_basics(
    pod: &mut PodSpec,
    ds: &str,
    main: Option<&str>,
    image: &str,
    c: &kiln_core::spec::ComponentSpec,
) -> Result<(), TransformError> {
    let ctr = match main {
        Some(name) => require_container(pod, ds, name)?,
        None => first_container(pod, ds)?,
    };
    set_main_image(ctr, image, &c.image_pull_policy);
    if !c.args.is_empty() {
        ctr.args = Some(c.args.clone());
    }
    add_pull_secrets(pod, &c.image_pull_secrets);
    set_resources_all(pod, c.resources.as_ref());
    Ok(())
}

/// The whole transform of a simple operand (upstream's sandbox device plugins, VFIO/CC/kata
/// managers, node status exporter pattern): validation init containers; image resolved from
/// `c` at spec path `path` (fallback `fallback_env`); pull policy, secrets, resources and args;
/// `extra_env` then the user env on container[0]; hostNetwork. No runtime class.
///
/// # Errors
/// An unresolvable image (naming `path`), a pod without containers.
pub fn apply_simple_component(
    ds: &mut DaemonSet,
    spec: &ClusterPolicySpec,
    ctx: &TransformContext,
    path: &str,
    fallback_env: &str,
    c: &kiln_core::spec::ComponentSpec,
    extra_env: &[(&str, &str)],
) -> Result<(), TransformError> {
    let name = ds_name(ds);
    let img = resolve_image(path, ImageFields::from(c), fallback_env, ctx)?;
    let pod = pod_spec(ds);
    transform_validation_init_containers(pod, spec, ctx)?;
    apply_component_basics(pod, &name, None, &img, c)?;
    let ctr = first_container(pod, &name)?;
    for (k, v) in extra_env {
        set_env(ctr, k, *v);
    }
    crate::env::apply_env(ctr, &c.env);
    apply_host_network(pod, c.host_network);
    Ok(())
}

/// Upstream MPS root rewrite (device plugin and MPS control daemon): hostPath volume `mps-root`
/// → `root`, `mps-shm` → `<root>/shm`.
pub fn rewrite_mps_volumes(pod: &mut PodSpec, root: &str) {
    set_host_path(pod, "mps-root", root);
    set_host_path(
        pod,
        "mps-shm",
        &format!("{}/shm", root.trim_end_matches('/')),
    );
}

/// Path of the CDI hook under the toolkit install dir: Go's
/// `filepath.Join(installDir, "toolkit/nvidia-cdi-hook")` (one `/` between parts; duplicate and
/// trailing slashes dropped), as upstream sets `NVIDIA_CDI_HOOK_PATH`.
pub fn cdi_hook_path(install_dir: &str) -> String {
    let parts: Vec<&str> = install_dir.split('/').filter(|p| !p.is_empty()).collect();
    let lead = if install_dir.starts_with('/') {
        "/"
    } else {
        ""
    };
    if parts.is_empty() {
        return format!("{lead}toolkit/nvidia-cdi-hook");
    }
    format!("{lead}{}/toolkit/nvidia-cdi-hook", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_path_is_a_path_join() {
        assert_eq!(
            cdi_hook_path("/usr/local/nvidia"),
            "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
        );
        assert_eq!(
            cdi_hook_path("/path/to/install/"),
            "/path/to/install/toolkit/nvidia-cdi-hook"
        );
        assert_eq!(cdi_hook_path("//a//b"), "/a/b/toolkit/nvidia-cdi-hook");
        assert_eq!(cdi_hook_path("/"), "/toolkit/nvidia-cdi-hook");
    }
}
