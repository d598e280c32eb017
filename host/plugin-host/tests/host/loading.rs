//! Lookup, pinning, name checks and the artifact cache.

use kiln_plugin_host::{
    CacheHit, HostConfig, PluginError, PluginHost, PluginSource, inspect, sha256_hex,
};
use serde_json::json;

use crate::common::*;

fn leak(bytes: Vec<u8>) -> &'static [u8] {
    Box::leak(bytes.into_boxed_slice())
}

#[test]
fn pins_are_checked() {
    let dirs = Dirs::new();
    let host = host_with_good(&dirs, dirs.config());
    let digest = sha256_hex(good_wasm());
    let loaded = host.load("good", Some(&digest.to_uppercase())).unwrap();
    assert_eq!(loaded.sha256(), digest);

    let wrong = "0".repeat(64);
    match host.load("good", Some(&wrong)).unwrap_err() {
        PluginError::DigestMismatch {
            plugin,
            expected,
            actual,
        } => {
            assert_eq!(
                (plugin.as_str(), expected.as_str(), actual.as_str()),
                ("good", wrong.as_str(), digest.as_str())
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        host.load("good", Some("abc")),
        Err(PluginError::InvalidPin { .. })
    ));
}

#[test]
fn drop_in_wins_over_bundled_and_bundled_is_the_fallback() {
    let dirs = Dirs::new();
    let bundled_bytes = leak(hostile("trap", "trap"));
    let bundled = [("good", good_wasm()), ("trap", bundled_bytes)];
    // "good" is bundled only; "trap" is bundled as a trapping plugin but replaced by a drop-in.
    dirs.install("trap", &hostile("not_json", "trap"));
    let host = PluginHost::new(dirs.config(), &bundled).unwrap();

    let good = host.load("good", None).unwrap();
    assert_eq!(good.source(), &PluginSource::Bundled);
    let trap = host.load("trap", None).unwrap();
    assert_eq!(
        trap.source(),
        &PluginSource::DropIn(dirs.drop_in.join("trap.wasm"))
    );
    let err = host
        .transform("trap", &[daemonset("ds")], &json!({}), &ctx())
        .unwrap_err();
    assert!(
        matches!(err, PluginError::InvalidPatch { .. }),
        "drop-in not used: {err:?}"
    );

    match host.load("missing", None).unwrap_err() {
        PluginError::NotFound { plugin, drop_in } => {
            assert_eq!(plugin, "missing");
            assert_eq!(drop_in, Some(dirs.drop_in.join("missing.wasm")));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        host.load("../etc/passwd", None),
        Err(PluginError::InvalidName { .. })
    ));
}

#[test]
fn a_component_with_another_name_is_refused() {
    let dirs = Dirs::new();
    dirs.install("other", good_wasm());
    let host = host_with_good(&dirs, dirs.config());
    match host.load("other", None).unwrap_err() {
        PluginError::NameMismatch { plugin, exported } => {
            assert_eq!((plugin.as_str(), exported.as_str()), ("other", "good"))
        }
        other => panic!("{other:?}"),
    }
    assert_good_works(&host);
}

#[test]
fn garbage_is_a_load_failure() {
    let dirs = Dirs::new();
    dirs.install("junk", b"not wasm at all");
    let host = host_with_good(&dirs, dirs.config());
    match host.load("junk", None) {
        Err(PluginError::LoadFailed { plugin, message }) => {
            assert_eq!(plugin, "junk");
            assert_eq!(message, "not a WebAssembly file (no \\0asm header)");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        inspect(b"not wasm"),
        Err(PluginError::LoadFailed { .. })
    ));
    match kiln_plugin_host::inspect_as(b"not wasm", "notes") {
        Err(PluginError::LoadFailed { plugin, .. }) => assert_eq!(plugin, "notes"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_second_host_loads_from_the_disk_cache() {
    let dirs = Dirs::new();
    let config = HostConfig {
        cache_dir: Some(dirs.cache.clone()),
        ..dirs.config()
    };
    let digest = sha256_hex(good_wasm());

    let first = host_with_good(&dirs, config.clone());
    let started = std::time::Instant::now();
    let loaded = first.load("good", None).unwrap();
    let compile = started.elapsed();
    assert_eq!(loaded.cache_hit(), CacheHit::Compiled);
    let artifact = first.artifact_path(&digest).unwrap();
    assert!(artifact.is_file(), "{artifact:?} missing");
    assert!(
        artifact
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(&digest)
    );
    // Loading again in the same host uses the loaded plugin.
    assert_eq!(
        first.load("good", None).unwrap().cache_hit(),
        CacheHit::Compiled
    );
    drop(first);

    let second = PluginHost::new(config, &[]).unwrap();
    let started = std::time::Instant::now();
    let loaded = second.load("good", None).unwrap();
    let cached = started.elapsed();
    assert_eq!(loaded.cache_hit(), CacheHit::Disk);
    println!("load of the good guest: compile {compile:?}, from disk cache {cached:?}");
    assert_good_works(&second);
}

/// `PluginHost::inspect_as` (`kiln plugin check`) compiles through the host's caches: an
/// accepted component is then loaded from the disk cache by another host, and checked again
/// it is not compiled again; a component refused after compiling leaves nothing cached.
#[test]
fn inspecting_fills_the_disk_cache_only_for_an_accepted_component() {
    let dirs = Dirs::new();
    let config = HostConfig {
        cache_dir: Some(dirs.cache.clone()),
        ..dirs.config()
    };
    let artifacts = || std::fs::read_dir(&dirs.cache).map_or(0, |d| d.count());
    let checker = PluginHost::new(config.clone(), &[]).unwrap();
    // Named otherwise than the file it would be installed as: refused, nothing cached.
    let report = checker.inspect_as(good_wasm(), "other").unwrap();
    assert!(report.refusal.is_some());
    assert_eq!(report.cache_hit, Some(CacheHit::Compiled));
    assert_eq!(artifacts(), 0);
    let report = checker.inspect_as(good_wasm(), "good").unwrap();
    assert!(report.accepted(), "{:?}", report.refusal);
    assert_eq!(report.cache_hit, Some(CacheHit::Compiled));
    // The artifact and its digest record.
    assert_eq!(artifacts(), 2);
    let again = PluginHost::new(config.clone(), &[]).unwrap();
    let report = again.inspect_as(good_wasm(), "good").unwrap();
    assert_eq!(report.cache_hit, Some(CacheHit::Disk));
    let host = host_with_good(&dirs, config);
    assert_eq!(host.load("good", None).unwrap().cache_hit(), CacheHit::Disk);
    assert_good_works(&host);
    // Refused before compiling: no compile at all.
    let report = checker
        .inspect_as(&standalone("forbidden_many"), "many")
        .unwrap();
    assert!(report.refusal.is_some() && report.cache_hit.is_none());
}

#[test]
fn released_plugins_reload_from_the_disk_cache() {
    let dirs = Dirs::new();
    let with_disk = host_with_good(
        &dirs,
        HostConfig {
            cache_dir: Some(dirs.cache.clone()),
            ..dirs.config()
        },
    );
    assert_eq!(
        with_disk.load("good", None).unwrap().cache_hit(),
        CacheHit::Compiled
    );
    assert_eq!(with_disk.loaded_plugins(), ["good"]);
    assert_eq!(with_disk.release_loaded(), 1);
    assert!(with_disk.loaded_plugins().is_empty());
    assert_eq!(with_disk.release_loaded(), 0);
    // Reloaded from the artifact, not recompiled, and it still works.
    assert_eq!(
        with_disk.plugin("good", None).unwrap().cache_hit(),
        CacheHit::Disk
    );
    assert_good_works(&with_disk);

    // Without a disk cache nothing is dropped (reloading would mean recompiling).
    let memory_only = host_with_good(&dirs, dirs.config());
    memory_only.load("good", None).unwrap();
    assert_eq!(memory_only.release_loaded(), 0);
    assert_eq!(
        memory_only.plugin("good", None).unwrap().cache_hit(),
        CacheHit::Compiled
    );
}

#[test]
fn an_unwritable_cache_dir_falls_back_to_memory() {
    let dirs = Dirs::new();
    let file = dirs.drop_in.join("not-a-dir");
    std::fs::write(&file, b"").unwrap();
    let config = HostConfig {
        cache_dir: Some(file.join("sub")),
        ..dirs.config()
    };
    let host = host_with_good(&dirs, config);
    assert!(host.artifact_path("x").is_none());
    assert_good_works(&host);
}
