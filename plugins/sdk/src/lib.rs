//! Guest-side SDK for kiln operand plugins (`kiln:operand@0.2.0`, the WIT package in this
//! crate's `wit/`).
//!
//! A plugin is a `cdylib` crate built for `wasm32-wasip2` that calls [`export_plugin!`] with an
//! edit function, or implements [`Plugin`] (configured by settings) and calls
//! [`export_plugin_with_settings!`]. The SDK parses the state's objects, the ClusterPolicy spec
//! and the settings, hands the plugin each object to edit, and answers the host with one
//! RFC 6902 patch per object (a `json_patch::diff`, or for typed DaemonSet edits
//! ([`transform_typed`]) the changed sections), so plugin code never writes patches by hand.
//!
//! ```text
//! host ──objects, spec, settings, context──► SDK (parse) ──► your edit ──► SDK (patch) ──patches──► host
//! ```
//!
//! Everything here is plain Rust over crates.io crates (`serde_json`, `k8s-openapi`,
//! `json-patch`; `wit-bindgen` on wasm32), so a plugin also unit-tests natively: call
//! [`transform_each`] or [`settings::run_plugin`] and apply the answer with
//! [`apply_outcomes`]. `kiln plugin test PLUGIN.wasm CASES_DIR` runs case files through the
//! compiled component and kiln's own host.

pub mod context;
pub mod error;
mod macros;
mod run;
pub mod settings;
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod wasm;

pub mod bump;

/// With the `leaking-allocator` feature, on wasm32: the plugin's global allocator is a
/// [`bump::Bump`] that (almost) never frees, since the host discards each call's instance.
#[cfg(all(target_arch = "wasm32", feature = "leaking-allocator"))]
#[global_allocator]
static ALLOCATOR: bump::Bump<bump::WasmMemory> = bump::Bump::new(bump::WasmMemory);

pub use context::Context;
pub use error::TransformError;
pub use k8s_openapi;
pub use run::{Decision, Outcome, apply_outcomes, transform_each, transform_typed};
pub use serde_json;
pub use settings::{Call, FieldError, Plugin};

/// The WIT package this SDK is built against (`wit/operand.wit`), as `namespace:name@version`.
pub const WIT_PACKAGE: &str = "kiln:operand@0.2.0";

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
