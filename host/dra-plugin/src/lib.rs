//! `kiln-dra-plugin`: kiln's DRA kubelet plugin for NVIDIA GPUs (`kiln dra-plugin`), a drop-in
//! for the `gpus` container of NVIDIA's k8s-dra-driver-gpu kubelet plugin (driver
//! `gpu.nvidia.com`).
//!
//! ```text
//!  GpuInventory ─► slices::devices ─► publish (ResourceSlice, one pool per node, written on change)
//!        │               ▲
//!        ├─ XIDs ─► health (a faulty GPU leaves the slice; dra-health stream says why)
//!        │
//!  kubelet ─► server: Registration (<registrar dir>/gpu.nvidia.com-reg.sock)
//!                     DRAPlugin + DRAResourceHealth (<plugins dir>/gpu.nvidia.com/dra.sock)
//!                 └► state::DeviceState::prepare ─► claim (from a watch cache) ─► config (GpuConfig)
//!                                                 ─► cdi (spec per claim) ─► checkpoint (on disk)
//! ```
//!
//! The names, value types and defaults follow NVIDIA's driver (k8s-dra-driver-gpu, read at
//! v25.12 and `main` of 2026-05): attribute and capacity names of its `gpu`/`mig` devices
//! ([`slices`]), its per-claim CDI spec kind `k8s.gpu.nvidia.com/claim` and device names
//! `<claim uid>-<device>` ([`cdi`]), its `GpuConfig` opaque config ([`config`]) and its flag
//! names ([`runtime::Options`]). kiln reuses its device plugin's CDI generator and XID health
//! tracker for the node-side work.

pub mod cdi;
pub mod checkpoint;
pub mod config;
pub mod metrics;
#[cfg(feature = "kube")]
pub mod publish;
pub mod runtime;
pub mod server;
pub mod slices;
pub mod state;

/// The DRA driver name kiln serves, NVIDIA's: the ResourceSlices' `spec.driver`, the claims'
/// allocation results' `driver`, the registration name and the plugin directory's name.
pub const DRIVER_NAME: &str = "gpu.nvidia.com";

/// Code generated from the vendored kubelet protos (both sides; the tests' stand-in kubelet
/// uses the client side).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    /// `k8s.io.kubelet.pkg.apis.dra.v1`: `DRAPlugin`.
    pub mod dra {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// `v1alpha1` (dra-health): `DRAResourceHealth`.
    pub mod health {
        tonic::include_proto!("v1alpha1");
    }
    /// `pluginregistration`: `Registration`.
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
}
