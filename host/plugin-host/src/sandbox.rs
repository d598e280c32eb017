//! What a plugin can reach: the linker (the world's `log` import plus a deterministic virtual
//! WASI), the per-call store state, and the import audit done at load.
//!
//! The virtual WASI keeps a plugin a pure function of its inputs, whatever language it is
//! written in (componentize-py and componentize-js link the whole WASI 0.2 surface):
//! - `wasi:clocks/wall-clock` reads [`VIRTUAL_WALL_CLOCK`] (the Unix epoch) on every call;
//!   `wasi:clocks/monotonic-clock` starts at 0 and moves only when the plugin sleeps or
//!   subscribes to a time, by exactly that much, without waiting (a sleep is ready at once);
//! - `wasi:random/*` draw from a ChaCha generator seeded with a SHA-256 digest of the call's
//!   inputs (see [`call_seed`]): the same inputs give the same bytes;
//! - `wasi:filesystem/*` has no preopened directory, so there is no file to open;
//! - `wasi:sockets/*` refuses every socket and every name lookup (`access-denied`);
//! - `wasi:http/types` and `wasi:http/outgoing-handler` are linked to functions that fail the
//!   call ("access denied") when called, so a plugin that merely links an HTTP client loads;
//! - `wasi:cli` has no environment or arguments, an empty stdin, and stdout and stderr go to
//!   the call's log.
//!
//! Anything else a component imports is refused by name before it is compiled.

use std::sync::Arc;

use rand::SeedableRng as _;
use rand::rngs::StdRng;
use sha2::{Digest, Sha256};
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, HasData, HasSelf, Linker, Resource, ResourceTable};
use wasmtime::{Engine, ResourceLimiter};
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::{HostWallClock, WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_io::poll::{Pollable, subscribe};

use crate::bindings::{v1, v2};
use crate::capture::{LogCollector, LogSource};
use crate::config::{HostConfig, MAX_TABLE_ELEMENTS};

/// The interfaces (without version) a plugin may import, besides the world's own `log`.
///
/// The io/cli part is what an ordinary `std` Rust guest for `wasm32-wasip2` imports; the
/// clocks, random, filesystem and sockets part is what componentize-py and componentize-js
/// link. All of them are the deterministic virtual WASI described in this module: no
/// environment, no arguments, empty stdin, stdout and stderr captured into the call's log,
/// `exit` turned into [`crate::PluginError::Exited`], fixed clocks, seeded random, no files,
/// no network.
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
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:sockets/network",
    "wasi:sockets/instance-network",
    "wasi:sockets/tcp",
    "wasi:sockets/tcp-create-socket",
    "wasi:sockets/udp",
    "wasi:sockets/udp-create-socket",
    "wasi:sockets/ip-name-lookup",
];

/// Interfaces (without version) a plugin may import but not use: every function of them fails
/// the call with "access denied" (componentize-js links an HTTP client by default).
pub const DENIED_INTERFACES: &[&str] = &["wasi:http/types", "wasi:http/outgoing-handler"];

/// What `wasi:clocks/wall-clock` reads on every call: the Unix epoch, 1970-01-01T00:00:00Z.
pub const VIRTUAL_WALL_CLOCK: std::time::Duration = std::time::Duration::ZERO;

/// The world's own imports: the `types` interface (types only) and the `log` function.
const WORLD_IMPORTS: &[&str] = &["kiln:operand/types", "log"];

/// `name` without its `@version`.
fn unversioned(name: &str) -> &str {
    name.split_once('@').map_or(name, |(n, _)| n)
}

/// Whether a component may import `name` (e.g. `wasi:io/streams@0.2.6`): the world's own
/// imports, the virtual WASI ([`ALLOWED_WASI_INTERFACES`]) and the denied interfaces
/// ([`DENIED_INTERFACES`]), any version.
pub fn is_allowed_import(name: &str) -> bool {
    let name = unversioned(name);
    WORLD_IMPORTS.contains(&name)
        || ALLOWED_WASI_INTERFACES.contains(&name)
        || DENIED_INTERFACES.contains(&name)
}

/// The seed of a call's random generators: the SHA-256 of its inputs, each length-prefixed
/// (the plugin's digest, the spec, the settings, every object's text, in order), so that the
/// same inputs draw the same bytes and any changed input draws others.
pub(crate) fn call_seed<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> [u8; 32] {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    hash.finalize().into()
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
    /// The virtual monotonic clock, in nanoseconds since the call started.
    monotonic_ns: u64,
    pub(crate) memory: MemoryCap,
    pub(crate) log: LogCollector,
}

/// The wall clock of the virtual WASI: always [`VIRTUAL_WALL_CLOCK`].
struct FixedWallClock;

impl HostWallClock for FixedWallClock {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(1)
    }

    fn now(&self) -> std::time::Duration {
        VIRTUAL_WALL_CLOCK
    }
}

impl CallState {
    /// A state granting nothing, with the budgets of `config`, logging into a fresh collector,
    /// its random generators seeded with `seed` (see [`call_seed`]).
    pub(crate) fn new(plugin: Arc<str>, config: &HostConfig, seed: [u8; 32]) -> Self {
        let log = LogCollector::new(plugin, config.log_limit_bytes);
        let mut insecure_seed = [0u8; 16];
        insecure_seed.copy_from_slice(&seed[..16]);
        // The builder starts empty: no env, args, preopens or network; stdin is empty.
        let wasi = WasiCtx::builder()
            .stdout(log.stream(LogSource::Stdout))
            .stderr(log.stream(LogSource::Stderr))
            .wall_clock(FixedWallClock)
            .secure_random(StdRng::from_seed(seed))
            .insecure_random(StdRng::from_seed(call_seed([seed.as_slice()])))
            .insecure_random_seed(u128::from_le_bytes(insecure_seed))
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        CallState {
            wasi,
            table: ResourceTable::new(),
            monotonic_ns: 0,
            memory: MemoryCap::new(config),
            log,
        }
    }
}

/// `HasData` projection for the virtual monotonic clock.
struct VirtualClock;

impl HasData for VirtualClock {
    type Data<'a> = VirtualClockView<'a>;
}

/// The virtual monotonic clock of one call and the table its pollables go in.
struct VirtualClockView<'a> {
    now_ns: &'a mut u64,
    table: &'a mut ResourceTable,
}

/// A pollable that is ready at once: a virtual sleep.
struct Elapsed;

#[wasmtime_wasi::async_trait]
impl Pollable for Elapsed {
    async fn ready(&mut self) {}
}

impl VirtualClockView<'_> {
    /// Moves the clock to `until` (when later) and returns a pollable ready at once.
    fn sleep_until(&mut self, until: u64) -> wasmtime::Result<Resource<DynPollable>> {
        *self.now_ns = (*self.now_ns).max(until);
        let elapsed = self.table.push(Elapsed)?;
        subscribe(self.table, elapsed)
    }
}

impl monotonic_clock::Host for VirtualClockView<'_> {
    fn now(&mut self) -> wasmtime::Result<monotonic_clock::Instant> {
        Ok(*self.now_ns)
    }

    fn resolution(&mut self) -> wasmtime::Result<monotonic_clock::Duration> {
        Ok(1)
    }

    fn subscribe_instant(
        &mut self,
        when: monotonic_clock::Instant,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.sleep_until(when)
    }

    fn subscribe_duration(
        &mut self,
        duration: monotonic_clock::Duration,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        let until = self.now_ns.saturating_add(duration);
        self.sleep_until(until)
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

/// The linker every plugin is instantiated with: the world's imports and the virtual WASI
/// (see the module documentation); the denied interfaces are added per component by
/// [`deny_imports`].
pub(crate) fn make_linker(engine: &Engine) -> wasmtime::Result<Linker<CallState>> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView};
    use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView};
    use wasmtime_wasi::filesystem::{WasiFilesystem, WasiFilesystemView};
    use wasmtime_wasi::p2::bindings::{cli, clocks, filesystem, random, sockets, sync};
    use wasmtime_wasi::random::WasiRandom;
    use wasmtime_wasi::sockets::{WasiSockets, WasiSocketsView};

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
    sync::io::poll::add_to_linker::<CallState, TableOnly>(&mut l, |s| &mut s.table)?;
    sync::io::streams::add_to_linker::<CallState, TableOnly>(&mut l, |s| &mut s.table)?;
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
    clocks::wall_clock::add_to_linker::<CallState, WasiClocks>(&mut l, CallState::clocks)?;
    monotonic_clock::add_to_linker::<CallState, VirtualClock>(&mut l, |s| VirtualClockView {
        now_ns: &mut s.monotonic_ns,
        table: &mut s.table,
    })?;
    random::random::add_to_linker::<CallState, WasiRandom>(&mut l, |s| s.wasi.random())?;
    random::insecure::add_to_linker::<CallState, WasiRandom>(&mut l, |s| s.wasi.random())?;
    random::insecure_seed::add_to_linker::<CallState, WasiRandom>(&mut l, |s| s.wasi.random())?;
    filesystem::preopens::add_to_linker::<CallState, WasiFilesystem>(
        &mut l,
        CallState::filesystem,
    )?;
    sync::filesystem::types::add_to_linker::<CallState, WasiFilesystem>(
        &mut l,
        CallState::filesystem,
    )?;
    let options = sockets::network::LinkOptions::default();
    sockets::network::add_to_linker::<CallState, WasiSockets>(
        &mut l,
        &options,
        CallState::sockets,
    )?;
    sockets::instance_network::add_to_linker::<CallState, WasiSockets>(&mut l, CallState::sockets)?;
    sockets::tcp_create_socket::add_to_linker::<CallState, WasiSockets>(
        &mut l,
        CallState::sockets,
    )?;
    sync::sockets::tcp::add_to_linker::<CallState, WasiSockets>(&mut l, CallState::sockets)?;
    // `create-udp-socket` is async in the async bindings; this is its sync binding.
    sync::sockets::udp_create_socket::add_to_linker::<CallState, WasiSockets>(
        &mut l,
        CallState::sockets,
    )?;
    sync::sockets::udp::add_to_linker::<CallState, WasiSockets>(&mut l, CallState::sockets)?;
    sockets::ip_name_lookup::add_to_linker::<CallState, WasiSockets>(&mut l, CallState::sockets)?;
    Ok(l)
}

/// Whether `component` imports one of the [`DENIED_INTERFACES`].
pub(crate) fn imports_denied(engine: &Engine, component: &Component) -> bool {
    imports_of(engine, component)
        .iter()
        .any(|name| DENIED_INTERFACES.contains(&unversioned(name)))
}

/// The marker type of the resources of a denied interface (none is ever created).
struct Denied;

/// The host type of resource `name` of a denied interface: the `wasi:io` resources it uses
/// (`input-stream`, `output-stream`, `pollable`, `io-error`) are the linked `wasi:io` ones;
/// its own resources are [`Denied`] (they can never be created).
fn denied_resource_type(name: &str) -> wasmtime::component::ResourceType {
    use wasmtime::component::ResourceType;
    use wasmtime_wasi_io::streams::{DynInputStream, DynOutputStream};
    match name {
        "input-stream" => ResourceType::host::<DynInputStream>(),
        "output-stream" => ResourceType::host::<DynOutputStream>(),
        "pollable" => ResourceType::host::<DynPollable>(),
        "io-error" => ResourceType::host::<wasmtime_wasi_io::streams::Error>(),
        _ => ResourceType::host::<Denied>(),
    }
}

/// Defines, in `linker`, every import of `component` from one of the [`DENIED_INTERFACES`]:
/// its resource types, and functions that fail the call with "access denied" (so that an HTTP
/// client linked but not used costs nothing, and one that is used gets no network).
pub(crate) fn deny_imports(
    linker: &mut Linker<CallState>,
    engine: &Engine,
    component: &Component,
) -> wasmtime::Result<()> {
    for (name, item) in component.component_type().imports(engine) {
        let ComponentItem::ComponentInstance(instance) = item.ty else {
            continue;
        };
        if !DENIED_INTERFACES.contains(&unversioned(name)) {
            continue;
        }
        let mut root = linker.root();
        let mut defined = root.instance(name)?;
        for (export, item) in instance.exports(engine) {
            match item.ty {
                ComponentItem::ComponentFunc(_) => {
                    let what = format!("{name}#{export}");
                    defined.func_new(export, move |_, _, _, _| {
                        wasmtime::bail!("access denied: {what} (plugins have no network)")
                    })?;
                }
                ComponentItem::Resource(_) => {
                    defined.resource(export, denied_resource_type(export), |_, _| Ok(()))?;
                }
                _ => {}
            }
        }
    }
    Ok(())
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
        assert!(is_allowed_import("wasi:filesystem/types@0.2.6"));
        assert!(is_allowed_import("wasi:sockets/tcp@0.2.9"));
        assert!(is_allowed_import("wasi:clocks/wall-clock@0.2.12"));
        assert!(is_allowed_import("wasi:random/random@0.2.6"));
        assert!(is_allowed_import("wasi:http/outgoing-handler@0.2.10"));
        assert!(!is_allowed_import("wasi:http/incoming-handler@0.2.10"));
        assert!(!is_allowed_import("wasi:keyvalue/store@0.2.0"));
        assert!(!is_allowed_import("wasi:cli/run@0.2.6"));
    }

    #[test]
    fn the_seed_is_a_function_of_every_input() {
        let a = call_seed([b"ab".as_slice(), b"c".as_slice()]);
        assert_eq!(a, call_seed([b"ab".as_slice(), b"c".as_slice()]));
        // Length prefixes keep the boundary: "ab"+"c" is not "a"+"bc".
        assert_ne!(a, call_seed([b"a".as_slice(), b"bc".as_slice()]));
    }
}
