//! Everything that can go wrong when loading or running a plugin.
//!
//! Every variant that concerns one plugin carries its name in `plugin`, and every message starts
//! with `plugin "<name>"`, so a log line or a ClusterPolicy condition always says which plugin
//! failed.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// A failure of the plugin host, naming the plugin concerned.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The Wasmtime engine could not be created from the [`crate::HostConfig`].
    #[error("cannot create the Wasm engine: {message}")]
    EngineSetup {
        /// Wasmtime's explanation.
        message: String,
    },
    /// No drop-in file and no bundled plugin has this name.
    #[error("plugin {plugin:?} not found ({})", looked_in(drop_in.as_deref()))]
    NotFound {
        /// Requested name.
        plugin: String,
        /// The drop-in path that was tried, if a drop-in directory is configured.
        drop_in: Option<PathBuf>,
    },
    /// The plugin name cannot be a file name (empty, `/`, `..`, …).
    #[error("plugin {plugin:?}: invalid plugin name")]
    InvalidName {
        /// Requested name.
        plugin: String,
    },
    /// The drop-in file exists but could not be read.
    #[error("plugin {plugin:?}: cannot read {path:?}: {source}")]
    ReadFailed {
        /// Plugin name.
        plugin: String,
        /// The drop-in file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The pin is not a 64-digit hexadecimal SHA-256.
    #[error("plugin {plugin:?}: pin {pin:?} is not a sha256 (64 hex digits)")]
    InvalidPin {
        /// Plugin name.
        plugin: String,
        /// The pin as given.
        pin: String,
    },
    /// The plugin is pinned to a SHA-256 that its bytes do not have.
    #[error("plugin {plugin:?}: sha256 is {actual}, but the plugin is pinned to {expected}")]
    DigestMismatch {
        /// Plugin name.
        plugin: String,
        /// The pinned digest (lowercase hex).
        expected: String,
        /// The digest of the bytes found (lowercase hex).
        actual: String,
    },
    /// The bytes are not a valid component, or it does not implement the
    /// `kiln:operand/operand-transform` world.
    #[error("plugin {plugin:?}: cannot load component: {message}")]
    LoadFailed {
        /// Plugin name.
        plugin: String,
        /// Wasmtime's explanation.
        message: String,
    },
    /// The component imports something outside the allowed surface.
    #[error(
        "plugin {plugin:?}: forbidden import {import:?} (plugins may import only the world's own imports and WASI io/cli)"
    )]
    ForbiddenImport {
        /// Plugin name.
        plugin: String,
        /// The import's full name, e.g. `wasi:filesystem/types@0.2.6`.
        import: String,
    },
    /// The component's `name()` differs from the name it was loaded by.
    #[error("plugin {plugin:?}: the component calls itself {exported:?}")]
    NameMismatch {
        /// The name it was loaded by.
        plugin: String,
        /// What its `name` export returned.
        exported: String,
    },
    /// The guest trapped (e.g. `unreachable`, a panic, an out-of-bounds access).
    #[error("plugin {plugin:?} trapped: {message}")]
    Trap {
        /// Plugin name.
        plugin: String,
        /// The trap and its backtrace, as Wasmtime renders it.
        message: String,
    },
    /// The guest used up its fuel (the deterministic instruction budget).
    #[error("plugin {plugin:?} ran out of fuel ({fuel} units)")]
    OutOfFuel {
        /// Plugin name.
        plugin: String,
        /// The fuel the call had.
        fuel: u64,
    },
    /// The guest ran past the wall-clock deadline.
    #[error("plugin {plugin:?} ran past its deadline of {deadline:?}")]
    DeadlineExceeded {
        /// Plugin name.
        plugin: String,
        /// The deadline of one call.
        deadline: Duration,
    },
    /// The guest tried to grow a linear memory past the cap.
    #[error("plugin {plugin:?} exceeded its memory limit of {limit_bytes} bytes")]
    MemoryLimit {
        /// Plugin name.
        plugin: String,
        /// The cap, in bytes, on one linear memory.
        limit_bytes: usize,
    },
    /// The guest overflowed its Wasm stack (e.g. unbounded recursion).
    #[error("plugin {plugin:?} exhausted its stack")]
    StackExhausted {
        /// Plugin name.
        plugin: String,
    },
    /// The guest called `wasi:cli/exit` (or `std::process::exit`).
    #[error("plugin {plugin:?} exited with status {status}")]
    Exited {
        /// Plugin name.
        plugin: String,
        /// The exit status: WASI 0.2 `exit` carries only success (0) or failure (1).
        status: i32,
    },
    /// The guest returned a `transform-error`.
    #[error("plugin {plugin:?} refused: {error}")]
    Guest {
        /// Plugin name.
        plugin: String,
        /// The guest's error, structure kept.
        error: GuestError,
    },
    /// The guest returned a different number of outcomes than objects it was given.
    #[error("plugin {plugin:?} returned {actual} outcomes for {expected} objects")]
    WrongOutcomeCount {
        /// Plugin name.
        plugin: String,
        /// Number of objects passed.
        expected: usize,
        /// Number of outcomes returned.
        actual: usize,
    },
    /// The patches together exceed the output cap.
    #[error(
        "plugin {plugin:?} returned {actual_bytes} bytes of patches, over the limit of {limit_bytes}"
    )]
    OutputTooLarge {
        /// Plugin name.
        plugin: String,
        /// The cap, in bytes.
        limit_bytes: usize,
        /// Total bytes of patch text returned.
        actual_bytes: usize,
    },
    /// A patch is not an RFC 6902 JSON Patch, or does not apply to its object.
    #[error("plugin {plugin:?}: invalid patch for object {index} ({object}): {message}")]
    InvalidPatch {
        /// Plugin name.
        plugin: String,
        /// Position of the object in the input.
        index: usize,
        /// `kind/name` of the object.
        object: String,
        /// Why it was refused.
        message: String,
    },
    /// The patched object is not acceptable (changed identity, not a valid DaemonSet, …).
    #[error("plugin {plugin:?}: invalid result for object {index} ({object}): {message}")]
    InvalidResult {
        /// Plugin name.
        plugin: String,
        /// Position of the object in the input.
        index: usize,
        /// `kind/name` of the object before the patch.
        object: String,
        /// What is wrong.
        message: String,
    },
    /// Any other failure of a call that Wasmtime reported (e.g. instantiation failed).
    #[error("plugin {plugin:?}: call failed: {message}")]
    CallFailed {
        /// Plugin name.
        plugin: String,
        /// Wasmtime's explanation.
        message: String,
    },
}

/// Where a plugin was looked for, for [`PluginError::NotFound`].
fn looked_in(drop_in: Option<&std::path::Path>) -> String {
    match drop_in {
        Some(p) => format!("no {} and no bundled plugin of that name", p.display()),
        None => "no bundled plugin of that name, and no drop-in directory is configured".into(),
    }
}

impl PluginError {
    /// The plugin this error is about, if any (all but [`PluginError::EngineSetup`]).
    pub fn plugin(&self) -> Option<&str> {
        use PluginError::*;
        match self {
            EngineSetup { .. } => None,
            NotFound { plugin, .. }
            | InvalidName { plugin }
            | ReadFailed { plugin, .. }
            | InvalidPin { plugin, .. }
            | DigestMismatch { plugin, .. }
            | LoadFailed { plugin, .. }
            | ForbiddenImport { plugin, .. }
            | NameMismatch { plugin, .. }
            | Trap { plugin, .. }
            | OutOfFuel { plugin, .. }
            | DeadlineExceeded { plugin, .. }
            | MemoryLimit { plugin, .. }
            | StackExhausted { plugin }
            | Exited { plugin, .. }
            | Guest { plugin, .. }
            | WrongOutcomeCount { plugin, .. }
            | OutputTooLarge { plugin, .. }
            | InvalidPatch { plugin, .. }
            | InvalidResult { plugin, .. }
            | CallFailed { plugin, .. } => Some(plugin),
        }
    }
}

/// A `transform-error` returned by a plugin, with its structure kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestError {
    /// A ClusterPolicy field is invalid.
    InvalidField {
        /// Path of the field, e.g. `spec.daemonsets.rollingUpdate.maxUnavailable`.
        path: String,
        /// Why it is rejected.
        message: String,
    },
    /// An input object lacks something the transform needs.
    InvalidObject(String),
    /// Any other failure.
    Failed(String),
}

impl fmt::Display for GuestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GuestError::InvalidField { path, message } => {
                write!(f, "invalid field {path}: {message}")
            }
            GuestError::InvalidObject(m) => write!(f, "invalid object: {m}"),
            GuestError::Failed(m) => write!(f, "failed: {m}"),
        }
    }
}
