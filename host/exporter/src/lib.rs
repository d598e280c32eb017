//! `kiln-exporter`: DCGM-compatible GPU metrics from NVML, with stable pod attribution.
//!
//! ```text
//!  NVML ──(every --collect-interval)──► poller ──► Snapshot ─┐
//!                                                             ├─► render (cached) ──► GET /metrics
//!  kubelet pod-resources ──(every --pod-resources-interval)──► PodState ─┘
//! ```
//!
//! Scrapes never wait on NVML or the kubelet: they render the latest snapshot and pod state
//! (and reuse the body while neither changed). Pod labels come from the deterministic rule in
//! [`attribution`]. See `README.md` for flags and metrics.

pub mod attribution;
pub mod catalogue;
pub mod config;
pub mod devid;
pub mod exposition;
pub mod fields;
pub mod podresources;
pub mod poller;
pub mod process;
pub mod render;
pub mod server;
pub mod snapshot;
pub mod state;

pub use config::{Config, ExporterError, run, serve};
