//! The node-label vocabulary: the label map, read access to it, and the label keys kiln and
//! upstream GPU Operator v26.7 agree on. The rules over them are in [`crate::labels`]; types
//! such as [`crate::spec`] read nodes through this module alone.

use std::collections::BTreeMap;

/// Node labels, key → value.
pub type Labels = BTreeMap<String, String>;

/// Read access to one node's labels, for rules that only look labels up: the API's map
/// ([`Labels`]) or a caller's own compact copy of it (the operator's node store).
pub trait LabelLookup {
    /// The value of label `key`, `None` when the node does not carry it.
    fn label(&self, key: &str) -> Option<&str>;
}

impl LabelLookup for Labels {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl<T: LabelLookup + ?Sized> LabelLookup for &T {
    fn label(&self, key: &str) -> Option<&str> {
        (**self).label(key)
    }
}

/// The NFD labels (value `"true"`) that mark a node as having an NVIDIA PCI device.
pub const NFD_GPU_LABELS: [&str; 3] = [
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
];
/// Prefix of every Node Feature Discovery label (used for "NFD is installed").
pub const NFD_PREFIX: &str = "feature.node.kubernetes.io/";
/// `"true"` on GPU nodes, `"false"` once a GPU node lost its PCI labels.
pub const GPU_PRESENT: &str = "nvidia.com/gpu.present";
/// Per-node workload config (`container`, `vm-passthrough`, `vm-vgpu`) when sandbox is on.
pub const WORKLOAD_CONFIG: &str = "nvidia.com/gpu.workload.config";
/// Global per-node kill switch: `"false"` removes every deploy label.
pub const DEPLOY_OPERANDS: &str = "nvidia.com/gpu.deploy.operands";
/// Prefix of the per-operand deploy labels the DaemonSet nodeSelectors require (`"true"`).
pub const DEPLOY_PREFIX: &str = "nvidia.com/gpu.deploy.";
/// Explicit MIG capability published by GFD.
pub const MIG_CAPABLE: &str = "nvidia.com/mig.capable";
/// The MIG config the MIG manager applies.
pub const MIG_CONFIG: &str = "nvidia.com/mig.config";
/// GPU product name published by GFD.
pub const GPU_PRODUCT: &str = "nvidia.com/gpu.product";
/// Set on vGPU hosts; such nodes are never MIG capable here.
pub const VGPU_HOST_DRIVER_VERSION: &str = "nvidia.com/vgpu.host-driver-version";
