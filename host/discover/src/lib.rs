//! `kiln-discover`: GPU node discovery for a cluster without Node Feature Discovery — the
//! `feature.node.kubernetes.io/*` labels kiln's states read, computed on each node from its own
//! files and written by that node's agent (`kiln discover`, a DaemonSet of the chart under
//! NVIDIA's `nfd.enabled`) on that node only.
//!
//! ```text
//! <sys>/bus/pci/devices/*/{vendor,class} ─┐
//! <proc>/sys/kernel/osrelease ────────────┼─► features::discover (pure) ──┐
//! <host>/etc/os-release ──────────────────┘                               ├─► node::node_labels
//! <host>/etc/kubernetes/node-feature-discovery/features.d/*                │
//!   ─► local::local_labels (NFD's local source: GFD's nvidia.com/* labels) ┘
//! Labels ─► node::apply: server-side apply on the agent's own Node (field manager kiln-discover)
//! ```
//!
//! | label | from | NFD's source |
//! |---|---|---|
//! | `feature.node.kubernetes.io/pci-<vendor>.present` | a PCI device of that vendor whose class starts with one of the allowed prefixes (NVIDIA's: `02`, `0200`, `0207`, `0300`, `0302`) | `pci` with NVIDIA's `deviceClassWhitelist` and `deviceLabelFields: [vendor]` |
//! | `…/kernel-version.full`, `.major`, `.minor`, `.revision` | the kernel release (`6.8.0-51-generic`: 6, 8, 0) | `kernel` |
//! | `…/system-os_release.ID`, `.VERSION_ID`, `.VERSION_ID.major`, `.VERSION_ID.minor` | the host's os-release | `system` |
//! | GFD's `nvidia.com/gpu.product`, `gpu.count`, `cuda.driver.major`, … ([`local::is_gfd_label`]) and `feature.node.kubernetes.io/*` | the `key=value` files in the host's `features.d` (kiln's GFD writes `gfd` there) | `local` |
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
//! `feature.node.kubernetes.io/` labels and GFD's own keys ([`local::GFD_LABEL_KEY_PATTERN`])
//! change. A node that was taken over can so mislabel only itself, and cannot set the
//! operator's `nvidia.com/gpu.deploy.*` or upgrade labels. A cluster that already runs NFD sets
//! `nfd.enabled=false` (as with NVIDIA's chart).
//!
//! **GFD's labels without NFD.** NVIDIA's GFD publishes `nvidia.com/gpu.product` and the rest
//! through NFD (a NodeFeature object for nfd-master, or a features.d file for nfd-worker's
//! local source); without NFD nothing would turn them into node labels. With the chart's
//! discovery, the chart sets `USE_NODE_FEATURE_API=false` in the ClusterPolicy's `gfd.env` (as
//! NVIDIA's operator does on OpenShift), so GFD writes the host's features.d file that its
//! DaemonSet already mounts, and this agent, reading the host's `/etc` anyway, applies those
//! labels as nfd-worker would ([`local`]). No new RBAC: GFD keeps NVIDIA's (it writes no
//! objects in that mode) and the agent keeps its one node `patch`. The agent looks again every
//! interval (`kiln discover --interval`, 60 s as nfd-worker's), so GFD's labels reach the node
//! within a minute of GFD writing them.
//!
//! Labels this agent applied and no longer computes (a GPU removed) are removed by the same
//! apply (server-side apply drops the fields a manager stops sending); labels another manager
//! wrote (NFD itself) are left alone unless this agent takes them over with the same key.

pub mod features;
pub mod local;
pub mod node;

pub use features::{
    HostPaths, Labels, NVIDIA_PCI_CLASSES, NVIDIA_VENDOR, PREFIX, discover, kernel_labels,
    os_release_labels, pci_labels,
};
pub use local::{GFD_LABEL_KEY_PATTERN, is_gfd_label, local_labels, may_write};
pub use node::{FIELD_MANAGER, apply, node_labels, run};

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
