//! kiln's OCI registry client for plugins: pulls a Wasm component by digest (the
//! [`kiln_plugin_host::oci::OciFetch`] of `kiln render` and `kiln operator`) and pushes one for
//! authors (`kiln plugin push`).
//!
//! Artifacts use the layout `wkg` (wasm-pkg-tools) writes for Wasm components: an OCI image
//! manifest with config media type [`WASM_CONFIG_MEDIA_TYPE`] and one layer of media type
//! [`WASM_LAYER_MEDIA_TYPE`] holding the component, so a component pushed by either tool pulls
//! with the other. The client is `oci-client` over rustls with the ring provider (no OpenSSL).
//! Registries are reached over HTTPS; plain HTTP only for the registries named in
//! [`Registry::new`]'s `insecure` list. Credentials come from a Docker `config.json`
//! ([`Credentials::from_docker_config`], the content of a `kubernetes.io/dockerconfigjson`
//! Secret); without an entry for a registry, pulls are anonymous.
//!
//! ```text
//! pull: manifest by digest ─► component_layer (one application/wasm layer, size ≤ limit)
//!       ─► blob (read at most its size + 1 bytes) ─► PulledArtifact (the host verifies both digests)
//! push: config blob ─► component blob ─► manifest (tag) ─► oci://REGISTRY/REPOSITORY@sha256:<manifest>
//! ```

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine as _;
use kiln_core::oci_ref::{OciRef, OciTarget};
use kiln_plugin_host::oci::{
    OCI_MANIFEST_MEDIA_TYPE, OciFetch, PulledArtifact, WASM_CONFIG_MEDIA_TYPE,
    WASM_LAYER_MEDIA_TYPE, component_layer,
};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

/// How long connecting to a registry may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a registry may leave a response without data.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Registry credentials by registry host, from a Docker `config.json`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials(HashMap<String, (String, String)>);

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut registries: Vec<&String> = self.0.keys().collect();
        registries.sort();
        f.debug_tuple("Credentials").field(&registries).finish()
    }
}

impl Credentials {
    /// Reads the `auths` of a Docker `config.json` (the `.dockerconfigjson` key of a
    /// `kubernetes.io/dockerconfigjson` Secret): per registry either `auth` (base64 of
    /// `user:password`) or `username` and `password`. Keys may be written as URLs
    /// (`https://ghcr.io/v1/`); they are reduced to the host (and port).
    ///
    /// # Errors
    /// A message naming the registry whose entry cannot be read (never the secret itself).
    pub fn from_docker_config(json: &[u8]) -> Result<Self, String> {
        let config: serde_json::Value = serde_json::from_slice(json)
            .map_err(|e| format!("registry credentials: not JSON: {e}"))?;
        let mut creds = HashMap::new();
        let Some(auths) = config.get("auths").and_then(|a| a.as_object()) else {
            return Err("registry credentials: no `auths` object".into());
        };
        for (key, entry) in auths {
            let bad = || {
                format!(
                    "registry credentials for {key:?}: need `auth` (base64 of user:password) or `username` and `password`"
                )
            };
            let pair = match (
                entry.get("auth").and_then(|a| a.as_str()),
                entry.get("username").and_then(|a| a.as_str()),
                entry.get("password").and_then(|a| a.as_str()),
            ) {
                (_, Some(user), Some(password)) => (user.to_string(), password.to_string()),
                (Some(auth), _, _) => {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(auth.trim())
                        .map_err(|_| bad())?;
                    let text = String::from_utf8(decoded).map_err(|_| bad())?;
                    let (user, password) = text.split_once(':').ok_or_else(bad)?;
                    (user.to_string(), password.to_string())
                }
                _ => return Err(bad()),
            };
            creds.insert(registry_host(key), pair);
        }
        Ok(Credentials(creds))
    }

    /// The authentication for `registry` (host and port): basic with its credentials, or
    /// anonymous.
    fn auth_for(&self, registry: &str) -> RegistryAuth {
        let docker_hub = ["docker.io", "index.docker.io", "registry-1.docker.io"];
        let found = self.0.get(registry).or_else(|| {
            docker_hub
                .contains(&registry)
                .then(|| docker_hub.iter().find_map(|h| self.0.get(*h)))
                .flatten()
        });
        match found {
            Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
            None => RegistryAuth::Anonymous,
        }
    }

    /// The registries with credentials, sorted.
    pub fn registries(&self) -> Vec<&str> {
        let mut r: Vec<&str> = self.0.keys().map(String::as_str).collect();
        r.sort_unstable();
        r
    }
}

/// `https://ghcr.io/v1/` → `ghcr.io`.
fn registry_host(key: &str) -> String {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    rest.split('/').next().unwrap_or(rest).to_string()
}

/// A registry client for plugins. Cheap to keep: it opens connections per operation, each on a
/// runtime of its own when called synchronously ([`OciFetch::fetch`]).
#[derive(Debug, Clone, Default)]
pub struct Registry {
    insecure: Vec<String>,
    credentials: Credentials,
}

impl Registry {
    /// A client reaching the registries in `insecure` (host[:port], as references write them)
    /// over plain HTTP and every other one over HTTPS, with `credentials`.
    pub fn new(insecure: Vec<String>, credentials: Credentials) -> Self {
        Registry {
            insecure,
            credentials,
        }
    }

    /// `e` with its causes (`: `-joined), and, when an HTTPS request to a registry not in the
    /// insecure list failed, a hint that it may be a plain-HTTP registry.
    fn explain(&self, registry: &str, e: &(dyn std::error::Error + 'static)) -> String {
        let mut text = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            let t = c.to_string();
            if !text.contains(&t) {
                text = format!("{text}: {t}");
            }
            cause = c.source();
        }
        if !self.insecure.iter().any(|r| r == registry) && text.contains("https://") {
            text.push_str(&format!(
                " (if {registry} serves plain HTTP, allow it with --insecure-registry {registry} \
                 or KILN_INSECURE_REGISTRIES)"
            ));
        }
        text
    }

    fn client(&self) -> Client {
        // reqwest is built without a crypto provider of its own: use ring, as kube does.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(self.insecure.clone()),
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            platform_resolver: None,
            // One PUT per blob: components are small (at most a few MiB), and chunked uploads
            // are where registries differ most (go-containerregistry's answers no Location).
            use_monolithic_push: true,
            ..ClientConfig::default()
        })
    }

    /// Pulls the manifest `reference` names by digest and its one component layer, refusing a
    /// layer larger than `max_component_bytes` before reading it. Both digests are checked
    /// (by the client as it reads; the host checks again before it stores or compiles).
    ///
    /// # Errors
    /// A one-line message: unreachable, unauthorized, not found, not a Wasm component artifact,
    /// too large, digest mismatch.
    pub async fn pull(
        &self,
        reference: &OciRef,
        max_component_bytes: usize,
    ) -> Result<PulledArtifact, String> {
        let image: Reference = reference
            .without_scheme()
            .parse()
            .map_err(|e| format!("{reference}: {e}"))?;
        let auth = self.credentials.auth_for(reference.registry());
        let client = self.client();
        let (manifest, _) = client
            .pull_manifest_raw(&image, &auth, &[OCI_MANIFEST_MEDIA_TYPE])
            .await
            .map_err(|e| format!("manifest: {}", self.explain(reference.registry(), &e)))?;
        let layer = component_layer(&manifest)?;
        if layer.size > max_component_bytes as u64 {
            return Err(format!(
                "the component layer has {} bytes, more than the {max_component_bytes} a plugin may have",
                layer.size
            ));
        }
        let mut stream = client
            .pull_blob_stream(&image, layer.digest.as_str())
            .await
            .map_err(|e| format!("component layer {}: {e}", layer.digest))?;
        let mut component = Vec::with_capacity(layer.size as usize);
        use futures::StreamExt as _;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| format!("component layer {}: {e}", layer.digest))?;
            if (component.len() + chunk.len()) as u64 > layer.size {
                return Err(format!(
                    "the registry sent more than the {} bytes of layer {}",
                    layer.size, layer.digest
                ));
            }
            component.extend_from_slice(&chunk);
        }
        Ok(PulledArtifact {
            manifest: manifest.to_vec(),
            component,
        })
    }

    /// Pushes `component` to `target` as a Wasm component artifact (config, layer, manifest
    /// tagged `target.tag`) and returns the pinned reference to pull it by. The manifest and
    /// config hold no timestamp, so pushing the same component again gives the same digest.
    ///
    /// # Errors
    /// A one-line message naming the step that failed.
    pub async fn push(&self, component: &[u8], target: &OciTarget) -> Result<OciRef, String> {
        let image: Reference = format!("{}/{}:{}", target.registry, target.repository, target.tag)
            .parse()
            .map_err(|e| format!("{target}: {e}"))?;
        let layer_digest = format!("sha256:{}", kiln_plugin_host::sha256_hex(component));
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [layer_digest],
        }))
        .map_err(|e| e.to_string())?;
        let config_digest = format!("sha256:{}", kiln_plugin_host::sha256_hex(&config));
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": WASM_CONFIG_MEDIA_TYPE, "digest": config_digest, "size": config.len()},
            "layers": [{"mediaType": WASM_LAYER_MEDIA_TYPE, "digest": layer_digest, "size": component.len()}],
        }))
        .map_err(|e| e.to_string())?;
        let client = self.client();
        let auth = self.credentials.auth_for(&target.registry);
        client
            .auth(&image, &auth, oci_client::RegistryOperation::Push)
            .await
            .map_err(|e| {
                format!(
                    "authenticating to {}: {}",
                    target.registry,
                    self.explain(&target.registry, &e)
                )
            })?;
        push_blob(&client, &image, config, &config_digest)
            .await
            .map_err(|e| format!("pushing the config blob: {e}"))?;
        push_blob(&client, &image, component.to_vec(), &layer_digest)
            .await
            .map_err(|e| format!("pushing the component blob: {e}"))?;
        let hex = kiln_plugin_host::sha256_hex(&manifest);
        let content_type = OCI_MANIFEST_MEDIA_TYPE
            .parse()
            .map_err(|e| format!("{e}"))?;
        client
            .push_manifest_raw(&image, manifest, content_type)
            .await
            .map_err(|e| format!("pushing the manifest: {e}"))?;
        target.pinned(&hex).map_err(|e| e.to_string())
    }

    /// [`Registry::pull`] from synchronous code: on a thread and runtime of its own, so it
    /// works inside or outside an async runtime.
    ///
    /// # Errors
    /// As [`Registry::pull`].
    pub fn pull_blocking(
        &self,
        reference: &OciRef,
        max_component_bytes: usize,
    ) -> Result<PulledArtifact, String> {
        block_on(self.pull(reference, max_component_bytes))
    }

    /// [`Registry::push`] from synchronous code.
    ///
    /// # Errors
    /// As [`Registry::push`].
    pub fn push_blocking(&self, component: &[u8], target: &OciTarget) -> Result<OciRef, String> {
        block_on(self.push(component, target))
    }
}

impl OciFetch for Registry {
    fn fetch(
        &self,
        reference: &OciRef,
        max_component_bytes: usize,
    ) -> Result<PulledArtifact, String> {
        self.pull_blocking(reference, max_component_bytes)
    }
}

/// Uploads one blob. A registry that answers the upload without the `Location` header the
/// distribution specification requires (go-containerregistry's) is asked whether it has the
/// blob now instead.
async fn push_blob(
    client: &Client,
    image: &Reference,
    data: Vec<u8>,
    digest: &str,
) -> Result<(), oci_client::errors::OciDistributionError> {
    match client.push_blob(image, data, digest).await {
        Ok(_) => Ok(()),
        Err(oci_client::errors::OciDistributionError::RegistryNoLocationError)
            if client.blob_exists(image, digest).await? =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Runs `f` to completion on a new thread with a current-thread runtime.
fn block_on<T: Send>(f: impl Future<Output = Result<T, String>> + Send) -> Result<T, String> {
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("starting a runtime: {e}"))?
                .block_on(f)
        })
        .join()
        .unwrap_or_else(|_| Err("the registry client panicked".into()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_docker_config_credentials() {
        let auth = base64::engine::general_purpose::STANDARD.encode("robot:s3cret");
        let json = format!(
            r#"{{"auths": {{"https://ghcr.io/v1/": {{"auth": "{auth}"}}, "127.0.0.1:5000": {{"username": "u", "password": "p"}}, "https://index.docker.io/v1/": {{"auth": "{auth}"}}}}}}"#
        );
        let c = Credentials::from_docker_config(json.as_bytes()).unwrap();
        assert_eq!(
            c.registries(),
            ["127.0.0.1:5000", "ghcr.io", "index.docker.io"]
        );
        assert_eq!(
            c.auth_for("ghcr.io"),
            RegistryAuth::Basic("robot".into(), "s3cret".into())
        );
        assert_eq!(
            c.auth_for("127.0.0.1:5000"),
            RegistryAuth::Basic("u".into(), "p".into())
        );
        assert_eq!(
            c.auth_for("docker.io"),
            RegistryAuth::Basic("robot".into(), "s3cret".into())
        );
        assert_eq!(c.auth_for("quay.io"), RegistryAuth::Anonymous);
        assert!(!format!("{c:?}").contains("s3cret"));
        let e = Credentials::from_docker_config(br#"{"auths": {"ghcr.io": {"auth": "!!"}}}"#)
            .unwrap_err();
        assert!(e.contains("\"ghcr.io\"") && !e.contains("!!"), "{e}");
        assert!(
            Credentials::from_docker_config(b"{}")
                .unwrap_err()
                .contains("no `auths`")
        );
    }
}
