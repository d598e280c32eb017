//! Plugin call costs: a warm call (fresh store + instantiate + `transform` + patch apply and
//! validation) of the Rust std test guest on one DaemonSet, and loading a plugin by compiling
//! it versus from the disk cache.
//!
//! Run with `cargo bench -p kiln-plugin-host`; the test guest is built on first use.
//!
//! With `KILN_BENCH_PLUGINS=a.wasm:b.wasm` (e.g. the Rust, Python and JavaScript templates of
//! `kiln plugin new --lang rust|python|js`, built as `host/cli/tests/plugin_author.rs` builds
//! them; each is installed under its file name), it prints only, for the Rust test guest and
//! each of those, one line: its size; reading, hashing and validating it (`wasmparser`, what
//! precedes a compile); compiling it cold (a new host, no disk cache); and loading it from the
//! precompiled disk cache (a new host) — medians of `$KILN_BENCH_LOADS` (default 10) and
//! `$KILN_BENCH_COMPILES` (default 3) runs; plain figures, not criterion runs: a Python
//! component takes seconds to compile. Per-call and render times of the same plugins on NVIDIA's
//! sample: `KILN_BENCH_PLUGINS=… cargo bench -p kiln-render`.
// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use kiln_plugin_host::{CacheHit, HostConfig, PluginHost};
use serde_json::json;

#[allow(dead_code)]
#[path = "../tests/host/common.rs"]
mod common;

fn warm_call(c: &mut Criterion) {
    if figures_only() {
        return;
    }
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
    if figures_only() {
        return;
    }
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

/// How many times each figure of [`plugin_figures`] is taken (the median is printed).
fn repeats(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// The median of `f`'s durations over `n` runs.
fn median_of(n: usize, mut f: impl FnMut() -> Duration) -> Duration {
    let mut runs: Vec<Duration> = (0..n).map(|_| f()).collect();
    runs.sort();
    runs[n / 2]
}

/// The component costs of the test guest and of every plugin in `$KILN_BENCH_PLUGINS`,
/// printed (see the crate documentation above).
fn plugin_figures(_: &mut Criterion) {
    let Some(list) = std::env::var_os("KILN_BENCH_PLUGINS") else {
        return;
    };
    let (compiles, loads) = (
        repeats("KILN_BENCH_COMPILES", 3),
        repeats("KILN_BENCH_LOADS", 10),
    );
    let good = std::env::temp_dir().join(format!("kiln-bench-good-{}.wasm", std::process::id()));
    std::fs::write(&good, common::good_wasm()).unwrap();
    let files: Vec<(String, PathBuf)> = std::iter::once(("good".to_string(), good.clone()))
        .chain(std::env::split_paths(&list).map(|path| {
            let name = path.file_stem().unwrap().to_str().unwrap().to_string();
            (name, path)
        }))
        .collect();
    let validator = || wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all());
    for (name, path) in files {
        let bytes = std::fs::read(&path).unwrap();
        // What precedes any compile: reading the file, its digest, and validating the Wasm.
        let validate = median_of(loads, || {
            let started = Instant::now();
            let bytes = std::fs::read(&path).unwrap();
            black_box(kiln_plugin_host::sha256_hex(&bytes));
            validator().validate_all(&bytes).unwrap();
            started.elapsed()
        });
        let dirs = common::Dirs::new();
        dirs.install(&name, &bytes);
        // Cold: no disk cache, a new host (and engine) each time.
        let compile = median_of(compiles, || {
            let started = Instant::now();
            let host = PluginHost::new(dirs.config(), &[]).unwrap();
            let plugin = host.load(&name, None).unwrap();
            assert_eq!(plugin.cache_hit(), CacheHit::Compiled);
            started.elapsed()
        });
        let config = HostConfig {
            cache_dir: Some(dirs.cache.clone()),
            ..dirs.config()
        };
        let host = PluginHost::new(config.clone(), &[]).unwrap();
        assert_eq!(
            host.load(&name, None).unwrap().cache_hit(),
            CacheHit::Compiled
        );
        let cached = median_of(loads, || {
            let started = Instant::now();
            let host = PluginHost::new(config.clone(), &[]).unwrap();
            assert_eq!(host.load(&name, None).unwrap().cache_hit(), CacheHit::Disk);
            started.elapsed()
        });
        println!(
            "{name}: {:.2} MiB; read+validate {:.1} ms; compile (cold, no cache) {:.2} s; \
             load from the precompiled cache {:.1} ms (medians of {loads}, {compiles}, {loads})",
            bytes.len() as f64 / f64::from(1 << 20),
            validate.as_secs_f64() * 1e3,
            compile.as_secs_f64(),
            cached.as_secs_f64() * 1e3,
        );
    }
    let _ = std::fs::remove_file(good);
}

/// With `$KILN_BENCH_PLUGINS` set, only [`plugin_figures`] runs.
fn figures_only() -> bool {
    std::env::var_os("KILN_BENCH_PLUGINS").is_some()
}

criterion_group!(benches, plugin_figures, warm_call, load);
criterion_main!(benches);
