//! `kiln-discover`: GPU node discovery for a cluster without Node Feature Discovery — the
//! `feature.node.kubernetes.io/*` labels kiln's states read, computed on each node from its own
//! files and written by that node's agent (`kiln discover`, a DaemonSet of the chart under
//! NVIDIA's `nfd.enabled`) on that node only.
//!
//! ```text
//! <sys>/bus/pci/devices/*/{vendor,class} ─┐
//! <proc>/sys/kernel/osrelease ────────────┼─► features::discover (pure) ─► Labels
//! <host>/etc/os-release ──────────────────┘
//! Labels ─► node::apply: server-side apply on the agent's own Node (field manager kiln-discover)
//! ```
//!
//! | label | from | NFD's source |
//! |---|---|---|
//! | `feature.node.kubernetes.io/pci-<vendor>.present` | a PCI device of that vendor whose class starts with one of the allowed prefixes (NVIDIA's: `02`, `0200`, `0207`, `0300`, `0302`) | `pci` with NVIDIA's `deviceClassWhitelist` and `deviceLabelFields: [vendor]` |
//! | `…/kernel-version.full`, `.major`, `.minor`, `.revision` | the kernel release (`6.8.0-51-generic`: 6, 8, 0) | `kernel` |
//! | `…/system-os_release.ID`, `.VERSION_ID`, `.VERSION_ID.major`, `.VERSION_ID.minor` | the host's os-release | `system` |
//!
//! These are the labels the operator reads: a PCI vendor `10de` label makes a GPU node
//! (`kiln_core::labels::NFD_GPU_LABELS`), the OS labels pick the driver image tag, the full kernel
//! version keys precompiled drivers and the NVIDIADriver pools.
//!
//! **Why kiln's own agent rather than bundling NFD.** NVIDIA's chart installs NFD (a master that
//! may write every node, a worker on every node, a garbage collector, its CRDs and its image) to
//! get these few labels. kiln's agent is the `kiln` binary already pulled for the operands, needs
//! no CRD, and may write only its own node: the chart gives its ServiceAccount node `patch`, and
//! a ValidatingAdmissionPolicy (`kiln-node-discovery`) admits a change only when the node named by
//! the pod-bound token (`authentication.kubernetes.io/node-name`) is the node changed and only
//! `feature.node.kubernetes.io/` labels change. A node that was taken over can so mislabel only
//! itself. A cluster that already runs NFD sets `nfd.enabled=false` (as with NVIDIA's chart).
//! NVIDIA's GFD labels (`nvidia.com/gpu.product`, …) still reach nodes through NFD's NodeFeature
//! objects: the agent does not publish those.
//!
//! Labels this agent applied and no longer computes (a GPU removed) are removed by the same
//! apply (server-side apply drops the fields a manager stops sending); labels another manager
//! wrote (NFD itself) are left alone unless this agent takes them over with the same key.

pub mod features;
pub mod node;

pub use features::{
    HostPaths, Labels, NVIDIA_PCI_CLASSES, NVIDIA_VENDOR, PREFIX, discover, kernel_labels,
    os_release_labels, pci_labels,
};
pub use node::{FIELD_MANAGER, apply, run};

/// What can go wrong discovering or labelling.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A host file that must be readable is not (kernel release, os-release).
    #[error(transparent)]
    Input(#[from] kiln_input::InputError),
    /// The PCI device directory cannot be listed.
    #[error("cannot list PCI devices in {dir}: {error}")]
    Pci {
        /// `<sys>/bus/pci/devices`.
        dir: std::path::PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The API server refused or failed the node patch.
    #[error("labelling node {node}: {error}")]
    Kube {
        /// The node.
        node: String,
        /// kube's error.
        error: Box<kube::Error>,
    },
}
