//! Node label rules: which nodes are GPU nodes and which `nvidia.com/gpu.deploy.*` labels they
//! carry (upstream GPU Operator v26.7 node-labeling controller, `updateGPUStateLabels`; see
//! `gpu-operator.md` §2.3).
//!
//! The output is a minimal [`LabelPatch`]: key → `Some(value)` to set, `None` to remove. A node
//! that already carries the right labels yields an empty patch, so a reconcile at steady state
//! writes nothing. The operator sends the patch as a JSON merge patch on `metadata.labels`.
//!
//! ```text
//! NFD PCI labels ──► gpu.present ──► workload config ──► deploy set ──► add absent/empty, sweep others
//! ```

use std::collections::BTreeMap;

use crate::context::{NodeOs, OS_ID_LABEL, OS_VERSION_LABEL};
use crate::spec::{ClusterPolicySpec, SandboxMode, Workload};

pub use crate::label_keys::{
    DEPLOY_OPERANDS, DEPLOY_PREFIX, GPU_PRESENT, GPU_PRODUCT, LabelLookup, Labels, MIG_CAPABLE,
    MIG_CONFIG, NFD_GPU_LABELS, NFD_PREFIX, VGPU_HOST_DRIVER_VERSION, WORKLOAD_CONFIG,
};

/// Reading a node's OS facts from its labels (the type is [`crate::context`]'s).
impl NodeOs {
    /// A node's OS from its NFD labels ([`OS_ID_LABEL`], [`OS_VERSION_LABEL`]); `rhel`, `rocky`
    /// and `ol` keep only the major version (upstream rule). `None` without both labels.
    pub fn from_labels(labels: &impl LabelLookup) -> Option<NodeOs> {
        let id = labels.label(OS_ID_LABEL)?.to_string();
        let mut version_id = labels.label(OS_VERSION_LABEL)?.to_string();
        if matches!(id.as_str(), "rhel" | "rocky" | "ol") {
            version_id = version_id.split('.').next().unwrap_or_default().to_string();
        }
        Some(NodeOs { id, version_id })
    }
}

/// A label change set: `Some(value)` sets the key, `None` removes it. Empty = nothing to write.
pub type LabelPatch = BTreeMap<String, Option<String>>;

/// Deploy components of the `container` workload (26.7 set; `mig-manager` is added separately).
pub const CONTAINER_COMPONENTS: [&str; 9] = [
    "driver",
    "gpu-feature-discovery",
    "container-toolkit",
    "device-plugin",
    "dcgm",
    "dcgm-exporter",
    "node-status-exporter",
    "operator-validator",
    "client",
];
/// Deploy components of `vm-passthrough` (first entry swapped for the kata variant in kata mode).
pub const VM_PASSTHROUGH_COMPONENTS: [&str; 6] = [
    "sandbox-device-plugin",
    "sandbox-validator",
    "vfio-manager",
    "kata-manager",
    "cc-manager",
    "client",
];
/// Deploy components of `vm-vgpu`.
pub const VM_VGPU_COMPONENTS: [&str; 6] = [
    "sandbox-device-plugin",
    "vgpu-manager",
    "vgpu-device-manager",
    "sandbox-validator",
    "cc-manager",
    "client",
];
/// Components known outside the three sets: the kata device plugin and the MIG manager.
const EXTRA_COMPONENTS: [&str; 2] = ["kata-sandbox-device-plugin", "mig-manager"];

/// The policy inputs the label rules read, taken from the active ClusterPolicy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelPolicy {
    /// `sandboxWorkloads.enabled` (nil = false).
    pub sandbox: bool,
    /// `sandboxWorkloads.defaultWorkload` (nil = container).
    pub default_workload: Workload,
    /// `sandboxWorkloads.mode` (nil = kubevirt).
    pub mode: SandboxMode,
    /// `migManager.enabled` (nil = true).
    pub mig_manager: bool,
    /// `migManager.config.default` (nil config = `""`).
    pub mig_default_config: String,
}

impl Default for LabelPolicy {
    fn default() -> Self {
        Self::from_spec(&ClusterPolicySpec::default())
    }
}

impl LabelPolicy {
    /// Read the label inputs from `spec`, applying the upstream nil defaults.
    pub fn from_spec(spec: &ClusterPolicySpec) -> Self {
        Self {
            sandbox: spec.sandbox_enabled(),
            default_workload: spec
                .sandbox_workloads
                .default_workload
                .unwrap_or(Workload::Container),
            mode: spec.sandbox_workloads.mode.unwrap_or(SandboxMode::Kubevirt),
            mig_manager: spec.mig_manager.common.enabled_or(true),
            mig_default_config: spec
                .mig_manager
                .config
                .as_ref()
                .map(|c| c.default.clone())
                .unwrap_or_default(),
        }
    }
}

/// Whether the node has an NVIDIA PCI device: any of [`NFD_GPU_LABELS`] is `"true"`.
pub fn has_gpu_pci_labels(labels: &Labels) -> bool {
    NFD_GPU_LABELS
        .iter()
        .any(|k| labels.get(*k).map(String::as_str) == Some("true"))
}

/// Whether the node carries any NFD label (prefix [`NFD_PREFIX`]).
pub fn has_nfd_labels(labels: &Labels) -> bool {
    labels.keys().any(|k| k.starts_with(NFD_PREFIX))
}

/// Whether the node is a GPU node for the operands: `nvidia.com/gpu.present=true`.
pub fn is_gpu_node(labels: &Labels) -> bool {
    labels.get(GPU_PRESENT).map(String::as_str) == Some("true")
}

/// MIG capability (upstream `hasMIGCapableGPU`): never on vGPU hosts; else the
/// `nvidia.com/mig.capable` label when present; else a product name containing h100, a100 or a30.
pub fn is_mig_capable(labels: &Labels) -> bool {
    if labels
        .get(VGPU_HOST_DRIVER_VERSION)
        .is_some_and(|v| !v.is_empty())
    {
        return false;
    }
    if let Some(v) = labels.get(MIG_CAPABLE) {
        return v == "true";
    }
    labels.get(GPU_PRODUCT).is_some_and(|p| {
        let p = p.to_ascii_lowercase();
        ["h100", "a100", "a30"].iter().any(|m| p.contains(m))
    })
}

/// The node's workload config: `container` unless sandbox is on, then the node's
/// `nvidia.com/gpu.workload.config` label, falling back to the policy default when missing or
/// invalid.
pub fn workload_config(labels: &Labels, policy: &LabelPolicy) -> Workload {
    if !policy.sandbox {
        return Workload::Container;
    }
    match labels.get(WORKLOAD_CONFIG).map(String::as_str) {
        Some("container") => Workload::Container,
        Some("vm-passthrough") => Workload::VmPassthrough,
        Some("vm-vgpu") => Workload::VmVgpu,
        _ => policy.default_workload,
    }
}

/// The deploy components of `workload` (without the MIG manager), in upstream order.
pub fn deploy_components(workload: Workload, mode: SandboxMode) -> Vec<&'static str> {
    match workload {
        Workload::Container => CONTAINER_COMPONENTS.to_vec(),
        Workload::VmPassthrough => {
            let mut set = VM_PASSTHROUGH_COMPONENTS.to_vec();
            if mode == SandboxMode::Kata {
                set[0] = "kata-sandbox-device-plugin";
            }
            set
        }
        Workload::VmVgpu => VM_VGPU_COMPONENTS.to_vec(),
    }
}

/// Every deploy label key kiln manages (all sets, the kata variant and the MIG manager).
pub fn known_deploy_keys() -> Vec<String> {
    let mut keys: Vec<String> = CONTAINER_COMPONENTS
        .iter()
        .chain(&VM_PASSTHROUGH_COMPONENTS)
        .chain(&VM_VGPU_COMPONENTS)
        .chain(&EXTRA_COMPONENTS)
        .map(|c| format!("{DEPLOY_PREFIX}{c}"))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The `gpu.present` step: `"true"` when PCI labels are present and the label is not already
/// `"true"`; `"false"` when it is `"true"` but no PCI label remains; otherwise no change.
pub fn plan_gpu_present(labels: &Labels) -> LabelPatch {
    let pci = has_gpu_pci_labels(labels);
    let present = is_gpu_node(labels);
    let mut patch = LabelPatch::new();
    if pci && !present {
        patch.insert(GPU_PRESENT.into(), Some("true".into()));
    } else if !pci && present {
        patch.insert(GPU_PRESENT.into(), Some("false".into()));
    }
    patch
}

/// The deploy-label step for a node whose `gpu.present` is already decided (upstream
/// `updateGPUStateLabels`):
/// - not a GPU node, or `gpu.deploy.operands=false`: remove every known deploy label;
/// - else remove known deploy keys outside the node's set (`mig-manager` is never swept for
///   `container`), and set each key of the set to `"true"` only when absent or empty;
/// - `container` + MIG capable: add `gpu.deploy.mig-manager=true` when the key is absent;
/// - MIG manager enabled + MIG capable + `mig.config` absent or empty + policy default
///   `all-disabled`: set `mig.config=all-disabled`.
pub fn plan_deploy_labels(labels: &Labels, policy: &LabelPolicy) -> LabelPatch {
    let mut patch = LabelPatch::new();
    let remove_all =
        !is_gpu_node(labels) || labels.get(DEPLOY_OPERANDS).map(String::as_str) == Some("false");
    if remove_all {
        for key in known_deploy_keys() {
            if labels.contains_key(&key) {
                patch.insert(key, None);
            }
        }
        return patch;
    }
    let workload = workload_config(labels, policy);
    let wanted: Vec<String> = deploy_components(workload, policy.mode)
        .iter()
        .map(|c| format!("{DEPLOY_PREFIX}{c}"))
        .collect();
    let mig_key = format!("{DEPLOY_PREFIX}mig-manager");
    for key in known_deploy_keys() {
        let keep_mig = workload == Workload::Container && key == mig_key;
        if labels.contains_key(&key) && !wanted.contains(&key) && !keep_mig {
            patch.insert(key, None);
        }
    }
    for key in wanted {
        if labels.get(&key).is_none_or(|v| v.is_empty()) {
            patch.insert(key, Some("true".into()));
        }
    }
    let mig_capable = is_mig_capable(labels);
    if workload == Workload::Container && mig_capable && !labels.contains_key(&mig_key) {
        patch.insert(mig_key, Some("true".into()));
    }
    if policy.mig_manager
        && mig_capable
        && policy.mig_default_config == "all-disabled"
        && labels.get(MIG_CONFIG).is_none_or(|v| v.is_empty())
    {
        patch.insert(MIG_CONFIG.into(), Some("all-disabled".into()));
    }
    patch
}

/// The whole label plan of one node: [`plan_gpu_present`], then [`plan_deploy_labels`] on the
/// result, merged into one minimal patch. Empty when the node is already labelled.
pub fn plan_node_labels(labels: &Labels, policy: &LabelPolicy) -> LabelPatch {
    let mut patch = plan_gpu_present(labels);
    let after = apply_patch(labels, &patch);
    patch.extend(plan_deploy_labels(&after, policy));
    patch
}

/// `labels` with `patch` applied (what the node will carry after the merge patch).
pub fn apply_patch(labels: &Labels, patch: &LabelPatch) -> Labels {
    let mut out = labels.clone();
    for (k, v) in patch {
        match v {
            Some(v) => out.insert(k.clone(), v.clone()),
            None => out.remove(k),
        };
    }
    out
}

#[cfg(test)]
#[path = "labels_tests.rs"]
mod tests;
