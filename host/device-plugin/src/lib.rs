//! `kiln-device-plugin`: the kubelet device plugin kiln runs on every GPU node
//! (`kiln device-plugin`), and its per-node config selection (`kiln device-plugin config-manager`).
//!
//! Behaviour follows NVIDIA's k8s-device-plugin v0.20 (reference: `device-plugin.md`): its
//! `sharedDevicesAllocationPolicy` (packed/distributed), NUMA `TopologyInfo` in ListAndWatch and
//! NVLink-aware preferred allocation of whole GPUs ([`allocate`]), with the fixes listed in its
//! §9. kiln's own addition: GPU health reaches the Node ([`node_health`], `kube` feature) — a
//! `GPUHealthy` condition, an Event per transition and, with `KILN_GPU_HEALTH_TAINT`, a
//! `nvidia.com/gpu-unhealthy:NoSchedule` taint (needs `patch` on `nodes` and `nodes/status` and
//! `create` on `events` in the plugin's ClusterRole; without them it logs once and stops).
//!
//! ```text
//!  GpuInventory ─► devices::build_resources ─► Snapshot (watch) ─► server (one socket/resource)
//!        │                 ▲                        ▲                 │ Register ─► kubelet.sock
//!        ├─ XIDs ─► health ┘ (all units of a GPU)   │                 └ ListAndWatch / Allocate
//!        └─ driver version ─► cdi (atomic rewrite)  └ config reloads (file, label + ConfigMap dir)
//! ```
//!
//! [`config`] is the v1 config file, shared with GFD.

pub mod allocate;
pub mod cdi;
pub mod config;
pub mod config_manager;
pub mod devices;
pub mod health;
#[cfg(feature = "kube")]
pub mod node_health;
#[cfg(feature = "kube")]
pub mod node_label;
pub mod runtime;
pub mod selection;
pub mod server;
pub mod settings;

/// Code generated from the vendored kubelet `deviceplugin/v1beta1/api.proto` (both sides).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("v1beta1");
}
