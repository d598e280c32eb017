//! `DRIVER_CONFIG_DIGEST`: NVIDIA GPU Operator v26.7.0's algorithm (FNV-1a 32 of the driver
//! pod's install state, as a decimal integer), defined once in
//! [`kiln_core::driver_digest`](kiln_plugin_std::kiln_core::driver_digest) and computed here on
//! the final pod spec, so a cluster taken over from NVIDIA's operator keeps its driver pods.

pub use kiln_plugin_std::kiln_core::driver_digest::{ENV, driver_config_digest as digest};
