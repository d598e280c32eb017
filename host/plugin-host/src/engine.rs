//! The one Wasmtime engine of a host, and the ticker thread that drives its epoch deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use wasmtime::{Config, Engine};

use crate::config::{EPOCH_TICK, HostConfig};
use crate::error::PluginError;

/// An engine with fuel metering and epoch interruption on, so that no call can run without a
/// CPU bound.
pub(crate) fn make_engine(cfg: &HostConfig) -> Result<Engine, PluginError> {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .consume_fuel(true)
        .epoch_interruption(true)
        .max_wasm_stack(cfg.max_wasm_stack_bytes)
        .parallel_compilation(true);
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
