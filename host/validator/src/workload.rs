//! The plugin step's workload (upstream `WITH_WORKLOAD=true`, `cmd/nvidia-validator`'s
//! `Plugin.runWorkload`): a pod bound to this node that requests one unit of the GPU resource
//! the device plugin advertises, so the device plugin's allocation and the container runtime's
//! injection are proven end to end, not only the node's allocatable count.
//!
//! The pod has upstream's shape (`validator/manifests/plugin-workload-validation.yaml`):
//! `generateName: nvidia-device-plugin-validator-`, label `app=nvidia-device-plugin-validator`,
//! `restartPolicy: OnFailure`, ServiceAccount `nvidia-operator-validator`, init container
//! `plugin-validation` holding the GPU (requests and limits 1), main container
//! `nvidia-device-plugin-validator`; image, pull policy, pull secrets and runtime class from
//! `VALIDATOR_IMAGE`, `VALIDATOR_IMAGE_PULL_POLICY`, `VALIDATOR_IMAGE_PULL_SECRETS` and
//! `VALIDATOR_RUNTIME_CLASS`; owner references and tolerations of the validator DaemonSet
//! `nvidia-operator-validator`. Upstream's init container runs the CUDA `vectorAdd` sample,
//! which kiln's image does not hold: kiln's runs `kiln validator cuda` (NVML's view, then a
//! CUDA context with memory written and read back, inside a container that got only what the
//! device plugin allocated) and its main
//! container `kiln validator wait --for cuda-ready`, the two sharing an `emptyDir` for the
//! status file. As upstream: an earlier workload pod on the node is deleted first, and the
//! step waits for the new one to reach `Succeeded`; unlike upstream, a failure is reported as
//! it happens, naming the container and its reason.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::serde_json::{self, json};

use crate::ExpectedResource;

/// `app` label of the workload pods (upstream `pluginValidatorLabelValue`).
pub const WORKLOAD_APP: &str = "nvidia-device-plugin-validator";
/// The init container that holds the GPU.
pub const WORKLOAD_INIT: &str = "plugin-validation";
/// The validator DaemonSet whose owners and tolerations the pod takes.
pub const VALIDATOR_DAEMONSET: &str = "nvidia-operator-validator";

/// What the workload pod is made of (the validator container's environment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadSpec {
    /// This node (`NODE_NAME`).
    pub node: String,
    /// The operator's namespace (`OPERATOR_NAMESPACE`).
    pub namespace: String,
    /// `VALIDATOR_IMAGE`.
    pub image: String,
    /// `VALIDATOR_IMAGE_PULL_POLICY` (empty: the manifest's `IfNotPresent`).
    pub pull_policy: String,
    /// `VALIDATOR_IMAGE_PULL_SECRETS`, comma-separated.
    pub pull_secrets: Vec<String>,
    /// `VALIDATOR_RUNTIME_CLASS` (empty: none).
    pub runtime_class: String,
}

impl WorkloadSpec {
    /// From the environment variables the operator sets on the plugin-validation container.
    ///
    /// # Errors
    /// A message naming the variable that is missing (`VALIDATOR_IMAGE`, `OPERATOR_NAMESPACE`).
    pub fn from_env(node: &str, var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let need = |name: &str| {
            var(name)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("{name} is not set: the workload pod cannot be made"))
        };
        Ok(WorkloadSpec {
            node: node.to_owned(),
            namespace: need("OPERATOR_NAMESPACE")?,
            image: need("VALIDATOR_IMAGE")?,
            pull_policy: var("VALIDATOR_IMAGE_PULL_POLICY").unwrap_or_default(),
            pull_secrets: var("VALIDATOR_IMAGE_PULL_SECRETS")
                .unwrap_or_default()
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            runtime_class: var("VALIDATOR_RUNTIME_CLASS").unwrap_or_default(),
        })
    }
}

/// The resource the workload requests (upstream `getGPUResourceName`): with the `mixed` MIG
/// strategy the first `nvidia.com/mig-*` with allocatable units, else `nvidia.com/gpu` (or its
/// time-sliced rename `nvidia.com/gpu.shared` when only that is advertised). `None`: nothing.
pub fn resource_name(
    allocatable: &BTreeMap<String, String>,
    expected: ExpectedResource,
) -> Option<String> {
    let has = |k: &str| {
        allocatable
            .get(k)
            .is_some_and(|v| v.trim().parse::<u64>().unwrap_or(0) > 0)
    };
    match expected {
        ExpectedResource::MigMixed => allocatable
            .keys()
            .find(|k| k.starts_with("nvidia.com/mig-") && has(k))
            .cloned(),
        ExpectedResource::Gpu => ["nvidia.com/gpu", "nvidia.com/gpu.shared"]
            .into_iter()
            .find(|k| has(k))
            .map(str::to_owned),
    }
}

/// The workload pod for `spec`, requesting one `resource`, owned and tolerated as `validator`
/// (the validator DaemonSet).
///
/// # Panics
/// Never: the pod is built from a literal of the `Pod` schema.
pub fn workload_pod(spec: &WorkloadSpec, resource: &str, validator: &DaemonSet) -> Pod {
    let pull = if spec.pull_policy.is_empty() {
        "IfNotPresent"
    } else {
        spec.pull_policy.as_str()
    };
    let status_dir = json!([{"name": "validations", "mountPath": "/run/nvidia/validations"}]);
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": format!("{WORKLOAD_APP}-"),
            "namespace": spec.namespace,
            "labels": {"app": WORKLOAD_APP},
        },
        "spec": {
            "nodeName": spec.node,
            "restartPolicy": "OnFailure",
            "serviceAccountName": VALIDATOR_DAEMONSET,
            "initContainers": [{
                "name": WORKLOAD_INIT,
                "image": spec.image,
                "imagePullPolicy": pull,
                "command": ["kiln", "validator", "cuda"],
                "securityContext": {"allowPrivilegeEscalation": false},
                "resources": {"limits": {resource: "1"}, "requests": {resource: "1"}},
                "volumeMounts": status_dir,
            }],
            "containers": [{
                "name": WORKLOAD_APP,
                "image": spec.image,
                "imagePullPolicy": pull,
                "command": ["kiln", "validator", "wait", "--for", "cuda-ready"],
                "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true},
                "volumeMounts": status_dir,
            }],
            "volumes": [{"name": "validations", "emptyDir": {}}],
        },
    });
    if !spec.pull_secrets.is_empty() {
        pod["spec"]["imagePullSecrets"] = spec
            .pull_secrets
            .iter()
            .map(|s| json!({"name": s}))
            .collect();
    }
    if !spec.runtime_class.is_empty() {
        pod["spec"]["runtimeClassName"] = spec.runtime_class.clone().into();
    }
    let mut pod: Pod = serde_json::from_value(pod).expect("a Pod literal");
    pod.metadata.owner_references = validator.metadata.owner_references.clone();
    if let Some(p) = pod.spec.as_mut() {
        p.tolerations = validator
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.tolerations.clone());
    }
    pod
}

/// Where a workload pod stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkloadOutcome {
    /// Not done yet (the phase, or `Pending` when it has none).
    Waiting(String),
    /// Every container ran and exited 0.
    Succeeded,
    /// It cannot succeed: why, naming the container.
    Failed(String),
}

/// The outcome of `pod`: `Succeeded`; `Failed` for phase `Failed` (with its reason, e.g. the
/// kubelet's `UnexpectedAdmissionError` when the device plugin cannot allocate), a container
/// that exited non-zero, or one that cannot start (`ErrImagePull`, `ImagePullBackOff`,
/// `CreateContainerError`, `CreateContainerConfigError`, `RunContainerError`,
/// `InvalidImageName`, `CrashLoopBackOff`); otherwise `Waiting`.
pub fn workload_outcome(pod: &Pod) -> WorkloadOutcome {
    let Some(status) = pod.status.as_ref() else {
        return WorkloadOutcome::Waiting("Pending".into());
    };
    let phase = status.phase.clone().unwrap_or_else(|| "Pending".into());
    if phase == "Succeeded" {
        return WorkloadOutcome::Succeeded;
    }
    let statuses = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for c in statuses {
        let state = c.state.as_ref();
        let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
        if let Some(t) = state.and_then(|s| s.terminated.as_ref()).or(last)
            && t.exit_code != 0
        {
            return WorkloadOutcome::Failed(format!(
                "container {} exited {}{}",
                c.name,
                t.exit_code,
                describe(t.reason.as_deref(), t.message.as_deref())
            ));
        }
        if let Some(w) = state.and_then(|s| s.waiting.as_ref())
            && CANNOT_START.contains(&w.reason.as_deref().unwrap_or(""))
        {
            return WorkloadOutcome::Failed(format!(
                "container {} cannot start{}",
                c.name,
                describe(w.reason.as_deref(), w.message.as_deref())
            ));
        }
    }
    if phase == "Failed" {
        return WorkloadOutcome::Failed(format!(
            "the pod failed{}",
            describe(status.reason.as_deref(), status.message.as_deref())
        ));
    }
    WorkloadOutcome::Waiting(phase)
}

/// Waiting reasons after which a container does not start without a change elsewhere.
const CANNOT_START: [&str; 7] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerError",
    "CreateContainerConfigError",
    "RunContainerError",
    "CrashLoopBackOff",
];

fn describe(reason: Option<&str>, message: Option<&str>) -> String {
    match (reason, message) {
        (Some(r), Some(m)) if !m.is_empty() => format!(": {r}: {m}"),
        (Some(r), _) => format!(": {r}"),
        (None, Some(m)) if !m.is_empty() => format!(": {m}"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> WorkloadSpec {
        WorkloadSpec::from_env("gpu-node-1", |k| {
            match k {
                "OPERATOR_NAMESPACE" => Some("gpu-operator"),
                "VALIDATOR_IMAGE" => Some("ghcr.io/kiln-dev/kiln:0.1.0"),
                "VALIDATOR_IMAGE_PULL_SECRETS" => Some("a,b"),
                "VALIDATOR_RUNTIME_CLASS" => Some("nvidia"),
                _ => None,
            }
            .map(str::to_owned)
        })
        .unwrap()
    }

    #[test]
    fn the_pod_has_upstreams_shape_on_this_node_with_one_gpu() {
        let ds: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": VALIDATOR_DAEMONSET, "ownerReferences": [{"apiVersion": "nvidia.com/v1",
                "kind": "ClusterPolicy", "name": "cluster-policy", "uid": "u1", "controller": true}]},
            "spec": {"selector": {}, "template": {"spec": {"containers": [],
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}}
        }))
        .unwrap();
        let pod = serde_json::to_value(workload_pod(&spec(), "nvidia.com/gpu", &ds)).unwrap();
        assert_eq!(
            pod["metadata"]["generateName"],
            "nvidia-device-plugin-validator-"
        );
        assert_eq!(pod["metadata"]["namespace"], "gpu-operator");
        assert_eq!(pod["metadata"]["labels"]["app"], WORKLOAD_APP);
        assert_eq!(
            pod["metadata"]["ownerReferences"][0]["name"],
            "cluster-policy"
        );
        let s = &pod["spec"];
        assert_eq!(s["nodeName"], "gpu-node-1");
        assert_eq!(s["restartPolicy"], "OnFailure");
        assert_eq!(s["serviceAccountName"], "nvidia-operator-validator");
        assert_eq!(s["runtimeClassName"], "nvidia");
        assert_eq!(s["imagePullSecrets"], json!([{"name": "a"}, {"name": "b"}]));
        assert_eq!(s["tolerations"][0]["key"], "nvidia.com/gpu");
        let init = &s["initContainers"][0];
        assert_eq!(init["name"], WORKLOAD_INIT);
        assert_eq!(init["image"], "ghcr.io/kiln-dev/kiln:0.1.0");
        assert_eq!(init["imagePullPolicy"], "IfNotPresent");
        assert_eq!(init["resources"]["limits"]["nvidia.com/gpu"], "1");
        assert_eq!(init["resources"]["requests"]["nvidia.com/gpu"], "1");
        let main = &s["containers"][0];
        assert_eq!(main["name"], WORKLOAD_APP);
        assert_eq!(main["securityContext"]["readOnlyRootFilesystem"], true);
        assert!(
            main["resources"].is_null(),
            "only the init container holds the GPU"
        );
    }

    #[test]
    fn the_env_names_what_is_missing_and_the_resource_follows_the_mig_strategy() {
        let e = WorkloadSpec::from_env("n", |_| None).unwrap_err();
        assert!(e.contains("OPERATOR_NAMESPACE"), "{e}");
        let alloc: BTreeMap<String, String> = [
            ("nvidia.com/gpu.shared", "4"),
            ("nvidia.com/mig-1g.10gb", "0"),
            ("nvidia.com/mig-2g.20gb", "2"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(
            resource_name(&alloc, ExpectedResource::Gpu).as_deref(),
            Some("nvidia.com/gpu.shared")
        );
        assert_eq!(
            resource_name(&alloc, ExpectedResource::MigMixed).as_deref(),
            Some("nvidia.com/mig-2g.20gb")
        );
        assert_eq!(resource_name(&BTreeMap::new(), ExpectedResource::Gpu), None);
    }

    #[test]
    fn outcomes_name_the_container_and_its_reason() {
        let pod = |status: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {}, "status": status})).unwrap()
        };
        assert_eq!(
            workload_outcome(&pod(json!({"phase": "Succeeded"}))),
            WorkloadOutcome::Succeeded
        );
        assert_eq!(
            workload_outcome(&pod(json!({"phase": "Pending"}))),
            WorkloadOutcome::Waiting("Pending".into())
        );
        assert_eq!(
            workload_outcome(&pod(json!({"phase": "Failed", "reason": "UnexpectedAdmissionError",
                "message": "Allocate failed due to no healthy devices present"}))),
            WorkloadOutcome::Failed("the pod failed: UnexpectedAdmissionError: Allocate failed due to no healthy devices present".into())
        );
        let failed = pod(json!({"phase": "Pending", "initContainerStatuses": [{
            "name": WORKLOAD_INIT, "ready": false, "restartCount": 1, "image": "", "imageID": "",
            "state": {"waiting": {"reason": "PodInitializing"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                "message": "cuda: not ready: NVML lists no GPU"}}}]}));
        assert_eq!(
            workload_outcome(&failed),
            WorkloadOutcome::Failed(
                "container plugin-validation exited 1: Error: cuda: not ready: NVML lists no GPU"
                    .into()
            )
        );
        let pull = pod(json!({"phase": "Pending", "initContainerStatuses": [{
            "name": WORKLOAD_INIT, "ready": false, "restartCount": 0, "image": "", "imageID": "",
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "back-off pulling"}}}]}));
        assert_eq!(
            workload_outcome(&pull),
            WorkloadOutcome::Failed(
                "container plugin-validation cannot start: ImagePullBackOff: back-off pulling"
                    .into()
            )
        );
    }
}
