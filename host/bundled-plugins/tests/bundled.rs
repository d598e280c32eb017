//! Every bundled plugin loads in the host under its own name and imports only what is allowed.

use kiln_plugin_host::{HostConfig, PluginHost, PluginSource};

#[test]
fn every_bundled_plugin_loads() {
    let host = PluginHost::new(HostConfig::in_memory(), kiln_bundled_plugins::BUNDLED).unwrap();
    let mut failures = Vec::new();
    for (i, (name, bytes)) in kiln_bundled_plugins::BUNDLED.iter().enumerate() {
        match host.load(name, None) {
            Ok(plugin) => {
                assert_eq!(plugin.name(), *name);
                assert_eq!(plugin.source(), &PluginSource::Bundled);
                assert_eq!(plugin.sha256(), kiln_plugin_host::sha256_hex(bytes));
                // One standard bundle, compiled once: every later name reuses it.
                assert!(plugin.is_bundle(), "{name}");
                let expected = if i == 0 {
                    kiln_plugin_host::CacheHit::Compiled
                } else {
                    kiln_plugin_host::CacheHit::Memory
                };
                assert_eq!(plugin.cache_hit(), expected, "{name}");
                println!(
                    "{name}: {} bytes, imports {:?}",
                    bytes.len(),
                    plugin.imports()
                );
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(
        failures.is_empty(),
        "bundled plugins that do not load:\n{}",
        failures.join("\n")
    );
    let mut names: Vec<&str> = kiln_bundled_plugins::BUNDLED
        .iter()
        .map(|(n, _)| *n)
        .collect();
    names.dedup();
    assert_eq!(names.len(), kiln_bundled_plugins::BUNDLED.len());
}

#[test]
fn build_time_digests_match_the_embedded_bytes() {
    let names: Vec<&str> = kiln_bundled_plugins::BUNDLED
        .iter()
        .map(|(n, _)| *n)
        .collect();
    let digest_names: Vec<&str> = kiln_bundled_plugins::BUNDLED_SHA256
        .iter()
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(digest_names, names);
    for ((name, bytes), (_, digest)) in kiln_bundled_plugins::BUNDLED
        .iter()
        .zip(kiln_bundled_plugins::BUNDLED_SHA256)
    {
        assert_eq!(*digest, kiln_plugin_host::sha256_hex(bytes), "{name}");
    }
}

#[test]
fn a_host_with_build_time_digests_loads_from_the_disk_cache_under_the_same_digest() {
    let dir = tempfile::tempdir().unwrap();
    let config = HostConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        ..HostConfig::in_memory()
    };
    let (name, bytes) = kiln_bundled_plugins::BUNDLED[0];
    let first = PluginHost::new(config.clone(), kiln_bundled_plugins::BUNDLED).unwrap();
    first.load(name, None).unwrap();
    let second = PluginHost::new(config, kiln_bundled_plugins::BUNDLED)
        .unwrap()
        .with_bundled_digests(kiln_bundled_plugins::BUNDLED_SHA256);
    let p = second.load(name, None).unwrap();
    assert_eq!(p.sha256(), kiln_plugin_host::sha256_hex(bytes));
    assert_eq!(p.cache_hit(), kiln_plugin_host::CacheHit::Disk);
}

/// The host does not parse a standard plugin's patched DaemonSet again as a typed DaemonSet
/// (`wit/README.md`, output policy) because `kiln_plugin_std::export_operand!` answers only
/// serializations of the typed DaemonSet it edited. Every bundled plugin must export through
/// it, not through `export_plugin!` (free-form `Value` edits, for site plugins); the one bundled
/// plugin configured by settings (`node-placement`) edits the typed `PodSpec` and writes it back
/// as it serializes.
#[test]
fn every_bundled_plugin_exports_the_typed_operand_path() {
    let plugins = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins");
    for (name, _) in kiln_bundled_plugins::BUNDLED {
        let lib = plugins.join(name).join("src/lib.rs");
        let text =
            std::fs::read_to_string(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
        assert!(
            (text.contains("kiln_plugin_std::export_operand!(")
                || text.contains("kiln_plugin_sdk::export_plugin_with_settings!("))
                && !text.contains("export_plugin!"),
            "{}: a bundled plugin exports through export_operand! (or, configured by settings, \
             export_plugin_with_settings! editing typed pod specs) only",
            lib.display()
        );
    }
}

/// The bundled plugins are one component: plugins loaded at the same time (the render's workers
/// each taking a state) wait for one compile of it instead of each compiling it, which made a
/// first render in an empty cache take twice as long (4.2 s against 2.1 s on 2 cores).
#[test]
fn plugins_of_one_component_loaded_at_once_compile_it_once() {
    let host = PluginHost::new(HostConfig::in_memory(), kiln_bundled_plugins::BUNDLED).unwrap();
    let names = ["driver", "dcgm", "device-plugin"];
    let start = std::sync::Barrier::new(names.len());
    let hits: Vec<kiln_plugin_host::CacheHit> = std::thread::scope(|scope| {
        let loads: Vec<_> = names
            .iter()
            .map(|name| {
                let (host, start) = (&host, &start);
                scope.spawn(move || {
                    start.wait();
                    host.load(name, None).unwrap().cache_hit()
                })
            })
            .collect();
        loads.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let compiled = hits
        .iter()
        .filter(|h| **h == kiln_plugin_host::CacheHit::Compiled)
        .count();
    assert_eq!(compiled, 1, "{hits:?}");
}
