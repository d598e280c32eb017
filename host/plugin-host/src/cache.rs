//! Compiled components, cached in memory by content digest and on disk as precompiled
//! artifacts named `<sha256 of the wasm>-<engine compatibility hash>.cwasm`.
//!
//! An artifact is native code that Wasmtime maps and runs without checking it, so it is used
//! only when it verifiably belongs to the wasm it is named after: when the host writes an
//! artifact it also writes `<artifact>.sha256`, recording the artifact's own SHA-256 and the
//! wasm's, and on load it hashes the artifact through an open descriptor (about 3 ms per MiB)
//! and maps that same file only if both match; otherwise it warns, recompiles and rewrites
//! both. A `.cwasm` swapped for another plugin's (or for any other file), truncated, or without
//! its record is therefore never run. What this cannot stop is someone who can write the
//! cache directory forging both files for code of their own: the directory must be writable
//! only by the host (the operator's is an `emptyDir` its init container fills).

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// Forgets a digest's single-flight lock ([`ComponentCache::get_or_compile`]) when its load
/// ends, whichever way; only that lock, not one a later caller made after it was forgotten.
struct Flight<'a> {
    loading: &'a Mutex<HashMap<String, Arc<Mutex<()>>>>,
    digest: &'a str,
    gate: Arc<Mutex<()>>,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let mut loading = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        if loading
            .get(self.digest)
            .is_some_and(|g| Arc::ptr_eq(g, &self.gate))
        {
            loading.remove(self.digest);
        }
    }
}

/// Compiled components of one engine.
pub(crate) struct ComponentCache {
    engine: Engine,
    dir: Option<PathBuf>,
    engine_hash: String,
    memory: Mutex<HashMap<String, Component>>,
    /// One lock per digest being loaded or compiled, so that callers asking for the same
    /// component at once (the render's workers loading the bundled plugins, which are one
    /// component) wait for the first one's compile instead of each compiling it again.
    loading: Mutex<HashMap<String, Arc<Mutex<()>>>>,
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
            loading: Mutex::default(),
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

    /// Forgets the component of `digest`: from memory, and its artifact and record from disk
    /// (a plugin refused after it was compiled leaves nothing behind).
    pub(crate) fn forget(&self, digest: &str) {
        self.memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(digest);
        if let Some(path) = self.artifact_path(digest) {
            let _ = std::fs::remove_file(record_path(&path));
            let _ = std::fs::remove_file(&path);
        }
    }

    /// The artifact path for wasm with digest `digest`, if there is a disk cache.
    pub(crate) fn artifact_path(&self, digest: &str) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.join(format!("{digest}-{}.cwasm", self.engine_hash)))
    }

    /// The component for `bytes` (whose SHA-256 is `digest`), compiling it only if neither
    /// cache has it; with a `deadline`, a compile runs on its own thread and is given up after
    /// it. `bytes` is called only when the component must be compiled.
    ///
    /// # Errors
    /// [`PluginError::LoadFailed`] when the bytes are not a valid component,
    /// [`PluginError::CompileTimeout`], or what `bytes` returns.
    pub(crate) fn get_or_compile(
        &self,
        plugin: &str,
        digest: &str,
        bytes: impl FnOnce() -> Result<Cow<'static, [u8]>, PluginError>,
        deadline: Option<Duration>,
    ) -> Result<(Component, CacheHit), PluginError> {
        let in_memory = || {
            self.memory
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(digest)
                .cloned()
        };
        if let Some(c) = in_memory() {
            return Ok((c, CacheHit::Memory));
        }
        // Single flight per digest: a second caller waits here, then finds the first one's
        // result in memory (or, if that failed, tries itself).
        let gate = self
            .loading
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(digest.to_string())
            .or_default()
            .clone();
        let flight = Flight {
            loading: &self.loading,
            digest,
            gate,
        };
        let _held = flight.gate.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = in_memory() {
            return Ok((c, CacheHit::Memory));
        }
        let path = self.artifact_path(digest);
        let artifact = path
            .as_deref()
            .and_then(|p| self.load_artifact(plugin, digest, p));
        let (component, hit) = match artifact {
            Some(c) => (c, CacheHit::Disk),
            None => {
                tracing::info!(
                    plugin,
                    "compiling plugin (no precompiled artifact; `kiln plugin precompile` fills the cache ahead of time)"
                );
                let c = match deadline {
                    Some(d) => compile_with_deadline(&self.engine, plugin, bytes()?, d)?,
                    None => compile(&self.engine, plugin, &bytes()?)?,
                };
                if let Some(p) = &path {
                    store_artifact(&c, digest, p);
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

    /// Loads the precompiled artifact of wasm `digest` at `path`; none if it is missing,
    /// its record (`<path>.sha256`) is missing or does not match it (see the module docs), or
    /// Wasmtime rejects it.
    #[allow(unsafe_code)]
    fn load_artifact(&self, plugin: &str, digest: &str, path: &Path) -> Option<Component> {
        let mut file = match std::fs::File::open(path) {
            Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => f,
            _ => return None,
        };
        let recorded = std::fs::read_to_string(record_path(path)).ok();
        let actual = match hash_reader(&mut file) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(plugin, path = %path.display(), error = %e, "cannot read plugin artifact; recompiling");
                return None;
            }
        };
        match recorded.as_deref().map(parse_record) {
            Some(Some((artifact, source))) if artifact == actual && source == digest => {}
            Some(_) => {
                tracing::warn!(plugin, path = %path.display(), "plugin artifact does not match its record (replaced or corrupted); ignoring it and recompiling");
                return None;
            }
            None => {
                tracing::warn!(plugin, path = %path.display(), "plugin artifact has no record of its digest (not written by this host); ignoring it and recompiling");
                return None;
            }
        }
        // SAFETY: `deserialize_file` trusts the file to be a Wasmtime artifact of this engine.
        // The bytes just hashed are those of an artifact this host compiled from the wasm of
        // SHA-256 `digest` (its record says so); we map them through the descriptor we
        // hashed, so a file renamed over `path` since is not what gets mapped. Wasmtime also
        // checks the header and version.
        let result = unsafe { Component::deserialize_file(&self.engine, opened_path(&file, path)) };
        match result {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(plugin, path = %path.display(), error = %format!("{e:#}"), "ignoring unusable plugin artifact");
                None
            }
        }
    }
}

/// The record of the artifact at `artifact`: `<artifact>.sha256`.
pub(crate) fn record_path(artifact: &Path) -> PathBuf {
    let mut name = artifact.as_os_str().to_owned();
    name.push(".sha256");
    PathBuf::from(name)
}

/// The record's text: the artifact's SHA-256 and the wasm's.
fn record_text(artifact_sha256: &str, source_sha256: &str) -> String {
    format!("artifact-sha256 {artifact_sha256}\nsource-sha256 {source_sha256}\n")
}

/// `(artifact sha256, source sha256)` of a record's text, if well-formed.
fn parse_record(text: &str) -> Option<(&str, &str)> {
    let mut lines = text.lines();
    let artifact = lines.next()?.strip_prefix("artifact-sha256 ")?;
    let source = lines.next()?.strip_prefix("source-sha256 ")?;
    Some((artifact, source))
}

/// The lowercase hex SHA-256 of what `reader` yields.
fn hash_reader(reader: &mut impl std::io::Read) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(hasher.finalize()));
        }
        hasher.update(&buf[..n]);
    }
}

/// A path that opens the same file as `file`: `/proc/self/fd/<fd>` on Linux (so what is
/// mapped is what was hashed), else `path` itself.
fn opened_path(file: &std::fs::File, path: &Path) -> PathBuf {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let _ = path;
        PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        path.to_path_buf()
    }
}

/// [`compile`] on its own thread, given up after `deadline` (the thread then finishes the
/// compile and drops it: Wasmtime cannot stop a compile; the size bounds of `audit` bound it).
///
/// # Errors
/// As [`compile`], and [`PluginError::CompileTimeout`].
pub(crate) fn compile_with_deadline(
    engine: &Engine,
    plugin: &str,
    bytes: Cow<'static, [u8]>,
    deadline: Duration,
) -> Result<Component, PluginError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let (engine, name) = (engine.clone(), plugin.to_string());
    std::thread::Builder::new()
        .name("kiln-plugin-compile".into())
        .spawn(move || {
            let _ = tx.send(compile(&engine, &name, &bytes));
        })
        .map_err(|e| PluginError::LoadFailed {
            plugin: plugin.to_string(),
            message: format!("cannot start a compile thread: {e}"),
        })?;
    match rx.recv_timeout(deadline) {
        Ok(result) => result,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(PluginError::CompileTimeout {
            plugin: plugin.to_string(),
            deadline,
        }),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(PluginError::LoadFailed {
            plugin: plugin.to_string(),
            message: "the compiler panicked".into(),
        }),
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
    Component::from_binary(engine, bytes).map_err(|e| {
        load_failed(crate::text::bounded_owned(
            format!("{e:#}"),
            crate::text::MAX_ENGINE_TEXT_BYTES,
        ))
    })
}

/// Writes `component` (compiled from wasm of SHA-256 `digest`) to `path`, and its record
/// next to it, each atomically (record first, so an artifact never lacks one); failures only
/// cost a recompile later.
fn store_artifact(component: &Component, digest: &str, path: &Path) {
    let write = |target: &Path, bytes: &[u8]| {
        let mut tmp = target.as_os_str().to_owned();
        tmp.push(format!(".tmp{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, target))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                e.to_string()
            })
    };
    let result = component
        .serialize()
        .map_err(|e| format!("{e:#}"))
        .and_then(|bytes| {
            let record = record_text(&sha256_hex(&bytes), digest);
            write(&record_path(path), record.as_bytes())?;
            write(path, &bytes)
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
