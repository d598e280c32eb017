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
pub mod podmeta;
pub mod podresources;
pub mod poller;
pub mod process;
pub mod render;
pub mod server;
pub mod snapshot;
pub mod state;
pub mod xid;

pub use config::{Config, ExporterError, run, serve};

/// `err: cause: cause…`, for log lines (error types here keep causes in `source()`).
#[must_use]
pub fn error_chain(err: &dyn std::error::Error) -> String {
    kiln_gpu::error_chain(err)
}

#[cfg(test)]
mod tests {
    #[test]
    fn error_chain_joins_causes_once() {
        let e = crate::ExporterError::Io {
            what: "binding x".into(),
            source: std::io::Error::other("in use"),
        };
        assert_eq!(super::error_chain(&e), "binding x: in use");
    }
}
