//! Plugins from an OCI registry, by digest: chain entries named
//! `oci://REGISTRY/REPOSITORY@sha256:<hex>` ([`kiln_core::oci_ref`]).
//!
//! ```text
//! oci://…@sha256:M ──► store (<cache dir>/oci/sha256/M/, else memory) ──► verify ──► bytes
//!                        └─ missing ──► OciFetch (once per digest) ──► verify ──► store
//! verify: sha256(manifest) = M; manifest = one `application/wasm` layer (config
//!         `application/vnd.wasm.config.v0+json`, as `wkg` pushes components);
//!         sha256(component) = the layer's digest, its size the layer's size
//! ```
//!
//! The check runs on every read, of the store as of the registry, so a component that does not
//! belong to the digest the policy names is never compiled or run: a tampered manifest or blob is
//! refused with [`PluginError::PullFailed`] naming the reference, and nothing of it is stored. A
//! stored copy that fails the check is deleted and pulled again. The network side is an
//! [`OciFetch`] the caller supplies ([`crate::PluginHost::with_oci_fetch`]; kiln's is
//! `kiln-plugin-oci`), so the host itself opens no connection.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kiln_core::oci_ref::OciRef;
use serde_json::Value;

use crate::cache::sha256_hex;
use crate::error::PluginError;

/// `config.mediaType` of a Wasm component artifact (the CNCF Wasm OCI artifact layout that
/// `wkg` and wasm-pkg-tools write).
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// `mediaType` of the layer holding the component's bytes.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// `mediaType` of the manifest (an OCI image manifest).
pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The largest manifest read (4 MiB, what the distribution specification asks registries to
/// accept).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// A manifest and the component it names, as pulled (not yet verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledArtifact {
    /// The manifest's bytes, exactly as the registry served them.
    pub manifest: Vec<u8>,
    /// The component layer's bytes.
    pub component: Vec<u8>,
}

/// The component layer a manifest names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentLayer {
    /// `sha256:<64 lowercase hex>`.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
}

/// Pulls artifacts from registries: the network side of [`crate::PluginHost`]'s OCI source.
pub trait OciFetch: Send + Sync {
    /// Pulls the manifest `reference` names **by its digest**, then the component layer it
    /// names ([`component_layer`]), refusing a layer larger than `max_component_bytes`. The
    /// host verifies the result ([`verify_artifact`]); an implementation may verify more.
    ///
    /// # Errors
    /// A one-line message (registry unreachable, not found, unauthorized, too large, …).
    fn fetch(
        &self,
        reference: &OciRef,
        max_component_bytes: usize,
    ) -> Result<PulledArtifact, String>;
}

/// The component layer of a Wasm artifact's manifest: an OCI image manifest (schemaVersion 2)
/// with config media type [`WASM_CONFIG_MEDIA_TYPE`] and exactly one layer, of media type
/// [`WASM_LAYER_MEDIA_TYPE`].
///
/// # Errors
/// A message saying which of these the manifest breaks.
pub fn component_layer(manifest: &[u8]) -> Result<ComponentLayer, String> {
    if manifest.len() > MAX_MANIFEST_BYTES {
        return Err(format!(
            "the manifest has {} bytes, more than {MAX_MANIFEST_BYTES}",
            manifest.len()
        ));
    }
    let m: Value =
        serde_json::from_slice(manifest).map_err(|e| format!("the manifest is not JSON: {e}"))?;
    if m["schemaVersion"] != 2 {
        return Err("the manifest's schemaVersion is not 2".into());
    }
    if let Some(t) = m.get("mediaType")
        && t != OCI_MANIFEST_MEDIA_TYPE
    {
        return Err(format!(
            "the manifest's mediaType is {t}, not {OCI_MANIFEST_MEDIA_TYPE}"
        ));
    }
    let config = &m["config"]["mediaType"];
    if config != WASM_CONFIG_MEDIA_TYPE {
        return Err(format!(
            "the manifest's config mediaType is {config}, not {WASM_CONFIG_MEDIA_TYPE}: not a Wasm component artifact"
        ));
    }
    let layers = m["layers"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let [layer] = layers else {
        return Err(format!(
            "the manifest has {} layers; a Wasm component artifact has exactly one",
            layers.len()
        ));
    };
    if layer["mediaType"] != WASM_LAYER_MEDIA_TYPE {
        return Err(format!(
            "the layer's mediaType is {}, not {WASM_LAYER_MEDIA_TYPE}",
            layer["mediaType"]
        ));
    }
    let digest = layer["digest"].as_str().unwrap_or_default();
    let hex_ok = digest.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    });
    if !hex_ok {
        return Err(format!(
            "the layer's digest {digest:?} is not sha256:<64 lowercase hex>"
        ));
    }
    let size = layer["size"]
        .as_u64()
        .ok_or("the layer has no size".to_string())?;
    Ok(ComponentLayer {
        digest: digest.to_string(),
        size,
    })
}

/// Checks that `artifact` is what `reference` names: the manifest's sha256 is the reference's
/// digest, and the component's sha256 and size are those of the manifest's one layer.
///
/// # Errors
/// A message naming the mismatch (expected and actual digests).
pub fn verify_artifact(reference: &OciRef, artifact: &PulledArtifact) -> Result<(), String> {
    let manifest = format!("sha256:{}", sha256_hex(&artifact.manifest));
    if manifest != reference.digest() {
        return Err(format!(
            "the manifest's digest is {manifest}, not the {} the reference names",
            reference.digest()
        ));
    }
    let layer = component_layer(&artifact.manifest)?;
    let component = format!("sha256:{}", sha256_hex(&artifact.component));
    if component != layer.digest || artifact.component.len() as u64 != layer.size {
        return Err(format!(
            "the component ({} bytes, {component}) is not the layer the manifest names ({} bytes, {})",
            artifact.component.len(),
            layer.size,
            layer.digest
        ));
    }
    Ok(())
}

/// The host's OCI source: the fetcher and the store of verified artifacts.
#[derive(Default)]
pub(crate) struct OciSource {
    fetch: Option<Arc<dyn OciFetch>>,
    /// `<cache dir>/oci/sha256`, when the host has a cache directory.
    dir: Option<PathBuf>,
    /// Verified artifacts by manifest digest, without a cache directory.
    memory: Mutex<HashMap<String, Arc<PulledArtifact>>>,
}

impl OciSource {
    pub(crate) fn new(fetch: Option<Arc<dyn OciFetch>>, cache_dir: Option<&Path>) -> Self {
        OciSource {
            fetch,
            dir: cache_dir.map(|d| d.join("oci").join("sha256")),
            memory: Mutex::default(),
        }
    }

    /// The verified component bytes of `reference` (`name` is the chain entry, as errors name
    /// it): from the store, else pulled once and stored.
    pub(crate) fn read(
        &self,
        name: &str,
        reference: &OciRef,
        max_component_bytes: usize,
    ) -> Result<Vec<u8>, PluginError> {
        let refused = |message: String| PluginError::PullFailed {
            plugin: name.to_string(),
            message,
        };
        if let Some(stored) = self.stored(reference) {
            match verify_artifact(reference, &stored) {
                Ok(()) => return Ok(stored.component.clone()),
                Err(e) => {
                    tracing::warn!(plugin = name, error = %e, "stored OCI artifact fails verification; pulling it again");
                    self.forget(reference);
                }
            }
        }
        let fetch = self.fetch.as_ref().ok_or_else(|| {
            refused("not in the plugin cache, and this host pulls from no registry".into())
        })?;
        let artifact = fetch
            .fetch(reference, max_component_bytes)
            .map_err(refused)?;
        verify_artifact(reference, &artifact).map_err(|e| refused(format!("refused: {e}")))?;
        self.store(reference, &artifact);
        tracing::info!(
            plugin = name,
            bytes = artifact.component.len(),
            "pulled OCI plugin"
        );
        Ok(artifact.component)
    }

    fn stored(&self, reference: &OciRef) -> Option<Arc<PulledArtifact>> {
        let Some(dir) = &self.dir else {
            let memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
            return memory.get(reference.digest_hex()).cloned();
        };
        let dir = dir.join(reference.digest_hex());
        let manifest = std::fs::read(dir.join("manifest.json")).ok()?;
        let component = std::fs::read(dir.join("component.wasm")).ok()?;
        Some(Arc::new(PulledArtifact {
            manifest,
            component,
        }))
    }

    /// Stores a verified artifact: written to a temporary directory, then renamed into place,
    /// so a reader sees all of it or none. A store that fails only costs a later pull.
    fn store(&self, reference: &OciRef, artifact: &PulledArtifact) {
        let Some(dir) = &self.dir else {
            let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
            memory.insert(
                reference.digest_hex().to_string(),
                Arc::new(artifact.clone()),
            );
            return;
        };
        let target = dir.join(reference.digest_hex());
        let tmp = dir.join(format!(
            ".tmp-{}-{}",
            reference.digest_hex(),
            std::process::id()
        ));
        let written = std::fs::create_dir_all(&tmp)
            .and_then(|()| std::fs::write(tmp.join("manifest.json"), &artifact.manifest))
            .and_then(|()| std::fs::write(tmp.join("component.wasm"), &artifact.component))
            .and_then(|()| std::fs::rename(&tmp, &target));
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&tmp);
            tracing::warn!(reference = %reference, error = %e, "cannot store the pulled OCI artifact");
        }
    }

    fn forget(&self, reference: &OciRef) {
        match &self.dir {
            Some(dir) => {
                let _ = std::fs::remove_dir_all(dir.join(reference.digest_hex()));
            }
            None => {
                let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
                memory.remove(reference.digest_hex());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wasm_manifest(layer: &[u8]) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": WASM_CONFIG_MEDIA_TYPE, "digest": format!("sha256:{}", sha256_hex(b"{}")), "size": 2},
            "layers": [{"mediaType": WASM_LAYER_MEDIA_TYPE, "digest": format!("sha256:{}", sha256_hex(layer)), "size": layer.len()}],
        }))
        .unwrap()
    }

    fn reference(manifest: &[u8]) -> OciRef {
        OciRef::parse(&format!(
            "oci://127.0.0.1:5000/plugins/site-x@sha256:{}",
            sha256_hex(manifest)
        ))
        .unwrap()
    }

    #[test]
    fn verifies_manifest_and_layer_digests() {
        let component = b"\0asm component".to_vec();
        let manifest = wasm_manifest(&component);
        let r = reference(&manifest);
        let good = PulledArtifact {
            manifest: manifest.clone(),
            component: component.clone(),
        };
        verify_artifact(&r, &good).unwrap();
        assert_eq!(
            component_layer(&manifest).unwrap(),
            ComponentLayer {
                digest: format!("sha256:{}", sha256_hex(&component)),
                size: component.len() as u64
            }
        );
        // Another blob under the same manifest.
        let mut tampered = good.clone();
        tampered.component[0] ^= 1;
        let e = verify_artifact(&r, &tampered).unwrap_err();
        assert!(e.contains("is not the layer the manifest names"), "{e}");
        // A manifest naming another layer: its own digest differs from the reference's.
        let other = PulledArtifact {
            manifest: wasm_manifest(b"other"),
            component: b"other".to_vec(),
        };
        let e = verify_artifact(&r, &other).unwrap_err();
        assert!(
            e.contains(&format!("not the {} the reference names", r.digest())),
            "{e}"
        );
    }

    #[test]
    fn refuses_what_is_not_a_wasm_artifact() {
        let base = serde_json::from_slice::<Value>(&wasm_manifest(b"x")).unwrap();
        let cases: [(&str, Value, &str); 5] = [
            ("/schemaVersion", 1.into(), "schemaVersion is not 2"),
            (
                "/mediaType",
                "application/vnd.oci.image.index.v1+json".into(),
                "mediaType is",
            ),
            (
                "/config/mediaType",
                "application/vnd.oci.image.config.v1+json".into(),
                "not a Wasm component artifact",
            ),
            (
                "/layers/0/mediaType",
                "application/vnd.oci.image.layer.v1.tar+gzip".into(),
                "layer's mediaType",
            ),
            ("/layers/0/digest", "sha256:abc".into(), "is not sha256"),
        ];
        for (pointer, value, want) in cases {
            let mut m = base.clone();
            *m.pointer_mut(pointer).unwrap() = value;
            let e = component_layer(&serde_json::to_vec(&m).unwrap()).unwrap_err();
            assert!(e.contains(want), "{pointer}: {e}");
        }
        let mut two = base.clone();
        let layer = two["layers"][0].clone();
        two["layers"].as_array_mut().unwrap().push(layer);
        let e = component_layer(&serde_json::to_vec(&two).unwrap()).unwrap_err();
        assert!(e.contains("has 2 layers"), "{e}");
        assert!(component_layer(b"{").unwrap_err().contains("not JSON"));
    }

    struct Fixed(PulledArtifact, std::sync::atomic::AtomicUsize);
    impl OciFetch for Fixed {
        fn fetch(&self, _: &OciRef, _: usize) -> Result<PulledArtifact, String> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(self.0.clone())
        }
    }

    #[test]
    fn pulls_once_stores_verified_and_refuses_tampered() {
        let component = b"\0asm component".to_vec();
        let manifest = wasm_manifest(&component);
        let r = reference(&manifest);
        let dir = tempfile::tempdir().unwrap();
        let good = Arc::new(Fixed(
            PulledArtifact {
                manifest: manifest.clone(),
                component: component.clone(),
            },
            0.into(),
        ));
        let source = OciSource::new(Some(good.clone()), Some(dir.path()));
        let name = r.to_string();
        assert_eq!(source.read(&name, &r, 1 << 20).unwrap(), component);
        assert_eq!(source.read(&name, &r, 1 << 20).unwrap(), component);
        assert_eq!(good.1.load(std::sync::atomic::Ordering::Relaxed), 1);
        // A stored copy changed on disk is not used: it is pulled again.
        let stored = dir
            .path()
            .join("oci/sha256")
            .join(r.digest_hex())
            .join("component.wasm");
        std::fs::write(&stored, b"evil").unwrap();
        assert_eq!(source.read(&name, &r, 1 << 20).unwrap(), component);
        assert_eq!(good.1.load(std::sync::atomic::Ordering::Relaxed), 2);
        assert_eq!(std::fs::read(&stored).unwrap(), component);

        // A registry serving another blob: refused, nothing stored.
        let mut bad = good.0.clone();
        bad.component[0] ^= 1;
        let dir = tempfile::tempdir().unwrap();
        let source = OciSource::new(Some(Arc::new(Fixed(bad, 0.into()))), Some(dir.path()));
        let e = source.read(&name, &r, 1 << 20).unwrap_err();
        assert!(matches!(&e, PluginError::PullFailed { plugin, .. } if *plugin == name));
        assert!(e.to_string().contains("refused: the component"), "{e}");
        assert!(!dir.path().join("oci/sha256").join(r.digest_hex()).exists());

        let none = OciSource::new(None, None);
        let e = none.read(&name, &r, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("pulls from no registry"), "{e}");
    }
}
