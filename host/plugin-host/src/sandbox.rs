//! What a plugin can reach: the linker (the world's `log` import plus a WASI io/cli surface
//! with nothing behind it), the per-call store state, and the import audit done at load.

use std::sync::Arc;

use wasmtime::component::{Component, HasData, HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, ResourceLimiter};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::bindings::OperandTransform;
use crate::bindings::kiln::operand::types::LogLevel;
use crate::capture::{LogCollector, LogSource};

/// The interfaces (without version) a plugin may import, besides the world's own `log`.
///
/// These are what an ordinary `std` Rust guest for `wasm32-wasip2` imports; all of them are
/// linked to an empty WASI context: no environment, no arguments, empty stdin, stdout and
/// stderr captured into the call's log, and `exit` turned into [`crate::PluginError::Exited`].
pub const ALLOWED_WASI_INTERFACES: &[&str] = &[
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
];

/// The world's own imports: the `types` interface (types only) and the `log` function.
const WORLD_IMPORTS: &[&str] = &["kiln:operand/types", "log"];

/// Whether a component may import `name` (e.g. `wasi:io/streams@0.2.6`).
pub fn is_allowed_import(name: &str) -> bool {
    let unversioned = name.split_once('@').map_or(name, |(n, _)| n);
    WORLD_IMPORTS.contains(&unversioned) || ALLOWED_WASI_INTERFACES.contains(&unversioned)
}

/// The full names of everything `component` imports, in declaration order.
pub(crate) fn imports_of(engine: &Engine, component: &Component) -> Vec<String> {
    component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// The full names of everything `component` exports, in declaration order.
pub(crate) fn exports_of(engine: &Engine, component: &Component) -> Vec<String> {
    component
        .component_type()
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// The first import outside the allowed surface, if any.
pub(crate) fn first_forbidden_import(engine: &Engine, component: &Component) -> Option<String> {
    imports_of(engine, component)
        .into_iter()
        .find(|name| !is_allowed_import(name))
}

/// Caps one linear memory and remembers whether the guest hit the cap.
#[derive(Debug)]
pub(crate) struct MemoryCap {
    limit_bytes: usize,
    /// Set when a memory was refused growth past `limit_bytes`.
    pub(crate) hit: bool,
}

/// Most elements a table may grow to; Rust guests use a few hundred.
const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Most core instances, tables and memories of one plugin instance.
const MAX_INSTANCES: usize = 64;

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit_bytes {
            self.hit = true;
            return Ok(false);
        }
        Ok(maximum.is_none_or(|max| desired <= max))
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS && maximum.is_none_or(|max| desired <= max))
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_INSTANCES
    }
}

/// The data of one call's store. Created fresh for every call and dropped after it.
pub(crate) struct CallState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) memory: MemoryCap,
    pub(crate) log: LogCollector,
}

impl CallState {
    /// A state granting nothing, logging into a fresh collector capped at `log_limit_bytes`.
    pub(crate) fn new(plugin: Arc<str>, memory_limit_bytes: usize, log_limit_bytes: usize) -> Self {
        let log = LogCollector::new(plugin, log_limit_bytes);
        // The builder starts empty: no env, args, preopens or network; stdin is empty.
        let wasi = WasiCtx::builder()
            .stdout(log.stream(LogSource::Stdout))
            .stderr(log.stream(LogSource::Stderr))
            .build();
        CallState {
            wasi,
            table: ResourceTable::new(),
            memory: MemoryCap {
                limit_bytes: memory_limit_bytes,
                hit: false,
            },
            log,
        }
    }
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl crate::bindings::kiln::operand::types::Host for CallState {}

impl crate::bindings::OperandTransformImports for CallState {
    fn log(&mut self, level: LogLevel, message: String) {
        let source = match level {
            LogLevel::Debug => LogSource::Debug,
            LogLevel::Info => LogSource::Info,
            LogLevel::Warn => LogSource::Warn,
        };
        self.log.push(source, message);
    }
}

/// `HasData` projection to the resource table, for the `wasi:io` interfaces.
struct TableOnly;

impl HasData for TableOnly {
    type Data<'a> = &'a mut ResourceTable;
}

/// The linker every plugin is instantiated with: the world's imports and the allowed WASI
/// interfaces, nothing else.
pub(crate) fn make_linker(engine: &Engine) -> wasmtime::Result<Linker<CallState>> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView};
    use wasmtime_wasi::p2::bindings::{cli, sync::io};

    let mut l = Linker::<CallState>::new(engine);
    OperandTransform::add_to_linker::<CallState, HasSelf<CallState>>(&mut l, |s| s)?;
    wasmtime_wasi_io::bindings::wasi::io::error::add_to_linker::<CallState, TableOnly>(
        &mut l,
        |s| &mut s.table,
    )?;
    io::poll::add_to_linker::<CallState, TableOnly>(&mut l, |s| &mut s.table)?;
    io::streams::add_to_linker::<CallState, TableOnly>(&mut l, |s| &mut s.table)?;
    cli::environment::add_to_linker::<CallState, WasiCli>(&mut l, CallState::cli)?;
    cli::exit::add_to_linker::<CallState, WasiCli>(&mut l, CallState::cli)?;
    cli::stdin::add_to_linker::<CallState, WasiCli>(&mut l, CallState::cli)?;
    cli::stdout::add_to_linker::<CallState, WasiCli>(&mut l, CallState::cli)?;
    cli::stderr::add_to_linker::<CallState, WasiCli>(&mut l, CallState::cli)?;
    cli::terminal_input::add_to_linker::<CallState, WasiCli>(&mut l, CallState::cli)?;
    cli::terminal_output::add_to_linker::<CallState, WasiCli>(&mut l, CallState::cli)?;
    cli::terminal_stdin::add_to_linker::<CallState, WasiCli>(&mut l, CallState::cli)?;
    cli::terminal_stdout::add_to_linker::<CallState, WasiCli>(&mut l, CallState::cli)?;
    cli::terminal_stderr::add_to_linker::<CallState, WasiCli>(&mut l, CallState::cli)?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowlist_ignores_versions_and_refuses_the_rest() {
        assert!(is_allowed_import("wasi:io/streams@0.2.6"));
        assert!(is_allowed_import("wasi:cli/terminal-stderr@0.2.0"));
        assert!(is_allowed_import("kiln:operand/types@0.1.0"));
        assert!(is_allowed_import("log"));
        assert!(!is_allowed_import("wasi:filesystem/types@0.2.6"));
        assert!(!is_allowed_import("wasi:sockets/tcp@0.2.6"));
        assert!(!is_allowed_import("wasi:clocks/wall-clock@0.2.6"));
        assert!(!is_allowed_import("wasi:random/random@0.2.6"));
    }
}
