//! `kiln-device-plugin`: the kubelet device plugin kiln runs on every GPU node
//! (`kiln device-plugin`), and its per-node config selection (`kiln device-plugin config-manager`).
//!
//! Behaviour follows NVIDIA's k8s-device-plugin v0.19 (reference: `device-plugin.md`), with the
//! fixes listed in its §9:
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
