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
    Config, DeviceIdStrategy, DeviceListStrategy, Flags, GfdFlags, Imex, MigStrategy, PluginFlags,
    ResourcePattern, Resources, SharedResourceSpec, SharingSpec, SharingSpecs, SleepInterval,
};
pub use sharing::{SharedResource, Sharing, SharingStrategy};

/// The resource-name prefix every advertised resource carries.
pub const RESOURCE_PREFIX: &str = "nvidia.com/";
/// The full-GPU resource, `nvidia.com/gpu`.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Why a config could not be used. `Display` starts with the file (when there is one) and the
/// field path, then upstream's message where upstream has one.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading config file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// Not YAML/JSON, a wrong type, or an unknown key; `path` is the field path
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
    /// An error in a named file.
    #[error("config file {file}: {source}")]
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
    /// Parses and validates a config document (YAML or JSON). An empty document is the
    /// default config. Afterwards upstream's `DisableResourceNamingInConfig` is applied:
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
            let de = serde_yaml_ng::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| {
                let path = e.path().to_string();
                let full = e.into_inner().to_string();
                // serde_yaml_ng prefixes its own (parent) path; keep one path, the precise one.
                let message = match full.split_once(": ") {
                    Some((head, tail)) if path.starts_with(head) => tail.to_owned(),
                    _ => full,
                };
                ConfigError::Syntax { path, message }
            })?
        };
        validate::validate(&mut cfg)?;
        Ok(cfg)
    }

    /// Reads and parses `path` (see [`Config::from_yaml`]).
    ///
    /// # Errors
    /// [`ConfigError::Read`], or [`ConfigError::InFile`] wrapping the parse error.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
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
