//! Standard plugin of the `dcgm-exporter` state: the GPU metrics exporter DaemonSet
//! (upstream `TransformDCGMExporter`, gpu-operator.md §3.6) and its RBAC, Service and
//! ServiceMonitor (§2.4).

mod objects;

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, EnvVar, EnvVarSource, KeyToPath, ObjectFieldSelector,
    PodSpec, VolumeMount,
};
use kiln_plugin_std::kiln_core::spec::{DcgmExporterSpec, EnvVarSpec};
use kiln_plugin_std::pod::{
    add_mounts, add_pull_secrets, add_volume, apply_host_network, ds_name, first_container,
    fit_command_to_image, host_path_volume, pod_spec, set_host_path, set_main_image,
    set_nri_annotation, set_resources_all, set_runtime_class, template_annotations,
    transform_validation_init_containers,
};
use kiln_plugin_std::serde_json::Value;
use kiln_plugin_std::{
    ClusterPolicySpec, Decision, Operand, TransformContext, TransformError, env, image,
};

/// Env naming the DCGM host engine the exporter connects to.
pub const REMOTE_HOSTENGINE_ENV: &str = "DCGM_REMOTE_HOSTENGINE_INFO";
/// The standalone DCGM host engine Service (`nvidia-dcgm`, port 5555).
pub const REMOTE_HOSTENGINE: &str = "nvidia-dcgm:5555";
/// Default HPC job-mapping directory.
pub const DEFAULT_JOB_MAPPING_DIR: &str = "/var/lib/dcgm-exporter/job-mapping";
/// Pod-labels enrichment env.
pub const POD_LABELS_ENV: &str = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS";
/// Pod-UID enrichment env.
pub const POD_UID_ENV: &str = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID";
/// Pod-label allowlist env.
pub const ALLOWLIST_ENV: &str = "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX";
/// Metrics read from a ConfigMap through the API.
pub const CONFIGMAP_DATA_ENV: &str = "DCGM_EXPORTER_CONFIGMAP_DATA";
/// Custom metrics file name (ConfigMap key and mount subPath).
pub const METRICS_FILE: &str = "dcgm-metrics.csv";
/// Where the custom metrics file is mounted.
pub const METRICS_PATH: &str = "/etc/dcgm-exporter/dcgm-metrics.csv";

/// The collectors file the asset names for NVIDIA's image; kiln's image has no such file and
/// `kiln exporter` uses its embedded list when `KILN_EXPORTER_COLLECTORS` is unset.
pub const ASSET_COLLECTORS: &str = "/etc/dcgm-exporter/dcp-metrics-included.csv";

/// dcgm-exporter env vars and the `kiln exporter` env var with the same meaning (reference
/// §2 flags; `host/exporter/src/config.rs`). On kiln's image the first is renamed to the second.
pub const KILN_ENV_NAMES: &[(&str, &str)] = &[
    ("DCGM_EXPORTER_COLLECTORS", "KILN_EXPORTER_COLLECTORS"),
    ("DCGM_EXPORTER_LISTEN", "KILN_EXPORTER_LISTEN"),
    ("DCGM_EXPORTER_INTERVAL", "KILN_EXPORTER_INTERVAL"),
    ("DCGM_EXPORTER_KUBERNETES", "KILN_EXPORTER_KUBERNETES"),
    ("DCGM_EXPORTER_NO_HOSTNAME", "KILN_EXPORTER_NO_HOSTNAME"),
    (
        "DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME",
        "KILN_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME",
    ),
    (
        "DCGM_POD_RESOURCES_KUBELET_SOCKET",
        "KILN_EXPORTER_POD_RESOURCES_KUBELET_SOCKET",
    ),
    (
        "NVIDIA_RESOURCE_NAMES",
        "KILN_EXPORTER_NVIDIA_RESOURCE_NAMES",
    ),
    (
        "KUBERNETES_VIRTUAL_GPUS",
        "KILN_EXPORTER_KUBERNETES_VIRTUAL_GPUS",
    ),
];

/// `kiln exporter`'s env vars (after [`KILN_ENV_NAMES`]' renaming) and flags that make it read
/// NVML's process lists and map their pids to pods: virtual-GPU mode (dcgm-exporter's
/// `KUBERNETES_VIRTUAL_GPUS`, whose per-pod `DCGM_FI_DEV_GPU_UTIL`/`FB_USED` come from each pod's
/// processes) and kiln's per-pod process metrics.
pub const PROCESS_VALUE_SWITCHES: &[(&str, &str)] = &[
    (
        "KILN_EXPORTER_KUBERNETES_VIRTUAL_GPUS",
        "--kubernetes-virtual-gpus",
    ),
    (
        "KILN_EXPORTER_KUBERNETES_PROCESS_METRICS",
        "--kubernetes-process-metrics",
    ),
];
/// The kubelet's pod log directory, whose `<namespace>_<pod>_<uid>` entries name the pods of the
/// pids' cgroups; mounted read-only at the same path for process values.
pub const POD_LOGS_DIR: &str = "/var/log/pods";
/// The volume (and mount) name of [`POD_LOGS_DIR`].
pub const POD_LOGS_VOLUME: &str = "pod-logs";

fn runs_kiln_exporter(ctr: &Container) -> bool {
    ctr.command
        .as_deref()
        .is_some_and(|c| c.len() >= 2 && c[0] == "kiln" && c[1] == "exporter")
}

/// Whether `kiln exporter` in `ctr` is asked for per-pod process values: an env var of
/// [`PROCESS_VALUE_SWITCHES`] that clap reads as true (anything but empty, `0`, `n`, `no`, `f`,
/// `false`, `off`, in any case), or the flag among the args.
pub fn asks_process_values(ctr: &Container) -> bool {
    PROCESS_VALUE_SWITCHES.iter().any(|(name, flag)| {
        let on = env::get_env(ctr, name).is_some_and(|v| {
            !matches!(
                v.to_ascii_lowercase().as_str(),
                "" | "0" | "n" | "no" | "f" | "false" | "off"
            )
        });
        on || ctr
            .args
            .as_deref()
            .is_some_and(|a| a.iter().any(|x| x == flag || x == &format!("{flag}=true")))
    })
}

/// kiln's image only, when [`asks_process_values`]: what reading other pods' processes needs,
/// which NVIDIA's asset leaves to the user's `dcgmExporter.hostPID` — `hostPID: true` (NVML
/// reports host pids; `/proc/<pid>/cgroup` names their pod) and the kubelet's pod log directory
/// read-only ([`POD_LOGS_DIR`], to turn a pod UID into its namespace and name without the API
/// server). The container's own `/proc` shows the host's processes once `hostPID` is on, so
/// `/proc` is not mounted. Without the switch, or on NVIDIA's image, nothing changes.
pub fn fit_pod_to_process_values(pod: &mut PodSpec, main: &str) -> Result<(), TransformError> {
    let ctr = first_container(pod, main)?;
    if !runs_kiln_exporter(ctr) || !asks_process_values(ctr) {
        return Ok(());
    }
    add_mounts(ctr, &[read_only_mount(POD_LOGS_VOLUME, POD_LOGS_DIR, None)]);
    add_volume(pod, host_path_volume(POD_LOGS_VOLUME, POD_LOGS_DIR, None));
    pod.host_pid = Some(true);
    Ok(())
}

/// When `ctr` runs `kiln exporter`: renames the dcgm-exporter env vars of [`KILN_ENV_NAMES`]
/// to kiln's (value or `valueFrom` kept, a kiln name already present wins) and drops
/// `DCGM_EXPORTER_COLLECTORS` when it is the asset's [`ASSET_COLLECTORS`]. Other env vars,
/// e.g. `DCGM_REMOTE_HOSTENGINE_INFO`, stay as they are (`kiln exporter` reads NVML, not DCGM).
pub fn fit_env_to_kiln_exporter(ctr: &mut Container) {
    if !runs_kiln_exporter(ctr) {
        return;
    }
    if env::get_env(ctr, "DCGM_EXPORTER_COLLECTORS") == Some(ASSET_COLLECTORS) {
        env::remove_env(ctr, "DCGM_EXPORTER_COLLECTORS");
    }
    let Some(list) = ctr.env.as_mut() else {
        return;
    };
    let present: Vec<String> = list.iter().map(|e| e.name.clone()).collect();
    list.retain(|e| {
        KILN_ENV_NAMES
            .iter()
            .find(|(up, _)| *up == e.name)
            .is_none_or(|(_, kiln)| !present.iter().any(|p| p == kiln))
    });
    for e in list.iter_mut() {
        if let Some((_, kiln)) = KILN_ENV_NAMES.iter().find(|(up, _)| *up == e.name) {
            e.name = (*kiln).to_owned();
        }
    }
    // What NVIDIA's image has built in or does not need: kiln's exporter reads its Hostname
    // label from KILN_EXPORTER_NODE_NAME and sees the GPUs through the NVIDIA runtime.
    if !present.iter().any(|p| p == "KILN_EXPORTER_NODE_NAME") {
        list.push(EnvVar {
            name: "KILN_EXPORTER_NODE_NAME".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "spec.nodeName".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    env::set_env(ctr, "NVIDIA_VISIBLE_DEVICES", "all");
    env::set_env(ctr, "NVIDIA_DRIVER_CAPABILITIES", "compute,utility");
}

/// The `dcgm-exporter` operand.
pub struct DcgmExporter;

impl Operand for DcgmExporter {
    const NAME: &'static str = "dcgm-exporter";
    const OBJECT_KINDS: &'static [&'static str] = &[
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "ServiceMonitor",
    ];

    /// Upstream `TransformDCGMExporter`, in its order: validation init containers; image, pull
    /// policy and secrets (`dcgmExporter.*`, fallback `DCGM_EXPORTER_IMAGE`); pod-template
    /// annotations; resources; args; DCGM host engine; hostNetwork; NRI annotation; runtime
    /// class; hostPID; HPC job mapping; pod labels/UID/allowlist env;
    /// `automountServiceAccountToken`; custom metrics ConfigMap; kubelet root dir; user env last;
    /// then, on kiln's image, dcgm-exporter env names become `kiln exporter`'s
    /// ([`fit_env_to_kiln_exporter`]) and per-pod process values get `hostPID` and the pod log
    /// directory ([`fit_pod_to_process_values`]).
    /// The main container is container[0].
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let e = &spec.dcgm_exporter;
        let c = &e.common;
        let img = image::resolve_image("spec.dcgmExporter", c.into(), "DCGM_EXPORTER_IMAGE", ctx)?;
        let pod = pod_spec(ds);
        transform_validation_init_containers(pod, spec, ctx)?;
        let ctr = first_container(pod, &name)?;
        set_main_image(ctr, &img, &c.image_pull_policy);
        // NVIDIA's asset runs the image's own entrypoint (no command).
        fit_command_to_image(ctr, None);
        add_pull_secrets(pod, &c.image_pull_secrets);
        if !e.annotations.is_empty() {
            template_annotations(ds).extend(e.annotations.clone());
        }
        let pod = pod_spec(ds);
        set_resources_all(pod, c.resources.as_ref());
        let ctr = first_container(pod, &name)?;
        if !c.args.is_empty() {
            ctr.args = Some(c.args.clone());
        }
        // DCGM host engine: the standalone `nvidia-dcgm` when enabled; otherwise a host engine on
        // localhost (DGX) needs the host network. The check reads the env as it stands now,
        // before the user env.
        let local_engine = if spec.dcgm.common.enabled_or(true) {
            env::set_env(ctr, REMOTE_HOSTENGINE_ENV, REMOTE_HOSTENGINE);
            false
        } else {
            env::get_env(ctr, REMOTE_HOSTENGINE_ENV).is_some_and(|v| v.starts_with("localhost"))
        };
        if local_engine {
            apply_host_network(pod, Some(true));
        }
        apply_host_network(pod, c.host_network);
        let main = first_container(pod, &name)?.name.clone();
        set_nri_annotation(ds, spec, &main);
        let pod = pod_spec(ds);
        set_runtime_class(pod, spec, ctx);
        if e.host_pid == Some(true) {
            pod.host_pid = Some(true);
        }
        if e.hpc_job_mapping.enabled == Some(true) {
            let dir = match e.hpc_job_mapping.directory.as_str() {
                "" => DEFAULT_JOB_MAPPING_DIR,
                d => d,
            };
            let ctr = first_container(pod, &name)?;
            env::set_env(ctr, "DCGM_HPC_JOB_MAPPING_DIR", dir);
            add_mounts(ctr, &[read_only_mount("hpc-job-mapping", dir, None)]);
            add_volume(
                pod,
                host_path_volume("hpc-job-mapping", dir, Some("DirectoryOrCreate")),
            );
        }
        let ctr = first_container(pod, &name)?;
        apply_enrichment_env(ctr, e);
        if needs_api_access(e, true) {
            pod.automount_service_account_token = Some(true);
        }
        if !e.config.name.is_empty() {
            let ctr = first_container(pod, &name)?;
            add_mounts(
                ctr,
                &[read_only_mount(
                    "metrics-config",
                    METRICS_PATH,
                    Some(METRICS_FILE),
                )],
            );
            add_volume(pod, metrics_config_volume(&e.config.name));
            let ctr = first_container(pod, &name)?;
            env::set_env(ctr, "DCGM_EXPORTER_COLLECTORS", METRICS_PATH);
        }
        let kubelet = spec.host_paths.kubelet_root_dir.as_str();
        if !kubelet.is_empty() && kubelet != "/var/lib/kubelet" {
            let path = format!("{}/pod-resources", kubelet.trim_end_matches('/'));
            set_host_path(pod, "pod-gpu-resources", &path);
        }
        let ctr = first_container(pod, &name)?;
        env::apply_env(ctr, &c.env);
        fit_env_to_kiln_exporter(ctr);
        fit_pod_to_process_values(pod, &name)
    }

    /// §2.4: the read-pods ClusterRole/ClusterRoleBinding gate, Service type and traffic
    /// policy, ServiceMonitor gate and tunables.
    fn object(
        obj: &mut Value,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<Decision, TransformError> {
        objects::edit(obj, spec, ctx)
    }
}

/// `DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS` / `…_POD_UID` = `true` for the spec flags, and
/// the comma-joined `podLabelAllowlistRegex`, in upstream order.
fn apply_enrichment_env(ctr: &mut Container, e: &DcgmExporterSpec) {
    if e.enable_pod_labels == Some(true) {
        env::set_env(ctr, POD_LABELS_ENV, "true");
    }
    if e.enable_pod_uid == Some(true) {
        env::set_env(ctr, POD_UID_ENV, "true");
    }
    if !e.pod_label_allowlist_regex.is_empty() {
        env::set_env(ctr, ALLOWLIST_ENV, e.pod_label_allowlist_regex.join(","));
    }
}

/// Whether the exporter reads the Kubernetes API (upstream's pod-metadata test): pod labels or
/// UIDs enabled by the spec flags, or by the user env (`…_POD_LABELS` / `…_POD_UID` equal to
/// `true`, case-insensitive). With `count_configmap_data`, a user env
/// `DCGM_EXPORTER_CONFIGMAP_DATA` other than "" and `none` also counts (the service-account
/// token rule; the read-pods ClusterRole gate leaves it out).
pub fn needs_api_access(e: &DcgmExporterSpec, count_configmap_data: bool) -> bool {
    if e.enable_pod_labels == Some(true) || e.enable_pod_uid == Some(true) {
        return true;
    }
    e.common
        .env
        .iter()
        .any(|EnvVarSpec { name, value }| match name.as_str() {
            POD_LABELS_ENV | POD_UID_ENV => value.eq_ignore_ascii_case("true"),
            CONFIGMAP_DATA_ENV => count_configmap_data && !value.is_empty() && value != "none",
            _ => false,
        })
}

fn read_only_mount(name: &str, path: &str, sub_path: Option<&str>) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(true),
        sub_path: sub_path.map(str::to_string),
        ..Default::default()
    }
}

fn metrics_config_volume(cm: &str) -> kiln_plugin_std::k8s_openapi::api::core::v1::Volume {
    kiln_plugin_std::k8s_openapi::api::core::v1::Volume {
        name: "metrics-config".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: cm.into(),
            items: Some(vec![KeyToPath {
                key: METRICS_FILE.into(),
                path: METRICS_FILE.into(),
                mode: None,
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

kiln_plugin_std::export_operand!(DcgmExporter);

#[cfg(test)]
mod tests;
