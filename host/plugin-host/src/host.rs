//! [`PluginHost`]: plugin lookup, loading and the sandboxed call.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use kiln_core::context::TransformContext;
use serde_json::Value;
use wasmtime::component::Linker;
use wasmtime::{Engine, Store};

use crate::bindings::{VALIDATE_SETTINGS, make_context_v1, make_context_v2, v1, v2};
use crate::cache::{CacheHit, ComponentCache, sha256_hex};
use crate::capture::PluginLog;
use crate::config::HostConfig;
use crate::engine::{EpochTicker, make_engine};
use crate::error::{GuestError, PluginError, SettingsError};
use crate::meta::PolicyMeta;
use crate::outcome::{OutputPolicy, Rendered, StepObjects, apply_outcomes_to, rendered};
use crate::sandbox::{
    CallState, call_seed, deny_imports, forbidden_imports, imports_denied, imports_of, make_linker,
};
use crate::trap::classify;

/// Where a plugin's bytes came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginSource {
    /// `<drop-in dir>/<name>.wasm`.
    DropIn(PathBuf),
    /// Compiled into the binary.
    Bundled,
    /// Pulled from a registry by digest: the chain entry `oci://…@sha256:…` (`crate::oci`).
    Oci(String),
}

/// The WIT package a plugin implements, told apart by the `kiln:operand/types` version it
/// imports and the exports it has (`0.2.0` is tried first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interface {
    /// `kiln:operand@0.1.0` (`wit/v0.1.0/operand.wit`): no settings, no policy metadata.
    V0_1,
    /// `kiln:operand@0.2.0` (`wit/operand.wit`).
    V0_2,
}

impl Interface {
    /// The package, e.g. `kiln:operand@0.2.0`.
    pub fn package(self) -> &'static str {
        match self {
            Interface::V0_1 => "kiln:operand@0.1.0",
            Interface::V0_2 => "kiln:operand@0.2.0",
        }
    }
}

/// A linked plugin, per interface version.
pub(crate) enum Pre {
    V1(v1::OperandTransformPre<CallState>),
    /// With the export index of `validate-settings` when the component has it.
    V2(
        v2::OperandTransformPre<CallState>,
        Option<wasmtime::component::ComponentExportIndex>,
    ),
}

/// The inputs of one call besides the objects and the cluster facts.
#[derive(Debug, Clone, Copy)]
pub struct CallInput<'a> {
    /// The ClusterPolicy spec as JSON text.
    pub spec: &'a str,
    /// The chain entry's settings as JSON text (`None`: the plugin gets `null`).
    pub settings: Option<&'a str>,
    /// The policy's name and annotations.
    pub policy: &'a PolicyMeta,
}

/// A plugin ready to run: compiled, audited, linked, and its name checked.
pub struct LoadedPlugin {
    name: Arc<str>,
    digest: String,
    source: PluginSource,
    cache_hit: CacheHit,
    imports: Vec<String>,
    /// Whether it imports `wasi:random` (its calls then get a seed digested from their inputs;
    /// the others skip the digest).
    draws_random: bool,
    shadows_bundled: bool,
    /// Whether it is a standard bundle, called with the context's `state` set to its name
    /// (see [`accepts_name`]).
    bundle: bool,
    pre: Pre,
}

impl LoadedPlugin {
    /// The name it was loaded by (and that its `name()` export returns).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Lowercase hex SHA-256 of its wasm bytes.
    pub fn sha256(&self) -> &str {
        &self.digest
    }
    /// Where its bytes came from.
    pub fn source(&self) -> &PluginSource {
        &self.source
    }
    /// Where its compiled code came from when it was loaded.
    pub fn cache_hit(&self) -> CacheHit {
        self.cache_hit
    }
    /// Whether its component is a standard bundle (`name()` is
    /// [`kiln_core::context::STANDARD_BUNDLE_NAME`]), which the host calls with the context's
    /// `state` set to this plugin's name.
    pub fn is_bundle(&self) -> bool {
        self.bundle
    }
    /// The WIT package it implements.
    pub fn interface(&self) -> Interface {
        match self.pre {
            Pre::V1(_) => Interface::V0_1,
            Pre::V2(..) => Interface::V0_2,
        }
    }
    /// Whether it exports `validate-settings` (`kiln:operand@0.2.0`,
    /// `operand-transform-validated`).
    pub fn validates_settings(&self) -> bool {
        matches!(self.pre, Pre::V2(_, Some(_)))
    }
    /// Full names of its imports (all within the allowed surface).
    pub fn imports(&self) -> &[String] {
        &self.imports
    }
    /// Whether it is a drop-in file named like a bundled plugin, which it replaces (logged as
    /// a warning at load; refused when [`HostConfig::refuse_shadowing`] is set).
    pub fn shadows_bundled(&self) -> bool {
        self.shadows_bundled
    }
    /// Whether it is a **standard** plugin: code bundled with kiln (from the binary, its
    /// digest computed at build time). Every other plugin is a **site** plugin, whose output
    /// the host holds to the site policy (no RBAC changes; pod privileges per
    /// [`HostConfig::site_pod_privileges`]).
    pub fn is_standard(&self) -> bool {
        self.source == PluginSource::Bundled
    }
    /// How `kiln render`'s `# Source` line names it: its name, plus
    /// ` (drop-in <path>, shadows bundled)` when it replaces a bundled plugin.
    pub fn describe_source(&self) -> String {
        match &self.source {
            PluginSource::DropIn(path) if self.shadows_bundled => format!(
                "{} (drop-in {}, shadows bundled)",
                self.name,
                crate::text::bounded(&path.display().to_string(), 512)
            ),
            _ => self.name.to_string(),
        }
    }
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.name)
            .field("sha256", &self.digest)
            .field("source", &self.source)
            .field("shadows_bundled", &self.shadows_bundled)
            .finish_non_exhaustive()
    }
}

/// The result of one plugin call.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformOutput {
    /// One decision per input object, in input order.
    pub rendered: Vec<Rendered>,
    /// What the plugin logged (bounded).
    pub log: PluginLog,
}

/// Runs operand plugins, each call in a fresh sandbox.
///
/// One engine per host; each plugin is compiled once (cached by content digest in memory and
/// on disk) and pre-linked; every call gets a fresh store with the memory cap, fuel and epoch
/// deadline of the [`HostConfig`]. `Send + Sync`: share it through an `Arc`. A failed call
/// leaves nothing behind, so the next call works.
pub struct PluginHost {
    pub(crate) config: HostConfig,
    pub(crate) engine: Engine,
    linker: Linker<CallState>,
    pub(crate) cache: ComponentCache,
    bundled: HashMap<String, &'static [u8]>,
    /// Build-time SHA-256 of bundled plugins, so loading one from the disk cache never reads
    /// (and so never pages in) its embedded bytes.
    bundled_digests: HashMap<String, String>,
    plugins: RwLock<HashMap<String, Arc<LoadedPlugin>>>,
    /// Plugin calls run so far ([`PluginHost::calls`]).
    calls: AtomicU64,
    /// `validate-settings` answers by (digest, settings text): the refused fields.
    settings_checked: std::sync::Mutex<HashMap<(String, String), Vec<SettingsError>>>,
    /// Plugins named `oci://…` ([`PluginHost::with_oci_fetch`]).
    oci: crate::oci::OciSource,
    _ticker: EpochTicker,
}

impl PluginHost {
    /// A host with limits `config` and the given bundled plugins (name, wasm bytes), e.g.
    /// `kiln_bundled_plugins::BUNDLED`. Bundled plugins are standard: trusted to leave RBAC
    /// and pod privileges as they must, and expected to answer through the SDK's typed operand
    /// path (`kiln_plugin_std::export_operand!`, or `export_standard_bundle!`, which runs the
    /// same path for each plugin it carries), whose DaemonSets the host does not parse again
    /// (`wit/README.md`, output policy). Names whose bytes are the same component (the standard
    /// bundle) share one compiled copy.
    ///
    /// # Errors
    /// [`PluginError::EngineSetup`] when Wasmtime refuses the configuration.
    pub fn new(config: HostConfig, bundled: &[(&str, &'static [u8])]) -> Result<Self, PluginError> {
        let engine = make_engine(&config)?;
        let linker = make_linker(&engine).map_err(|e| PluginError::EngineSetup {
            message: format!("{e:#}"),
        })?;
        let cache_dir = config.cache_dir.clone();
        let cache = ComponentCache::new(&engine, cache_dir.clone());
        let _ticker = EpochTicker::start(&engine)?;
        Ok(PluginHost {
            bundled: bundled.iter().map(|(n, b)| (n.to_string(), *b)).collect(),
            bundled_digests: HashMap::new(),
            config,
            engine,
            linker,
            cache,
            plugins: RwLock::default(),
            calls: AtomicU64::new(0),
            settings_checked: Default::default(),
            oci: crate::oci::OciSource::new(None, cache_dir.as_deref()),
            _ticker,
        })
    }

    /// Supplies the SHA-256 of bundled plugins computed at build time (e.g.
    /// `kiln_bundled_plugins::BUNDLED_SHA256`): a bundled plugin whose precompiled artifact is
    /// in the cache then loads without hashing or reading its embedded bytes, which keeps those
    /// pages out of the process's memory. Digests must be of the bytes given to
    /// [`PluginHost::new`]; a wrong one only misses the cache or loads another build's artifact
    /// of the same digest, so pass digests from the same build as the bytes.
    #[must_use]
    pub fn with_bundled_digests(mut self, digests: &[(&str, &str)]) -> Self {
        self.bundled_digests = digests
            .iter()
            .filter(|(n, _)| self.bundled.contains_key(*n))
            .map(|(n, d)| (n.to_string(), d.to_ascii_lowercase()))
            .collect();
        self
    }

    /// Lets chain entries named `oci://REGISTRY/REPOSITORY@sha256:<hex>` be pulled with
    /// `fetch` (once per digest, verified, kept in `<cache dir>/oci/`, else in memory; see
    /// `crate::oci`). Without it such a plugin loads only when already stored.
    #[must_use]
    pub fn with_oci_fetch(mut self, fetch: std::sync::Arc<dyn crate::oci::OciFetch>) -> Self {
        self.oci = crate::oci::OciSource::new(Some(fetch), self.config.cache_dir.as_deref());
        self
    }

    /// The host's limits.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// Whether precompiled artifacts are kept on disk (a cache directory is configured and
    /// could be created).
    pub fn has_disk_cache(&self) -> bool {
        self.cache.has_disk()
    }

    /// The precompiled-artifact path for wasm with SHA-256 `sha256`, when a disk cache is used.
    pub fn artifact_path(&self, sha256: &str) -> Option<PathBuf> {
        self.cache.artifact_path(sha256)
    }

    /// Resolves `name` (drop-in directory first, then the bundled plugins), checks the pin,
    /// compiles or fetches it from cache, audits its imports, links it and checks its name.
    /// Always re-reads the drop-in file; later [`PluginHost::transform`] calls use the result.
    ///
    /// # Errors
    /// [`PluginError::InvalidName`], [`PluginError::InvalidPin`], [`PluginError::NotFound`],
    /// [`PluginError::ReadFailed`], [`PluginError::ShadowingRefused`],
    /// [`PluginError::DigestMismatch`], [`PluginError::ComponentLimit`],
    /// [`PluginError::LoadFailed`], [`PluginError::CompileTimeout`],
    /// [`PluginError::ForbiddenImport`], [`PluginError::NameMismatch`], or any call error of
    /// its `name()` export.
    pub fn load(&self, name: &str, pin: Option<&str>) -> Result<Arc<LoadedPlugin>, PluginError> {
        check_name(name)?;
        let pin = pin.map(|p| check_pin(name, p)).transpose()?;
        let (bytes, source) = self.read(name)?;
        let shadows_bundled =
            matches!(source, PluginSource::DropIn(_)) && self.bundled.contains_key(name);
        if let (true, PluginSource::DropIn(path)) = (shadows_bundled, &source) {
            if self.config.refuse_shadowing {
                return Err(PluginError::ShadowingRefused {
                    plugin: name.to_string(),
                    path: path.clone(),
                });
            }
            tracing::warn!(plugin = name, path = %path.display(), "drop-in plugin shadows the bundled plugin of the same name");
        }
        if source != PluginSource::Bundled {
            // Site code is audited (bounds, imports) before any time is spent compiling it
            // and before anything of it is cached.
            crate::audit::check_bytes(name, &bytes, &self.config)?;
        }
        let digest = match (&source, self.bundled_digests.get(name)) {
            (PluginSource::Bundled, Some(d)) => d.clone(),
            _ => sha256_hex(&bytes),
        };
        if let Some(expected) = pin
            && expected != digest
        {
            return Err(PluginError::DigestMismatch {
                plugin: name.to_string(),
                expected,
                actual: digest,
            });
        }
        if let Some(p) = self.cached(name)
            && p.digest == digest
            && p.source == source
        {
            return Ok(p);
        }
        // Site code gets the compile deadline; bundled code is known and compiles unbounded
        // (under load a standard plugin can take tens of seconds).
        let deadline = (source != PluginSource::Bundled).then_some(self.config.compile_deadline);
        let (component, cache_hit) =
            self.cache
                .get_or_compile(name, &digest, || Ok(bytes), deadline)?;
        let linked = crate::audit::check_resources(name, &component, &self.config)
            .and_then(|()| self.link(name, digest.clone(), source, cache_hit, &component));
        let mut loaded = match linked {
            Ok(loaded) => loaded,
            Err(e) => {
                // Refused after compiling (it does not link, or calls itself otherwise):
                // nothing of it stays cached.
                if cache_hit == CacheHit::Compiled {
                    self.cache.forget(&digest);
                }
                return Err(e);
            }
        };
        loaded.shadows_bundled = shadows_bundled;
        let loaded = Arc::new(loaded);
        let mut plugins = self.plugins.write().unwrap_or_else(|e| e.into_inner());
        plugins.insert(name.to_string(), loaded.clone());
        Ok(loaded)
    }

    /// The drop-in file that shadows the bundled plugin `name`, if both exist: what
    /// [`PluginHost::load`] would warn about (or refuse with `refuse_shadowing`), found with one
    /// `stat` and no load, so a caller can report it whether or not the plugin is loaded now
    /// (e.g. the operator's status).
    pub fn shadowing_drop_in(&self, name: &str) -> Option<PathBuf> {
        if !self.bundled.contains_key(name) {
            return None;
        }
        let path = self
            .config
            .drop_in_dir
            .as_ref()?
            .join(format!("{name}.wasm"));
        path.is_file().then_some(path)
    }

    /// The plugin loaded now under `name`, if any (e.g. to say where it came from, see
    /// [`LoadedPlugin::describe_source`]).
    pub fn loaded(&self, name: &str) -> Option<Arc<LoadedPlugin>> {
        self.cached(name)
    }

    /// Names of the plugins loaded now (sorted), e.g. to check that an idle caller released
    /// them.
    pub fn loaded_plugins(&self) -> Vec<String> {
        let plugins = self.plugins.read().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<String> = plugins.keys().cloned().collect();
        names.sort();
        names
    }

    /// How many plugin calls this host has run (each sandboxed call of one plugin, failed ones
    /// included): a caller that reuses a render instead of rendering again shows it here.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Drops every loaded plugin (compiled code, linked instances) so their memory — the
    /// mapped precompiled artifacts and Wasmtime's per-module metadata — goes back to the OS;
    /// the next call of a plugin loads it again from the disk cache (about 2 ms each, no
    /// compile). Does nothing without a disk cache, where reloading would mean recompiling
    /// (about 0.6 s a plugin). Returns how many plugins were dropped.
    ///
    /// A long-running caller that renders rarely (the operator between reconciles) calls this
    /// when it goes idle; a call already running keeps its plugin alive until it returns.
    pub fn release_loaded(&self) -> usize {
        if !self.cache.has_disk() {
            return 0;
        }
        self.cache.clear_memory();
        let mut plugins = self.plugins.write().unwrap_or_else(|e| e.into_inner());
        let n = plugins.len();
        plugins.clear();
        n
    }

    /// The loaded plugin `name`, loading it on first use; with a pin, reloads when the loaded
    /// one has another digest.
    ///
    /// # Errors
    /// As [`PluginHost::load`].
    pub fn plugin(&self, name: &str, pin: Option<&str>) -> Result<Arc<LoadedPlugin>, PluginError> {
        match self.cached(name) {
            Some(p) if pin.is_none_or(|pin| pin.eq_ignore_ascii_case(&p.digest)) => Ok(p),
            _ => self.load(name, pin),
        }
    }

    /// Runs plugin `name` on `objects` and applies and validates its patches.
    ///
    /// # Errors
    /// Any [`PluginError`] naming the plugin: lookup and load errors, then call errors (trap,
    /// fuel, deadline, memory, stack, exit), the guest's own refusal
    /// ([`PluginError::Guest`]), and output errors (count, size, patch, result).
    pub fn transform(
        &self,
        name: &str,
        objects: &[Value],
        spec: &Value,
        ctx: &TransformContext,
    ) -> Result<TransformOutput, PluginError> {
        let plugin = self.plugin(name, None)?;
        self.call(&plugin, objects, spec, ctx)
    }

    /// Runs an already loaded plugin (see [`PluginHost::transform`]).
    ///
    /// # Errors
    /// As [`PluginHost::transform`], without the lookup errors.
    pub fn call(
        &self,
        plugin: &LoadedPlugin,
        objects: &[Value],
        spec: &Value,
        ctx: &TransformContext,
    ) -> Result<TransformOutput, PluginError> {
        let spec = spec.to_string();
        let policy = PolicyMeta::default();
        let input = CallInput {
            spec: &spec,
            settings: None,
            policy: &policy,
        };
        self.call_with(plugin, objects, &input, ctx)
    }

    /// Runs an already loaded plugin with settings and policy metadata: checks the settings
    /// ([`PluginHost::check_settings`]), then calls `transform` and applies and validates its
    /// patches.
    ///
    /// # Errors
    /// [`PluginError::InvalidSettings`], then as [`PluginHost::transform`] without the lookup
    /// errors.
    pub fn call_with(
        &self,
        plugin: &LoadedPlugin,
        objects: &[Value],
        input: &CallInput<'_>,
        ctx: &TransformContext,
    ) -> Result<TransformOutput, PluginError> {
        self.check_settings(plugin, input.settings)?;
        let (results, log) =
            self.call_step(plugin, StepObjects::Input(objects), None, input, ctx)?;
        Ok(TransformOutput {
            rendered: rendered(results),
            log,
        })
    }

    /// Checks the settings a chain entry gives `plugin` (`None`: none): a `kiln:operand@0.1.0`
    /// plugin takes none; a `0.2.0` plugin with a `validate-settings` export is asked, once per
    /// digest and settings text (the answer is remembered); one without it accepts anything.
    ///
    /// # Errors
    /// [`PluginError::InvalidSettings`] naming the plugin and every refused field; a call
    /// error (trap, deadline, …) of `validate-settings`.
    pub fn check_settings(
        &self,
        plugin: &LoadedPlugin,
        settings: Option<&str>,
    ) -> Result<(), PluginError> {
        let refused = |errors| PluginError::InvalidSettings {
            plugin: plugin.name.to_string(),
            errors,
        };
        let index = match &plugin.pre {
            Pre::V1(_) if settings.is_some() => {
                return Err(refused(vec![SettingsError::from_guest(
                    String::new(),
                    "the plugin implements kiln:operand@0.1.0, which takes no settings".into(),
                )]));
            }
            Pre::V1(_) | Pre::V2(_, None) => return Ok(()),
            Pre::V2(_, Some(index)) => index,
        };
        let text = settings.unwrap_or("null");
        let key = (plugin.digest.clone(), text.to_string());
        let known = self
            .settings_checked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let errors = match known {
            Some(errors) => errors,
            None => {
                let errors = self.call_validate(plugin, index, text)?;
                let mut checked = self
                    .settings_checked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if checked.len() >= MAX_SETTINGS_CHECKED {
                    checked.clear();
                }
                checked.insert(key, errors.clone());
                errors
            }
        };
        if errors.is_empty() {
            Ok(())
        } else {
            Err(refused(errors))
        }
    }

    /// Calls `validate-settings` in a fresh sandbox; the refused fields (empty: accepted).
    fn call_validate(
        &self,
        plugin: &LoadedPlugin,
        index: &wasmtime::component::ComponentExportIndex,
        settings: &str,
    ) -> Result<Vec<SettingsError>, PluginError> {
        let Pre::V2(pre, _) = &plugin.pre else {
            return Ok(Vec::new());
        };
        type FieldErrors = Vec<v2::kiln::operand::types::FieldError>;
        let seed = call_seed([
            plugin.digest.as_bytes(),
            VALIDATE_SETTINGS.as_bytes(),
            settings.as_bytes(),
        ]);
        let mut store = self.new_store(&plugin.name, seed);
        let result = pre
            .instance_pre()
            .instantiate(&mut store)
            .and_then(|instance| {
                instance
                    .get_typed_func::<(&str, &str), (Result<(), FieldErrors>,)>(&mut store, index)
            })
            .and_then(|func| func.call(&mut store, (&called_name(&plugin.name), settings)));
        match result {
            Ok((Ok(()),)) => Ok(Vec::new()),
            Ok((Err(errors),)) => {
                let mut errors: Vec<SettingsError> = errors
                    .into_iter()
                    .take(MAX_SETTINGS_ERRORS)
                    .map(|e| SettingsError::from_guest(e.path, e.message))
                    .collect();
                if errors.is_empty() {
                    errors.push(SettingsError::from_guest(
                        String::new(),
                        "refused (the plugin named no field)".into(),
                    ));
                }
                Ok(errors)
            }
            Err(err) => {
                let log = store.data().log.finish();
                Err(classify(
                    &plugin.name,
                    &self.config,
                    store.data(),
                    &log,
                    err,
                ))
            }
        }
    }

    /// Runs `plugin` on `objects` and applies its patches (see `outcome::apply_outcomes_to`);
    /// returns, per object, the result or `None` when omitted, and the plugin's log. `texts`
    /// are the objects' JSON text when the caller has it (else they are serialized here);
    /// `spec` is the ClusterPolicy spec as JSON text.
    pub(crate) fn call_step(
        &self,
        plugin: &LoadedPlugin,
        objects: StepObjects<'_>,
        texts: Option<&[String]>,
        input: &CallInput<'_>,
        ctx: &TransformContext,
    ) -> Result<(Vec<Option<Value>>, PluginLog), PluginError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let serialized: Vec<String>;
        let texts = match texts {
            Some(t) => t,
            None => {
                serialized = objects.as_slice().iter().map(Value::to_string).collect();
                &serialized
            }
        };
        let seed = if plugin.draws_random {
            let head = [
                plugin.digest.as_bytes(),
                input.spec.as_bytes(),
                input.settings.unwrap_or("null").as_bytes(),
            ];
            call_seed(head.into_iter().chain(texts.iter().map(String::as_bytes)))
        } else {
            [0; 32]
        };
        let mut store = self.new_store(&plugin.name, seed);
        let called = called_name(&plugin.name);
        let result = match &plugin.pre {
            Pre::V1(pre) => {
                let mut ctx = make_context_v1(ctx);
                if plugin.bundle {
                    ctx.state = called;
                }
                pre.instantiate(&mut store).and_then(|instance| {
                    instance
                        .call_transform(&mut store, texts, input.spec, &ctx)
                        .map(|r| r.map_err(GuestError::from).map(v1_outcomes))
                })
            }
            Pre::V2(pre, _) => {
                let ctx = make_context_v2(ctx, &called, input.policy);
                let settings = input.settings.unwrap_or("null");
                pre.instantiate(&mut store).and_then(|instance| {
                    instance
                        .call_transform(&mut store, texts, input.spec, settings, &ctx)
                        .map(|r| r.map_err(GuestError::from).map(v2_outcomes))
                })
            }
        };
        let log = store.data().log.finish();
        let outcomes = match result {
            Err(err) => {
                return Err(classify(
                    &plugin.name,
                    &self.config,
                    store.data(),
                    &log,
                    err,
                ));
            }
            Ok(Err(error)) => {
                return Err(PluginError::Guest {
                    plugin: plugin.name.to_string(),
                    error,
                });
            }
            Ok(Ok(outcomes)) => outcomes,
        };
        drop(store);
        let policy = OutputPolicy {
            output_limit_bytes: self.config.output_limit_bytes,
            object_limit_bytes: self.config.object_limit_bytes,
            site: (!plugin.is_standard()).then_some(self.config.site_pod_privileges),
        };
        let sizes: Vec<usize> = texts.iter().map(String::len).collect();
        let results = apply_outcomes_to(&plugin.name, objects, &sizes, outcomes, &policy)?;
        Ok((results, log))
    }

    /// A fresh store for one call of `plugin`, with every limit set, its virtual
    /// `wasi:random` seeded with `seed`.
    fn new_store(&self, plugin: &Arc<str>, seed: [u8; 32]) -> Store<CallState> {
        let state = CallState::new(plugin.clone(), &self.config, seed);
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.memory);
        if let Some(fuel) = self.config.fuel {
            // The engine meters fuel exactly when `config.fuel` is set, so this cannot fail.
            let _ = store.set_fuel(fuel);
        }
        store.set_epoch_deadline(self.config.deadline_ticks());
        store.epoch_deadline_trap();
        store
    }

    fn cached(&self, name: &str) -> Option<Arc<LoadedPlugin>> {
        self.plugins
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// The plugin's bytes: read from the drop-in file, or borrowed from the binary (not copied,
    /// not touched until compiled).
    fn read(&self, name: &str) -> Result<(Cow<'static, [u8]>, PluginSource), PluginError> {
        if let Some(reference) = oci_ref(name)? {
            let max = self.config.max_component_bytes;
            let bytes = self.oci.read(name, &reference, max)?;
            return Ok((Cow::Owned(bytes), PluginSource::Oci(name.to_string())));
        }
        let drop_in = self
            .config
            .drop_in_dir
            .as_ref()
            .map(|d| d.join(format!("{name}.wasm")));
        if let Some(path) = &drop_in {
            // A file somewhat over the size bound is still read, so that the audit names every
            // bound it exceeds; past the ceiling only its size is.
            let ceiling = self
                .config
                .max_component_bytes
                .saturating_mul(AUDIT_CEILING);
            match read_bounded(path, ceiling) {
                Ok(Ok(bytes)) => {
                    return Ok((Cow::Owned(bytes), PluginSource::DropIn(path.clone())));
                }
                Ok(Err(actual)) => {
                    return Err(PluginError::ComponentLimit {
                        plugin: name.to_string(),
                        exceeded: vec![crate::Bound {
                            what: "bytes",
                            actual,
                            limit: self.config.max_component_bytes as u64,
                        }],
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(PluginError::ReadFailed {
                        plugin: name.to_string(),
                        path: path.clone(),
                        source,
                    });
                }
            }
        }
        match self.bundled.get(name) {
            Some(bytes) => Ok((Cow::Borrowed(*bytes), PluginSource::Bundled)),
            None => Err(PluginError::NotFound {
                plugin: name.to_string(),
                drop_in,
            }),
        }
    }

    /// Audits, links and name-checks a compiled component.
    fn link(
        &self,
        name: &str,
        digest: String,
        source: PluginSource,
        cache_hit: CacheHit,
        component: &wasmtime::component::Component,
    ) -> Result<LoadedPlugin, PluginError> {
        let forbidden = forbidden_imports(&self.engine, component);
        if !forbidden.is_empty() {
            return Err(PluginError::ForbiddenImport {
                plugin: name.to_string(),
                imports: forbidden,
            });
        }
        let pre = self.link_pre(name, component)?;
        let plugin: Arc<str> = name.into();
        let exported = self.call_name(&plugin, &pre)?;
        let expected = oci_ref(name)?.map(|r| r.plugin_name().to_string());
        let bundle = accepts_name(expected.as_deref().unwrap_or(name), &exported)
            .map_err(|e| rename_plugin(e, name))?;
        let imports = imports_of(&self.engine, component);
        let draws_random = imports.iter().any(|i| i.starts_with("wasi:random/"));
        Ok(LoadedPlugin {
            name: plugin,
            digest,
            source,
            cache_hit,
            imports,
            draws_random,
            shadows_bundled: false,
            bundle,
            pre,
        })
    }

    /// Links `component` as a `kiln:operand@0.2.0` plugin, else as a `0.1.0` one.
    ///
    /// # Errors
    /// [`PluginError::LoadFailed`] naming both mismatches when it is neither.
    pub(crate) fn link_pre(
        &self,
        name: &str,
        component: &wasmtime::component::Component,
    ) -> Result<Pre, PluginError> {
        let load_failed = |message: String| PluginError::LoadFailed {
            plugin: name.to_string(),
            message,
        };
        // A component importing a denied interface gets its own linker, with that interface's
        // functions failing the call; the others share the host's.
        let instance_pre = if imports_denied(&self.engine, component) {
            let mut linker = self.linker.clone();
            deny_imports(&mut linker, &self.engine, component)
                .and_then(|()| linker.instantiate_pre(component))
        } else {
            self.linker.instantiate_pre(component)
        }
        .map_err(|e| load_failed(format!("{e:#}")))?;
        match v2::OperandTransformPre::new(instance_pre.clone()) {
            Ok(pre) => Ok(Pre::V2(
                pre,
                component.get_export_index(None, VALIDATE_SETTINGS),
            )),
            Err(e2) => match v1::OperandTransformPre::new(instance_pre) {
                Ok(pre) => Ok(Pre::V1(pre)),
                Err(e1) => Err(load_failed(format!(
                    "not a kiln:operand@0.2.0 plugin ({e2:#}), nor a kiln:operand@0.1.0 plugin ({e1:#})"
                ))),
            },
        }
    }

    /// Calls the `name` export in a fresh sandbox.
    pub(crate) fn call_name(&self, plugin: &Arc<str>, pre: &Pre) -> Result<String, PluginError> {
        let mut store = self.new_store(plugin, call_seed([plugin.as_bytes()]));
        let result = match pre {
            Pre::V1(pre) => pre
                .instantiate(&mut store)
                .and_then(|i| i.call_name(&mut store)),
            Pre::V2(pre, _) => pre
                .instantiate(&mut store)
                .and_then(|i| i.call_name(&mut store)),
        };
        result.map_err(|err| {
            let log = store.data().log.finish();
            classify(plugin, &self.config, store.data(), &log, err)
        })
    }
}

/// A drop-in up to this many times [`HostConfig::max_component_bytes`] is read and audited
/// whole (every exceeded bound reported); a bigger one is refused by its size alone.
const AUDIT_CEILING: usize = 4;

/// Most settings checks a host remembers (digest and settings text); past it they are
/// forgotten and asked again.
const MAX_SETTINGS_CHECKED: usize = 256;
/// Most refused fields of one `validate-settings` answer that are kept.
const MAX_SETTINGS_ERRORS: usize = 32;

/// 0.1.0 outcomes as 0.2.0's (the same variant).
fn v1_outcomes(outcomes: Vec<v1::Outcome>) -> Vec<v2::Outcome> {
    outcomes
        .into_iter()
        .map(|o| match o {
            v1::Outcome::Patch(p) => v2::Outcome::Patch(p),
            v1::Outcome::Omit => v2::Outcome::Omit,
        })
        .collect()
}

/// 0.2.0 outcomes as they are.
fn v2_outcomes(outcomes: Vec<v2::Outcome>) -> Vec<v2::Outcome> {
    outcomes
}

/// Whether a component whose `name()` returned `exported` may be loaded as plugin `name`: when
/// the two are equal (`Ok(false)`), or when it is a standard bundle, a component carrying several
/// standard plugins' code whose `name()` is [`kiln_core::context::STANDARD_BUNDLE_NAME`]
/// (`Ok(true)`: it is called with the context's `state` set to `name`, which it dispatches on,
/// and answers `failed` for a plugin it does not carry).
///
/// # Errors
/// [`PluginError::NameMismatch`] for any other name (the drop-in file is not the plugin it is
/// named after).
pub(crate) fn accepts_name(name: &str, exported: &str) -> Result<bool, PluginError> {
    if exported == name {
        Ok(false)
    } else if exported == kiln_core::context::STANDARD_BUNDLE_NAME {
        Ok(true)
    } else {
        Err(PluginError::NameMismatch {
            plugin: name.to_string(),
            exported: crate::text::bounded(exported, crate::text::MAX_NAME_BYTES).into_owned(),
        })
    }
}

/// The bytes of the file at `path`, or `Err(size)` when it has more than `max_bytes` (never
/// reading more than `max_bytes + 1`, whatever the file is).
fn read_bounded(path: &std::path::Path, max_bytes: usize) -> std::io::Result<Result<Vec<u8>, u64>> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    if len > max_bytes as u64 {
        return Ok(Err(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max_bytes as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > max_bytes {
        return Ok(Err(bytes.len() as u64));
    }
    Ok(Ok(bytes))
}

/// A plugin name must be usable as a file name: non-empty, no path separators, not `.`/`..`.
fn check_name(name: &str) -> Result<(), PluginError> {
    if oci_ref(name)?.is_some() {
        return Ok(());
    }
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && name.len() <= 253;
    if ok {
        Ok(())
    } else {
        Err(PluginError::InvalidName {
            plugin: name.to_string(),
        })
    }
}

/// A pin is a SHA-256 in hex; returned lowercased.
fn check_pin(name: &str, pin: &str) -> Result<String, PluginError> {
    if pin.len() == 64 && pin.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(pin.to_ascii_lowercase())
    } else {
        Err(PluginError::InvalidPin {
            plugin: name.to_string(),
            pin: pin.to_string(),
        })
    }
}

/// The name a component is called by: an `oci://` entry's repository's last path segment
/// ([`kiln_core::oci_ref::OciRef::plugin_name`]: what its `name()` answers and what a
/// standard bundle dispatches on), else the chain entry's name itself.
fn called_name(name: &str) -> String {
    match oci_ref(name) {
        Ok(Some(r)) => r.plugin_name().to_string(),
        _ => name.to_string(),
    }
}

/// The registry reference a chain entry names, when it starts with `oci://`.
///
/// # Errors
/// [`PluginError::InvalidName`] when it starts with `oci://` but is not a valid reference by
/// digest ([`kiln_core::oci_ref::OciRef::parse`]).
fn oci_ref(name: &str) -> Result<Option<kiln_core::oci_ref::OciRef>, PluginError> {
    if !kiln_core::oci_ref::is_oci(name) {
        return Ok(None);
    }
    kiln_core::oci_ref::OciRef::parse(name)
        .map(Some)
        .map_err(|_| PluginError::InvalidName {
            plugin: name.to_string(),
        })
}

/// A [`PluginError::NameMismatch`] of an `oci://` plugin names the chain entry.
fn rename_plugin(e: PluginError, name: &str) -> PluginError {
    match e {
        PluginError::NameMismatch { exported, .. } => PluginError::NameMismatch {
            plugin: name.to_string(),
            exported,
        },
        e => e,
    }
}
