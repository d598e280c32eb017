//! Limits and locations of the plugin host.

use std::path::PathBuf;
use std::time::Duration;

/// Default cap on the linear memory of one call, all of the component's memories together:
/// 64 MiB.
pub const DEFAULT_MEMORY_LIMIT_BYTES: usize = 64 << 20;
/// Most table elements of one call, all of the component's tables together (Rust guests use a
/// few hundred).
pub const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Default of [`HostConfig::max_memories`]: most linear memories one component may define,
/// all its core modules together (a Rust guest has one).
pub const MAX_MEMORIES: u32 = 4;
/// Default of [`HostConfig::max_tables`]: most tables one component may define, all its core
/// modules together (a Rust guest and the component shims have a few).
pub const MAX_TABLES: u32 = 8;
/// Most linear memories one core module may define (multi-memory is not used by guests).
pub const MAX_MEMORIES_PER_MODULE: u32 = 1;
/// Most tables one core module may define.
pub const MAX_TABLES_PER_MODULE: u32 = 1;
/// Default of [`HostConfig::max_core_instances`]: most core instances one component may create
/// (a Rust `wasm32-wasip2` guest has 4, componentize-js's default output 4, componentize-py's
/// 14, and 38 with `--stub-wasi`).
pub const MAX_CORE_INSTANCES: u32 = 48;
/// Default cap on a plugin's wasm file: 32 MiB. The standard plugins are 0.3–0.6 MiB; the
/// default outputs of componentize-js (about 12 MB, a JavaScript engine) and componentize-py
/// (about 18.4 MB, a Python interpreter and its standard library) fit, and the compile deadline
/// and memory budgets still bound what such a plugin costs.
pub const DEFAULT_MAX_COMPONENT_BYTES: usize = 32 << 20;
/// Default of [`HostConfig::max_function_body_bytes`]: most bytes of one function body. Compile
/// time grows faster than linearly in a function's size, so one huge function is refused rather
/// than compiled (rustc's largest functions in the standard plugins are under 64 KiB).
pub const MAX_FUNCTION_BODY_BYTES: usize = 1 << 20;
/// Default bound on compiling one drop-in plugin: 120 s. Generous on purpose: a standard-size
/// plugin can take tens of seconds to compile on a loaded 2-core node (`docs/benchmarks.md`);
/// the size bounds keep the worst case finite, the deadline keeps a load from hanging a render.
pub const DEFAULT_COMPILE_DEADLINE: Duration = Duration::from_secs(120);
/// Default cap on one object a plugin returns, serialized as compact JSON: 1 MiB (the API
/// server refuses objects over about 1.5 MiB).
pub const DEFAULT_OBJECT_LIMIT_BYTES: usize = 1 << 20;
/// Environment variable for [`HostConfig::site_pod_privileges`] (`deny` or `allow`).
pub const SITE_POD_PRIVILEGES_ENV: &str = "KILN_SITE_POD_PRIVILEGES";
/// Environment variable for [`HostConfig::refuse_shadowing`] (`true` or `false`).
pub const REFUSE_SHADOWING_ENV: &str = "KILN_REFUSE_SHADOWING";

/// Whether a **site** plugin (any plugin not bundled with kiln) may widen an operand pod's
/// privileges: set `hostPID`, `hostNetwork` or `hostIPC`, make a container `privileged`, add a
/// capability, or add a `hostPath` volume, beyond what the object had when the plugin got it.
/// Standard (bundled) plugins are not restricted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PodPrivileges {
    /// Refuse any widening with [`crate::PluginError::PodPrivilegeWidened`] (the default).
    /// Keeping or dropping what the input had is allowed.
    #[default]
    Deny,
    /// Allow it (a site that ships, say, a privileged monitoring sidecar by plugin).
    Allow,
}

impl std::str::FromStr for PodPrivileges {
    type Err = String;

    /// `deny` or `allow`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "deny" => Ok(PodPrivileges::Deny),
            "allow" => Ok(PodPrivileges::Allow),
            other => Err(format!("expected deny or allow, got {other:?}")),
        }
    }
}
/// Fuel per call when fuel metering is chosen ([`HostConfig::fuel`]): 500 million units
/// (roughly that many Wasm instructions).
pub const DEFAULT_FUEL: u64 = 500_000_000;
/// Default wall-clock deadline per call: 2 s.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(2);
/// Default cap on the total bytes of patch text one call may return: 16 MiB.
pub const DEFAULT_OUTPUT_LIMIT_BYTES: usize = 16 << 20;
/// Default cap on the captured log of one call (log lines, stdout and stderr together): 64 KiB.
pub const DEFAULT_LOG_LIMIT_BYTES: usize = 64 << 10;
/// Default Wasm stack of a call: 1 MiB.
pub const DEFAULT_MAX_WASM_STACK_BYTES: usize = 1 << 20;
/// Default bytes of each plugin memory slot kept mapped between calls: 2 MiB (see
/// [`HostConfig::keep_resident_bytes`]).
pub const DEFAULT_KEEP_RESIDENT_BYTES: usize = 2 << 20;
/// Default drop-in directory for site plugins.
pub const DEFAULT_DROP_IN_DIR: &str = "/etc/kiln/plugins";
/// How often the epoch ticker advances the engine's epoch; the deadline's resolution.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Limits and locations of a [`crate::PluginHost`].
///
/// Every limit applies to every call; there is no way to call a plugin without them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    /// Cap, in bytes, on the linear memory of one call, all of the component's memories
    /// together (default 64 MiB); the elements of all its tables together are capped at
    /// [`MAX_TABLE_ELEMENTS`]. Growing past either fails the call with
    /// [`crate::PluginError::MemoryLimit`].
    pub memory_limit_bytes: usize,
    /// Deterministic fuel per call, or `None` (the default) for the epoch deadline alone.
    /// With `Some(n)` every call gets `n` units (see [`DEFAULT_FUEL`]) and running out fails it
    /// with [`crate::PluginError::OutOfFuel`]; instantiation counts against it. Fuel metering
    /// is compiled into the plugins' code and slows every call (`cargo bench -p kiln-render`
    /// prints the render with and without it), so it is opt-in; the deadline bounds every call
    /// either way.
    pub fuel: Option<u64>,
    /// Wall-clock deadline per call (default 2 s, resolution [`EPOCH_TICK`]), always on.
    /// Exceeding it fails the call with [`crate::PluginError::DeadlineExceeded`].
    pub deadline: Duration,
    /// Cap, in bytes, on the total patch text of one call (default 16 MiB).
    pub output_limit_bytes: usize,
    /// Cap, in bytes, on the captured log of one call: `log` lines, stdout and stderr together
    /// (default 64 KiB). Output past it is dropped and the log is marked truncated.
    pub log_limit_bytes: usize,
    /// Wasm stack size, in bytes (default 1 MiB). Overflowing it fails the call with
    /// [`crate::PluginError::StackExhausted`].
    pub max_wasm_stack_bytes: usize,
    /// Directory searched first for `<name>.wasm` (default `/etc/kiln/plugins`); `None` for
    /// bundled plugins only.
    pub drop_in_dir: Option<PathBuf>,
    /// Directory of precompiled artifacts (default `$KILN_PLUGIN_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/kiln/plugins` or
    /// `~/.cache/kiln/plugins`); `None`, or a directory that cannot be created, disables the disk
    /// cache. It must be writable only by the operator: its files are loaded as native code.
    pub cache_dir: Option<PathBuf>,
    /// Bytes of each linear memory (and table) slot of the instance pool kept mapped between
    /// calls and reset in place rather than returned to the OS (default
    /// [`DEFAULT_KEEP_RESIDENT_BYTES`], 2 MiB; 0 returns every page after every call).
    ///
    /// A call into a slot whose pages were returned takes a page fault on every page it
    /// touches (about 420 per render of the sample, a fifth of its CPU time). On Linux 6.7 and
    /// later (`PAGEMAP_SCAN`) only the pages the call dirtied are reset, with `memset`, and
    /// they stay resident: about 1 MiB per slot a standard plugin uses. Older kernels reset
    /// the slot's first `keep_resident_bytes` whole. A host that idles between rare renders
    /// and counts its resident memory (the operator) sets 0.
    pub keep_resident_bytes: usize,
    /// Cap, in bytes, on one object a plugin returns, serialized as compact JSON (default
    /// [`DEFAULT_OBJECT_LIMIT_BYTES`], 1 MiB); over it the call fails with
    /// [`crate::PluginError::ObjectTooLarge`].
    pub object_limit_bytes: usize,
    /// Whether site plugins may widen operand pods' privileges (default
    /// [`PodPrivileges::Deny`]; `kiln render`/`kiln operator --site-pod-privileges`,
    /// [`SITE_POD_PRIVILEGES_ENV`]).
    pub site_pod_privileges: PodPrivileges,
    /// Refuse a drop-in file named like a bundled plugin with
    /// [`crate::PluginError::ShadowingRefused`] (default `false`: it is loaded, with a warning,
    /// and [`crate::LoadedPlugin::shadows_bundled`] says so; `--refuse-shadowing`,
    /// [`REFUSE_SHADOWING_ENV`]).
    pub refuse_shadowing: bool,
    /// Cap, in bytes, on a plugin's wasm file (default [`DEFAULT_MAX_COMPONENT_BYTES`]).
    pub max_component_bytes: usize,
    /// Most bytes of one function body of a drop-in (default [`MAX_FUNCTION_BODY_BYTES`]).
    pub max_function_body_bytes: usize,
    /// Most linear memories one component may define, all its core modules together (default
    /// [`MAX_MEMORIES`]); the instance pool holds this many per concurrent call.
    pub max_memories: u32,
    /// Most tables one component may define (default [`MAX_TABLES`]); pooled like memories.
    pub max_tables: u32,
    /// Most core instances one component may create (default [`MAX_CORE_INSTANCES`]); pooled
    /// like memories.
    pub max_core_instances: u32,
    /// Bound on compiling one drop-in (site) plugin (default [`DEFAULT_COMPILE_DEADLINE`]);
    /// past it the load fails with [`crate::PluginError::CompileTimeout`]. Bundled plugins are
    /// not bounded (their size is fixed at build time; under load one can take tens of
    /// seconds). Wasmtime cannot stop a compile, so
    /// the compile finishes on its own thread and is discarded; the size bounds
    /// ([`HostConfig::max_component_bytes`], [`MAX_FUNCTION_BODY_BYTES`]) bound that work.
    pub compile_deadline: Duration,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            memory_limit_bytes: DEFAULT_MEMORY_LIMIT_BYTES,
            fuel: None,
            deadline: DEFAULT_DEADLINE,
            output_limit_bytes: DEFAULT_OUTPUT_LIMIT_BYTES,
            log_limit_bytes: DEFAULT_LOG_LIMIT_BYTES,
            max_wasm_stack_bytes: DEFAULT_MAX_WASM_STACK_BYTES,
            drop_in_dir: Some(PathBuf::from(DEFAULT_DROP_IN_DIR)),
            cache_dir: default_cache_dir(),
            keep_resident_bytes: DEFAULT_KEEP_RESIDENT_BYTES,
            object_limit_bytes: DEFAULT_OBJECT_LIMIT_BYTES,
            site_pod_privileges: PodPrivileges::Deny,
            refuse_shadowing: false,
            max_component_bytes: DEFAULT_MAX_COMPONENT_BYTES,
            max_function_body_bytes: MAX_FUNCTION_BODY_BYTES,
            max_memories: MAX_MEMORIES,
            max_tables: MAX_TABLES,
            max_core_instances: MAX_CORE_INSTANCES,
            compile_deadline: DEFAULT_COMPILE_DEADLINE,
        }
    }
}

impl HostConfig {
    /// The defaults without any filesystem: no drop-in directory and no disk cache.
    pub fn in_memory() -> Self {
        HostConfig {
            drop_in_dir: None,
            cache_dir: None,
            ..HostConfig::default()
        }
    }

    /// Every limit of this host by name, with its value and unit, in the order
    /// `kiln plugin check` prints them.
    pub fn limits(&self) -> Vec<(&'static str, String)> {
        let ms = |d: Duration| format!("{} ms", d.as_millis());
        vec![
            ("component bytes", self.max_component_bytes.to_string()),
            (
                "bytes in one function body",
                self.max_function_body_bytes.to_string(),
            ),
            ("memories", self.max_memories.to_string()),
            ("tables", self.max_tables.to_string()),
            ("core instances", self.max_core_instances.to_string()),
            (
                "memories in one core module",
                MAX_MEMORIES_PER_MODULE.to_string(),
            ),
            (
                "tables in one core module",
                MAX_TABLES_PER_MODULE.to_string(),
            ),
            ("memory bytes per call", self.memory_limit_bytes.to_string()),
            ("table elements per call", MAX_TABLE_ELEMENTS.to_string()),
            ("wasm stack bytes", self.max_wasm_stack_bytes.to_string()),
            ("deadline per call", ms(self.deadline)),
            (
                "fuel per call",
                self.fuel
                    .map_or_else(|| "off".to_string(), |f| f.to_string()),
            ),
            ("compile deadline", ms(self.compile_deadline)),
            ("patch bytes per call", self.output_limit_bytes.to_string()),
            ("bytes per object", self.object_limit_bytes.to_string()),
            ("log bytes per call", self.log_limit_bytes.to_string()),
        ]
    }

    /// The epoch deadline in ticks of [`EPOCH_TICK`], rounded up, at least 1.
    pub(crate) fn deadline_ticks(&self) -> u64 {
        let tick = EPOCH_TICK.as_nanos();
        (self.deadline.as_nanos().div_ceil(tick)).max(1) as u64
    }
}

/// Environment variable naming the precompiled-artifact directory (the operator Deployment
/// points it at an `emptyDir` that an init container fills with `kiln plugin precompile`).
pub const CACHE_DIR_ENV: &str = "KILN_PLUGIN_CACHE_DIR";

/// `$KILN_PLUGIN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln/plugins`, else
/// `$HOME/.cache/kiln/plugins`, else none.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(CACHE_DIR_ENV).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("kiln").join("plugins"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_rounds_up_to_ticks() {
        let mut cfg = HostConfig::in_memory();
        assert_eq!(cfg.deadline_ticks(), 200);
        cfg.deadline = Duration::from_millis(15);
        assert_eq!(cfg.deadline_ticks(), 2);
        cfg.deadline = Duration::ZERO;
        assert_eq!(cfg.deadline_ticks(), 1);
    }
}
