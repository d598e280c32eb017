//! Choosing this node's config from the mounted ConfigMap directory (one file per key) by the
//! value of the node label `nvidia.com/device-plugin.config` (reference §3, with upstream's
//! error strings).

use std::path::{Path, PathBuf};

use crate::config::ConfigError;

/// Default node label naming the config key.
pub const NODE_LABEL: &str = "nvidia.com/device-plugin.config";

/// Where configs come from and how to choose without a label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigDir {
    /// The ConfigMap mount (`CONFIG_FILE_SRCDIR`).
    pub dir: PathBuf,
    /// `DEFAULT_CONFIG`: the key used when the label is unset.
    pub default_config: Option<String>,
    /// `FALLBACK_STRATEGIES` (`named`, `single`, `empty`), tried in order without label and
    /// default.
    pub fallbacks: Vec<String>,
}

/// The chosen config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// The key, or `None` for the empty config.
    pub name: Option<String>,
    /// File content ("" for the empty config).
    pub text: String,
}

/// Why no config could be chosen (upstream's messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// The directory holds no config.
    #[error("no configuration files available")]
    NoneAvailable,
    /// The label (or default) names a missing key.
    #[error("specified config {0} does not exist")]
    Missing(String),
    /// No label, no default, no fallback applied.
    #[error("no config was set, no default was provided, and all fallbacks failed")]
    FallbacksFailed,
    /// A fallback name that is not `named`, `single` or `empty`.
    #[error("unknown fallback strategy: {0}")]
    UnknownFallback(String),
    /// The directory or file could not be read.
    #[error("reading {path}: {message}")]
    Read {
        /// Path.
        path: PathBuf,
        /// IO error text.
        message: String,
    },
}

impl ConfigDir {
    /// Keys in the directory, sorted: regular entries not starting with `..` (ConfigMap
    /// volume internals); symlinks to files count (that is how ConfigMap keys appear).
    ///
    /// # Errors
    /// [`SelectError::Read`].
    pub fn available(&self) -> Result<Vec<String>, SelectError> {
        let read_err = |e: std::io::Error| SelectError::Read {
            path: self.dir.clone(),
            message: e.to_string(),
        };
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(read_err)? {
            let entry = entry.map_err(read_err)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("..") || entry.path().is_dir() {
                continue;
            }
            out.push(name);
        }
        out.sort();
        Ok(out)
    }

    /// Chooses by `label` (empty = unset), then `default_config`, then the fallbacks.
    ///
    /// # Errors
    /// [`SelectError`]; the running config should be kept.
    pub fn select(&self, label: Option<&str>) -> Result<Selected, SelectError> {
        let keys = self.available()?;
        if keys.is_empty() {
            return Err(SelectError::NoneAvailable);
        }
        let named = |name: &str| -> Result<Selected, SelectError> {
            if !keys.iter().any(|k| k == name) {
                return Err(SelectError::Missing(name.to_owned()));
            }
            self.read(name)
        };
        if let Some(l) = label.filter(|l| !l.is_empty()) {
            return named(l);
        }
        if let Some(d) = self.default_config.as_deref().filter(|d| !d.is_empty()) {
            return named(d);
        }
        for f in &self.fallbacks {
            match f.as_str() {
                "named" if keys.iter().any(|k| k == "default") => return self.read("default"),
                "single" if keys.len() == 1 => return self.read(&keys[0]),
                "empty" => {
                    return Ok(Selected {
                        name: None,
                        text: String::new(),
                    });
                }
                "named" | "single" => {}
                other => return Err(SelectError::UnknownFallback(other.to_owned())),
            }
        }
        Err(SelectError::FallbacksFailed)
    }

    fn read(&self, name: &str) -> Result<Selected, SelectError> {
        let path = self.dir.join(name);
        // Bounded like every config file (regular file, at most 1 MiB).
        let text = crate::config::read_file(&path).map_err(|e| {
            let full = match &e {
                ConfigError::Read { source, .. } => source.to_string(),
                other => other.to_string(),
            };
            let prefix = format!("{}: ", path.display());
            SelectError::Read {
                message: full.strip_prefix(&prefix).unwrap_or(&full).to_owned(),
                path: path.clone(),
            }
        })?;
        Ok(Selected {
            name: Some(name.to_owned()),
            text,
        })
    }
}

/// Writes `text` to `dst` atomically (temp file in the same directory + rename) unless it
/// already holds exactly that; returns whether it wrote. Replaces upstream's symlink, which
/// dangled when the key disappeared (issue #364).
///
/// # Errors
/// The IO error.
pub fn write_if_changed(dst: &Path, text: &str) -> std::io::Result<bool> {
    if std::fs::read_to_string(dst).is_ok_and(|cur| cur == text) {
        return Ok(false);
    }
    let dir = dst.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = dst.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.unwrap_or_default(),
        std::process::id()
    ));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dst)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(keys: &[(&str, &str)]) -> (tempfile::TempDir, ConfigDir) {
        let t = tempfile::tempdir().unwrap();
        for (k, v) in keys {
            std::fs::write(t.path().join(k), v).unwrap();
        }
        std::fs::create_dir(t.path().join("..data")).unwrap();
        let c = ConfigDir {
            dir: t.path().to_owned(),
            default_config: None,
            fallbacks: vec!["named".into(), "single".into()],
        };
        (t, c)
    }

    #[test]
    fn label_then_default_key_then_single() {
        let (_t, c) = dir(&[("default", "a"), ("ts5", "b")]);
        assert_eq!(c.available().unwrap(), ["default", "ts5"]);
        assert_eq!(c.select(Some("ts5")).unwrap().text, "b");
        assert_eq!(c.select(None).unwrap().name.as_deref(), Some("default"));
        assert_eq!(c.select(Some("")).unwrap().text, "a");
        assert_eq!(
            c.select(Some("nope")),
            Err(SelectError::Missing("nope".into()))
        );
        assert_eq!(
            SelectError::Missing("nope".into()).to_string(),
            "specified config nope does not exist"
        );
        let (_t, c) = dir(&[("only", "x")]);
        assert_eq!(c.select(None).unwrap().text, "x");
        let (_t, mut c) = dir(&[("a", "x"), ("b", "y")]);
        assert_eq!(c.select(None), Err(SelectError::FallbacksFailed));
        c.fallbacks.push("bogus".into());
        assert_eq!(
            c.select(None),
            Err(SelectError::UnknownFallback("bogus".into()))
        );
    }

    #[test]
    fn write_if_changed_replaces_atomically_and_skips_equal_content() {
        let t = tempfile::tempdir().unwrap();
        let dst = t.path().join("config").join("config.yaml");
        assert!(write_if_changed(&dst, "a").unwrap());
        assert!(!write_if_changed(&dst, "a").unwrap());
        assert!(write_if_changed(&dst, "b").unwrap());
        assert_eq!(std::fs::read_to_string(&dst).unwrap(), "b");
    }
}
