//! Guest-side SDK for kiln operand plugins.
//!
//! A plugin is a `cdylib` crate built for `wasm32-wasip2` that implements [`Operand`] and calls
//! [`export_operand!`]. The SDK parses the state's objects and the ClusterPolicy spec, hands the
//! plugin typed objects to edit, and answers the host with one RFC 6902 patch per object
//! (computed with `json_patch::diff`), so plugin code never writes patches by hand.
//!
//! ```text
//! host ──objects, spec, ctx──► SDK (parse) ──► Operand::daemonset / Operand::object ──► SDK (diff) ──patches──► host
//! ```
//!
//! The edit helpers ([`env`], [`image`], [`pod`], [`common`]) follow the upstream GPU Operator's
//! transform semantics (v26.7, `shared/reference/gpu-operator.md` §3.0 and §4) and are plain Rust,
//! so every plugin also unit-tests natively.

pub mod common;
pub mod env;
pub mod error;
pub mod image;
mod macros;
pub mod pod;
mod run;
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod wasm;

pub use error::TransformError;
pub use k8s_openapi;
pub use kiln_core;
pub use kiln_core::context::TransformContext;
pub use kiln_core::spec::ClusterPolicySpec;
pub use run::{Decision, Operand, Outcome, apply_native, run_operand, transform_each};
pub use serde_json;

/// Write a line to the host's log (the `log` import); a no-op natively.
pub fn log_info(message: &str) {
    #[cfg(target_arch = "wasm32")]
    wasm::log(wasm::LogLevel::Info, message);
    #[cfg(not(target_arch = "wasm32"))]
    let _ = message;
}

/// Write a warning to the host's log; a no-op natively.
pub fn log_warn(message: &str) {
    #[cfg(target_arch = "wasm32")]
    wasm::log(wasm::LogLevel::Warn, message);
    #[cfg(not(target_arch = "wasm32"))]
    let _ = message;
}
