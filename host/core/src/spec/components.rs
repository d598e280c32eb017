//! Per-component spec types of the ClusterPolicy.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodSecurityContext, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};

#[cfg(feature = "kube")]
use schemars::JsonSchema;

#[cfg(feature = "kube")]
use super::schema::{crd_default, quantity_map};

/// An environment variable of the container: `name` and `value` (`valueFrom` is not supported).
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
    /// Limits, e.g. `{cpu: 500m, memory: 200Mi}`; a value may also be a plain number
    /// (`cpu: 1`), as the CRD's int-or-string quantities allow.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "quantities"
    )]
    #[cfg_attr(feature = "kube", schemars(schema_with = "quantity_map"))]
    pub limits: Option<BTreeMap<String, Quantity>>,
    /// Requests (same shape as `limits`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "quantities"
    )]
    #[cfg_attr(feature = "kube", schemars(schema_with = "quantity_map"))]
    pub requests: Option<BTreeMap<String, Quantity>>,
}

/// A quantity as the CRD stores it: a string (`500m`) or a number (`1`, kept as its text).
#[derive(Deserialize)]
#[serde(untagged)]
enum QuantityValue {
    Text(String),
    Number(serde_json::Number),
}

/// `{name: quantity}` where a quantity is a string or a number (see [`QuantityValue`]).
fn quantities<'de, D>(d: D) -> Result<Option<BTreeMap<String, Quantity>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let raw = Option::<BTreeMap<String, QuantityValue>>::deserialize(d)?;
    Ok(raw.map(|m| {
        m.into_iter()
            .map(|(k, v)| {
                let text = match v {
                    QuantityValue::Text(s) => s,
                    QuantityValue::Number(n) => n.to_string(),
                };
                (k, Quantity(text))
            })
            .collect()
    }))
}

/// The fields every operand shares: enable flag, image, pull policy and secrets, resources,
/// args, env, hostNetwork.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ComponentSpec {
    /// Whether to deploy this component; when unset, the component's default applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Image repository, e.g. `nvcr.io/nvidia`.
    #[serde(default)]
    pub repository: String,
    /// Image name, or a full reference when repository and version are empty (pattern
    /// `[a-zA-Z0-9\-]+`).
    // The pattern refuses `""`, so an empty name is left out when serialized.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[cfg_attr(feature = "kube", schemars(extend("pattern" = r"[a-zA-Z0-9\-]+")))]
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
    /// `enabled`, or `default` when unset.
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
    /// Image name (pattern `[a-zA-Z0-9\-]+`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[cfg_attr(feature = "kube", schemars(extend("pattern" = r"[a-zA-Z0-9\-]+")))]
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
    /// Create the ServiceMonitor (exporter: unset = false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Scrape interval, e.g. `15s` (a Prometheus duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(extend("pattern" = DURATION_PATTERN)))]
    pub interval: Option<String>,
    /// Scrape timeout (a Prometheus duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(extend("pattern" = DURATION_PATTERN)))]
    pub scrape_timeout: Option<String>,
    /// honorLabels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub honor_labels: Option<bool>,
    /// Labels merged into the ServiceMonitor's metadata.
    #[serde(default)]
    pub additional_labels: BTreeMap<String, String>,
    /// Prometheus relabelings for the ServiceMonitor, as in a ServiceMonitor's `relabelings`
    /// (`action` defaults to `replace`).
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(with = "Vec<RelabelConfig>"))]
    pub relabelings: Vec<serde_json::Value>,
}

/// Prometheus' duration syntax (`30s`, `1m30s`, `0`), the CRD's pattern for scrape settings.
pub const DURATION_PATTERN: &str =
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$";

/// One Prometheus relabeling rule of `serviceMonitor.relabelings`, as in a ServiceMonitor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RelabelConfig {
    /// Source labels whose values are concatenated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_labels: Vec<String>,
    /// Separator between concatenated source label values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub separator: Option<String>,
    /// Label the result is written to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_label: Option<String>,
    /// Regex matched against the concatenated values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// Modulus for `hashmod` (≥ 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(extend("minimum" = 0)))]
    pub modulus: Option<u64>,
    /// Replacement value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
    /// Action; default `replace`.
    #[serde(default = "relabel_action", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "kube",
        schemars(
            transform = crd_default,
            extend("enum" = [
                "replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod",
                "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep",
                "lowercase", "Lowercase", "uppercase", "Uppercase", "keepequal", "KeepEqual",
                "dropequal", "DropEqual"
            ])
        )
    )]
    pub action: Option<String>,
}

fn relabel_action() -> Option<String> {
    Some("replace".into())
}

/// `operator`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct OperatorSpec {
    /// Runtime class name for operands (default `nvidia`).
    #[serde(default = "runtime_class", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub runtime_class: Option<String>,
    /// Deprecated, unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_runtime: Option<String>,
    /// Use the OpenShift Driver Toolkit (unset = on for OpenShift).
    #[serde(
        default,
        rename = "use_ocp_driver_toolkit",
        skip_serializing_if = "Option::is_none"
    )]
    pub use_ocp_driver_toolkit: Option<bool>,
    /// Operator metrics.
    #[serde(default)]
    pub metrics: OperatorMetricsSpec,
    /// Deprecated upstream (the init container image of all components); accepted, unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_container: Option<ImageSpec>,
    /// Labels for the operator's own objects (upstream: set by the Helm chart; unused here).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations for the operator's own objects (as `labels`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

fn runtime_class() -> Option<String> {
    Some("nvidia".into())
}

/// An image reference block without env (`operator.initContainer`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    /// Image repository.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repository: String,
    /// Image name (pattern `[a-zA-Z0-9\-]+`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[cfg_attr(feature = "kube", schemars(extend("pattern" = r"[a-zA-Z0-9\-]+")))]
    pub image: String,
    /// Tag or digest.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Pull policy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_pull_policy: String,
    /// Pull secrets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
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
    /// Update strategy for all operands (default `RollingUpdate`).
    #[serde(default = "rolling_update", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub update_strategy: Option<UpdateStrategy>,
    /// Rolling update tunables.
    #[serde(default)]
    pub rolling_update: RollingUpdateSpec,
    /// Replaces `pod.securityContext` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,
}

fn rolling_update() -> Option<UpdateStrategy> {
    Some(UpdateStrategy::RollingUpdate)
}

/// How operand DaemonSets replace their pods: `RollingUpdate` (default) or `OnDelete`.
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

/// Startup/liveness/readiness probe overrides; each set field replaces the asset's. Timeouts,
/// periods and thresholds are ≥ 1 (CRD minimums).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ProbeSpec {
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay_seconds: Option<i32>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(extend("minimum" = 1)))]
    pub timeout_seconds: Option<i32>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(extend("minimum" = 1)))]
    pub period_seconds: Option<i32>,
    /// Count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(extend("minimum" = 1)))]
    pub success_threshold: Option<i32>,
    /// Count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(extend("minimum" = 1)))]
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
    /// Shared component fields (`enabled` unset = true).
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
    /// auto | open | proprietary (default `auto`).
    #[serde(
        default = "kernel_module_auto",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
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
    /// Driver upgrade policy (read by the upgrade controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<DriverUpgradePolicySpec>,
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

fn kernel_module_auto() -> Option<KernelModuleType> {
    Some(KernelModuleType::Auto)
}

/// `driver.upgradePolicy`: how driver pods are replaced when their template changes (NVIDIA's
/// `DriverUpgradePolicySpec`). Every field has the CRD's default, applied by serde as well, so a
/// typed policy read from `upgradePolicy: {}` equals the one the API server stores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DriverUpgradePolicySpec {
    /// Global switch for automatic upgrades; when false the other fields are ignored
    /// (default false).
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub auto_upgrade: bool,
    /// Nodes upgraded in parallel; 0 means no limit (default 1).
    #[serde(default = "one")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub max_parallel_upgrades: u32,
    /// Nodes with the driver installed that may be unavailable during the upgrade: a count
    /// (`5`) or a percentage of the nodes at the start, rounded up (`10%`); default `25%`.
    #[serde(default = "quarter")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub max_unavailable: IntOrString,
    /// Wait for selected pods (jobs) to complete before upgrading a node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_completion: Option<WaitForCompletionSpec>,
    /// Deletion of pods that use GPUs before upgrading a node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_deletion: Option<PodDeletionSpec>,
    /// Node drain before upgrading a node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainSpec>,
}

impl Default for DriverUpgradePolicySpec {
    /// The CRD's defaults (what `upgradePolicy: {}` becomes).
    fn default() -> Self {
        DriverUpgradePolicySpec {
            auto_upgrade: false,
            max_parallel_upgrades: one(),
            max_unavailable: quarter(),
            wait_for_completion: None,
            pod_deletion: None,
            drain: None,
        }
    }
}

fn one() -> u32 {
    1
}

fn quarter() -> IntOrString {
    IntOrString::String("25%".into())
}

fn five_minutes() -> u32 {
    300
}

/// `driver.upgradePolicy.waitForCompletion`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WaitForCompletionSpec {
    /// Label selector (`app=job`) of the pods to wait for; empty waits for none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_selector: String,
    /// Seconds to wait before giving up; 0 waits forever (default 0).
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub timeout_seconds: u32,
}

/// `driver.upgradePolicy.podDeletion`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PodDeletionSpec {
    /// Delete pods not managed by a controller too (default false).
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub force: bool,
    /// Seconds to wait for pod termination; 0 waits forever (default 300).
    #[serde(default = "five_minutes")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub timeout_seconds: u32,
    /// Continue although pods use emptyDir (its data is lost) (default false).
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub delete_empty_dir: bool,
}

impl Default for PodDeletionSpec {
    /// The CRD's defaults.
    fn default() -> Self {
        PodDeletionSpec {
            force: false,
            timeout_seconds: five_minutes(),
            delete_empty_dir: false,
        }
    }
}

/// `driver.upgradePolicy.drain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Drain the node during the upgrade (default false).
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub enable: bool,
    /// Force the drain (default false).
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub force: bool,
    /// Label selector of the pods to drain; empty drains all.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_selector: String,
    /// Seconds before giving up the drain; 0 waits forever (default 300).
    #[serde(default = "five_minutes")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub timeout_seconds: u32,
    /// Continue although pods use emptyDir (default false).
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub delete_empty_dir: bool,
}

impl Default for DrainSpec {
    /// The CRD's defaults.
    fn default() -> Self {
        DrainSpec {
            enable: false,
            force: false,
            pod_selector: String::new(),
            timeout_seconds: five_minutes(),
            delete_empty_dir: false,
        }
    }
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
    /// Shared component fields (`enabled` unset = true).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// Install directory on the host (default `/usr/local/nvidia`).
    #[serde(
        default = "toolkit_install_dir",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub install_dir: Option<String>,
}

fn toolkit_install_dir() -> Option<String> {
    Some("/usr/local/nvidia".into())
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
    /// Shared component fields (`enabled` unset = true).
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
    #[serde(default = "mps_root", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub root: Option<String>,
}

fn mps_root() -> Option<String> {
    Some(DEFAULT_MPS_ROOT.into())
}

/// `dcgmExporter`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DcgmExporterSpec {
    /// Shared component fields (`enabled` unset = true).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// Pod template annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Custom metrics ConfigMap (key `dcgm-metrics.csv`).
    #[serde(default)]
    pub config: NameSpec,
    /// ServiceMonitor (unset enabled = false).
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
    /// Shared component fields (`enabled` unset = true).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// Unused upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_port: Option<i32>,
}

/// How MIG devices are advertised: `single` (every GPU of a node the same) or `mixed`.
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
    /// Shared component fields (`enabled` unset = true).
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
    /// Default MIG config label value: `all-disabled` (the default) or empty.
    #[serde(default = "all_disabled")]
    #[cfg_attr(
        feature = "kube",
        schemars(transform = crd_default, extend("enum" = ["all-disabled", ""]))
    )]
    pub default: String,
}

fn all_disabled() -> String {
    "all-disabled".into()
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
    /// Enable sandbox workloads (unset = false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `container` (default), `vm-passthrough` or `vm-vgpu`.
    #[serde(
        default = "container_workload",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub default_workload: Option<Workload>,
    /// `kubevirt` (default) or `kata`.
    #[serde(default = "kubevirt", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub mode: Option<SandboxMode>,
}

fn container_workload() -> Option<Workload> {
    Some(Workload::Container)
}

fn kubevirt() -> Option<SandboxMode> {
    Some(SandboxMode::Kubevirt)
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
    /// Shared component fields (`enabled` unset = false).
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
    /// Shared component fields (`enabled` unset = false).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// vGPU devices ConfigMap and default.
    #[serde(default)]
    pub config: VgpuDevicesConfigSpec,
}

/// `vgpuDeviceManager.config`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub struct VgpuDevicesConfigSpec {
    /// ConfigMap name; empty uses the default vGPU devices config.
    #[serde(default)]
    pub name: String,
    /// Default key of that ConfigMap (default `default`).
    #[serde(default = "default_key")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub default: String,
}

fn default_key() -> String {
    "default".into()
}

/// `cdi`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CdiSpec {
    /// CDI (default true; unset = true since v25.10).
    #[serde(default = "some_true", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub enabled: Option<bool>,
    /// Deprecated, unused (default false).
    #[serde(default = "some_false", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub default: Option<bool>,
    /// NRI plugin injection (default false).
    #[serde(default = "some_false", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub nri_plugin_enabled: Option<bool>,
}

fn some_true() -> Option<bool> {
    Some(true)
}

fn some_false() -> Option<bool> {
    Some(false)
}

impl CdiSpec {
    /// `cdi.enabled`, unset = true.
    pub fn enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }
    /// `cdi.nriPluginEnabled`, unset = false.
    pub fn nri_plugin_enabled(&self) -> bool {
        self.nri_plugin_enabled.unwrap_or(false)
    }
}

/// `ccManager`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CcManagerSpec {
    /// Shared component fields (`enabled` unset = false).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// `on`, `off` or `devtools`.
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(extend("enum" = ["on", "off", "devtools"])))]
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
    #[serde(default = "kubelet_root")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub kubelet_root_dir: String,
}

fn kubelet_root() -> String {
    "/var/lib/kubelet".into()
}

/// `kataManager` (deprecated upstream; the state is never enabled).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct KataManagerSpec {
    /// Shared component fields (`enabled` unset = false).
    #[serde(flatten)]
    pub common: ComponentSpec,
    /// Kata manager configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<KataManagerConfigSpec>,
}

/// `kataManager.config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct KataManagerConfigSpec {
    /// Where kata artifacts are placed on the host (default
    /// `/opt/nvidia-gpu-operator/artifacts/runtimeclasses`).
    #[serde(default = "kata_artifacts_dir")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub artifacts_dir: String,
    /// Kata runtime classes to configure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtime_classes: Vec<KataRuntimeClassSpec>,
}

fn kata_artifacts_dir() -> String {
    "/opt/nvidia-gpu-operator/artifacts/runtimeclasses".into()
}

/// `kataManager.config.runtimeClasses[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct KataRuntimeClassSpec {
    /// RuntimeClass name.
    pub name: String,
    /// nodeSelector of the RuntimeClass.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// The OCI artifact with the class's kata artifacts.
    pub artifacts: KataArtifactsSpec,
}

/// `kataManager.config.runtimeClasses[].artifacts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct KataArtifactsSpec {
    /// OCI artifact URL.
    pub url: String,
    /// Secret used to pull it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pull_secret: String,
}

/// Accept an explicit `null` (the upstream sample writes `plugin:` with no value) as default.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
