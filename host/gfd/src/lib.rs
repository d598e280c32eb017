//! `kiln-gfd`: GPU feature discovery — the `nvidia.com/*` node labels of upstream GFD
//! (reference `device-plugin.md` §5: product with the `-SHARED` rule, memory, count,
//! replicas, sharing strategy, family, compute capability, CUDA and driver versions, MIG
//! labels per strategy, machine, timestamp), from a [`kiln_gpu::GpuInventory`] and the same
//! device-plugin config file the plugin reads ([`kiln_device_plugin::config`]).
//!
//! ```text
//!  GpuInventory ─┐
//!  config.yaml ──┼─► make_labels (pure) ─► Output::Node   merge patch of metadata.labels
//!  /sys (dmi,pci)┘                      ├► Output::File   features.d for nfd-worker
//!                                       └► Output::Stdout
//! ```
//!
//! **Output: labels go straight onto the Node** (a JSON merge patch of `metadata.labels`,
//! never a full update) by default. Why not NFD's NodeFeature, upstream's default since
//! v0.19: kiln does not deploy NFD, and a NodeFeature only becomes labels when nfd-master
//! runs with `extraLabelNs: [nvidia.com]`, so GFD's labels would silently depend on another
//! operator's setup. A direct patch needs only `patch` on `nodes` (kiln's GFD ClusterRole has
//! it). GFD owns exactly the keys it wrote last, recorded in the
//! [`OWNED_LABELS_ANNOTATION`] annotation, so a later pass removes labels it no longer
//! produces (e.g. MIG labels after a strategy change) and never touches the operator's
//! labels. Labels are kept when GFD exits (upstream's file mode drops them, issue #796). The
//! features.d file (`--output file`) remains for clusters that run NFD.

mod host;
mod labels;
mod mig;
mod output;
mod run;

use std::path::PathBuf;

pub use host::{read_machine, read_pci_modes};
pub use labels::{
    GpuMode, LabelInput, Labels, PREFIX, clean_name, expressible, family, make_labels,
};
pub use mig::profile_slices;
pub use output::{
    OWNED_LABELS_ANNOTATION, make_node_patch, patch_node, render_lines, write_features_file,
};
pub use run::{DEFAULT_SLEEP_INTERVAL, Effective, Options, Output, run, snapshot, write};

/// Why labelling failed.
#[derive(Debug, thiserror::Error)]
pub enum GfdError {
    /// NVML's driver version is not `X.Y[.Z]` (upstream's labeler error).
    #[error("driver version {0:?} is not of the form X.Y[.Z]")]
    DriverVersion(String),
    /// MPS sharing is configured and a GPU is in MIG mode.
    #[error(
        "error creating sharing labeler: failed to check MPS-capable: MPS sharing is not supported for mig devices (GPU {index} has MIG enabled)"
    )]
    MpsWithMig {
        /// The MIG-enabled GPU.
        index: u32,
    },
    /// The GPU inventory could not be read.
    #[error("reading the GPU inventory")]
    Gpu(#[from] kiln_gpu::GpuError),
    /// The device-plugin config file is unreadable or invalid.
    #[error("loading the device-plugin config")]
    Config(#[from] kiln_device_plugin::config::ConfigError),
    /// The features.d file could not be written.
    #[error("writing labels to {}", path.display())]
    OutputFile {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The Node could not be read or patched.
    #[error("labelling node {node}")]
    Kube {
        /// The node.
        node: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
}
