//! Turning a failed call into the [`PluginError`] that says what happened.

use wasmtime::Trap;

use crate::capture::{LogSource, PluginLog};
use crate::config::HostConfig;
use crate::error::PluginError;
use crate::sandbox::CallState;
use crate::text::{MAX_ENGINE_TEXT_BYTES, bounded_owned};

/// How many trailing stderr lines (a Rust panic message) are quoted in a trap message.
const STDERR_LINES_QUOTED: usize = 5;

/// The error for a call of `plugin` that Wasmtime failed with `err`.
///
/// A refused memory growth wins over whatever trap followed it (a Rust guest aborts when an
/// allocation fails); then fuel, the epoch deadline and stack overflow are told apart from
/// other traps, and a `wasi:cli/exit` becomes [`PluginError::Exited`].
pub(crate) fn classify(
    plugin: &str,
    cfg: &HostConfig,
    state: &CallState,
    log: &PluginLog,
    err: wasmtime::Error,
) -> PluginError {
    let plugin = plugin.to_string();
    if state.memory.hit {
        return PluginError::MemoryLimit {
            plugin,
            limit_bytes: cfg.memory_limit_bytes,
        };
    }
    if let Some(exit) = err.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return PluginError::Exited {
            plugin,
            status: exit.0,
        };
    }
    match err.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => PluginError::OutOfFuel {
            plugin,
            fuel: cfg.fuel.unwrap_or(0),
        },
        Some(Trap::Interrupt) => PluginError::DeadlineExceeded {
            plugin,
            deadline: cfg.deadline,
        },
        Some(Trap::StackOverflow) => PluginError::StackExhausted { plugin },
        Some(_) => {
            let mut message = format!("{err:#}");
            let stderr = log.messages(LogSource::Stderr);
            if !stderr.is_empty() {
                let tail = &stderr[stderr.len().saturating_sub(STDERR_LINES_QUOTED)..];
                message = format!("{message}; stderr: {}", tail.join(" / "));
            }
            PluginError::Trap {
                plugin,
                message: bounded_owned(message, MAX_ENGINE_TEXT_BYTES),
            }
        }
        None => PluginError::CallFailed {
            plugin,
            message: bounded_owned(format!("{err:#}"), MAX_ENGINE_TEXT_BYTES),
        },
    }
}
