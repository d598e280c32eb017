//! `GPUCluster` (`nvidia.com/v1alpha1`, cluster-scoped, short name `gc`): NVIDIA GPU Operator
//! v26.7.0's second enablement path, built on Kubernetes Dynamic Resource Allocation (DRA). One
//! object, named [`GPU_CLUSTER_NAME`] (a CRD rule), deploys the DRA stack instead of the device
//! plugin: NVIDIA's DRA driver for GPUs, a DRA validation DaemonSet, and DCGM / dcgm-exporter
//! taking their GPUs through an admin-access ResourceClaimTemplate. It does not manage the
//! driver: that comes from the host or an NVIDIADriver CR.
//!
//! Field names, shapes, defaults and the singleton rule follow NVIDIA's `GPUClusterSpec`
//! (`deployments/gpu-operator/crds/nvidia.com_gpuclusters.yaml`, checked path by path by
//! `host/core/tests/gpucluster_crd.rs`). `dcgm`, `dcgmExporter` and `daemonsets` have exactly the
//! ClusterPolicy's shapes and reuse its types; `draDriver` is this module's.
//!
//! ```text
//! GPUCluster spec ─► DraState::enabled ─► per state: assets/state-<name> + plugins/<name>
//!                                          (each plugin reads the spec as a ClusterPolicySpec:
//!                                           the shared fields, and `draDriver` through
//!                                           ClusterPolicySpec::dra_driver)
//! ```

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{DaemonsetsSpec, DcgmExporterSpec, DcgmSpec, EnvVarSpec, ResourcesSpec};

#[cfg(feature = "kube")]
use super::schema::crd_default;
#[cfg(feature = "kube")]
use kube::CustomResource;
#[cfg(feature = "kube")]
use schemars::JsonSchema;

/// The one name a GPUCluster may have (NVIDIA's CRD rule `self.metadata.name == 'gpu-cluster'`).
pub const GPU_CLUSTER_NAME: &str = "gpu-cluster";

/// The DRA driver's name, which is also the name of its GPU DeviceClass and the attribute domain
/// its ResourceSlices publish (`device.attributes['gpu.nvidia.com']`).
pub const GPU_DRIVER_NAME: &str = "gpu.nvidia.com";

/// The kubelet root the DRA assets are written for (`hostPaths.kubeletRootDir`'s default).
pub const DEFAULT_KUBELET_ROOT: &str = "/var/lib/kubelet";

/// `path` moved from under [`DEFAULT_KUBELET_ROOT`] to under `root` (`/var/lib/kubelet/plugins`
/// with root `/data/kubelet` → `/data/kubelet/plugins`); any other path, or an empty `root`,
/// leaves it unchanged.
pub fn under_kubelet_root(path: &str, root: &str) -> String {
    match path.strip_prefix(DEFAULT_KUBELET_ROOT) {
        Some(rest) if !root.is_empty() && (rest.is_empty() || rest.starts_with('/')) => {
            format!("{}{rest}", root.trim_end_matches('/'))
        }
        _ => path.to_string(),
    }
}

/// The GPUCluster spec.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(CustomResource, JsonSchema))]
#[cfg_attr(
    feature = "kube",
    kube(
        group = "nvidia.com",
        version = "v1alpha1",
        kind = "GPUCluster",
        plural = "gpuclusters",
        shortname = "gc",
        doc = "The cluster's GPUs through Kubernetes Dynamic Resource Allocation: NVIDIA's DRA driver for GPUs, its validation, and DCGM and the metrics exporter claiming GPUs with admin access. A singleton named gpu-cluster; the driver comes from the host or an NVIDIADriver.",
        status = "GpuClusterStatus",
        printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.state"}"#,
        printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
    )
)]
#[serde(rename_all = "camelCase")]
pub struct GpuClusterSpec {
    /// NVIDIA's DRA driver for GPUs (required by the CRD).
    #[serde(default)]
    pub dra_driver: DraDriverSpec,
    /// The standalone DCGM host engine, claiming every GPU with admin access; off when absent or
    /// `enabled` is unset (the exporter then runs its embedded host engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dcgm: Option<DcgmSpec>,
    /// The metrics exporter, claiming every GPU with admin access; on when absent or `enabled` is
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dcgm_exporter: Option<DcgmExporterSpec>,
    /// Host paths the DaemonSets mount.
    #[serde(default)]
    pub host_paths: GpuClusterHostPathsSpec,
    /// Settings common to every DaemonSet of the GPUCluster (and the compute-domain
    /// controller's priority class and tolerations).
    #[serde(default)]
    pub daemonsets: DaemonsetsSpec,
}

/// `spec.hostPaths` of a GPUCluster (no `rootFS`: the DRA operands mount the host root at `/`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GpuClusterHostPathsSpec {
    /// Where the driver's root is on the host (empty = `/run/nvidia/driver`, the driver
    /// container's).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub driver_install_dir: String,
    /// The kubelet's root directory (default `/var/lib/kubelet`): its `plugins` and
    /// `plugins_registry` folders are where the DRA kubelet plugins register.
    #[serde(default = "kubelet_root")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub kubelet_root_dir: String,
}

impl Default for GpuClusterHostPathsSpec {
    fn default() -> Self {
        GpuClusterHostPathsSpec {
            driver_install_dir: String::new(),
            kubelet_root_dir: kubelet_root(),
        }
    }
}

fn kubelet_root() -> String {
    "/var/lib/kubelet".into()
}

/// `spec.draDriver`: the image and settings of NVIDIA's DRA driver for GPUs
/// (`k8s-dra-driver-gpu`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DraDriverSpec {
    /// Image repository, e.g. `registry.k8s.io/dra-driver-nvidia`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repository: String,
    /// Image name (letters, digits and `-`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[cfg_attr(feature = "kube", schemars(extend("pattern" = r"^[a-zA-Z0-9\-]+$")))]
    pub image: String,
    /// Tag, or a digest starting with `sha256:`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Image pull policy (`Always`, `Never`, `IfNotPresent`; empty = `IfNotPresent`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_pull_policy: String,
    /// Pull secret names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// The driver's feature gates, `{name: on}`, handed to every driver container as
    /// `FEATURE_GATES` (`Name=true|false` pairs joined by `,`, sorted by name).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    /// The `gpus` kubelet plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<GpusSpec>,
    /// ComputeDomains (multi-node NVLink): the `compute-domains` kubelet plugin and the
    /// compute-domain controller. Off when absent (NVIDIA's controller treats a missing block as
    /// disabled; `enabled` defaults to true only inside a present block).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_domains: Option<ComputeDomainsSpec>,
}

/// `draDriver.gpus`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GpusSpec {
    /// The `gpus` container of the kubelet-plugin DaemonSet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_plugin: Option<KubeletPluginSpec>,
}

/// `draDriver.computeDomains`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainsSpec {
    /// Whether ComputeDomains are deployed (default true).
    #[serde(default = "some_true", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub enabled: Option<bool>,
    /// The compute-domain controller Deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<ContainerSettingsSpec>,
    /// The `compute-domains` container of the kubelet-plugin DaemonSet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_plugin: Option<KubeletPluginSpec>,
}

fn some_true() -> Option<bool> {
    Some(true)
}

/// Env and resources of one container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ContainerSettingsSpec {
    /// Added to the container's env (set-or-append).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVarSpec>,
    /// Replaces the container's requests/limits when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesSpec>,
}

/// One kubelet-plugin container: env, resources and its gRPC health check.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct KubeletPluginSpec {
    /// Added to the container's env (set-or-append).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVarSpec>,
    /// Replaces the container's requests/limits when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesSpec>,
    /// The gRPC health endpoint the probes use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthcheck: Option<HealthcheckSpec>,
}

/// A kubelet plugin's gRPC health endpoint (`HEALTHCHECK_PORT`, probed by the liveness and
/// startup probes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HealthcheckSpec {
    /// Serve and probe it (default true).
    #[serde(default = "some_true", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub enabled: Option<bool>,
    /// TCP port, 1–65535 (when unset, the container's default: 51516 for `gpus`, 51515 for
    /// `compute-domains`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "kube",
        schemars(extend("minimum" = 1, "maximum" = 65535))
    )]
    pub port: Option<i32>,
}

impl KubeletPluginSpec {
    /// The health port the container serves and is probed on: `None` when the health check is
    /// disabled, else `healthcheck.port` or `default`.
    pub fn health_port(this: Option<&Self>, default: i32) -> Option<i32> {
        match this.and_then(|k| k.healthcheck.as_ref()) {
            Some(h) if h.enabled == Some(false) => None,
            Some(h) => Some(h.port.unwrap_or(default)),
            None => Some(default),
        }
    }
}

impl DraDriverSpec {
    /// `FEATURE_GATES`: the gates as `Name=bool` joined by `,`, sorted by name
    /// (`AdminAccess=false,MPSSupport=true`); empty when none is set.
    pub fn feature_gates_value(&self) -> String {
        self.feature_gates
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Whether a feature gate is on (an unset gate is off).
    pub fn gate(&self, name: &str) -> bool {
        self.feature_gates.get(name) == Some(&true)
    }

    /// Whether ComputeDomains are deployed: `computeDomains` present with `enabled` not false.
    pub fn compute_domains_enabled(&self) -> bool {
        self.compute_domains
            .as_ref()
            .is_some_and(|c| c.enabled != Some(false))
    }
}

/// `status` of a GPUCluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GpuClusterStatus {
    /// ready / notReady / disabled.
    #[serde(default)]
    pub state: GpuClusterState,
    /// The operator namespace (where the DRA operands run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Conditions (`Ready`, `Error`), as `metav1.Condition`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

/// `status.state` of a GPUCluster (CRD enum).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub enum GpuClusterState {
    /// Every operand is ready.
    #[serde(rename = "ready")]
    Ready,
    /// An operand is not ready, or a prerequisite is missing (a ClusterPolicy exists).
    #[default]
    #[serde(rename = "notReady")]
    NotReady,
    /// Not reconciled.
    #[serde(rename = "disabled")]
    Disabled,
}

/// The states a GPUCluster renders, in apply order. Each is a folder `assets/state-<name>` and a
/// standard plugin `plugins/<name>`, as a ClusterPolicy's [`crate::State`]s are; they are a
/// list of their own because no ClusterPolicy ever enables them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DraState {
    /// NVIDIA's DRA driver: the kubelet-plugin DaemonSet (`gpus`, and `compute-domains` when
    /// ComputeDomains are on), the compute-domain controller, DeviceClasses, RBAC and the
    /// ValidatingAdmissionPolicy that keeps each kubelet plugin to its own node's
    /// ResourceSlices.
    DraDriver,
    /// The DRA validation DaemonSet (driver and DRA readiness on each GPU node).
    DraValidation,
    /// The standalone DCGM host engine, with its GPUs claimed through an admin-access
    /// ResourceClaimTemplate.
    DcgmDra,
    /// The metrics exporter, with its GPUs claimed through an admin-access
    /// ResourceClaimTemplate.
    DcgmExporterDra,
}

impl DraState {
    /// Every DRA state in apply order.
    pub const ALL: [DraState; 4] = [
        DraState::DraDriver,
        DraState::DraValidation,
        DraState::DcgmDra,
        DraState::DcgmExporterDra,
    ];

    /// The state's name: assets folder `assets/state-<name>` and standard plugin `<name>`.
    pub const fn name(self) -> &'static str {
        match self {
            DraState::DraDriver => "dra-driver",
            DraState::DraValidation => "dra-validation",
            DraState::DcgmDra => "dcgm-dra",
            DraState::DcgmExporterDra => "dcgm-exporter-dra",
        }
    }

    /// The assets folder name, `state-<name>`.
    pub fn folder(self) -> String {
        format!("state-{}", self.name())
    }

    /// Whether `spec` deploys this state: the driver and the validation always; DCGM when
    /// `dcgm.enabled` is true; the exporter unless `dcgmExporter.enabled` is false.
    pub fn enabled(self, spec: &GpuClusterSpec) -> bool {
        match self {
            DraState::DraDriver | DraState::DraValidation => true,
            DraState::DcgmDra => spec
                .dcgm
                .as_ref()
                .is_some_and(|d| d.common.enabled == Some(true)),
            DraState::DcgmExporterDra => spec
                .dcgm_exporter
                .as_ref()
                .is_none_or(|e| e.common.enabled != Some(false)),
        }
    }

    /// The states `spec` deploys, in apply order.
    pub fn enabled_states(spec: &GpuClusterSpec) -> Vec<DraState> {
        DraState::ALL
            .into_iter()
            .filter(|s| s.enabled(spec))
            .collect()
    }
}

impl fmt::Display for DraState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`DraState::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown DRA state {0:?}")]
pub struct UnknownDraState(pub String);

impl std::str::FromStr for DraState {
    type Err = UnknownDraState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.strip_prefix("state-").unwrap_or(s);
        DraState::ALL
            .into_iter()
            .find(|st| st.name() == s)
            .ok_or_else(|| UnknownDraState(s.to_string()))
    }
}

#[cfg(feature = "kube")]
pub use crd::{crd, default_spec, openapi_schema};

#[cfg(feature = "kube")]
mod crd {
    use std::sync::OnceLock;

    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use serde_json::{Value, json};

    use super::{GPU_CLUSTER_NAME, GPUCluster};
    use crate::spec::schema::{apply_schema, structural_schema_for};

    /// The GPUCluster CRD's `openAPIV3Schema`, structural, with what the derive cannot express,
    /// as NVIDIA v26.7.0's CRD has it (`host/core/tests/gpucluster_crd.rs` compares every path):
    /// - the singleton rule on the object: `metadata.name` must be [`GPU_CLUSTER_NAME`];
    /// - the root types `apiVersion`, `kind` and `metadata` and does not require `spec`;
    /// - `spec` requires `draDriver`, `status` requires `state`;
    /// - `status.conditions[]` carries the validation of `metav1.Condition`.
    pub fn openapi_schema() -> &'static Value {
        static SCHEMA: OnceLock<Value> = OnceLock::new();
        SCHEMA.get_or_init(|| {
            let mut v = structural_schema_for::<GPUCluster>();
            v["x-kubernetes-validations"] = json!([{
                "rule": format!("self.metadata.name == '{GPU_CLUSTER_NAME}'"),
                "message": format!("GPUCluster is a singleton, metadata.name must be '{GPU_CLUSTER_NAME}'"),
            }]);
            // As controller-gen writes the root: the object's own fields typed, `spec` optional.
            if let Some(root) = v.as_object_mut() {
                root.remove("required");
            }
            v["properties"]["apiVersion"] = json!({"type": "string"});
            v["properties"]["kind"] = json!({"type": "string"});
            v["properties"]["metadata"] = json!({"type": "object"});
            v["properties"]["spec"]["required"] = json!(["draDriver"]);
            // controller-gen's format of the (shared) relabeling type's `int64` modulus, which
            // the ClusterPolicy schema leaves out.
            if let Some(modulus) = v.pointer_mut(
                "/properties/spec/properties/dcgmExporter/properties/serviceMonitor/properties/relabelings/items/properties/modulus",
            ) {
                modulus["format"] = json!("int64");
            }
            crate::spec::schema::condition_rules(&mut v["properties"]["status"]);
            v
        })
    }

    /// The API server's pruning and defaulting of a GPUCluster `spec` with this CRD's schema
    /// (as [`crate::spec::schema::default_spec`] for a ClusterPolicy); returns the pruned
    /// unknown fields as paths below `spec`.
    pub fn default_spec(spec: &mut Value) -> Vec<String> {
        apply_schema(&openapi_schema()["properties"]["spec"], spec)
    }

    /// The CRD object (`gpuclusters.nvidia.com`, `v1alpha1`, cluster-scoped, short name `gc`,
    /// columns `Status` and `Age`) with the schema of [`openapi_schema`].
    pub fn crd() -> CustomResourceDefinition {
        let mut crd = GPUCluster::crd();
        crd.spec.names.list_kind = Some("GPUClusterList".into());
        for version in &mut crd.spec.versions {
            if let Some(schema) = version.schema.as_mut() {
                schema.open_api_v3_schema = Some(
                    serde_json::from_value(openapi_schema().clone())
                        .expect("a schema deserializes"),
                );
            }
        }
        crd
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn states_round_trip_and_follow_the_spec() {
        for st in DraState::ALL {
            assert_eq!(st.folder().parse::<DraState>(), Ok(st));
        }
        assert!("dcgm".parse::<DraState>().is_err());
        let spec: GpuClusterSpec = serde_json::from_value(json!({"draDriver": {}})).unwrap();
        assert_eq!(
            DraState::enabled_states(&spec),
            [
                DraState::DraDriver,
                DraState::DraValidation,
                DraState::DcgmExporterDra
            ]
        );
        let spec: GpuClusterSpec = serde_json::from_value(
            json!({"dcgm": {"enabled": true}, "dcgmExporter": {"enabled": false}}),
        )
        .unwrap();
        assert_eq!(
            DraState::enabled_states(&spec),
            [
                DraState::DraDriver,
                DraState::DraValidation,
                DraState::DcgmDra
            ]
        );
    }

    #[test]
    fn kubelet_paths_move_with_the_root() {
        let p = "/var/lib/kubelet/plugins_registry";
        assert_eq!(
            under_kubelet_root(p, "/data/k/"),
            "/data/k/plugins_registry"
        );
        assert_eq!(under_kubelet_root(p, DEFAULT_KUBELET_ROOT), p);
        assert_eq!(under_kubelet_root(p, ""), p);
        assert_eq!(
            under_kubelet_root("/var/lib/kubeletx", "/k"),
            "/var/lib/kubeletx"
        );
        assert_eq!(under_kubelet_root("/var/run/cdi", "/k"), "/var/run/cdi");
    }

    #[test]
    fn feature_gates_health_ports_and_compute_domains() {
        let d: DraDriverSpec = serde_json::from_value(json!({
            "featureGates": {"MPSSupport": true, "AdminAccess": false},
            "gpus": {"kubeletPlugin": {"healthcheck": {"port": 52000}}},
            "computeDomains": {"kubeletPlugin": {"healthcheck": {"enabled": false}}},
        }))
        .unwrap();
        assert_eq!(d.feature_gates_value(), "AdminAccess=false,MPSSupport=true");
        assert!(d.gate("MPSSupport") && !d.gate("AdminAccess") && !d.gate("Other"));
        // A present computeDomains block is on unless it says otherwise.
        assert!(d.compute_domains_enabled());
        assert!(!DraDriverSpec::default().compute_domains_enabled());
        let gpus = d.gpus.as_ref().and_then(|g| g.kubelet_plugin.as_ref());
        assert_eq!(KubeletPluginSpec::health_port(gpus, 51516), Some(52000));
        let cd = d
            .compute_domains
            .as_ref()
            .and_then(|c| c.kubelet_plugin.as_ref());
        assert_eq!(KubeletPluginSpec::health_port(cd, 51515), None);
        assert_eq!(KubeletPluginSpec::health_port(None, 51515), Some(51515));
    }
}
