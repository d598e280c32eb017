//! `kiln-device-plugin`: the kubelet device plugin kiln runs on every GPU node
//! (`kiln device-plugin`), and its per-node config selection (`kiln device-plugin config-manager`).
//!
//! Behaviour follows NVIDIA's k8s-device-plugin v0.19 (reference: `device-plugin.md`), with the
//! fixes listed in its §9. [`config`] is the v1 config file, shared with GFD.

pub mod config;
