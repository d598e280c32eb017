//! Per-component spec types of the ClusterPolicy.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodSecurityContext, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};

#[cfg(feature = "kube")]
use schemars::JsonSchema;

/// `{name, value}`: an env var as upstream's spec carries it (no `valueFrom`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub struct EnvVarSpec {
    /// Variable name.
    pub name: String,
    /// Value (may be empty).
    #[serde(default)]
    pub value: String,
}

/// `{limits, requests}`, replacing the container's resources when set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub struct ResourcesSpec {
    /// Limits, e.g. `{cpu: 500m, memory: 200Mi}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<BTreeMap<String, Quantity>>,
    /// Requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<BTreeMap<String, Quantity>>,
}

/// The fields every operand shares: enable flag, image, pull policy and secrets, resources,
/// args, env, hostNetwork.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ComponentSpec {
    /// Enable flag; `None` (nil) takes the state's default (see `kiln_core::plan`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Image repository, e.g. `nvcr.io/nvidia`.
    #[serde(default)]
    pub repository: String,
    /// Image name, or a full reference when repository and version are empty.
    #[serde(default)]
    pub image: String,
    /// Tag, or a digest starting with `sha256:`.
    #[serde(default)]
    pub version: String,
    /// `Always`, `Never`, `IfNotPresent`; anything else reads as `IfNotPresent`.
    #[serde(default)]
    pub image_pull_policy: String,
    /// Pull secret names.
    #[serde(default)]
    pub image_pull_secrets: Vec<String>,
    /// Replaces requests/limits of every container when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesSpec>,
    /// Replaces container[0] args when non-empty.
    #[serde(default)]
    pub args: Vec<String>,
    /// Applied last with set-or-append semantics.
    #[serde(default)]
    pub env: Vec<EnvVarSpec>,
    /// Host networking; only `true` has an effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
}

impl ComponentSpec {
    /// `enabled`, or `default` when nil.
    pub fn enabled_or(&self, default: bool) -> bool {
        self.enabled.unwrap_or(default)
    }
}

/// An image-only block (`driver.manager`, `vfioManager.driverManager`, …).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DriverManagerSpec {
    /// Image repository.
    #[serde(default)]
    pub repository: String,
    /// Image name.
    #[serde(default)]
    pub image: String,
    /// Tag or digest.
    #[serde(default)]
    pub version: String,
    /// Pull policy.
    #[serde(default)]
    pub image_pull_policy: String,
    /// Pull secrets.
    #[serde(default)]
    pub image_pull_secrets: Vec<String>,
    /// Env for the k8s-driver-manager init container.
    #[serde(default)]
    pub env: Vec<EnvVarSpec>,
}

/// `{enabled}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub struct EnabledSpec {
    /// The flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// A ServiceMonitor's tunables (operator metrics and the exporter).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    /// Create the ServiceMonitor (exporter: nil = false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Scrape interval, e.g. `15s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// Scrape timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_timeout: Option<String>,
    /// honorLabels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub honor_labels: Option<bool>,
    /// Labels merged into the ServiceMonitor's metadata.
    #[serde(default)]
    pub additional_labels: BTreeMap<String, String>,
    /// Prometheus relabel configs, passed through.
    #[serde(default)]
    pub relabelings: Vec<serde_json::Value>,
}

/// `operator`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct OperatorSpec {
    /// Runtime class name for operands (default `nvidia`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class: Option<String>,
    /// Deprecated, unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_runtime: Option<String>,
    /// Use the OpenShift Driver Toolkit (nil = on for OpenShift).
    #[serde(
        default,
        rename = "use_ocp_driver_toolkit",
        skip_serializing_if = "Option::is_none"
    )]
    pub use_ocp_driver_toolkit: Option<bool>,
    /// Operator metrics.
    #[serde(default)]
    pub metrics: OperatorMetricsSpec,
}

/// `operator.metrics`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct OperatorMetricsSpec {
    /// The operator's ServiceMonitor tunables (it is always created).
    #[serde(default)]
    pub service_monitor: ServiceMonitorSpec,
}

/// `daemonsets`: settings applied to every operand DaemonSet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DaemonsetsSpec {
    /// Labels for the DaemonSet metadata and pod template (`app`, `app.kubernetes.io/part-of`
    /// are skipped on the template).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations for the DaemonSet metadata and pod template.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Replace (not merge) the pod tolerations when non-empty.
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
    /// Replaces the pod priority class when non-empty.
    #[serde(default)]
    pub priority_class_name: String,
    /// Update strategy for all operands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
    /// Rolling update tunables.
    #[serde(default)]
    pub rolling_update: RollingUpdateSpec,
    /// Replaces `pod.securityContext` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,
}

/// `daemonsets.updateStrategy` (CRD enum; default RollingUpdate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub enum UpdateStrategy {
    /// Rolling update (default).
    RollingUpdate,
    /// Pods are replaced only when deleted.
    OnDelete,
}

/// `daemonsets.rollingUpdate`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdateSpec {
    /// An int (`"1"`) or a percentage (`"10%"`).
    #[serde(default)]
    pub max_unavailable: String,
}

/// Startup/liveness/readiness probe overrides; each set field replaces the asset's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ProbeSpec {
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay_seconds: Option<i32>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_seconds: Option<i32>,
    /// Count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_threshold: Option<i32>,
    /// Count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<i32>,
}

/// `driver.kernelModuleType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum KernelModuleType {
    /// Let the driver container choose.
    Auto,
    /// Open GPU kernel modules.
    Open,
    /// Proprietary modules.
    Proprietary,
}

/// `driver`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DriverSpec {
    /// Shared component fields (`enabled` nil = true).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// Hand the driver to NVIDIADriver CRs (the state is skipped).
    #[serde(
        default,
        rename = "useNvidiaDriverCRD",
        skip_serializing_if = "Option::is_none"
    )]
    pub use_nvidia_driver_crd: Option<bool>,
    /// Precompiled driver images, one DaemonSet per kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_precompiled: Option<bool>,
    /// Deprecated no-op.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_open_kernel_modules: Option<bool>,
    /// auto | open | proprietary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_module_type: Option<KernelModuleType>,
    /// Probe overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_probe: Option<ProbeSpec>,
    /// Probe overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<ProbeSpec>,
    /// Probe overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<ProbeSpec>,
    /// GPUDirect RDMA.
    #[serde(default)]
    pub rdma: RdmaSpec,
    /// Driver upgrade policy (kept as JSON here; the upgrade controller types it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<serde_json::Value>,
    /// The k8s-driver-manager init container.
    #[serde(default)]
    pub manager: DriverManagerSpec,
    /// Package repository ConfigMap.
    #[serde(default)]
    pub repo_config: RepoConfigSpec,
    /// CA certificates ConfigMap.
    #[serde(default)]
    pub cert_config: NameSpec,
    /// vGPU licensing.
    #[serde(default)]
    pub licensing_config: LicensingConfigSpec,
    /// vGPU topology daemon config.
    #[serde(default)]
    pub virtual_topology: VirtualTopologySpec,
    /// Kernel module parameters ConfigMap.
    #[serde(default)]
    pub kernel_module_config: NameSpec,
    /// Secret whose keys become env (`envFrom.secretRef`).
    #[serde(default)]
    pub secret_env: String,
}

/// `driver.rdma`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RdmaSpec {
    /// GPUDirect RDMA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Use the host's MOFED.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_host_mofed: Option<bool>,
}

/// `{name}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub struct NameSpec {
    /// Object name; empty means unset.
    #[serde(default)]
    pub name: String,
}

/// `driver.repoConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RepoConfigSpec {
    /// ConfigMap name; empty means unset.
    #[serde(default)]
    pub config_map_name: String,
}

/// `driver.licensingConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LicensingConfigSpec {
    /// ConfigMap holding `gridd.conf`.
    #[serde(default)]
    pub config_map_name: String,
    /// Secret holding `gridd.conf` (preferred).
    #[serde(default)]
    pub secret_name: String,
    /// NLS licensing: also mount the client token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nls_enabled: Option<bool>,
}

/// `driver.virtualTopology`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub struct VirtualTopologySpec {
    /// ConfigMap name.
    #[serde(default)]
    pub config: String,
}

/// `toolkit`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ToolkitSpec {
    /// Shared component fields (`enabled` nil = true).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// Install directory on the host (default `/usr/local/nvidia`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_dir: Option<String>,
}

impl ToolkitSpec {
    /// `installDir`, default `/usr/local/nvidia`.
    pub fn install_dir(&self) -> &str {
        match self.install_dir.as_deref() {
            Some(d) if !d.is_empty() => d,
            _ => "/usr/local/nvidia",
        }
    }
}

/// `devicePlugin`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DevicePluginSpec {
    /// Shared component fields (`enabled` nil = true).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// Per-node config ConfigMap.
    #[serde(default)]
    pub config: DevicePluginConfigSpec,
    /// MPS settings.
    #[serde(default)]
    pub mps: MpsSpec,
}

/// Upstream's default MPS root on the host (`DefaultMPSRoot`).
pub const DEFAULT_MPS_ROOT: &str = "/run/nvidia/mps";

impl DevicePluginSpec {
    /// `mps.root` when set, non-empty and different from [`DEFAULT_MPS_ROOT`]: only then do the
    /// device plugin and MPS DaemonSets get their `mps-root`/`mps-shm` volumes rewritten.
    pub fn custom_mps_root(&self) -> Option<&str> {
        self.mps
            .root
            .as_deref()
            .filter(|r| !r.is_empty() && *r != DEFAULT_MPS_ROOT)
    }
}

/// `devicePlugin.config`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub struct DevicePluginConfigSpec {
    /// ConfigMap name; empty disables config-manager.
    #[serde(default)]
    pub name: String,
    /// Default key of that ConfigMap.
    #[serde(default)]
    pub default: String,
}

/// `devicePlugin.mps`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub struct MpsSpec {
    /// MPS root on the host (default `/run/nvidia/mps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
}

/// `dcgmExporter`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DcgmExporterSpec {
    /// Shared component fields (`enabled` nil = true).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// Pod template annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Custom metrics ConfigMap (key `dcgm-metrics.csv`).
    #[serde(default)]
    pub config: NameSpec,
    /// ServiceMonitor (nil enabled = false).
    #[serde(default)]
    pub service_monitor: ServiceMonitorSpec,
    /// Service tunables.
    #[serde(default)]
    pub service: ServiceSpec,
    /// Run in the host PID namespace.
    #[serde(default, rename = "hostPID", skip_serializing_if = "Option::is_none")]
    pub host_pid: Option<bool>,
    /// HPC job mapping.
    #[serde(default)]
    pub hpc_job_mapping: HpcJobMappingSpec,
    /// Add pod labels to metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_pod_labels: Option<bool>,
    /// Add pod UIDs to metrics.
    #[serde(
        default,
        rename = "enablePodUID",
        skip_serializing_if = "Option::is_none"
    )]
    pub enable_pod_uid: Option<bool>,
    /// Pod-label allowlist regexes.
    #[serde(default)]
    pub pod_label_allowlist_regex: Vec<String>,
}

/// `dcgmExporter.service`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// Service type.
    #[serde(default, rename = "type")]
    pub type_: String,
    /// `Cluster` or `Local`.
    #[serde(default)]
    pub internal_traffic_policy: String,
}

/// `dcgmExporter.hpcJobMapping`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub struct HpcJobMappingSpec {
    /// Enable job mapping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Directory (default `/var/lib/dcgm-exporter/job-mapping`).
    #[serde(default)]
    pub directory: String,
}

/// `dcgm`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DcgmSpec {
    /// Shared component fields (`enabled` nil = true).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// Unused upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_port: Option<i32>,
}

/// `mig.strategy` (CRD enum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum MigStrategy {
    /// MIG devices are not exposed.
    None,
    /// Every GPU on a node has the same MIG layout.
    Single,
    /// Mixed MIG layouts, one resource per profile.
    Mixed,
}

impl MigStrategy {
    /// The lowercase name (`none`, `single`, `mixed`).
    pub const fn as_str(self) -> &'static str {
        match self {
            MigStrategy::None => "none",
            MigStrategy::Single => "single",
            MigStrategy::Mixed => "mixed",
        }
    }
}

/// `mig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub struct MigSpec {
    /// Strategy; unset lets the device plugin decide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<MigStrategy>,
}

/// `migManager`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MigManagerSpec {
    /// Shared component fields (`enabled` nil = true).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// mig-parted config ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<MigConfigSpec>,
    /// GPU clients ConfigMap.
    #[serde(default)]
    pub gpu_clients_config: NameSpec,
}

/// `migManager.config`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub struct MigConfigSpec {
    /// ConfigMap name; empty uses `default-mig-parted-config`.
    #[serde(default)]
    pub name: String,
    /// Default MIG config label value (`all-disabled` or empty).
    #[serde(default)]
    pub default: String,
}

/// Per-component validator env blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub struct EnvOnlySpec {
    /// Env applied to that validation step.
    #[serde(default)]
    pub env: Vec<EnvVarSpec>,
}

/// `validator`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ValidatorSpec {
    /// Shared component fields.
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// Plugin validation env.
    #[serde(default, deserialize_with = "null_as_default")]
    pub plugin: EnvOnlySpec,
    /// Toolkit validation env.
    #[serde(default, deserialize_with = "null_as_default")]
    pub toolkit: EnvOnlySpec,
    /// Driver validation env.
    #[serde(default, deserialize_with = "null_as_default")]
    pub driver: EnvOnlySpec,
    /// CUDA validation env.
    #[serde(default, deserialize_with = "null_as_default")]
    pub cuda: EnvOnlySpec,
    /// VFIO-PCI validation env.
    #[serde(default, rename = "vfioPCI", deserialize_with = "null_as_default")]
    pub vfio_pci: EnvOnlySpec,
    /// vGPU manager validation env.
    #[serde(default, deserialize_with = "null_as_default")]
    pub vgpu_manager: EnvOnlySpec,
    /// vGPU devices validation env.
    #[serde(default, deserialize_with = "null_as_default")]
    pub vgpu_devices: EnvOnlySpec,
}

/// `sandboxWorkloads`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SandboxWorkloadsSpec {
    /// Enable sandbox workloads (nil = false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `container`, `vm-passthrough` or `vm-vgpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_workload: Option<Workload>,
    /// `kubevirt` or `kata`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<SandboxMode>,
}

/// A GPU workload configuration (`nvidia.com/gpu.workload.config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Containers (default).
    Container,
    /// VMs with PCI passthrough.
    VmPassthrough,
    /// VMs with vGPU.
    VmVgpu,
}

/// `sandboxWorkloads.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    /// KubeVirt (default).
    Kubevirt,
    /// Kata containers.
    Kata,
}

/// `vfioManager` and `vgpuManager`: a component with a driver-manager init container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DriverManagedSpec {
    /// Shared component fields (`enabled` nil = false).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// The k8s-driver-manager init container.
    #[serde(default)]
    pub driver_manager: DriverManagerSpec,
    /// Kernel module parameters ConfigMap (vGPU manager).
    #[serde(default)]
    pub kernel_module_config: NameSpec,
}

/// `vgpuDeviceManager`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct VgpuDeviceManagerSpec {
    /// Shared component fields (`enabled` nil = false).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// vGPU devices ConfigMap and default.
    #[serde(default)]
    pub config: DevicePluginConfigSpec,
}

/// `cdi`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CdiSpec {
    /// CDI (nil = true since v25.10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Deprecated, unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<bool>,
    /// NRI plugin injection (nil = false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nri_plugin_enabled: Option<bool>,
}

impl CdiSpec {
    /// `cdi.enabled`, nil = true.
    pub fn enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }
    /// `cdi.nriPluginEnabled`, nil = false.
    pub fn nri_plugin_enabled(&self) -> bool {
        self.nri_plugin_enabled.unwrap_or(false)
    }
}

/// `ccManager`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CcManagerSpec {
    /// Shared component fields (`enabled` nil = false).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// `on`, `off` or `devtools`.
    #[serde(default)]
    pub default_mode: String,
}

/// `hostPaths`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HostPathsSpec {
    /// Host root filesystem as seen by operands (default `/`).
    #[serde(default, rename = "rootFS")]
    pub root_fs: String,
    /// Driver install directory (default `/run/nvidia/driver`).
    #[serde(default)]
    pub driver_install_dir: String,
    /// Kubelet root (default `/var/lib/kubelet`).
    #[serde(default)]
    pub kubelet_root_dir: String,
}

/// Accept an explicit `null` (the upstream sample writes `plugin:` with no value) as default.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
