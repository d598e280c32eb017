//! What a plugin can reach: the linker (the world's `log` import plus a WASI io/cli surface
//! with nothing behind it), the per-call store state, and the import audit done at load.

use std::sync::Arc;

use wasmtime::component::{Component, HasData, HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, ResourceLimiter};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::bindings::{v1, v2};
use crate::capture::{LogCollector, LogSource};
use crate::config::{HostConfig, MAX_TABLE_ELEMENTS};

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

/// Every import outside the allowed surface, in declaration order (empty when none).
pub(crate) fn forbidden_imports(engine: &Engine, component: &Component) -> Vec<String> {
    imports_of(engine, component)
        .into_iter()
        .filter(|name| !is_allowed_import(name))
        .collect()
}

/// The budget of one call: all of its linear memories together are capped at `limit_bytes`,
/// all of its tables together at [`MAX_TABLE_ELEMENTS`] elements, and it may create at most
/// [`HostConfig::max_memories`] memories, [`HostConfig::max_tables`] tables and
/// [`HostConfig::max_core_instances`] core instances
/// (the same bounds `load` checks). One store per call, so the sums are per call.
#[derive(Debug)]
pub(crate) struct MemoryCap {
    limit_bytes: usize,
    /// Bytes of all memories of the call now (initial sizes included: Wasmtime asks the
    /// limiter for them when it creates a memory).
    memory_bytes: usize,
    /// Elements of all tables of the call now.
    table_elements: usize,
    /// The growth last granted and not yet done, taken back if it fails.
    pending_memory: usize,
    pending_table: usize,
    /// Set when a memory or table was refused growth past the budget.
    pub(crate) hit: bool,
    /// Most memories, tables and core instances of the call.
    counts: (u32, u32, u32),
}

impl MemoryCap {
    pub(crate) fn new(config: &HostConfig) -> Self {
        MemoryCap {
            limit_bytes: config.memory_limit_bytes,
            counts: (
                config.max_memories,
                config.max_tables,
                config.max_core_instances,
            ),
            memory_bytes: 0,
            table_elements: 0,
            pending_memory: 0,
            pending_table: 0,
            hit: false,
        }
    }
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        let grow = desired.saturating_sub(current);
        let total = self.memory_bytes.saturating_add(grow);
        if total > self.limit_bytes {
            self.hit = true;
            return Ok(false);
        }
        self.memory_bytes = total;
        self.pending_memory = grow;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.memory_bytes -= std::mem::take(&mut self.pending_memory);
        Ok(())
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        let grow = desired.saturating_sub(current);
        let total = self.table_elements.saturating_add(grow);
        if total > MAX_TABLE_ELEMENTS {
            self.hit = true;
            return Ok(false);
        }
        self.table_elements = total;
        self.pending_table = grow;
        Ok(true)
    }

    fn table_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.table_elements -= std::mem::take(&mut self.pending_table);
        Ok(())
    }

    fn instances(&self) -> usize {
        self.counts.2 as usize
    }

    fn tables(&self) -> usize {
        self.counts.1 as usize
    }

    fn memories(&self) -> usize {
        self.counts.0 as usize
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
    /// A state granting nothing, with the budgets of `config`, logging into a fresh collector.
    pub(crate) fn new(plugin: Arc<str>, config: &HostConfig) -> Self {
        let log = LogCollector::new(plugin, config.log_limit_bytes);
        // The builder starts empty: no env, args, preopens or network; stdin is empty.
        let wasi = WasiCtx::builder()
            .stdout(log.stream(LogSource::Stdout))
            .stderr(log.stream(LogSource::Stderr))
            .build();
        CallState {
            wasi,
            table: ResourceTable::new(),
            memory: MemoryCap::new(config),
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

impl v1::kiln::operand::types::Host for CallState {}
impl v2::kiln::operand::types::Host for CallState {}

/// The world's `log` import, as both packages spell it.
macro_rules! log_import {
    ($m:ident) => {
        impl $m::OperandTransformImports for CallState {
            fn log(&mut self, level: $m::LogLevel, message: String) {
                let source = match level {
                    $m::LogLevel::Debug => LogSource::Debug,
                    $m::LogLevel::Info => LogSource::Info,
                    $m::LogLevel::Warn => LogSource::Warn,
                };
                self.log.push(source, message);
            }
        }
    };
}
log_import!(v1);
log_import!(v2);

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
    // Both packages define the top-level `log` import; their `log-level` enums are equal case
    // by case, so the second definition serves both (component types are structural).
    l.allow_shadowing(true);
    v1::OperandTransform::add_to_linker::<CallState, HasSelf<CallState>>(&mut l, |s| s)?;
    v2::OperandTransform::add_to_linker::<CallState, HasSelf<CallState>>(&mut l, |s| s)?;
    l.allow_shadowing(false);
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
