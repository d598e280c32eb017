//! kiln's plugin host: runs operand transforms as sandboxed WebAssembly components.
//!
//! A plugin implements the `kiln:operand/operand-transform` world of `kiln:operand@0.2.0`
//! (`wit/operand.wit`; `0.1.0` components, `wit/v0.1.0/operand.wit`, still load): it gets a
//! state's objects, the ClusterPolicy spec, its chain entry's settings and the cluster facts,
//! and answers one outcome (an RFC 6902 JSON Patch, or *omit*) per object. The host applies and
//! validates the patches.
//!
//! ```text
//! name ──► drop-in dir / bundled (shadowing?) ──► audit on the bytes (every bound, imports)
//!      ──► sha256 (pin?) ──► compile (deadline) or cache (memory, disk: artifact digest checked)
//!      ──► link as 0.2.0 or 0.1.0 (InstancePre) ──► name() check ──► LoadedPlugin
//!          (refused after compiling: its artifact is removed)
//! chain ─► every step loaded, settings checked (validate-settings) ──► per step:
//! call ──► fresh Store (memory cap, epoch deadline, fuel if set, virtual WASI) ──► transform()
//!      ──► outcomes ──► json-patch ──► output policy (identity, DaemonSet selector, size;
//!          site: typed DaemonSet, RBAC, pod privileges) ──► Rendered
//! ```
//!
//! Plugins get **no capabilities** and are deterministic: the only imports they may have are
//! the world's `log` and WASI 0.2 ([`ALLOWED_WASI_INTERFACES`], [`DENIED_INTERFACES`]), linked
//! to a deterministic virtual system: empty environment, clocks fixed at
//! [`VIRTUAL_WALL_CLOCK`] (sleeps return at once), random seeded from the call's inputs, no
//! files, no network, HTTP "access denied". Anything else is refused at load with
//! [`PluginError::ForbiddenImport`].
//!
//! ```no_run
//! use kiln_plugin_host::{HostConfig, PluginHost, Rendered};
//! # fn main() -> Result<(), kiln_plugin_host::PluginError> {
//! let host = PluginHost::new(HostConfig::default(), &[])?;
//! let ctx = kiln_core::context::TransformContext::default();
//! let objects = vec![serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})];
//! let out = host.transform("device-plugin", &objects, &serde_json::json!({}), &ctx)?;
//! assert_eq!(out.rendered.len(), 1);
//! # Ok(()) }
//! ```

mod audit;
mod bindings;
mod cache;
mod capture;
mod chain;
mod config;
mod engine;
mod error;
mod host;
mod inspect;
mod meta;
pub mod oci;
mod outcome;
mod patch;
mod sandbox;
pub mod text;
mod trap;
pub mod wit_package;

pub use cache::{CacheHit, sha256_hex};
pub use capture::{LogLine, LogSource, PluginLog};
pub use chain::{ChainInput, ChainOutput, Omitted, PluginRef};
pub use config::{
    CACHE_DIR_ENV, DEFAULT_COMPILE_DEADLINE, DEFAULT_DEADLINE, DEFAULT_DROP_IN_DIR, DEFAULT_FUEL,
    DEFAULT_KEEP_RESIDENT_BYTES, DEFAULT_LOG_LIMIT_BYTES, DEFAULT_MAX_COMPONENT_BYTES,
    DEFAULT_MAX_WASM_STACK_BYTES, DEFAULT_MEMORY_LIMIT_BYTES, DEFAULT_OBJECT_LIMIT_BYTES,
    DEFAULT_OUTPUT_LIMIT_BYTES, EPOCH_TICK, HostConfig, MAX_CORE_INSTANCES,
    MAX_FUNCTION_BODY_BYTES, MAX_MEMORIES, MAX_MEMORIES_PER_MODULE, MAX_TABLE_ELEMENTS, MAX_TABLES,
    MAX_TABLES_PER_MODULE, PodPrivileges, REFUSE_SHADOWING_ENV, SITE_POD_PRIVILEGES_ENV,
    default_cache_dir,
};
pub use engine::PERFMAP_ENV;
pub use error::{Bound, GuestError, PluginError, SettingsError};
pub use host::{CallInput, Interface, LoadedPlugin, PluginHost, PluginSource, TransformOutput};
pub use inspect::{INSPECTED, PluginReport, inspect, inspect_as};
pub use meta::PolicyMeta;
pub use outcome::Rendered;
pub use sandbox::{
    ALLOWED_WASI_INTERFACES, DENIED_INTERFACES, VIRTUAL_WALL_CLOCK, is_allowed_import,
};

#[cfg(test)]
mod send_sync {
    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn host_is_send_and_sync() {
        assert_send_sync::<super::PluginHost>();
        assert_send_sync::<super::LoadedPlugin>();
    }
}
