//! The device plugin's config file, version `v1` (reference `device-plugin.md` §2), shared with
//! GFD so both derive sharing from the same file.
//!
//! ```yaml
//! version: v1
//! flags:
//!   migStrategy: none            # none | single | mixed
//!   plugin: {deviceListStrategy: [envvar], deviceIDStrategy: uuid}
//! sharing:
//!   timeSlicing:
//!     renameByDefault: false
//!     failRequestsGreaterThanOne: false
//!     resources: [{name: nvidia.com/gpu, replicas: 5}]
//! ```
//!
//! Differences from upstream (which decodes with Go's `encoding/json`): keys are exact
//! (camelCase) and **unknown keys are rejected** with their field path (upstream ignores them,
//! issue #1433); `sharing.mps` and `sharing.timeSlicing` together are rejected (§9.6). Values
//! that upstream rejects are rejected with upstream's message, prefixed by the field path.
//!
//! Entry points: [`Config::from_yaml`], [`Config::from_file`], then [`Config::sharing`] for the
//! per-resource replicas and renames.

mod schema;
mod sharing;
mod validate;

use std::path::{Path, PathBuf};

pub use schema::{
    AllocationPolicy, Config, DeviceIdStrategy, DeviceListStrategy, Flags, GfdFlags, Imex,
    MigStrategy, PluginFlags, ResourcePattern, Resources, SharedResourceSpec, SharingSpec,
    SharingSpecs, SleepInterval,
};
pub use sharing::{SharedResource, Sharing, SharingStrategy};
pub use validate::MAX_REPLICAS;

/// The resource-name prefix every advertised resource carries.
pub const RESOURCE_PREFIX: &str = "nvidia.com/";
/// The full-GPU resource, `nvidia.com/gpu`.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Why a config could not be used. `Display` starts with the file (when there is one) and the
/// field path, then upstream's message where upstream has one.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read: missing, not a regular file, over
    /// [`kiln_input::MAX_FILE_BYTES`], not UTF-8 (the source names the file).
    #[error("reading the config file")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong, naming the file.
        #[source]
        source: kiln_input::InputError,
    },
    /// Not YAML/JSON, a wrong type, an unknown or repeated key, nested too deep (the rules of
    /// [`kiln_input::yaml`]); `path` is the field path
    /// (`sharing.timeSlicing.resources[0].replicas`, `.` for the document).
    #[error("{path}: {message}")]
    Syntax {
        /// Field path.
        path: String,
        /// The decoder's message (names the unknown field and the expected ones).
        message: String,
    },
    /// A value upstream also rejects; `message` is upstream's text (e.g.
    /// `number of replicas must be >= 2`).
    #[error("{path}: {message}")]
    Invalid {
        /// Field path.
        path: String,
        /// Upstream's error string.
        message: String,
    },
    /// An error in a named file (the source says what and where).
    #[error("config file {}", file.display())]
    InFile {
        /// The file.
        file: PathBuf,
        /// What is wrong in it.
        #[source]
        source: Box<ConfigError>,
    },
}

impl ConfigError {
    /// The upstream-style message without the field path (what upstream would print).
    #[must_use]
    pub fn message(&self) -> String {
        match self {
            Self::Read { source, .. } => source.to_string(),
            Self::Syntax { message, .. } | Self::Invalid { message, .. } => message.clone(),
            Self::InFile { source, .. } => source.message(),
        }
    }

    pub(crate) fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl Config {
    /// Parses and validates a config document (YAML or JSON) with kiln's one loader
    /// ([`kiln_input::yaml::from_str`]: duplicate keys, depth over [`kiln_input::MAX_DEPTH`] and
    /// text over 1 MiB are refused). An empty document is the default config. Afterwards upstream's `DisableResourceNamingInConfig` is applied:
    /// `resources` is dropped, and each shared resource's `rename` is derived from
    /// `renameByDefault` (a warning is logged when the file set something else) and `devices`
    /// becomes `all`.
    ///
    /// # Errors
    /// [`ConfigError::Syntax`] (unknown key, wrong type) or [`ConfigError::Invalid`] (upstream's
    /// messages, §2.4), both with the field path.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let mut cfg: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            kiln_input::yaml::from_str(text).map_err(|e| ConfigError::Syntax {
                path: e.path,
                message: e.message,
            })?
        };
        validate::validate(&mut cfg)?;
        Ok(cfg)
    }

    /// Reads `path` (a regular file of at most [`kiln_input::MAX_FILE_BYTES`]) and parses it
    /// (see [`Config::from_yaml`]).
    ///
    /// # Errors
    /// [`ConfigError::Read`], or [`ConfigError::InFile`] wrapping the parse error.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = read_file(path)?;
        Self::from_yaml(&text).map_err(|e| ConfigError::InFile {
            file: path.to_owned(),
            source: Box::new(e),
        })
    }

    /// The active sharing: which strategy, and per resource its replicas and advertised name.
    #[must_use]
    pub fn sharing(&self) -> Sharing {
        Sharing::from_config(self)
    }
}

/// Reads a config file with kiln's bounded reader (regular file, at most
/// [`kiln_input::MAX_FILE_BYTES`]).
///
/// # Errors
/// [`ConfigError::Read`].
pub fn read_file(path: &Path) -> Result<String, ConfigError> {
    kiln_input::read_bounded(path, kiln_input::MAX_FILE_BYTES).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })
}

/// `gpu` → `nvidia.com/gpu`; names that already carry the prefix are kept (upstream rule §2.3).
#[must_use]
pub fn qualify_resource_name(name: &str) -> String {
    if name.starts_with(RESOURCE_PREFIX) {
        name.to_owned()
    } else {
        format!("{RESOURCE_PREFIX}{name}")
    }
}

#[cfg(test)]
mod tests;
