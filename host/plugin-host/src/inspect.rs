//! Checking a wasm file without installing it (`kiln plugin check FILE.wasm`).

use std::sync::Arc;

use crate::cache::{CacheHit, sha256_hex};
use crate::config::HostConfig;
use crate::error::PluginError;
use crate::host::{Interface, PluginHost, Pre};
use crate::sandbox::{exports_of, imports_of};

/// The name [`inspect`] uses in errors about the bytes, whose real name is not known yet
/// ([`inspect_as`] takes one, e.g. the file name a drop-in would be looked up by).
pub const INSPECTED: &str = "(inspected file)";

/// What [`inspect`] found out about a wasm file.
#[derive(Debug)]
pub struct PluginReport {
    /// Lowercase hex SHA-256 of the bytes (what a pin must say).
    pub sha256: String,
    /// Full names of the component's imports.
    pub imports: Vec<String>,
    /// Full names of the component's exports (empty when it was refused before compiling).
    pub exports: Vec<String>,
    /// Every bound of the host with what the component has against it.
    pub bounds: Vec<crate::Bound>,
    /// What its `name()` export returned, when it could be called.
    pub name: Option<String>,
    /// The WIT package it implements, when it links as a plugin.
    pub interface: Option<Interface>,
    /// Whether it exports `validate-settings`.
    pub validates_settings: bool,
    /// Why the host would refuse it; none when it would be accepted.
    pub refusal: Option<PluginError>,
    /// Where the compiled component came from: [`CacheHit::Compiled`] when it was compiled
    /// now (and, when accepted by a host with a disk cache, written there as
    /// [`PluginHost::load`] would: a later load of the same bytes maps the artifact), or from
    /// that host's caches; none when it was refused before compiling. A component refused
    /// after compiling leaves nothing cached.
    pub cache_hit: Option<CacheHit>,
}

impl PluginReport {
    /// Whether the host would load it (under the name it reports).
    pub fn accepted(&self) -> bool {
        self.refusal.is_none()
    }
}

/// Compiles `bytes` with default limits, lists its imports and exports, and checks it the way
/// [`PluginHost::load`] would: allowed imports, the world's exports, a callable `name()`.
///
/// # Errors
/// [`PluginError::EngineSetup`], or [`PluginError::LoadFailed`] when the bytes are not a
/// component at all; every other problem is reported in [`PluginReport::refusal`].
pub fn inspect(bytes: &[u8]) -> Result<PluginReport, PluginError> {
    inspect_as(bytes, INSPECTED)
}

/// [`inspect`], naming the plugin `label` in errors (`kiln plugin check` passes the file name
/// without `.wasm`, the name the host would look the file up by); a component whose `name()`
/// differs from `label` is refused with [`PluginError::NameMismatch`], as the host would, unless
/// it is a standard bundle (`kiln_core::context::STANDARD_BUNDLE_NAME`).
///
/// # Errors
/// As [`inspect`].
pub fn inspect_as(bytes: &[u8], label: &str) -> Result<PluginReport, PluginError> {
    let host = PluginHost::new(HostConfig::in_memory(), &[])?;
    host.inspect_as(bytes, label)
}

impl PluginHost {
    /// [`inspect`] with this host's engine and limits.
    ///
    /// # Errors
    /// As [`inspect`].
    pub fn inspect(&self, bytes: &[u8]) -> Result<PluginReport, PluginError> {
        self.inspect_as(bytes, INSPECTED)
    }

    /// [`inspect_as`] with this host's engine, limits and compiled-component caches (memory,
    /// and the disk cache when it has one): an accepted component is cached by digest as
    /// [`PluginHost::load`] caches it, so checking a plugin spares compiling it again.
    ///
    /// # Errors
    /// As [`inspect`].
    pub fn inspect_as(&self, bytes: &[u8], label: &str) -> Result<PluginReport, PluginError> {
        let declared = crate::audit::declared(bytes);
        let bounds = crate::audit::bounds(bytes.len() as u64, &declared, &self.config);
        if let Err(e) = crate::audit::check_bytes(label, bytes, &self.config) {
            return Ok(PluginReport {
                sha256: sha256_hex(bytes),
                imports: declared.imports,
                exports: Vec::new(),
                bounds,
                name: None,
                interface: None,
                validates_settings: false,
                refusal: Some(e),
                cache_hit: None,
            });
        }
        let digest = sha256_hex(bytes);
        let (component, hit) = self.cache.get_or_compile(
            label,
            &digest,
            || Ok(std::borrow::Cow::Owned(bytes.to_vec())),
            Some(self.config.compile_deadline),
        )?;
        let report = self.report(label, digest, &component, bounds);
        // Refused after compiling: nothing of it stays cached (as in `PluginHost::load`).
        if report.refusal.is_some() && hit == CacheHit::Compiled {
            self.cache.forget(&report.sha256);
        }
        Ok(PluginReport {
            cache_hit: Some(hit),
            ..report
        })
    }

    /// The report on a compiled `component` (its `cache_hit` still none).
    fn report(
        &self,
        label: &str,
        sha256: String,
        component: &wasmtime::component::Component,
        bounds: Vec<crate::Bound>,
    ) -> PluginReport {
        let mut report = PluginReport {
            sha256,
            imports: imports_of(&self.engine, component),
            exports: exports_of(&self.engine, component),
            bounds,
            name: None,
            interface: None,
            validates_settings: false,
            refusal: None,
            cache_hit: None,
        };
        if let Err(e) = crate::audit::check_resources(label, component, &self.config) {
            report.refusal = Some(e);
            return report;
        }
        let pre = self.link_pre(label, component);
        if let Ok(pre) = &pre {
            report.interface = Some(match pre {
                Pre::V1(_) => Interface::V0_1,
                Pre::V2(..) => Interface::V0_2,
            });
            report.validates_settings = matches!(pre, Pre::V2(_, Some(_)));
        }
        match pre.and_then(|pre| self.call_name(&Arc::from(label), &pre)) {
            // The host looks a drop-in up by file name and refuses one whose `name()` differs
            // (unless it is a standard bundle).
            Ok(name) => {
                if label != INSPECTED {
                    report.refusal = crate::host::accepts_name(label, &name).err();
                }
                report.name = Some(name);
            }
            Err(e) => report.refusal = Some(e),
        }
        report
    }
}
