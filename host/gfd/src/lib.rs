//! `kiln-gfd`: GPU feature discovery — the `nvidia.com/*` node labels of upstream GFD
//! (reference `device-plugin.md` §5: product with the `-SHARED` rule, memory, count,
//! replicas, sharing strategy, family, compute capability, CUDA and driver versions, MIG
//! labels per strategy, machine, timestamp), from a [`kiln_gpu::GpuInventory`] and the same
//! device-plugin config file the plugin reads ([`kiln_device_plugin::config`]).
//!
//! ```text
//!  GpuInventory ─┐
//!  config.yaml ──┼─► make_labels (pure) ─► Output::NodeFeature  nfd.k8s-sigs.io NodeFeature
//!  /sys (dmi,pci)┘                      ├► Output::File         features.d for nfd-worker
//!                                       └► Output::Stdout
//! ```
//!
//! **Output: NVIDIA's contract.** Like NVIDIA's GFD (v0.20.0, what GPU Operator v26.7.0 runs),
//! labels reach the Node through Node Feature Discovery, never by writing the Node: by default
//! (`USE_NODE_FEATURE_API` unset or true) a NodeFeature `nvidia-features-for-<node>` in GFD's
//! namespace, owned by GFD's DaemonSet and pod, which nfd-master turns into node labels
//! ([`write_node_feature`]); with `USE_NODE_FEATURE_API=false` (the operator sets it on
//! OpenShift) the features.d file `/etc/kubernetes/node-feature-discovery/features.d/gfd`
//! that the DaemonSet mounts, read by nfd-worker ([`write_features_file`]). So GFD needs
//! exactly NVIDIA's RBAC (nodes read-only; `nodefeatures` get/list/watch/create/update and
//! `pods` get in its namespace), and NFD must run with `nvidia.com` among its extra label
//! namespaces (`extraLabelNs`), as NVIDIA's chart configures it. The file is kept when GFD
//! exits (NVIDIA's file mode deletes it, issue #796).

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
    NODE_FEATURE_GROUP, NODE_FEATURE_VERSION, NODE_NAME_LABEL, NodeFeatureTarget, node_feature,
    node_feature_differs, node_feature_name, owners_of, render_lines, write_features_file,
    write_node_feature,
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
    /// The NodeFeature (or this pod, its owner) could not be read or written.
    #[error("labelling node {node}")]
    Kube {
        /// The node.
        node: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
}
