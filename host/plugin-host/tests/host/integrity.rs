//! Integrity: a precompiled artifact runs only when it belongs to the wasm it is named after;
//! a drop-in shadowing a bundled plugin is visible and refusable.

use kiln_plugin_host::{CacheHit, HostConfig, PluginError, PluginHost, PluginSource, sha256_hex};
use serde_json::json;

use crate::common::*;

fn cached(dirs: &Dirs) -> HostConfig {
    HostConfig {
        cache_dir: Some(dirs.cache.clone()),
        ..dirs.config()
    }
}

/// Loads `good` and `other` through a disk cache and returns the artifact paths.
fn fill_cache(dirs: &Dirs) -> (std::path::PathBuf, std::path::PathBuf) {
    dirs.install("other", &patcher("other", "[]"));
    let host = host_with_good(dirs, cached(dirs));
    let good = host.load("good", None).unwrap();
    let other = host.load("other", None).unwrap();
    assert_eq!(good.cache_hit(), CacheHit::Compiled);
    (
        host.artifact_path(good.sha256()).unwrap(),
        host.artifact_path(other.sha256()).unwrap(),
    )
}

fn record(artifact: &std::path::Path) -> std::path::PathBuf {
    let mut p = artifact.as_os_str().to_owned();
    p.push(".sha256");
    p.into()
}

#[test]
fn an_artifact_comes_with_its_record_and_is_reused() {
    let dirs = Dirs::new();
    let (good, _) = fill_cache(&dirs);
    let text = std::fs::read_to_string(record(&good)).unwrap();
    let artifact_sha = sha256_hex(&std::fs::read(&good).unwrap());
    assert_eq!(
        text,
        format!(
            "artifact-sha256 {artifact_sha}\nsource-sha256 {}\n",
            sha256_hex(good_wasm())
        )
    );
    let host = PluginHost::new(cached(&dirs), &[]).unwrap();
    assert_eq!(host.load("good", None).unwrap().cache_hit(), CacheHit::Disk);
}

#[test]
fn an_artifact_swapped_for_another_plugins_is_not_run() {
    let dirs = Dirs::new();
    let (good, other) = fill_cache(&dirs);
    // Another plugin's artifact under good's name: alone, then with its record too.
    for with_record in [false, true] {
        std::fs::copy(&other, &good).unwrap();
        if with_record {
            std::fs::copy(record(&other), record(&good)).unwrap();
        }
        let host = PluginHost::new(cached(&dirs), &[]).unwrap();
        let loaded = host.load("good", None).unwrap();
        assert_eq!(
            loaded.cache_hit(),
            CacheHit::Compiled,
            "with record: {with_record}"
        );
        // It is the good guest that runs (the other one answers `[]` and has another name).
        let out = host
            .transform("good", &[daemonset("ds")], &json!({}), &ctx())
            .unwrap();
        let kiln_plugin_host::Rendered::Keep(o) = &out.rendered[0] else {
            panic!("omitted")
        };
        assert_eq!(
            o["metadata"]["labels"]["kiln.test/seen"], "device-plugin",
            "{o}"
        );
        // The recompile rewrote the artifact and its record.
        let host = PluginHost::new(cached(&dirs), &[]).unwrap();
        assert_eq!(host.load("good", None).unwrap().cache_hit(), CacheHit::Disk);
    }
    // Without a record, or a truncated artifact: recompiled.
    std::fs::remove_file(record(&good)).unwrap();
    let host = PluginHost::new(cached(&dirs), &[]).unwrap();
    assert_eq!(
        host.load("good", None).unwrap().cache_hit(),
        CacheHit::Compiled
    );
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(&good, &bytes[..bytes.len() / 2]).unwrap();
    let host = PluginHost::new(cached(&dirs), &[]).unwrap();
    assert_eq!(
        host.load("good", None).unwrap().cache_hit(),
        CacheHit::Compiled
    );
}

#[test]
fn a_drop_in_shadowing_a_bundled_plugin_is_flagged_and_refusable() {
    let dirs = Dirs::new();
    let bundled: &'static [u8] = Box::leak(patcher("device-plugin", "[]").into_boxed_slice());
    dirs.install("device-plugin", &patcher("device-plugin", "[]"));
    let host = PluginHost::new(dirs.config(), &[("device-plugin", bundled)]).unwrap();
    let p = host.load("device-plugin", None).unwrap();
    let path = dirs.drop_in.join("device-plugin.wasm");
    assert_eq!(p.source(), &PluginSource::DropIn(path.clone()));
    assert!(p.shadows_bundled());
    assert!(!p.is_standard());
    assert_eq!(
        p.describe_source(),
        format!(
            "device-plugin (drop-in {}, shadows bundled)",
            path.display()
        )
    );
    assert!(host.loaded("device-plugin").unwrap().shadows_bundled());
    // The same answer without a load (what the operator's status reports).
    assert_eq!(host.shadowing_drop_in("device-plugin"), Some(path.clone()));
    assert_eq!(host.shadowing_drop_in("good"), None);

    let host = PluginHost::new(
        HostConfig {
            refuse_shadowing: true,
            ..dirs.config()
        },
        &[("device-plugin", bundled)],
    )
    .unwrap();
    let err = host.load("device-plugin", None).unwrap_err();
    assert!(
        matches!(&err, PluginError::ShadowingRefused { plugin, path: p } if plugin == "device-plugin" && *p == path),
        "{err:?}"
    );
    // Without the drop-in, the bundled one loads, and is standard.
    std::fs::remove_file(&path).unwrap();
    let p = host.load("device-plugin", None).unwrap();
    assert!(p.is_standard() && !p.shadows_bundled());
    assert_eq!(p.describe_source(), "device-plugin");
    assert_eq!(host.shadowing_drop_in("device-plugin"), None);
}

#[test]
fn a_drop_in_that_is_not_a_regular_small_file_is_not_read_whole() {
    let dirs = Dirs::new();
    std::os::unix::fs::symlink("/dev/zero", dirs.drop_in.join("zero.wasm")).unwrap();
    let host = PluginHost::new(
        HostConfig {
            max_component_bytes: 1 << 20,
            ..dirs.config()
        },
        &[],
    )
    .unwrap();
    let err = host.load("zero", None).unwrap_err();
    assert!(
        matches!(&err, PluginError::ComponentLimit { exceeded, .. }
            if exceeded.len() == 1 && exceeded[0].what == "bytes" && exceeded[0].limit == 1_048_576
                // read up to 4 times the bound (to audit it whole), never more
                && exceeded[0].actual == (4 << 20) + 1),
        "{err:?}"
    );
}
