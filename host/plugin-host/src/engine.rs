//! The one Wasmtime engine of a host, and the ticker thread that drives its epoch deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::config::{EPOCH_TICK, HostConfig, MAX_MEMORIES_PER_MODULE, MAX_TABLES_PER_MODULE};
use crate::error::PluginError;

/// Component instances the pooling allocator keeps slots for: the most plugin calls one host
/// runs at the same time.
pub const POOL_SLOTS: u32 = 32;

// The pool is partitioned by construction: every call may hold at most max_memories
// memories, max_tables tables and max_core_instances core instances (checked at load and by
// the call's limiter), and the pool has that many per slot, so a plugin at its bounds cannot
// take a slot's share from another call ("maximum concurrent limit of 64 for memory stripe 0
// reached" was one plugin's 63 memories starving every other call).

/// Set to `1` to write a perf map of plugin code (`/tmp/perf-<pid>.map`) so that `perf`
/// profiles name the Wasm functions; a debugging aid, off by default.
pub const PERFMAP_ENV: &str = "KILN_PLUGIN_PERFMAP";

/// An engine with epoch interruption always on (and fuel metering when configured), so that no
/// call can run without a CPU bound, and a pooling allocator: instantiating into a reused slot
/// (with copy-on-write memory images) is what keeps a fresh store per call cheap.
pub(crate) fn make_engine(cfg: &HostConfig) -> Result<Engine, PluginError> {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(POOL_SLOTS)
        .total_core_instances(POOL_SLOTS * cfg.max_core_instances)
        .total_memories(POOL_SLOTS * cfg.max_memories)
        .total_tables(POOL_SLOTS * cfg.max_tables)
        .max_memories_per_component(cfg.max_memories)
        .max_tables_per_component(cfg.max_tables)
        .max_core_instances_per_component(cfg.max_core_instances)
        .max_memories_per_module(MAX_MEMORIES_PER_MODULE)
        .max_tables_per_module(MAX_TABLES_PER_MODULE)
        .total_stacks(POOL_SLOTS)
        .max_memory_size(cfg.memory_limit_bytes)
        .linear_memory_keep_resident(cfg.keep_resident_bytes)
        .table_keep_resident(cfg.keep_resident_bytes)
        .pagemap_scan(wasmtime::Enabled::Auto);
    let mut config = Config::new();
    config
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
        .wasm_component_model(true)
        .consume_fuel(cfg.fuel.is_some())
        .epoch_interruption(true)
        .max_wasm_stack(cfg.max_wasm_stack_bytes)
        .parallel_compilation(true);
    if std::env::var_os(PERFMAP_ENV).is_some_and(|v| v == "1") {
        // Names of JIT-compiled plugin functions in /tmp/perf-<pid>.map, for `perf record`.
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    Engine::new(&config).map_err(|e| PluginError::EngineSetup {
        message: format!("{e:#}"),
    })
}

/// A background thread advancing the engine's epoch every [`EPOCH_TICK`]; stopped on drop.
#[derive(Debug)]
pub(crate) struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    /// Starts ticking `engine`.
    pub(crate) fn start(engine: &Engine) -> Result<Self, PluginError> {
        let stop = Arc::new(AtomicBool::new(false));
        let engine = engine.clone();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("kiln-plugin-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::park_timeout(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .map_err(|e| PluginError::EngineSetup {
                message: format!("cannot start the epoch ticker: {e}"),
            })?;
        Ok(EpochTicker {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}
