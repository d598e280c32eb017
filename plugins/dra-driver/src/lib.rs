//! Standard plugin of the `dra-driver` state of a GPUCluster: NVIDIA's DRA driver for GPUs
//! (kubelet-plugin DaemonSet with the `gpus` and `compute-domains` containers, the
//! compute-domain controller Deployment, DeviceClasses, RBAC, and the ValidatingAdmissionPolicy
//! keeping each kubelet plugin to its own node's ResourceSlices), as NVIDIA v26.7.0's GPUCluster
//! controller renders it from `spec.draDriver`.
//!
//! The spec is the GPUCluster's, read as a ClusterPolicySpec (`draDriver` in
//! [`ClusterPolicySpec::dra_driver`]); the SDK has already applied `daemonsets.*` and the
//! `driverInstallDir` rewrite to the DaemonSet.

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::k8s_openapi::api::core::v1::{
    Container, PodSpec, ResourceRequirements, VolumeMount,
};
use kiln_plugin_std::k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kiln_plugin_std::kiln_core::spec::gpucluster::{
    DEFAULT_KUBELET_ROOT, DraDriverSpec, KubeletPluginSpec, under_kubelet_root,
};
use kiln_plugin_std::pod::{
    add_mounts, add_pull_secrets, add_volume, container, host_path_volume, init_container, mount,
    pod_spec, remove_container, set_main_image, set_resources, set_side_image,
};
use kiln_plugin_std::serde_json::{Value, json};
use kiln_plugin_std::{
    ClusterPolicySpec, Decision, Operand, TransformContext, TransformError, env, image,
};

/// The command of the `gpus` container on kiln's image: kiln's own DRA kubelet plugin.
pub const KILN_COMMAND: [&str; 2] = ["kiln", "dra-plugin"];

/// The placeholder the assets carry for the operator namespace.
const PLACEHOLDER: &str = "FILLED_BY_OPERATOR";

/// The `gpus` container's default health port.
pub const GPUS_HEALTH_PORT: i32 = 51516;
/// The `compute-domains` container's default health port.
pub const COMPUTE_DOMAINS_HEALTH_PORT: i32 = 51515;
/// The kubelet-plugin containers.
const GPUS: &str = "gpus";
const COMPUTE_DOMAINS: &str = "compute-domains";
/// Where the driver validation and the plugins see the driver root.
pub const DRIVER_ROOT_CTR_PATH: &str = "/driver-root";

/// Objects that exist only with ComputeDomains on: `(kind, name)`.
pub const COMPUTE_DOMAIN_OBJECTS: [(&str, &str); 12] = [
    ("ServiceAccount", "nvidia-dra-driver-controller"),
    ("ServiceAccount", "compute-domain-daemon-service-account"),
    ("ClusterRole", "nvidia-dra-driver-controller"),
    ("ClusterRole", "compute-domain-daemon"),
    ("ClusterRoleBinding", "nvidia-dra-driver-controller"),
    ("ClusterRoleBinding", "compute-domain-daemon"),
    ("Role", "nvidia-dra-driver-controller"),
    ("Role", "nvidia-dra-driver-kubeletplugin"),
    ("RoleBinding", "nvidia-dra-driver-controller"),
    ("RoleBinding", "nvidia-dra-driver-kubeletplugin"),
    ("DeviceClass", "compute-domain-daemon.nvidia.com"),
    ("DeviceClass", "compute-domain-default-channel.nvidia.com"),
];

/// The compute-domain controller Deployment (also only with ComputeDomains on).
pub const CONTROLLER: &str = "nvidia-dra-driver-controller";

/// Host mounts the `gpus` container gets with the `PassthroughSupport` feature gate (binding
/// GPUs to vfio-pci): `(volume, host path, mount path, propagation)`.
const PASSTHROUGH_MOUNTS: [(&str, &str, &str); 3] = [
    ("lib-modules", "/lib/modules/", "HostToContainer"),
    ("sysfs", "/sys/", "Bidirectional"),
    ("procfs", "/proc/", "Bidirectional"),
];

/// The `dra-driver` operand.
pub struct DraDriver;

fn dra(spec: &ClusterPolicySpec) -> Result<&DraDriverSpec, TransformError> {
    spec.dra_driver
        .as_ref()
        .ok_or_else(|| TransformError::field("spec.draDriver", "required"))
}

fn driver_image(d: &DraDriverSpec, ctx: &TransformContext) -> Result<String, TransformError> {
    image::resolve_image(
        "spec.draDriver",
        image::ImageFields {
            repository: &d.repository,
            image: &d.image,
            version: &d.version,
        },
        "DRA_DRIVER_IMAGE",
        ctx,
    )
}

/// The validator image of the driver-validation init container (`VALIDATOR_IMAGE`; a
/// GPUCluster has no validator block).
fn validator_image(ctx: &TransformContext) -> Result<String, TransformError> {
    ctx.fallback_image("VALIDATOR_IMAGE")
        .map(str::to_string)
        .ok_or_else(|| {
            TransformError::Failed("no validator image: the operator's VALIDATOR_IMAGE".into())
        })
}

/// Image (and `IMAGE_NAME` where the container has it), `FEATURE_GATES`, health port, env and
/// resources of one kubelet-plugin container.
fn kubelet_plugin(
    ctr: &mut Container,
    d: &DraDriverSpec,
    image: &str,
    settings: Option<&KubeletPluginSpec>,
    default_port: i32,
) {
    set_main_image(ctr, image, &d.image_pull_policy);
    // Only the `gpus` container names its image (NVIDIA's assets).
    if env::get_env(ctr, "IMAGE_NAME").is_some() {
        env::set_env(ctr, "IMAGE_NAME", image);
    }
    let gates = d.feature_gates_value();
    if gates.is_empty() {
        env::remove_env(ctr, "FEATURE_GATES");
    } else {
        env::set_env(ctr, "FEATURE_GATES", gates);
    }
    match KubeletPluginSpec::health_port(settings, default_port) {
        Some(port) => {
            env::set_env(ctr, "HEALTHCHECK_PORT", port.to_string());
            for probe in [ctr.liveness_probe.as_mut(), ctr.startup_probe.as_mut()]
                .into_iter()
                .flatten()
            {
                if let Some(grpc) = probe.grpc.as_mut() {
                    grpc.port = port;
                }
            }
        }
        None => {
            env::remove_env(ctr, "HEALTHCHECK_PORT");
            ctr.liveness_probe = None;
            ctr.startup_probe = None;
        }
    }
    if let Some(s) = settings {
        set_resources(ctr, s.resources.as_ref());
        env::apply_env(ctr, &s.env);
    }
}

/// The `gpus` container on kiln's image: `kiln dra-plugin` in place of NVIDIA's shell
/// entrypoint (kiln reads the validator's driver-ready file itself and has no shell), and no
/// gRPC health port or probes (kiln's plugin serves none; the kubelet sees a dead plugin by its
/// socket).
fn run_kiln(ctr: &mut Container) {
    ctr.command = Some(KILN_COMMAND.iter().map(|s| (*s).to_string()).collect());
    ctr.args = None;
    env::remove_env(ctr, "HEALTHCHECK_PORT");
    ctr.liveness_probe = None;
    ctr.startup_probe = None;
}

/// A quantity in its base unit (`500m` → 0.5, `1Gi` → 2^30), for comparing; `None` for a
/// value that is not a Kubernetes quantity.
fn quantity_value(q: &str) -> Option<f64> {
    const SUFFIXES: [(&str, f64); 13] = [
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("Pi", 1125899906842624.0),
        ("Ei", 1152921504606846976.0),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    for (suffix, factor) in SUFFIXES {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<f64>().ok().map(|n| n * factor);
        }
    }
    q.parse().ok()
}

/// Kubernetes' effective request of an init container running before `containers`: per
/// resource, the largest limit and the largest request among them (NVIDIA gives the
/// driver-validation init container these, so it fits wherever the plugin fits).
fn largest_resources(containers: &[Container]) -> Option<ResourceRequirements> {
    let mut out = ResourceRequirements::default();
    let mut any = false;
    for c in containers {
        let Some(r) = &c.resources else { continue };
        for (src, dst) in [
            (&r.limits, &mut out.limits),
            (&r.requests, &mut out.requests),
        ] {
            for (name, q) in src.iter().flatten() {
                let map = dst.get_or_insert_with(Default::default);
                let bigger = map.get(name).is_none_or(|old: &Quantity| {
                    quantity_value(&q.0).unwrap_or(0.0) > quantity_value(&old.0).unwrap_or(0.0)
                });
                if bigger {
                    map.insert(name.clone(), q.clone());
                    any = true;
                }
            }
        }
    }
    any.then_some(out)
}

/// Host paths under the kubelet root follow `hostPaths.kubeletRootDir`: volumes, mounts and
/// the `KUBELET_*_DIRECTORY_PATH` env.
fn move_kubelet_root(pod: &mut PodSpec, root: &str) {
    if root.is_empty() || root == DEFAULT_KUBELET_ROOT {
        return;
    }
    for v in pod.volumes.iter_mut().flatten() {
        if let Some(hp) = v.host_path.as_mut() {
            hp.path = under_kubelet_root(&hp.path, root);
        }
    }
    for c in pod
        .containers
        .iter_mut()
        .chain(pod.init_containers.iter_mut().flatten())
    {
        for m in c.volume_mounts.iter_mut().flatten() {
            m.mount_path = under_kubelet_root(&m.mount_path, root);
        }
        for e in c.env.iter_mut().flatten() {
            if e.name.starts_with("KUBELET_")
                && let Some(v) = e.value.as_mut()
            {
                *v = under_kubelet_root(v, root);
            }
        }
    }
}

impl Operand for DraDriver {
    const NAME: &'static str = "dra-driver";
    const OBJECT_KINDS: &'static [&'static str] = &[
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "DeviceClass",
        "Deployment",
        "ValidatingAdmissionPolicy",
    ];

    /// The kubelet-plugin DaemonSet: driver image and `IMAGE_NAME` on each plugin container,
    /// `FEATURE_GATES`, the health port (env and gRPC probes) and `gpus` / `computeDomains`
    /// kubelet-plugin env and resources; the `compute-domains` container only with
    /// ComputeDomains on; the `PassthroughSupport` host mounts; the driver-validation init
    /// container on the validator image with the plugins' largest resources; pull secrets;
    /// paths under the kubelet root.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let d = dra(spec)?;
        let image = driver_image(d, ctx)?;
        let validator = validator_image(ctx)?;
        let pod = pod_spec(ds);
        let gpus_settings = d.gpus.as_ref().and_then(|g| g.kubelet_plugin.as_ref());
        let ctr = container(pod, GPUS).ok_or_else(|| {
            TransformError::InvalidObject("the kubelet plugin has no gpus container".into())
        })?;
        kubelet_plugin(ctr, d, &image, gpus_settings, GPUS_HEALTH_PORT);
        if image::is_kiln_image(&image) {
            if d.compute_domains_enabled() {
                return Err(TransformError::field(
                    "spec.draDriver.computeDomains.enabled",
                    "kiln's image runs the gpus kubelet plugin only (`kiln dra-plugin`); \
                     disable computeDomains or use NVIDIA's DRA driver image",
                ));
            }
            run_kiln(ctr);
        }
        if d.gate("PassthroughSupport") {
            let mounts: Vec<VolumeMount> = PASSTHROUGH_MOUNTS
                .iter()
                .map(|(name, path, propagation)| VolumeMount {
                    mount_propagation: Some((*propagation).into()),
                    read_only: (*name == "lib-modules").then_some(true),
                    ..mount(name, path)
                })
                .collect();
            add_mounts(ctr, &mounts);
            for (name, path, _) in PASSTHROUGH_MOUNTS {
                add_volume(pod, host_path_volume(name, path, Some("Directory")));
            }
        }
        if d.compute_domains_enabled() {
            let cd = d.compute_domains.as_ref();
            let settings = cd.and_then(|c| c.kubelet_plugin.as_ref());
            if let Some(ctr) = container(pod, COMPUTE_DOMAINS) {
                kubelet_plugin(ctr, d, &image, settings, COMPUTE_DOMAINS_HEALTH_PORT);
            }
        } else {
            remove_container(pod, COMPUTE_DOMAINS);
        }
        let largest = largest_resources(&pod.containers);
        if let Some(init) = init_container(pod, "driver-validation") {
            set_side_image(init, &validator, &d.image_pull_policy);
            if init.image_pull_policy.is_none() {
                init.image_pull_policy = Some(image::pull_policy(""));
            }
            if let Some(r) = largest {
                init.resources = Some(r);
            }
            // The plugins read the driver where this container validated it.
            env::set_env(init, "DRIVER_INSTALL_DIR_CTR_PATH", DRIVER_ROOT_CTR_PATH);
            for m in init.volume_mounts.iter_mut().flatten() {
                if m.name == "driver-install-dir" {
                    m.mount_path = DRIVER_ROOT_CTR_PATH.into();
                }
            }
        }
        add_pull_secrets(pod, &d.image_pull_secrets);
        move_kubelet_root(pod, &spec.host_paths.kubelet_root_dir);
        Ok(())
    }

    /// ComputeDomain objects are omitted with ComputeDomains off; the controller Deployment
    /// gets the driver image, `FEATURE_GATES`, the controller env and resources, the lease
    /// namespace, `daemonsets.priorityClassName` and `daemonsets.tolerations` after its own;
    /// the admission policy names the kubelet plugin's service account in the operator
    /// namespace.
    fn object(
        obj: &mut Value,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<Decision, TransformError> {
        let d = dra(spec)?;
        let kind = obj["kind"].as_str().unwrap_or_default().to_string();
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let cd_object = COMPUTE_DOMAIN_OBJECTS.contains(&(kind.as_str(), name.as_str()))
            || (kind == "Deployment" && name == CONTROLLER);
        if cd_object && !d.compute_domains_enabled() {
            return Ok(Decision::Omit);
        }
        match kind.as_str() {
            "Deployment" => controller(obj, spec, d, ctx)?,
            "ValidatingAdmissionPolicy" => {
                for m in obj["spec"]["matchConditions"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                {
                    if let Some(e) = m["expression"].as_str() {
                        m["expression"] = json!(e.replace(PLACEHOLDER, &ctx.operator_namespace));
                    }
                }
            }
            _ => {}
        }
        Ok(Decision::Keep)
    }
}

/// The compute-domain controller Deployment's edits (see [`DraDriver::object`]), made on the
/// JSON object (a typed `PodSpec` round trip through `Value` would add a third of the standard
/// bundle's size).
fn controller(
    obj: &mut Value,
    spec: &ClusterPolicySpec,
    d: &DraDriverSpec,
    ctx: &TransformContext,
) -> Result<(), TransformError> {
    let image = driver_image(d, ctx)?;
    let settings = d
        .compute_domains
        .as_ref()
        .and_then(|c| c.controller.as_ref());
    let pod = &mut obj["spec"]["template"]["spec"];
    if let Some(ctr) = pod["containers"].get_mut(0) {
        ctr["image"] = json!(image);
        ctr["imagePullPolicy"] = json!(image::pull_policy(&d.image_pull_policy));
        set_env_value(ctr, "IMAGE_NAME", &image);
        set_env_value(
            ctr,
            "LEADER_ELECTION_LEASE_LOCK_NAMESPACE",
            &ctx.operator_namespace,
        );
        let gates = d.feature_gates_value();
        if gates.is_empty() {
            if let Some(env) = ctr["env"].as_array_mut() {
                env.retain(|e| e["name"] != "FEATURE_GATES");
            }
        } else {
            set_env_value(ctr, "FEATURE_GATES", &gates);
        }
        if let Some(s) = settings {
            if let Some(r) = &s.resources {
                ctr["resources"] = json!({"limits": r.limits, "requests": r.requests});
            }
            for e in &s.env {
                set_env_value(ctr, &e.name, &e.value);
            }
        }
    }
    let ds = &spec.daemonsets;
    if !ds.priority_class_name.is_empty() {
        pod["priorityClassName"] = json!(ds.priority_class_name);
    }
    if !ds.tolerations.is_empty() {
        let extra = kiln_plugin_std::serde_json::to_value(&ds.tolerations)
            .map_err(|e| TransformError::Failed(format!("{CONTROLLER}: {e}")))?;
        if !pod["tolerations"].is_array() {
            pod["tolerations"] = json!([]);
        }
        if let (Some(list), Value::Array(extra)) = (pod["tolerations"].as_array_mut(), extra) {
            list.extend(extra);
        }
    }
    for name in &d.image_pull_secrets {
        if !pod["imagePullSecrets"].is_array() {
            pod["imagePullSecrets"] = json!([]);
        }
        if let Some(list) = pod["imagePullSecrets"].as_array_mut()
            && !list.iter().any(|s| s["name"] == name.as_str())
        {
            list.push(json!({"name": name}));
        }
    }
    Ok(())
}

/// `name=value` on a container as JSON: the value replaced in place (dropping `valueFrom`) when
/// the name exists, else appended (the SDK's [`env::set_env`] rule).
fn set_env_value(ctr: &mut Value, name: &str, value: &str) {
    if !ctr["env"].is_array() {
        ctr["env"] = json!([]);
    }
    let Some(list) = ctr["env"].as_array_mut() else {
        return;
    };
    match list.iter_mut().find(|e| e["name"] == name) {
        Some(e) => *e = json!({"name": name, "value": value}),
        None => list.push(json!({"name": name, "value": value})),
    }
}

kiln_plugin_std::export_operand!(DraDriver);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<DraDriver>(env!("CARGO_MANIFEST_DIR"), 2);
    }

    #[test]
    fn quantities_compare_in_base_units() {
        assert_eq!(quantity_value("500m"), Some(0.5));
        assert_eq!(quantity_value("1Gi"), Some(1073741824.0));
        assert_eq!(quantity_value("2"), Some(2.0));
        assert_eq!(quantity_value("x"), None);
        let ctr = |cpu: &str, mem: &str| Container {
            resources: Some(ResourceRequirements {
                limits: Some(
                    [
                        ("cpu".to_string(), Quantity(cpu.into())),
                        ("memory".to_string(), Quantity(mem.into())),
                    ]
                    .into(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = largest_resources(&[ctr("500m", "256Mi"), ctr("300m", "512Mi")]).unwrap();
        let limits = r.limits.unwrap();
        assert_eq!(limits["cpu"].0, "500m");
        assert_eq!(limits["memory"].0, "512Mi");
        assert!(largest_resources(&[Container::default()]).is_none());
    }
}
