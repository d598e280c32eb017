//! Plugins distributed through a real OCI registry: go-containerregistry's in-memory registry
//! (`testcluster/registry/build.sh` builds it from Go modules), started by the test on a loopback
//! port and reached over plain HTTP (named as an insecure registry).
//!
//! A plugin pushed with [`Registry::push`] and pinned by the digest it returns renders through
//! the operator's path (a [`Renderer`] over a host with the registry as its
//! [`kiln_plugin_host::oci::OciFetch`], the policy's `kiln.dev/plugins` chain); a manifest
//! rewritten in the registry under the pinned digest is refused, naming the reference, and
//! nothing of it is stored; a reference by tag is refused when the policy is read.
//!
//! Without the registry binary the tests are skipped with a loud message, unless
//! `$KILN_REQUIRE_REGISTRY_TEST` is set (CI sets it in `.ci/run`), when they fail.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use kiln_core::State;
use kiln_core::oci_ref::{OciRef, OciTarget};
use kiln_plugin_host::oci::OciFetch as _;
use kiln_plugin_host::{HostConfig, PluginError, PluginHost};
use kiln_plugin_oci::{Credentials, Registry};
use kiln_render::{Policy, Renderer, defaults};
use serde_json::Value;

#[allow(dead_code)]
#[path = "../../plugin-host/tests/host/common.rs"]
mod common;

/// The registry process, killed when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn registry_binary() -> PathBuf {
    std::env::var_os("KILN_TEST_REGISTRY").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testcluster/registry/bin/registry"),
        PathBuf::from,
    )
}

/// Starts the registry on a free port (it prints `serving on port N`), or `None` when its
/// binary is missing and the test may be skipped.
fn start() -> Option<Server> {
    let bin = registry_binary();
    if !bin.is_file() {
        let msg = format!(
            "\n\n!!!!!!!! registry test SKIPPED: no {} (run testcluster/registry/build.sh); \
             OCI plugin distribution is not checked !!!!!!!!\n\n",
            bin.display()
        );
        assert!(
            std::env::var_os("KILN_REQUIRE_REGISTRY_TEST").is_none(),
            "KILN_REQUIRE_REGISTRY_TEST is set: {msg}"
        );
        eprintln!("{msg}");
        return None;
    }
    let mut child = Command::new(&bin)
        .args(["-port", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let port = loop {
        let line = lines
            .next()
            .expect("the registry exited before serving")
            .unwrap();
        if let Some(port) = line.split("serving on port ").nth(1) {
            break port.trim().to_string();
        }
    };
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Some(Server {
        child,
        addr: format!("127.0.0.1:{port}"),
    })
}

fn registry(server: &Server) -> Registry {
    Registry::new(vec![server.addr.clone()], Credentials::default())
}

/// A site plugin `name` (the `patch_each` fixture) that annotates every object.
fn annotating_plugin(name: &str) -> Vec<u8> {
    common::patcher(
        name,
        r#"[{"op":"add","path":"/metadata/annotations","value":{"example.com/pulled":"by-digest"}}]"#,
    )
}

/// The artifact cache the render tests share (`target/kiln-test-plugin-cache`).
fn shared_cache() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/kiln-test-plugin-cache")
}

fn host(cache: &Path, registry: Registry) -> Arc<PluginHost> {
    let cfg = HostConfig {
        cache_dir: Some(cache.to_path_buf()),
        ..HostConfig::in_memory()
    };
    Arc::new(
        PluginHost::new(cfg, kiln_bundled_plugins::BUNDLED)
            .unwrap()
            .with_oci_fetch(Arc::new(registry)),
    )
}

/// The repository's sample ClusterPolicy, chaining `entry` after the device-plugin state's
/// standard plugin.
fn policy(entry: &str) -> Result<Policy, String> {
    let sample =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/samples/clusterpolicy.yaml");
    let mut doc: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(sample).unwrap()).unwrap();
    let annotation = format!("device-plugin:\n  then:\n    - name: {entry}\n");
    doc["metadata"]["annotations"] = serde_json::json!({ "kiln.dev/plugins": annotation });
    Policy::from_object(&doc).map_err(|e| e.to_string())
}

#[test]
fn a_plugin_pulled_by_digest_renders_and_a_tampered_one_is_refused() {
    let Some(server) = start() else { return };
    let reg = registry(&server);
    let plugin = annotating_plugin("site-annotate");
    let target =
        OciTarget::parse(&format!("oci://{}/plugins/site-annotate:v1", server.addr)).unwrap();
    let pinned = reg.push_blocking(&plugin, &target).unwrap();
    // Pushing the same component again gives the same digest (no timestamps).
    assert_eq!(reg.push_blocking(&plugin, &target).unwrap(), pinned);
    assert_eq!(
        reg.pull_blocking(&pinned, 1 << 20).unwrap().component,
        plugin
    );

    // The operator's path: a renderer over a host that pulls, the chain from the annotation.
    // The artifact cache is the one the render tests share (the standard plugins compile once
    // per checkout); the pulled copy of this test's plugin is removed first, so it is pulled.
    let cache = shared_cache();
    let stored = cache.join("oci/sha256").join(pinned.digest_hex());
    let _ = std::fs::remove_dir_all(&stored);
    let renderer = Renderer::new(host(&cache, registry(&server)));
    let policy = policy(&pinned.to_string()).unwrap();
    let ctx = defaults::render_context();
    let rendered = renderer
        .render_state(State::DevicePlugin, &policy, &ctx)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!rendered.objects.is_empty());
    for o in &rendered.objects {
        assert_eq!(
            o["metadata"]["annotations"]["example.com/pulled"], "by-digest",
            "{o}"
        );
    }
    assert_eq!(
        std::fs::read(stored.join("component.wasm")).unwrap(),
        plugin
    );
    let loaded = renderer.host().loaded(&pinned.to_string()).unwrap();
    assert_eq!(
        loaded.source(),
        &kiln_plugin_host::PluginSource::Oci(pinned.to_string())
    );

    // The registry now serves another manifest under the pinned digest (naming another
    // component, pushed under another tag): refused, and nothing stored for it.
    let other = annotating_plugin("other");
    let other_ref = reg
        .push_blocking(
            &other,
            &OciTarget::parse(&format!(
                "oci://{}/plugins/site-annotate:other",
                server.addr
            ))
            .unwrap(),
        )
        .unwrap();
    let other_manifest = reg.pull_blocking(&other_ref, 1 << 20).unwrap().manifest;
    overwrite_manifest(&server, &pinned, &other_manifest);
    let fresh = tempfile::tempdir().unwrap();
    let host = host(fresh.path(), registry(&server));
    let err = host.load(&pinned.to_string(), None).unwrap_err();
    assert!(
        matches!(&err, PluginError::PullFailed { plugin, .. } if *plugin == pinned.to_string()),
        "{err}"
    );
    assert!(err.to_string().contains("sha256"), "{err}");
    assert!(
        !fresh
            .path()
            .join("oci/sha256")
            .join(pinned.digest_hex())
            .exists()
    );
    // The fetcher on its own refuses it too (the client checks the digest as it reads).
    assert!(registry(&server).fetch(&pinned, 1 << 20).is_err());
    // The host that pulled before keeps the verified copy it stored: still the same plugin.
    let again = Renderer::new(host_with_store(&cache))
        .render_state(State::DevicePlugin, &policy, &ctx)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again, rendered);
}

/// A host that pulls from no registry: only what is stored under `cache`.
fn host_with_store(cache: &Path) -> Arc<PluginHost> {
    let cfg = HostConfig {
        cache_dir: Some(cache.to_path_buf()),
        ..HostConfig::in_memory()
    };
    Arc::new(PluginHost::new(cfg, kiln_bundled_plugins::BUNDLED).unwrap())
}

/// PUTs `manifest` under `reference`'s digest (the in-memory registry stores a manifest under
/// the reference it is put to without checking it against the digest: a tampering registry).
fn overwrite_manifest(server: &Server, reference: &OciRef, manifest: &[u8]) {
    use std::io::{Read as _, Write as _};
    let mut conn = std::net::TcpStream::connect(&server.addr).unwrap();
    let head = format!(
        "PUT /v2/{}/manifests/{} HTTP/1.1\r\nHost: {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reference.repository(),
        reference.digest(),
        server.addr,
        kiln_plugin_host::oci::OCI_MANIFEST_MEDIA_TYPE,
        manifest.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(manifest).unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
}

#[test]
fn references_by_tag_and_plain_http_without_consent_are_refused() {
    let err = policy("oci://127.0.0.1:5000/plugins/site-annotate:v1").unwrap_err();
    assert!(
        err.contains("then[0].name") && err.contains("pulled by digest only"),
        "{err}"
    );
    let Some(server) = start() else { return };
    let plugin = annotating_plugin("site-annotate");
    let target =
        OciTarget::parse(&format!("oci://{}/plugins/site-annotate:v1", server.addr)).unwrap();
    let pinned = registry(&server).push_blocking(&plugin, &target).unwrap();
    // HTTPS is the default: a registry not named insecure is not reached over plain HTTP.
    let https_only = Registry::new(Vec::new(), Credentials::default());
    assert!(https_only.pull_blocking(&pinned, 1 << 20).is_err());
    // A layer over the size bound is refused before it is read.
    let err = registry(&server)
        .pull_blocking(&pinned, plugin.len() - 1)
        .unwrap_err();
    assert!(err.contains("more than the"), "{err}");
    // The component's name() must be the repository's last path component.
    let misnamed = registry(&server)
        .push_blocking(
            &annotating_plugin("elsewhere"),
            &OciTarget::parse(&format!("oci://{}/plugins/site-annotate:v2", server.addr)).unwrap(),
        )
        .unwrap();
    let cache = tempfile::tempdir().unwrap();
    let err = host(cache.path(), registry(&server))
        .load(&misnamed.to_string(), None)
        .unwrap_err();
    assert!(
        matches!(&err, PluginError::NameMismatch { plugin, exported } if *plugin == misnamed.to_string() && exported == "elsewhere"),
        "{err}"
    );
}

/// A standard bundle pushed under a bundled plugin's name (`…/node-placement`) runs as that
/// plugin: the host calls it by the repository's last path segment, not by the whole
/// reference, in `validate-settings` and in `transform`.
#[test]
fn the_standard_bundle_pulled_as_node_placement_runs_as_node_placement() {
    let Some(server) = start() else { return };
    let reg = registry(&server);
    let bundle = kiln_bundled_plugins::get("node-placement").expect("node-placement is bundled");
    let target =
        OciTarget::parse(&format!("oci://{}/site/node-placement:v1", server.addr)).unwrap();
    let pinned = reg.push_blocking(bundle, &target).unwrap();
    let sample =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/samples/clusterpolicy.yaml");
    let mut doc: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(sample).unwrap()).unwrap();
    let annotation = format!(
        "device-plugin:\n  then:\n    - name: {pinned}\n      settings:\n        nodeSelector: {{pool: gpu-a}}\n"
    );
    doc["metadata"]["annotations"] = serde_json::json!({ "kiln.dev/plugins": annotation });
    let policy = Policy::from_object(&doc).unwrap();
    let fresh = tempfile::tempdir().unwrap();
    let rendered = Renderer::new(host(fresh.path(), registry(&server)))
        .render_state(State::DevicePlugin, &policy, &defaults::render_context())
        .unwrap_or_else(|e| panic!("{e}"));
    let daemonsets: Vec<_> = rendered
        .objects
        .iter()
        .filter(|o| o["kind"] == "DaemonSet")
        .collect();
    assert!(!daemonsets.is_empty());
    for ds in daemonsets {
        assert_eq!(
            ds["spec"]["template"]["spec"]["nodeSelector"]["pool"], "gpu-a",
            "{ds}"
        );
    }
}
