//! The standard kiln plugins, compiled to WebAssembly components and embedded in the binary.
//!
//! The build script builds every plugin crate under `plugins/` (every directory but `sdk`) with
//! `cargo build --profile plugin --target wasm32-wasip2` (release, size-optimized, LTO) into `target/plugins`, and embeds each
//! artifact here under the plugin's name, which is its directory name (`plugins/dcgm` →
//! package `kiln-plugin-dcgm` → `kiln_plugin_dcgm.wasm` → plugin `dcgm`).
//!
//! ```no_run
//! let host = kiln_plugin_host::PluginHost::new(Default::default(), kiln_bundled_plugins::BUNDLED)?
//!     .with_bundled_digests(kiln_bundled_plugins::BUNDLED_SHA256);
//! # Ok::<(), kiln_plugin_host::PluginError>(())
//! ```
//!
//! Setting `KILN_SKIP_PLUGIN_BUILD=1` skips the plugin build and embeds nothing (for quick
//! host-only checks); the wasm32-wasip2 target must otherwise be installed
//! (`rustup target add wasm32-wasip2`).

include!(concat!(env!("OUT_DIR"), "/bundled.rs"));

/// The bytes of bundled plugin `name`, if there is one.
pub fn get(name: &str) -> Option<&'static [u8]> {
    BUNDLED.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}
