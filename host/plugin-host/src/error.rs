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
    /// A plugin named `oci://…@sha256:…` could not be pulled, or what the registry served is
    /// not the artifact the digest names (a tampered manifest or blob): nothing of it is run or
    /// stored.
    #[error("plugin {plugin:?}: cannot pull: {message}")]
    PullFailed {
        /// The chain entry (the reference).
        plugin: String,
        /// What failed, with expected and actual digests for a mismatch.
        message: String,
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
        "plugin {plugin:?}: forbidden import{} {} (plugins may import only the world's own imports and the virtual WASI)",
        if imports.len() == 1 { "" } else { "s" },
        quoted_list(imports)
    )]
    ForbiddenImport {
        /// Plugin name.
        plugin: String,
        /// Every forbidden import's full name, in declaration order, e.g.
        /// `wasi:filesystem/types@0.2.6`.
        imports: Vec<String>,
    },
    /// The component is bigger than the host compiles, or declares more memories, tables,
    /// core instances or initial memory than one plugin may have; checked on the bytes before
    /// compiling (and nothing is cached), every exceeded bound named at once.
    #[error(
        "plugin {plugin:?}: the component is over {}: {}",
        if exceeded.len() == 1 { "a bound" } else { "several bounds" },
        exceeded.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    ComponentLimit {
        /// Plugin name.
        plugin: String,
        /// Every exceeded bound (at least one), in the order `kiln plugin check` lists them.
        exceeded: Vec<Bound>,
    },
    /// Compiling a drop-in component took longer than [`crate::HostConfig::compile_deadline`].
    #[error("plugin {plugin:?}: compiling took longer than {deadline:?}")]
    CompileTimeout {
        /// Plugin name.
        plugin: String,
        /// The compile deadline.
        deadline: Duration,
    },
    /// A drop-in file has the name of a bundled plugin, and the host is set to refuse that
    /// ([`crate::HostConfig::refuse_shadowing`]).
    #[error(
        "plugin {plugin:?}: drop-in {path:?} shadows the bundled plugin of that name, which this host refuses"
    )]
    ShadowingRefused {
        /// Plugin name.
        plugin: String,
        /// The drop-in file.
        path: PathBuf,
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
    /// The guest tried to grow its linear memories (all of them together) or tables past the
    /// per-call cap.
    #[error("plugin {plugin:?} exceeded its memory limit of {limit_bytes} bytes")]
    MemoryLimit {
        /// Plugin name.
        plugin: String,
        /// The cap, in bytes, on all linear memories of one call together.
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
    /// The chain entry's `settings` were refused: by the plugin's `validate-settings` export
    /// (`kiln:operand@0.2.0`), or because the plugin implements `kiln:operand@0.1.0`, which takes
    /// none. Found when the policy is read, before any transform of the render runs.
    #[error(
        "plugin {plugin:?}: invalid settings: {}",
        errors.iter().map(|e| format!("{}: {}", e.path, e.message)).collect::<Vec<_>>().join("; ")
    )]
    InvalidSettings {
        /// Plugin name.
        plugin: String,
        /// Every refused field (at least one), paths starting with `settings`
        /// (`settings.nodeSelector.pool`), text bounded.
        errors: Vec<SettingsError>,
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
    /// The patched object's `apiVersion`, `kind`, `metadata.name` or `metadata.namespace`
    /// differs from the object the plugin was given (no plugin may change them).
    #[error(
        "plugin {plugin:?}: object {index} ({object}): {field} changed from {before} to {after}; no plugin may change an object's identity"
    )]
    IdentityChanged {
        /// Plugin name.
        plugin: String,
        /// Position of the object in the input.
        index: usize,
        /// `kind/name` of the object before the patch.
        object: String,
        /// JSON Pointer of the member, e.g. `/metadata/namespace`.
        field: &'static str,
        /// The member before, as JSON (`nothing` when absent).
        before: String,
        /// The member after, as JSON (`nothing` when absent), bounded.
        after: String,
    },
    /// A site plugin changed what an RBAC object grants: the `rules` or `aggregationRule` of a
    /// Role/ClusterRole, the `roleRef` or `subjects` of a RoleBinding/ClusterRoleBinding.
    #[error(
        "plugin {plugin:?}: object {index} ({object}): {field} changed; a site plugin may not change RBAC rules, role references or subjects"
    )]
    RbacChanged {
        /// Plugin name.
        plugin: String,
        /// Position of the object in the input.
        index: usize,
        /// `kind/name` of the object.
        object: String,
        /// JSON Pointer of the member, e.g. `/rules` or `/subjects`.
        field: &'static str,
    },
    /// A site plugin widened an operand pod's privileges beyond what its input had (host
    /// namespaces, a privileged container, added capabilities, a hostPath volume), and the host
    /// does not allow that ([`crate::HostConfig::site_pod_privileges`]).
    #[error(
        "plugin {plugin:?}: object {index} ({object}): {field} widens the pod's privileges; site plugins may not (see HostConfig::site_pod_privileges, `--site-pod-privileges`)"
    )]
    PodPrivilegeWidened {
        /// Plugin name.
        plugin: String,
        /// Position of the object in the input.
        index: usize,
        /// `kind/name` of the object.
        object: String,
        /// Path of the widening setting, e.g.
        /// `/spec/template/spec/containers[name=ctr]/securityContext/privileged`.
        field: String,
    },
    /// The patched object serializes to more bytes than [`crate::HostConfig::object_limit_bytes`]
    /// (the API server refuses objects over about 1.5 MiB).
    #[error(
        "plugin {plugin:?}: object {index} ({object}) serializes to more than {limit_bytes} bytes"
    )]
    ObjectTooLarge {
        /// Plugin name.
        plugin: String,
        /// Position of the object in the input.
        index: usize,
        /// `kind/name` of the object.
        object: String,
        /// The bound, in bytes.
        limit_bytes: usize,
        /// Bytes counted before the check gave up: more than `limit_bytes` (counting stops at
        /// the first write past the limit).
        actual_bytes: usize,
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

/// `"a", "b"` for the forbidden-import message.
fn quoted_list(items: &[String]) -> String {
    items
        .iter()
        .map(|i| format!("{i:?}"))
        .collect::<Vec<_>>()
        .join(", ")
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
            | PullFailed { plugin, .. }
            | LoadFailed { plugin, .. }
            | ForbiddenImport { plugin, .. }
            | ComponentLimit { plugin, .. }
            | CompileTimeout { plugin, .. }
            | ShadowingRefused { plugin, .. }
            | IdentityChanged { plugin, .. }
            | RbacChanged { plugin, .. }
            | PodPrivilegeWidened { plugin, .. }
            | ObjectTooLarge { plugin, .. }
            | NameMismatch { plugin, .. }
            | Trap { plugin, .. }
            | OutOfFuel { plugin, .. }
            | DeadlineExceeded { plugin, .. }
            | MemoryLimit { plugin, .. }
            | StackExhausted { plugin }
            | Exited { plugin, .. }
            | Guest { plugin, .. }
            | InvalidSettings { plugin, .. }
            | WrongOutcomeCount { plugin, .. }
            | OutputTooLarge { plugin, .. }
            | InvalidPatch { plugin, .. }
            | InvalidResult { plugin, .. }
            | CallFailed { plugin, .. } => Some(plugin),
        }
    }
}

/// One bound of a component and what a component has against it (`kiln plugin check` prints
/// them all; [`PluginError::ComponentLimit`] lists the exceeded ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// What is counted: `bytes`, `bytes in one function body`, `memories`, `tables`,
    /// `core instances`, `memories in one core module`, `tables in one core module` or
    /// `bytes of initial memory`.
    pub what: &'static str,
    /// How many the component has.
    pub actual: u64,
    /// The most it may have ([`HostConfig`] and the `MAX_*` constants of the crate root).
    pub limit: u64,
}

impl Bound {
    /// Whether the component is over this bound.
    pub fn exceeded(&self) -> bool {
        self.actual > self.limit
    }
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} (limit {})", self.actual, self.what, self.limit)
    }
}

/// One settings field a plugin refused ([`PluginError::InvalidSettings`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError {
    /// `settings`, or `settings.` and the path the plugin named (`settings.nodeSelector.pool`).
    pub path: String,
    /// Why (bounded as any guest text).
    pub message: String,
}

impl SettingsError {
    /// A field error as a plugin's `validate-settings` named it (`path` relative to the
    /// settings, empty for the whole value), bounded and escaped.
    pub(crate) fn from_guest(path: String, message: String) -> Self {
        use crate::text::{MAX_GUEST_TEXT_BYTES, MAX_NAME_BYTES, bounded_owned};
        let path = bounded_owned(path, MAX_NAME_BYTES);
        let path = match path.as_str() {
            "" => "settings".to_string(),
            p if p.starts_with('[') => format!("settings{p}"),
            p => format!("settings.{p}"),
        };
        SettingsError {
            path,
            message: bounded_owned(message, MAX_GUEST_TEXT_BYTES),
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

impl GuestError {
    /// An `invalid-field` error as a guest returned it, bounded and escaped once, here, before
    /// anything prints it.
    pub(crate) fn invalid_field(path: String, message: String) -> Self {
        use crate::text::{MAX_GUEST_TEXT_BYTES, MAX_NAME_BYTES, bounded_owned};
        GuestError::InvalidField {
            path: bounded_owned(path, MAX_NAME_BYTES),
            message: bounded_owned(message, MAX_GUEST_TEXT_BYTES),
        }
    }
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
