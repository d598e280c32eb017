//! Compiled components, cached in memory by content digest and on disk as precompiled
//! artifacts named `<sha256 of the wasm>-<engine compatibility hash>.cwasm`.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::error::PluginError;

/// Where a compiled component came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheHit {
    /// Already compiled by this host.
    Memory,
    /// Loaded from a precompiled artifact in the cache directory.
    Disk,
    /// Compiled now (and written to the cache directory if there is one).
    Compiled,
}

/// The lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Compiled components of one engine.
pub(crate) struct ComponentCache {
    engine: Engine,
    dir: Option<PathBuf>,
    engine_hash: String,
    memory: Mutex<HashMap<String, Component>>,
}

impl ComponentCache {
    /// A cache for `engine`; `dir` is created if needed, and dropped (no disk cache) if that fails.
    pub(crate) fn new(engine: &Engine, dir: Option<PathBuf>) -> Self {
        let dir = dir.filter(|d| match std::fs::create_dir_all(d) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(dir = %d.display(), error = %e, "plugin cache directory unusable; caching in memory only");
                false
            }
        });
        ComponentCache {
            engine: engine.clone(),
            dir,
            engine_hash: engine_hash(engine),
            memory: Mutex::default(),
        }
    }

    /// Whether precompiled artifacts are kept on disk.
    pub(crate) fn has_disk(&self) -> bool {
        self.dir.is_some()
    }

    /// Forgets the components compiled or loaded so far (the disk cache stays).
    pub(crate) fn clear_memory(&self) {
        self.memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// The artifact path for wasm with digest `digest`, if there is a disk cache.
    pub(crate) fn artifact_path(&self, digest: &str) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.join(format!("{digest}-{}.cwasm", self.engine_hash)))
    }

    /// The component for `bytes` (whose SHA-256 is `digest`), compiling it only if neither
    /// cache has it.
    ///
    /// # Errors
    /// [`PluginError::LoadFailed`] when the bytes are not a valid component.
    pub(crate) fn get_or_compile(
        &self,
        plugin: &str,
        digest: &str,
        bytes: &[u8],
    ) -> Result<(Component, CacheHit), PluginError> {
        if let Some(c) = self
            .memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(digest)
        {
            return Ok((c.clone(), CacheHit::Memory));
        }
        let path = self.artifact_path(digest);
        let (component, hit) = match path.as_deref().and_then(|p| self.load_artifact(p)) {
            Some(c) => (c, CacheHit::Disk),
            None => {
                tracing::info!(
                    plugin,
                    "compiling plugin (no precompiled artifact; `kiln plugin precompile` fills the cache ahead of time)"
                );
                let c = compile(&self.engine, plugin, bytes)?;
                if let Some(p) = &path {
                    store_artifact(&c, p);
                }
                (c, CacheHit::Compiled)
            }
        };
        self.memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(digest.to_string(), component.clone());
        Ok((component, hit))
    }

    /// Loads a precompiled artifact; none if it is missing or Wasmtime rejects it.
    #[allow(unsafe_code)]
    fn load_artifact(&self, path: &Path) -> Option<Component> {
        if !path.is_file() {
            return None;
        }
        // SAFETY: `deserialize_file` trusts the file to be a Wasmtime artifact. We only read
        // files this module wrote (`store_artifact`, write-then-rename) into the operator's own
        // cache directory, under a name made of the wasm's SHA-256 and this engine's
        // compatibility hash; Wasmtime itself also checks the header and version.
        match unsafe { Component::deserialize_file(&self.engine, path) } {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %format!("{e:#}"), "ignoring unusable plugin artifact");
                None
            }
        }
    }
}

/// Compiles `bytes` as a component of `engine`. Bytes without the Wasm magic are refused as
/// such rather than with the parser's byte dump.
///
/// # Errors
/// [`PluginError::LoadFailed`] naming `plugin`.
pub(crate) fn compile(
    engine: &Engine,
    plugin: &str,
    bytes: &[u8],
) -> Result<Component, PluginError> {
    let load_failed = |message: String| PluginError::LoadFailed {
        plugin: plugin.to_string(),
        message,
    };
    if !bytes.starts_with(b"\0asm") {
        return Err(load_failed(
            "not a WebAssembly file (no \\0asm header)".into(),
        ));
    }
    Component::from_binary(engine, bytes).map_err(|e| load_failed(format!("{e:#}")))
}

/// Writes `component` to `path` atomically; failures only cost a recompile later.
fn store_artifact(component: &Component, path: &Path) {
    let result = component
        .serialize()
        .map_err(|e| format!("{e:#}"))
        .and_then(|bytes| {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, bytes)
                .and_then(|()| std::fs::rename(&tmp, path))
                .map_err(|e| {
                    let _ = std::fs::remove_file(&tmp);
                    e.to_string()
                })
        });
    if let Err(e) = result {
        tracing::warn!(path = %path.display(), error = %e, "cannot write plugin artifact");
    }
}

/// Feeds `Hash` input into SHA-256, so the engine hash is stable across processes.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    /// Unused: the SHA-256 digest is read instead.
    fn finish(&self) -> u64 {
        0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// First 16 hex digits of the SHA-256 of the engine's precompile compatibility hash.
fn engine_hash(engine: &Engine) -> String {
    let mut h = Sha256Hasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut h);
    hex::encode(&h.0.finalize()[..8])
}
