//! The standard kiln plugins, compiled to one WebAssembly component and embedded in the binary.
//!
//! The build script builds `plugins/bundle` (the standard bundle: every plugin crate under
//! `plugins/` but `sdk`, `std` and `bundle`, behind one `name`/`transform`, see
//! `kiln_plugin_std::export_standard_bundle!`) with `cargo build --profile plugin --target
//! wasm32-wasip2 --cfg kiln_standard_bundle` (opt-level 3, LTO) into `target/plugins`, and lists
//! it here once under each plugin's name, which is its directory name (`plugins/dcgm` → plugin
//! `dcgm`). The host compiles the bundle once (every name has the same digest) and tells it the
//! name it was loaded by (`kiln:operand@0.2.0`'s `context.plugin`), which it dispatches on. Besides
//! the standard plugins, one per state, it carries `node-placement`, configured by settings. Each plugin crate still builds alone into a
//! standalone component (`cargo build -p kiln-plugin-dcgm --target wasm32-wasip2`), e.g. as the
//! starting point of a drop-in.
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
