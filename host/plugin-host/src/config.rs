//! Limits and locations of the plugin host.

use std::path::PathBuf;
use std::time::Duration;

/// Default cap on one linear memory of a plugin: 64 MiB.
pub const DEFAULT_MEMORY_LIMIT_BYTES: usize = 64 << 20;
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
    /// Cap, in bytes, on each linear memory of a plugin instance (default 64 MiB). Growing past
    /// it fails the call with [`crate::PluginError::MemoryLimit`].
    pub memory_limit_bytes: usize,
    /// Deterministic fuel per call, or `None` (the default) for the epoch deadline alone.
    /// With `Some(n)` every call gets `n` units (see [`DEFAULT_FUEL`]) and running out fails it
    /// with [`crate::PluginError::OutOfFuel`]; instantiation counts against it. Fuel metering
    /// is compiled into the plugins' code and costs about a third of their run time (measured
    /// on the standard plugins), so it is opt-in; the deadline bounds every call either way.
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
