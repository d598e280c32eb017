//! Plugin call costs: a warm call (fresh store + instantiate + `transform` + patch apply and
//! validation) of the Rust std test guest on one DaemonSet, and loading a plugin by compiling
//! it versus from the disk cache.
//!
//! Run with `cargo bench -p kiln-plugin-host`; the test guest is built on first use.
//!
//! With `KILN_BENCH_PLUGINS=a.wasm:b.wasm` (e.g. the Python and JavaScript templates built by
//! `kiln plugin new --lang python|js`), it first prints, for the Rust test guest and each of
//! those, the time to compile it, to load it from the disk cache, and the median of 50 warm
//! calls on one DaemonSet (one line each; plain figures, not criterion runs: a Python
//! component takes seconds to compile).
// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use kiln_plugin_host::{CacheHit, HostConfig, PluginHost};
use serde_json::json;

#[allow(dead_code)]
#[path = "../tests/host/common.rs"]
mod common;

fn warm_call(c: &mut Criterion) {
    let dirs = common::Dirs::new();
    let host = common::host_with_good(&dirs, dirs.config());
    let objects = [common::daemonset("nvidia-device-plugin-daemonset")];
    let spec = json!({});
    let ctx = common::ctx();
    host.load("good", None).unwrap();
    c.bench_function("warm_call/good/1_daemonset", |b| {
        b.iter(|| {
            black_box(
                host.transform("good", black_box(&objects), &spec, &ctx)
                    .unwrap(),
            )
        })
    });
    let many: Vec<_> = (0..20)
        .map(|i| common::daemonset(&format!("ds-{i}")))
        .collect();
    c.bench_function("warm_call/good/20_daemonsets", |b| {
        b.iter(|| {
            black_box(
                host.transform("good", black_box(&many), &spec, &ctx)
                    .unwrap(),
            )
        })
    });
}

fn load(c: &mut Criterion) {
    let mut group = c.benchmark_group("load");
    group.sample_size(10);
    group.bench_function("compile/good", |b| {
        b.iter(|| {
            let dirs = common::Dirs::new();
            let host = common::host_with_good(&dirs, dirs.config());
            let p = host.load("good", None).unwrap();
            assert_eq!(p.cache_hit(), CacheHit::Compiled);
        })
    });
    let dirs = common::Dirs::new();
    let config = HostConfig {
        cache_dir: Some(dirs.cache.clone()),
        ..dirs.config()
    };
    common::host_with_good(&dirs, config.clone())
        .load("good", None)
        .unwrap();
    group.bench_function("disk_cache/good", |b| {
        b.iter(|| {
            let host = PluginHost::new(config.clone(), &[]).unwrap();
            let p = host.load("good", None).unwrap();
            assert_eq!(p.cache_hit(), CacheHit::Disk);
        })
    });
    group.finish();
}

/// Compile, disk-cache load and median warm call of the test guest and of every plugin in
/// `$KILN_BENCH_PLUGINS`, printed (see the crate documentation above).
fn other_languages(_: &mut Criterion) {
    let Some(list) = std::env::var_os("KILN_BENCH_PLUGINS") else {
        return;
    };
    let mut files: Vec<(String, Vec<u8>)> = vec![("good".into(), common::good_wasm().to_vec())];
    for path in std::env::split_paths(&list) {
        let bytes = std::fs::read(&path).unwrap();
        let name = kiln_plugin_host::inspect(&bytes).unwrap().name.unwrap();
        files.push((name, bytes));
    }
    let objects = [common::daemonset("nvidia-device-plugin-daemonset")];
    let ctx = common::ctx();
    for (name, bytes) in files {
        let dirs = common::Dirs::new();
        dirs.install(&name, &bytes);
        let config = HostConfig {
            cache_dir: Some(dirs.cache.clone()),
            ..dirs.config()
        };
        let started = std::time::Instant::now();
        let host = PluginHost::new(config.clone(), &[]).unwrap();
        assert_eq!(
            host.load(&name, None).unwrap().cache_hit(),
            CacheHit::Compiled
        );
        let compile = started.elapsed();
        let started = std::time::Instant::now();
        let host = PluginHost::new(config, &[]).unwrap();
        assert_eq!(host.load(&name, None).unwrap().cache_hit(), CacheHit::Disk);
        let load = started.elapsed();
        let mut calls: Vec<_> = (0..50)
            .map(|_| {
                let started = std::time::Instant::now();
                black_box(host.transform(&name, &objects, &json!({}), &ctx).unwrap());
                started.elapsed()
            })
            .collect();
        calls.sort();
        println!(
            "{name}: {} bytes; compile {:.2} s; load from cache {:.1} ms; warm call {:.2} ms (median of 50)",
            bytes.len(),
            compile.as_secs_f64(),
            load.as_secs_f64() * 1e3,
            calls[25].as_secs_f64() * 1e3
        );
    }
}

criterion_group!(benches, other_languages, warm_call, load);
criterion_main!(benches);
