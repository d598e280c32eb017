//! `NVIDIADriver` (`nvidia.com/v1alpha1`, cluster-scoped): one driver configuration for the
//! GPU nodes its `nodeSelector` picks (NVIDIA GPU Operator's node-pool driver CR).
//!
//! Field names, shapes, enums and defaults follow upstream's `NVIDIADriverSpec`
//! (`api/nvidia/v1alpha1/nvidiadriver_types.go`). kiln renders an NVIDIADriver through the same
//! `state-driver` assets and `driver` plugin as the ClusterPolicy: [`NvidiaDriverSpec::policy_spec`]
//! writes the CR's fields onto a copy of the policy's spec (its `driver`, `gds`, `gdrcopy` and the
//! pod settings of `daemonsets`), and the host then makes one DaemonSet per node pool of the
//! CR ([`node_pools`], [`daemonset_name`], [`finish_daemonset`]).
//!
//! ```text
//! NVIDIADriver ─┐
//! nodes ────────┼─► node_pools (one per OS, or OS+kernel when precompiled)
//! ClusterPolicy ┘      └─► per pool: policy_spec ─► state-driver + driver plugin ─► finish_daemonset
//! ```
//!
//! Two NVIDIADrivers may not select the same node ([`overlaps`]): each gets an error naming the
//! other and neither is applied on that node set. Upstream's owner routing, which gives a
//! `default: true` CR the GPU nodes no other CR selects, is [`node_owners`] (the operator does
//! not label nodes with it yet).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{NodeAffinity, PodSecurityContext, Toleration};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    ComponentSpec, DrainSpec, DriverManagerSpec, DriverSpec, DriverUpgradePolicySpec, EnvVarSpec,
    KernelModuleType, LicensingConfigSpec, NameSpec, PodDeletionSpec, ProbeSpec, RdmaSpec,
    RepoConfigSpec, ResourcesSpec, VirtualTopologySpec, WaitForCompletionSpec,
};
use crate::context::NodeOs;
use crate::label_keys::{GPU_PRESENT, LabelLookup};

#[cfg(feature = "kube")]
use super::schema::crd_default;
#[cfg(feature = "kube")]
use kube::CustomResource;
#[cfg(feature = "kube")]
use schemars::JsonSchema;

/// Label on every object kiln applies for an NVIDIADriver, naming the CR
/// (`kiln.dev/nvidiadriver=<name>`): how its stale DaemonSets (a node pool that went away) are
/// found again.
pub const NVIDIADRIVER_LABEL: &str = "kiln.dev/nvidiadriver";

/// NFD's kernel label; precompiled drivers make one pool per kernel (upstream).
pub const KERNEL_LABEL: &str = "feature.node.kubernetes.io/kernel-version.full";

/// Most characters of a DaemonSet's `app` label value and name (a DNS-1123 label, upstream
/// `getDriverAppName`).
pub const APP_NAME_MAX: usize = 63;

/// The NVIDIADriver spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(CustomResource, JsonSchema))]
#[cfg_attr(
    feature = "kube",
    kube(
        group = "nvidia.com",
        version = "v1alpha1",
        kind = "NVIDIADriver",
        plural = "nvidiadrivers",
        shortname = "nvd",
        shortname = "nvdriver",
        shortname = "nvdrivers",
        status = "NvidiaDriverStatus",
        doc = "An NVIDIA driver for a set of GPU nodes (its nodeSelector): the driver image, its version and options, and how its pods are upgraded. Used when the ClusterPolicy sets driver.useNvidiaDriverCRD.",
        printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.state"}"#,
        printcolumn = r#"{"name":"Default","type":"boolean","jsonPath":".spec.default"}"#,
        printcolumn = r#"{"name":"Age","type":"string","jsonPath":".metadata.creationTimestamp"}"#
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NvidiaDriverSpec {
    /// Upstream's fallback driver, for the GPU nodes no other NVIDIADriver selects (default
    /// false; such a CR may not set `nodeSelector`, a CRD rule). kiln keeps and shows it
    /// (`kubectl get nvidiadrivers`, column `Default`) but does not yet narrow such a CR to
    /// the remaining nodes: it selects what its `nodeSelector` selects.
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub default: bool,
    /// `gpu` | `vgpu` | `vgpu-host-manager` (default `gpu`); immutable.
    #[serde(default = "driver_type_gpu")]
    #[cfg_attr(
        feature = "kube",
        schemars(
            transform = crd_default,
            extend("x-kubernetes-validations" = [{"rule": "self == oldSelf",
                "message": "driverType is immutable: create a new NVIDIADriver to change it"}])
        )
    )]
    pub driver_type: DriverType,
    /// Precompiled driver images, one DaemonSet per kernel (unset = false); immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "kube",
        schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf",
            "message": "usePrecompiled is immutable: create a new NVIDIADriver to change it"}]))
    )]
    pub use_precompiled: Option<bool>,
    /// Deprecated no-op (use `kernelModuleType`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_open_kernel_modules: Option<bool>,
    /// `auto` | `open` | `proprietary` (default `auto`).
    #[serde(
        default = "kernel_module_auto",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub kernel_module_type: Option<KernelModuleType>,
    /// Driver container startup probe; when unset, NVIDIA's default (60 s delay, 5 s when
    /// precompiled; timeout 60 s, period 10 s, 120 failures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_probe: Option<ProbeSpec>,
    /// Liveness probe overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<ProbeSpec>,
    /// Readiness probe overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<ProbeSpec>,
    /// GPUDirect RDMA (nvidia-peermem); unset takes the ClusterPolicy's `driver.rdma`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<RdmaSpec>,
    /// GPUDirect Storage (nvidia-fs sidecar).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gds: Option<SidecarDriverSpec>,
    /// GDRCopy sidecar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdrcopy: Option<SidecarDriverSpec>,
    /// Image repository, e.g. `nvcr.io/nvidia`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repository: String,
    /// Image name (default `nvcr.io/nvidia/driver`).
    #[serde(default = "driver_image")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub image: String,
    /// Driver version (the branch for precompiled drivers), or a `sha256:` digest.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Image pull policy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_pull_policy: String,
    /// Image pull secret names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// The k8s-driver-manager init container.
    #[serde(default)]
    pub manager: DriverManagerSpec,
    /// Requests/limits of the driver containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesSpec>,
    /// Driver container args.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Driver container env (set-or-append).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVarSpec>,
    /// Package repository ConfigMap (`{name}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_config: Option<NameSpec>,
    /// CA certificates ConfigMap (`{name}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_config: Option<NameSpec>,
    /// vGPU licensing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub licensing_config: Option<NvidiaDriverLicensingSpec>,
    /// vGPU topology daemon ConfigMap (`{name}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_topology_config: Option<NameSpec>,
    /// Kernel module parameters ConfigMap (`{name}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_module_config: Option<NameSpec>,
    /// Secret whose keys become the driver container's env.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret_env: String,
    /// Nodes this driver is for; unset = every GPU node (`nvidia.com/gpu.present=true` is always
    /// required as well).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Node affinity of the driver pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<NodeAffinity>,
    /// Labels of the DaemonSet and its pods (`app` and `app.kubernetes.io/*` are ignored: the
    /// pod selector is immutable).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of the DaemonSet and its pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Pod tolerations (replace the asset's when non-empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Pod priority class (replaces the asset's when non-empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub priority_class_name: String,
    /// Pod security context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,
    /// Run the driver pods in the host's network namespace (`hostNetwork: true`,
    /// `dnsPolicy: ClusterFirstWithHostNet`); unset = false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
    /// How this CR's driver pods are replaced when their template changes; when unset,
    /// NVIDIA's defaults for an NVIDIADriver apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<NvidiaDriverUpgradePolicySpec>,
}

/// `spec.upgradePolicy`: the fields and defaults of the ClusterPolicy's
/// `driver.upgradePolicy` ([`DriverUpgradePolicySpec`]), except that `autoUpgrade` defaults to
/// true here (NVIDIA's NVIDIADriver CRD).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NvidiaDriverUpgradePolicySpec {
    /// Upgrade this CR's nodes automatically when the driver pod template changes (default
    /// true); when false the other fields are ignored.
    #[serde(default = "yes")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub auto_upgrade: bool,
    /// Nodes upgraded in parallel; 0 means no limit (default 1).
    #[serde(default = "max_parallel_default")]
    #[cfg_attr(feature = "kube", schemars(transform = crd_default))]
    pub max_parallel_upgrades: u32,
    /// Nodes that may be unavailable during the upgrade: a count or a percentage, rounded up
    /// (default `25%`).
    #[serde(default = "max_unavailable_default")]
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

fn yes() -> bool {
    true
}

fn max_parallel_default() -> u32 {
    DriverUpgradePolicySpec::default().max_parallel_upgrades
}

fn max_unavailable_default() -> IntOrString {
    DriverUpgradePolicySpec::default().max_unavailable
}

impl NvidiaDriverUpgradePolicySpec {
    /// The policy the upgrade controller runs (upstream `GetUpgradePolicyWithDefaults`): these
    /// fields, with each unset step (`waitForCompletion`, `podDeletion`, `drain`) at its CRD
    /// defaults rather than off.
    pub fn effective(&self) -> DriverUpgradePolicySpec {
        DriverUpgradePolicySpec {
            auto_upgrade: self.auto_upgrade,
            max_parallel_upgrades: self.max_parallel_upgrades,
            max_unavailable: self.max_unavailable.clone(),
            wait_for_completion: Some(self.wait_for_completion.clone().unwrap_or_default()),
            pod_deletion: Some(self.pod_deletion.clone().unwrap_or_default()),
            drain: Some(self.drain.clone().unwrap_or_default()),
        }
    }
}

impl Default for NvidiaDriverUpgradePolicySpec {
    /// The CRD's defaults (what `upgradePolicy: {}` becomes).
    fn default() -> Self {
        serde_json::from_value(serde_json::json!({})).expect("an empty policy parses")
    }
}

impl Default for NvidiaDriverSpec {
    /// The CRD's defaults (what `spec: {}` becomes).
    fn default() -> Self {
        serde_json::from_value(serde_json::json!({})).expect("an empty spec parses")
    }
}

fn driver_type_gpu() -> DriverType {
    DriverType::Gpu
}

fn kernel_module_auto() -> Option<KernelModuleType> {
    Some(KernelModuleType::Auto)
}

fn driver_image() -> String {
    "nvcr.io/nvidia/driver".into()
}

/// `spec.driverType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub enum DriverType {
    /// Data-center GPU driver.
    #[serde(rename = "gpu")]
    Gpu,
    /// vGPU guest driver.
    #[serde(rename = "vgpu")]
    Vgpu,
    /// vGPU host manager (kiln does not render it from an NVIDIADriver).
    #[serde(rename = "vgpu-host-manager")]
    VgpuHostManager,
}

impl DriverType {
    /// The CRD value (`gpu`, `vgpu`, `vgpu-host-manager`).
    pub fn as_str(self) -> &'static str {
        match self {
            DriverType::Gpu => "gpu",
            DriverType::Vgpu => "vgpu",
            DriverType::VgpuHostManager => "vgpu-host-manager",
        }
    }
}

/// `spec.gds` / `spec.gdrcopy`: a driver sidecar's image and settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SidecarDriverSpec {
    /// Enable the sidecar (unset = false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
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
    /// Args.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Env.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVarSpec>,
}

impl SidecarDriverSpec {
    /// As the ClusterPolicy's `gds`/`gdrcopy` component.
    fn component(&self) -> ComponentSpec {
        ComponentSpec {
            enabled: self.enabled,
            repository: self.repository.clone(),
            image: self.image.clone(),
            version: self.version.clone(),
            image_pull_policy: self.image_pull_policy.clone(),
            image_pull_secrets: self.image_pull_secrets.clone(),
            resources: None,
            args: self.args.clone(),
            env: self.env.clone(),
            host_network: None,
        }
    }
}

/// `spec.licensingConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NvidiaDriverLicensingSpec {
    /// Secret holding `gridd.conf` (preferred).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret_name: String,
    /// Deprecated: ConfigMap holding `gridd.conf`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// NLS licensing: also mount the client token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nls_enabled: Option<bool>,
}

/// The NVIDIADriver's overall state: `ready` when every driver pod is ready, else `notReady`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub enum NvidiaDriverState {
    /// Not applied (kept for compatibility with NVIDIA's states; kiln does not set it).
    #[serde(rename = "ignored")]
    Ignored,
    /// Every driver pod of the CR is ready.
    #[serde(rename = "ready")]
    Ready,
    /// Some driver pod is not ready, or the CR cannot be applied.
    #[default]
    #[serde(rename = "notReady")]
    NotReady,
    /// The ClusterPolicy does not hand the driver to NVIDIADriver CRs.
    #[serde(rename = "disabled")]
    Disabled,
}

/// `status` of an NVIDIADriver.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NvidiaDriverStatus {
    /// ready / notReady / disabled.
    #[serde(default)]
    pub state: NvidiaDriverState,
    /// Operator namespace (where the driver DaemonSets run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `Ready` and `Error` conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

impl NvidiaDriverSpec {
    /// The nodes this CR is for: its `nodeSelector` (unset = every GPU node) and always
    /// `nvidia.com/gpu.present=true` (upstream `getNodePools`).
    pub fn effective_selector(&self) -> BTreeMap<String, String> {
        let mut s = BTreeMap::from([(GPU_PRESENT.to_string(), "true".to_string())]);
        if let Some(own) = &self.node_selector {
            s.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        s
    }

    /// Whether a node with `labels` is one of this CR's.
    pub fn selects(&self, labels: &impl LabelLookup) -> bool {
        matches(&self.effective_selector(), labels)
    }

    /// Whether precompiled drivers are on (unset = false).
    pub fn precompiled(&self) -> bool {
        self.use_precompiled == Some(true)
    }

    /// The upgrade policy of this CR's DaemonSets (upstream `GetUpgradePolicyWithDefaults`):
    /// its `upgradePolicy` ([`NvidiaDriverUpgradePolicySpec::effective`]), or, when unset, the CRD
    /// defaults with auto upgrade on. The ClusterPolicy's `driver.upgradePolicy` is not read.
    pub fn upgrade_policy(&self) -> DriverUpgradePolicySpec {
        self.upgrade_policy.clone().unwrap_or_default().effective()
    }

    /// This CR's fields as a ClusterPolicy `driver` block; what the CR does not carry (RDMA
    /// when unset) comes from the policy's `base`.
    pub fn driver_spec(&self, base: &DriverSpec) -> DriverSpec {
        let name = |n: &Option<NameSpec>| n.clone().unwrap_or_default();
        let licensing = self.licensing_config.clone().unwrap_or_default();
        DriverSpec {
            common: ComponentSpec {
                enabled: Some(true),
                repository: self.repository.clone(),
                image: self.image.clone(),
                version: self.version.clone(),
                image_pull_policy: self.image_pull_policy.clone(),
                image_pull_secrets: self.image_pull_secrets.clone(),
                resources: self.resources.clone(),
                args: self.args.clone(),
                env: self.env.clone(),
                host_network: self.host_network,
            },
            use_nvidia_driver_crd: None,
            use_precompiled: self.use_precompiled,
            use_open_kernel_modules: self.use_open_kernel_modules,
            kernel_module_type: self.kernel_module_type.or(Some(KernelModuleType::Auto)),
            startup_probe: Some(
                self.startup_probe
                    .clone()
                    .unwrap_or_else(|| default_startup_probe(self.precompiled())),
            ),
            liveness_probe: self.liveness_probe.clone(),
            readiness_probe: self.readiness_probe.clone(),
            rdma: self.rdma.clone().unwrap_or_else(|| base.rdma.clone()),
            upgrade_policy: Some(self.upgrade_policy()),
            manager: self.manager.clone(),
            repo_config: RepoConfigSpec {
                config_map_name: name(&self.repo_config).name,
            },
            cert_config: name(&self.cert_config),
            licensing_config: LicensingConfigSpec {
                config_map_name: licensing.name,
                secret_name: licensing.secret_name,
                nls_enabled: licensing.nls_enabled,
            },
            virtual_topology: VirtualTopologySpec {
                config: name(&self.virtual_topology_config).name,
            },
            kernel_module_config: name(&self.kernel_module_config),
            secret_env: self.secret_env.clone(),
        }
    }

    /// The ClusterPolicy spec (JSON, as stored) the driver state is rendered from for this CR:
    /// `policy` with `driver` replaced by [`NvidiaDriverSpec::driver_spec`], `gds`/`gdrcopy` by
    /// the CR's (off when the CR has none), and the pod settings of `daemonsets` (labels,
    /// annotations, tolerations, priority class, pod security context) by the CR's; the rest of
    /// `daemonsets` (update strategy) stays the policy's.
    ///
    /// # Errors
    /// A [`super::SpecError`] naming the policy field when `policy` is not a valid spec, or
    /// `spec.upgradePolicy.maxUnavailable` (the CR's own field) when that is not an
    /// int-or-percent ([`crate::intstr::IntOrPercent`]).
    pub fn policy_spec(&self, policy: &Value) -> Result<Value, super::SpecError> {
        // Checked here, on the CR's own path: the derived policy carries this value as its
        // `driver.upgradePolicy`, which would name a field the CR does not have.
        if let Some(up) = &self.upgrade_policy
            && let Err(message) = crate::intstr::IntOrPercent::parse(&up.max_unavailable)
        {
            return Err(super::SpecError {
                path: "spec.upgradePolicy.maxUnavailable".into(),
                message,
            });
        }
        let parsed = super::ClusterPolicySpec::from_json(policy)?;
        let mut out = policy.clone();
        if !out.is_object() {
            out = Value::Object(Default::default());
        }
        out["driver"] = to(&self.driver_spec(&parsed.driver));
        let sidecar = |s: &Option<SidecarDriverSpec>| match s {
            Some(s) => s.component(),
            None => ComponentSpec {
                enabled: Some(false),
                ..Default::default()
            },
        };
        out["gds"] = to(&sidecar(&self.gds));
        out["gdrcopy"] = to(&sidecar(&self.gdrcopy));
        if !out["daemonsets"].is_object() {
            out["daemonsets"] = Value::Object(Default::default());
        }
        let ds = &mut out["daemonsets"];
        ds["labels"] = to(&sanitized_labels(&self.labels));
        ds["annotations"] = to(&self.annotations);
        // The asset's toleration stays when the CR adds its own (NVIDIA's NVIDIADriver
        // manifests append them).
        let tolerations: Vec<Toleration> = if self.tolerations.is_empty() {
            Vec::new()
        } else {
            std::iter::once(gpu_toleration())
                .chain(self.tolerations.iter().cloned())
                .collect()
        };
        ds["tolerations"] = to(&tolerations);
        ds["priorityClassName"] = Value::String(self.priority_class_name.clone());
        match &self.pod_security_context {
            Some(psc) => ds["podSecurityContext"] = to(psc),
            None => {
                if let Some(m) = ds.as_object_mut() {
                    m.remove("podSecurityContext");
                }
            }
        }
        Ok(out)
    }
}

fn to<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("spec types serialize")
}

/// Upstream's startup probe when the CR sets none: 60 s initial delay (5 s precompiled),
/// timeout 60 s, period 10 s, success 1, failures 120.
pub fn default_startup_probe(precompiled: bool) -> ProbeSpec {
    ProbeSpec {
        initial_delay_seconds: Some(if precompiled { 5 } else { 60 }),
        timeout_seconds: Some(60),
        period_seconds: Some(10),
        success_threshold: Some(1),
        failure_threshold: Some(120),
    }
}

/// Labels the CR may set: not `app` nor `app.kubernetes.io/*` (the pod selector uses them and
/// is immutable; upstream `sanitizeDriverLabels`).
pub fn sanitized_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter(|(k, _)| *k != "app" && !k.starts_with("app.kubernetes.io/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn matches(selector: &BTreeMap<String, String>, labels: &impl LabelLookup) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.label(k) == Some(v.as_str()))
}

/// One node pool of an NVIDIADriver: the nodes sharing an OS (and kernel, precompiled; and RHCOS
/// version on OpenShift), which get one DaemonSet.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodePool {
    /// The pool's OS as image tags use it (`rhel9` for `rhel` `9.4`, see [`NodeOs::from_labels`]).
    pub os: NodeOs,
    /// The pool's OS tag, the part of its object names (upstream `osTag`: ID and VERSION_ID,
    /// the major version only for `rhel`, `rocky` and `ol`: `ubuntu22.04`, `rhel9`).
    pub name: String,
    /// The kernel, for precompiled drivers.
    pub kernel: Option<String>,
    /// The RHCOS version ([`OSTREE_VERSION_LABEL`]), on OpenShift without precompiled drivers.
    pub rhcos_version: Option<String>,
    /// The DaemonSet's `nodeSelector`: the CR's effective selector plus the OS labels (and the
    /// kernel label, precompiled; the RHCOS version label on OpenShift).
    pub node_selector: BTreeMap<String, String>,
}

/// NFD's label with the OS major version, selected instead of `VERSION_ID` where the OS tag
/// drops the minor version (`rhel`, `rocky`, `ol`).
pub const OS_VERSION_MAJOR_LABEL: &str =
    "feature.node.kubernetes.io/system-os_release.VERSION_ID.major";

/// NFD's label with the RHCOS (ostree) version of an OpenShift node.
pub const OSTREE_VERSION_LABEL: &str =
    "feature.node.kubernetes.io/system-os_release.OSTREE_VERSION";

/// The node pools of `spec` among `nodes` on plain Kubernetes: [`node_pools_for`] with
/// `openshift` false.
pub fn node_pools<L: LabelLookup>(
    spec: &NvidiaDriverSpec,
    nodes: impl IntoIterator<Item = L>,
) -> Vec<NodePool> {
    node_pools_for(spec, nodes, false)
}

/// The node pools of `spec` among `nodes` (their labels: a map, or any [`LabelLookup`] such as
/// the operator's node store), sorted, as upstream's `getNodePools` partitions them: nodes the
/// CR selects grouped by OS tag, and by NFD's kernel when precompiled, or, on `openshift`
/// without precompiled drivers, by RHCOS version ([`OSTREE_VERSION_LABEL`]). The pool selects
/// the OS by `ID` and `VERSION_ID`, or [`OS_VERSION_MAJOR_LABEL`] (the tag's major version)
/// where the tag drops the minor version. Nodes without the NFD labels a pool needs (OS,
/// kernel, RHCOS version) are left out (upstream logs "Is NFD installed?" and skips them).
pub fn node_pools_for<L: LabelLookup>(
    spec: &NvidiaDriverSpec,
    nodes: impl IntoIterator<Item = L>,
    openshift: bool,
) -> Vec<NodePool> {
    use crate::context::{OS_ID_LABEL, OS_VERSION_LABEL};
    let selector = spec.effective_selector();
    let mut pools = BTreeSet::new();
    for labels in nodes.into_iter().filter(|l| matches(&selector, l)) {
        let Some(os) = NodeOs::from_labels(&labels) else {
            continue;
        };
        // Both present: `from_labels` read them.
        let id = labels.label(OS_ID_LABEL).unwrap_or_default();
        let version = labels.label(OS_VERSION_LABEL).unwrap_or_default();
        let tag = os.tag();
        let mut node_selector = selector.clone();
        node_selector.insert(OS_ID_LABEL.into(), id.into());
        if tag.ends_with(version) {
            node_selector.insert(OS_VERSION_LABEL.into(), version.into());
        } else {
            // NFD sets the major label with VERSION_ID; a node given by ID and VERSION_ID alone
            // (`kiln render --nvidia-driver --os rhel:9.4`) is pooled by its VERSION_ID's major
            // (upstream skips it; the pool's selector needs the label all the same).
            node_selector.insert(OS_VERSION_MAJOR_LABEL.into(), os.version_id.clone());
        }
        let kernel = if spec.precompiled() {
            let Some(k) = labels.label(KERNEL_LABEL) else {
                continue;
            };
            node_selector.insert(KERNEL_LABEL.into(), k.into());
            Some(k.to_string())
        } else {
            None
        };
        let rhcos_version = if !spec.precompiled() && openshift {
            let Some(r) = labels.label(OSTREE_VERSION_LABEL) else {
                continue;
            };
            node_selector.insert(OSTREE_VERSION_LABEL.into(), r.into());
            Some(r.to_string())
        } else {
            None
        };
        pools.insert(NodePool {
            os,
            name: tag,
            kernel,
            rhcos_version,
            node_selector,
        });
    }
    pools.into_iter().collect()
}

/// The name (and `app` label) of an NVIDIADriver's DaemonSet for `pool`, as upstream's
/// `getDriverAppName`: `nvidia-<driverType>-driver-<pool>-<hash>`, the hash taken over the
/// CR's UID (plus `-<kernel>` for a precompiled pool, else `-<rhcos version>` for an OpenShift
/// pool) with FNV-1a (32 bit), its decimal text
/// encoded with apimachinery's `rand.SafeEncodeString`; the prefix is cut so the whole stays
/// within [`APP_NAME_MAX`].
pub fn daemonset_name(driver_type: DriverType, pool: &NodePool, uid: &str) -> String {
    let prefix = format!("nvidia-{}-driver-{}", driver_type.as_str(), pool.name);
    let mut hashed = uid.to_string();
    if let Some(k) = pool.kernel.as_ref().or(pool.rhcos_version.as_ref()) {
        hashed.push('-');
        hashed.push_str(k);
    }
    let hash = safe_encode(&fnv1a32(hashed.as_bytes()).to_string());
    let keep = APP_NAME_MAX
        .saturating_sub(hash.len() + 1)
        .min(prefix.len());
    let prefix = prefix[..keep].trim_end_matches(['-', '.']);
    format!("{prefix}-{hash}")
}

/// Most characters of an object name (a DNS-1123 subdomain) that [`driver_name`] keeps.
pub const OBJECT_NAME_MAX: usize = 253;

/// The name of a node pool's service account, RBAC objects and OpenShift SCC (upstream
/// `getDriverName`): `nvidia-<driverType>-driver-<cr>-<pool>`, or
/// `nvidia-vgpu-manager-<cr>-<pool>` for `vgpu-host-manager`, cut to [`OBJECT_NAME_MAX`].
pub fn driver_name(driver_type: DriverType, cr: &str, pool: &NodePool) -> String {
    let mut name = match driver_type {
        DriverType::VgpuHostManager => format!("nvidia-vgpu-manager-{cr}-{}", pool.name),
        t => format!("nvidia-{}-driver-{cr}-{}", t.as_str(), pool.name),
    };
    name.truncate(OBJECT_NAME_MAX);
    name
}

fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// apimachinery's `rand.SafeEncodeString`: each character mapped onto an alphabet without
/// vowels or confusable characters.
fn safe_encode(s: &str) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    s.chars()
        .map(|c| ALPHANUMS[(c as usize) % ALPHANUMS.len()] as char)
        .collect()
}

/// Label naming a driver DaemonSet's OS pool (`ubuntu22.04`), on the DaemonSet and its pods.
pub const OS_VERSION_POOL_LABEL: &str = "nvidia.com/node.os-version";

/// Label naming a precompiled driver DaemonSet's kernel ([`sanitized_kernel`]), on the
/// DaemonSet and its pods.
pub const PRECOMPILED_KERNEL_LABEL: &str = "nvidia.com/precompiled.kernel-version";

/// A kernel version as a label value (upstream `getSanitizedKernelVersion`): architecture
/// suffixes (`x86_64`, `aarch64`, each optionally `_64k`) removed, `_` turned into `.`, a
/// trailing `.` dropped, lower case (`5.14.0-427.37.1.el9_4.x86_64` → `5.14.0-427.37.1.el9.4`).
pub fn sanitized_kernel(kernel: &str) -> String {
    let mut k = kernel.to_string();
    for arch in ["x86_64_64k", "aarch64_64k", "x86_64", "aarch64"] {
        k = k.replace(arch, "");
    }
    k.replace('_', ".").trim_end_matches('.').to_lowercase()
}

/// The toleration every NVIDIADriver's pods have (NVIDIA's NVIDIADriver manifests); a CR's
/// `tolerations` are added after it.
pub fn gpu_toleration() -> Toleration {
    Toleration {
        key: Some("nvidia.com/gpu".into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    }
}

/// Make the rendered driver DaemonSet `ds` the one of an NVIDIADriver's pool: named `name`
/// (also its `app` label, pod selector and pod label, so pods of another driver DaemonSet —
/// e.g. ones the ClusterPolicy's DaemonSet orphaned — are never adopted), labelled
/// [`NVIDIADRIVER_LABEL`]`=<cr>`, the pool's `nodeSelector` added to the asset's, and the CR's
/// node affinity set. Then what NVIDIA's NVIDIADriver manifests have and the ClusterPolicy's
/// driver DaemonSet has not: the labels [`OS_VERSION_POOL_LABEL`] (and, for a precompiled pool,
/// [`PRECOMPILED_KERNEL_LABEL`]) on the DaemonSet and its pods; the driver pods' anti-affinity
/// also against `nvidia-vgpu-manager` pods; `NVIDIA_VISIBLE_DEVICES=void` first in the env of
/// `nvidia-driver-ctr` and `nvidia-peermem-ctr` (they always run with runc's view of no GPU);
/// and the CR's `args` after the driver container's `init` rather than instead of it.
pub fn finish_daemonset(
    ds: &mut Value,
    name: &str,
    cr: &str,
    pool: &NodePool,
    node_affinity: Option<&NodeAffinity>,
) {
    let set = |v: &mut Value, ptr: &str, key: &str, val: &str| {
        if let Some(m) = object_at(v, ptr) {
            m.insert(key.into(), Value::String(val.into()));
        }
    };
    ds["metadata"]["name"] = Value::String(name.into());
    set(ds, "/metadata/labels", "app", name);
    set(ds, "/metadata/labels", NVIDIADRIVER_LABEL, cr);
    set(ds, "/spec/selector/matchLabels", "app", name);
    set(ds, "/spec/template/metadata/labels", "app", name);
    set(ds, "/spec/template/metadata/labels", NVIDIADRIVER_LABEL, cr);
    for (k, v) in &pool.node_selector {
        set(ds, "/spec/template/spec/nodeSelector", k, v);
    }
    if let Some(aff) = node_affinity
        && let Some(m) = object_at(ds, "/spec/template/spec/affinity")
    {
        m.insert(
            "nodeAffinity".into(),
            serde_json::to_value(aff).expect("NodeAffinity serializes"),
        );
    }
    for ptr in ["/metadata/labels", "/spec/template/metadata/labels"] {
        set(ds, ptr, OS_VERSION_POOL_LABEL, &pool.name);
        if let Some(k) = &pool.kernel {
            set(ds, ptr, PRECOMPILED_KERNEL_LABEL, &sanitized_kernel(k));
        }
    }
    if let Some(terms) = ds
        .pointer_mut("/spec/template/spec/affinity/podAntiAffinity/requiredDuringSchedulingIgnoredDuringExecution")
        .and_then(Value::as_array_mut)
    {
        for expr in terms
            .iter_mut()
            .filter_map(|t| t.pointer_mut("/labelSelector/matchExpressions"))
            .filter_map(Value::as_array_mut)
            .flatten()
            .filter(|e| e["key"] == "app.kubernetes.io/component")
        {
            if let Some(values) = expr.get_mut("values").and_then(Value::as_array_mut)
                && !values.iter().any(|v| v == "nvidia-vgpu-manager")
            {
                values.push(Value::String("nvidia-vgpu-manager".into()));
            }
        }
    }
    for c in ds
        .pointer_mut("/spec/template/spec/containers")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        let main = c["name"] == DRIVER_CONTAINER;
        if !(main || c["name"] == "nvidia-peermem-ctr") {
            continue;
        }
        let Some(m) = c.as_object_mut() else { continue };
        let env = m.entry("env").or_insert_with(|| Value::Array(Vec::new()));
        if let Some(env) = env.as_array_mut()
            && !env.iter().any(|e| e["name"] == "NVIDIA_VISIBLE_DEVICES")
        {
            env.insert(
                0,
                serde_json::json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}),
            );
        }
        let runs_init = m.get("command") == Some(&serde_json::json!(["nvidia-driver"]));
        if main
            && runs_init
            && let Some(args) = m.get_mut("args").and_then(Value::as_array_mut)
            && args.first().and_then(Value::as_str) != Some("init")
        {
            args.insert(0, Value::String("init".into()));
        }
    }
}

/// The driver DaemonSet's main container, as NVIDIA's driver asset names it.
pub const DRIVER_CONTAINER: &str = "nvidia-driver-ctr";

/// The [`DRIVER_CONTAINER`]s of a pod spec (`spec.template.spec` as a JSON map), to edit in
/// place; none when the pod has no `containers` list.
pub fn driver_containers_mut(
    pod: &mut serde_json::Map<String, Value>,
) -> impl Iterator<Item = &mut Value> {
    pod.get_mut("containers")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter(|c| c["name"] == DRIVER_CONTAINER)
}

/// `app.kubernetes.io/component` of a `vgpu-host-manager` NVIDIADriver's objects.
pub const VGPU_HOST_MANAGER_COMPONENT: &str = "nvidia-vgpu-host-manager";

/// Node label the vGPU host manager's pods select (instead of `nvidia.com/gpu.deploy.driver`).
pub const VGPU_MANAGER_DEPLOY_LABEL: &str = "nvidia.com/gpu.deploy.vgpu-manager";

/// Make a driver state object `o` the `driverType: vgpu-host-manager` form of it, as NVIDIA's
/// NVIDIADriver manifests render it: `app.kubernetes.io/component: nvidia-vgpu-host-manager`
/// on the object (and its pods); for the DaemonSet also the pods select
/// [`VGPU_MANAGER_DEPLOY_LABEL`] instead of `nvidia.com/gpu.deploy.driver`, get 120 s to
/// terminate, the `nvidia-driver-ctr` container mounts the host's `/sys/fs/cgroup` and
/// `/dev/vfio` (volumes `cgroup`, `vfio`, after `host-os-release`) and has no startup probe or
/// preStop hook (the host manager writes no driver-ready marker).
pub fn finish_vgpu_host_manager(o: &mut Value) {
    let component = |v: &mut Value, ptr: &str| {
        if let Some(m) = v.pointer_mut(ptr).and_then(Value::as_object_mut)
            && m.contains_key("app.kubernetes.io/component")
        {
            m.insert(
                "app.kubernetes.io/component".into(),
                Value::String(VGPU_HOST_MANAGER_COMPONENT.into()),
            );
        }
    };
    component(o, "/metadata/labels");
    if o["kind"] != "DaemonSet" {
        return;
    }
    component(o, "/spec/template/metadata/labels");
    let Some(pod) = o
        .pointer_mut("/spec/template/spec")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    if let Some(sel) = pod.get_mut("nodeSelector").and_then(Value::as_object_mut)
        && sel.remove("nvidia.com/gpu.deploy.driver").is_some()
    {
        sel.insert(
            VGPU_MANAGER_DEPLOY_LABEL.into(),
            Value::String("true".into()),
        );
    }
    pod.insert("terminationGracePeriodSeconds".into(), Value::from(120));
    let host =
        |name: &str, path: &str| serde_json::json!({"name": name, "hostPath": {"path": path}});
    if let Some(vols) = pod.get_mut("volumes").and_then(Value::as_array_mut) {
        let at = vols
            .iter()
            .position(|v| v["name"] == "host-os-release")
            .map_or(vols.len(), |i| i + 1);
        vols.splice(
            at..at,
            [host("cgroup", "/sys/fs/cgroup"), host("vfio", "/dev/vfio")],
        );
    }
    for c in driver_containers_mut(pod) {
        if let Some(m) = c.as_object_mut() {
            m.remove("startupProbe");
            m.remove("lifecycle");
        }
        if let Some(mounts) = c.get_mut("volumeMounts").and_then(Value::as_array_mut) {
            let at = mounts
                .iter()
                .position(|v| v["name"] == "host-os-release")
                .map_or(mounts.len(), |i| i + 1);
            mounts.splice(
                at..at,
                [
                    serde_json::json!({"name": "cgroup", "mountPath": "/sys/fs/cgroup"}),
                    serde_json::json!({"name": "vfio", "mountPath": "/dev/vfio"}),
                ],
            );
        }
    }
}

/// The object at JSON pointer `ptr`, created (as empty objects) along the way.
fn object_at<'a>(v: &'a mut Value, ptr: &str) -> Option<&'a mut serde_json::Map<String, Value>> {
    let mut cur = v;
    for key in ptr.split('/').filter(|k| !k.is_empty()) {
        if !cur.is_object() {
            *cur = Value::Object(Default::default());
        }
        cur = cur
            .as_object_mut()?
            .entry(key.to_string())
            .or_insert_with(|| Value::Object(Default::default()));
    }
    if !cur.is_object() {
        *cur = Value::Object(Default::default());
    }
    cur.as_object_mut()
}

/// Overlapping NVIDIADrivers: for each CR (by name) that selects a node another CR selects
/// too, the names of those others (sorted). `drivers` are `(name, spec)`; `nodes` the labels of
/// every node (any [`LabelLookup`]). Only real nodes count: two selectors that could overlap
/// but match no common node do not conflict (upstream checks the nodes).
pub fn overlaps<L: LabelLookup>(
    drivers: &[(String, &NvidiaDriverSpec)],
    nodes: impl IntoIterator<Item = L>,
) -> BTreeMap<String, BTreeSet<String>> {
    let selectors: Vec<(&str, BTreeMap<String, String>)> = drivers
        .iter()
        .map(|(n, s)| (n.as_str(), s.effective_selector()))
        .collect();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for labels in nodes {
        let on: Vec<&str> = selectors
            .iter()
            .filter(|(_, s)| matches(s, &labels))
            .map(|(n, _)| *n)
            .collect();
        if on.len() < 2 {
            continue;
        }
        for a in &on {
            let others = on.iter().filter(|b| *b != a).map(|b| b.to_string());
            out.entry(a.to_string()).or_default().extend(others);
        }
    }
    out
}

#[path = "nvidiadriver_owner.rs"]
mod owner;
pub use owner::{OWNER_LABEL, OwnerError, check_owner_selector, node_owners};

#[path = "nvidiadriver_install.rs"]
mod install;
pub use install::{
    ClusterProxy, MANIFEST_DRIVER_MOUNTS, OpenShiftFacts, OpenShiftRender, Toolkit,
    additional_configs, install_state,
};

#[cfg(test)]
#[path = "nvidiadriver_tests.rs"]
mod tests;
