//! Plugin call costs: a warm call (fresh store + instantiate + `transform` + patch apply and
//! validation) of the Rust std test guest on one DaemonSet, and loading a plugin by compiling
//! it versus from the disk cache.
//!
//! Run with `cargo bench -p kiln-plugin-host`; the test guest is built on first use.
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

criterion_group!(benches, warm_call, load);
criterion_main!(benches);
