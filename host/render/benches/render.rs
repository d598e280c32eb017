//! Render costs: a warm call of each standard plugin through the Wasm host, the same plugin
//! logic called natively, a full render of the upstream sample (Wasm vs native), and loading
//! all bundled plugins by compiling them versus from the precompiled disk cache.
//!
//! `cargo bench -p kiln-render` (the load figures are printed first, then criterion's).
//! Targets (issue 2): full warm render ≤ 2 ms and ≤ 1.5× native; cache load ≤ 50 ms.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use kiln_core::State;
use kiln_core::context::TransformContext;
use kiln_plugin_host::{HostConfig, PluginHost};
use kiln_plugin_sdk::{Outcome, run_operand};
use kiln_render::{Policy, Renderer, assets, defaults, placeholders};
use serde_json::Value;

fn sample_policy() -> Policy {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/upstream/clusterpolicy-sample.yaml");
    let doc: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(path).expect("shared/ sample")).unwrap();
    Policy::from_object(&doc).unwrap()
}

/// The state's objects as the host hands them to plugins.
fn state_objects(state: State, policy: &Policy, ctx: &TransformContext) -> Vec<Value> {
    assets::load_state(state, false)
        .unwrap()
        .into_iter()
        .map(|a| {
            let mut o = a.object;
            placeholders::fill(&mut o, &ctx.operator_namespace, policy.spec.runtime_class());
            o
        })
        .collect()
}

/// The same plugin logic, called natively (SDK entry point + patch application).
fn native(state: State, objects: &[Value], spec: &Value, ctx: &TransformContext) -> Vec<Value> {
    let texts: Vec<String> = objects.iter().map(Value::to_string).collect();
    let spec = spec.to_string();
    macro_rules! dispatch {
        ($($s:ident => $t:path),* $(,)?) => {
            match state { $(State::$s => run_operand::<$t>(&texts, &spec, ctx),)* }
        };
    }
    let outcomes = dispatch!(
        PreRequisites => kiln_plugin_pre_requisites::PreRequisites,
        OperatorMetrics => kiln_plugin_operator_metrics::OperatorMetrics,
        Driver => kiln_plugin_driver::Driver,
        ContainerToolkit => kiln_plugin_container_toolkit::ContainerToolkit,
        OperatorValidation => kiln_plugin_operator_validation::OperatorValidation,
        DevicePlugin => kiln_plugin_device_plugin::DevicePlugin,
        MpsControlDaemon => kiln_plugin_mps_control_daemon::MpsControlDaemon,
        Dcgm => kiln_plugin_dcgm::Dcgm,
        DcgmExporter => kiln_plugin_dcgm_exporter::DcgmExporter,
        GpuFeatureDiscovery => kiln_plugin_gpu_feature_discovery::GpuFeatureDiscovery,
        MigManager => kiln_plugin_mig_manager::MigManager,
        NodeStatusExporter => kiln_plugin_node_status_exporter::NodeStatusExporter,
        VgpuManager => kiln_plugin_vgpu_manager::VgpuManager,
        VgpuDeviceManager => kiln_plugin_vgpu_device_manager::VgpuDeviceManager,
        SandboxValidation => kiln_plugin_sandbox_validation::SandboxValidation,
        VfioManager => kiln_plugin_vfio_manager::VfioManager,
        SandboxDevicePlugin => kiln_plugin_sandbox_device_plugin::SandboxDevicePlugin,
        KataDevicePlugin => kiln_plugin_kata_device_plugin::KataDevicePlugin,
        KataManager => kiln_plugin_kata_manager::KataManager,
        CcManager => kiln_plugin_cc_manager::CcManager,
    )
    .expect("native transform");
    outcomes
        .into_iter()
        .zip(objects)
        .filter_map(|(o, obj)| match o {
            Outcome::Omit => None,
            Outcome::Patch(p) => {
                let patch: json_patch::Patch = serde_json::from_str(&p).unwrap();
                let mut doc = obj.clone();
                json_patch::patch(&mut doc, &patch).unwrap();
                Some(doc)
            }
        })
        .collect()
}

fn print_load_figures() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = HostConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        ..HostConfig::in_memory()
    };
    let t = Instant::now();
    let host = PluginHost::new(cfg.clone(), kiln_bundled_plugins::BUNDLED).unwrap();
    for (name, _) in kiln_bundled_plugins::BUNDLED {
        host.load(name, None).unwrap();
    }
    let compile = t.elapsed();
    let t = Instant::now();
    let host = PluginHost::new(cfg, kiln_bundled_plugins::BUNDLED).unwrap();
    for (name, _) in kiln_bundled_plugins::BUNDLED {
        host.load(name, None).unwrap();
    }
    let cached = t.elapsed();
    let bytes: usize = kiln_bundled_plugins::BUNDLED
        .iter()
        .map(|(_, b)| b.len())
        .sum();
    eprintln!(
        "load of all {} bundled plugins ({:.1} MiB): compile {:.1} ms, from the precompiled disk cache {:.1} ms",
        kiln_bundled_plugins::BUNDLED.len(),
        bytes as f64 / (1 << 20) as f64,
        compile.as_secs_f64() * 1e3,
        cached.as_secs_f64() * 1e3
    );
}

/// CPU time (user + system) of this process so far, from `/proc/self/stat` (clock ticks of
/// 10 ms); `None` off Linux.
fn process_cpu() -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(std::time::Duration::from_millis(ticks * 10))
}

/// CPU time per full render, all states one after another on one thread, Wasm and native:
/// unlike criterion's wall-clock figures these hold on a loaded machine.
fn print_cpu_figures(policy: &Policy, ctx: &TransformContext) {
    let n: u32 = std::env::var("KILN_BENCH_CPU_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    // Compiled artifacts are cached on disk, so that a profile of this phase
    // (`KILN_BENCH_CPU_ONLY=1 KILN_PLUGIN_PERFMAP=1 perf record …`) shows rendering, not Cranelift.
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-bench-plugin-cache");
    let host = |fuel| {
        let cfg = HostConfig {
            fuel,
            cache_dir: Some(cache.clone()),
            ..HostConfig::in_memory()
        };
        let host = PluginHost::new(cfg, kiln_bundled_plugins::BUNDLED).unwrap();
        for (name, _) in kiln_bundled_plugins::BUNDLED {
            host.load(name, None).unwrap();
        }
        Renderer::new(Arc::new(host))
    };
    let renderer = host(None);
    let states = kiln_core::plan::enabled_states(&policy.spec);
    let per_render = |f: &dyn Fn()| {
        f();
        let before = process_cpu()?;
        for _ in 0..n {
            f();
        }
        Some((process_cpu()? - before) / n)
    };
    let wasm = per_render(&|| {
        for &s in &states {
            black_box(renderer.render_state(s, policy, ctx).unwrap());
        }
    });
    if std::env::var_os("KILN_BENCH_CPU_ONLY").is_some_and(|v| v == "wasm") {
        // Profiling the Wasm path alone.
        eprintln!("wasm CPU per render: {wasm:?}");
        return;
    }
    let native = per_render(&|| {
        for &state in &states {
            let mut sctx = ctx.clone();
            sctx.state = state.name().into();
            let objects = state_objects(state, policy, &sctx);
            black_box(native(state, &objects, &policy.spec_json, &sctx));
        }
    });
    let fueled = host(Some(kiln_plugin_host::DEFAULT_FUEL));
    let wasm_fuel = per_render(&|| {
        for &s in &states {
            black_box(fueled.render_state(s, policy, ctx).unwrap());
        }
    });
    if let (Some(w), Some(wf), Some(nat)) = (wasm, wasm_fuel, native) {
        eprintln!(
            "CPU time per full render of the sample ({} states, sequential, mean of {n}): wasm {:.2} ms (with fuel metering {:.2} ms), native {:.2} ms, ratio {:.2}",
            states.len(),
            w.as_secs_f64() * 1e3,
            wf.as_secs_f64() * 1e3,
            nat.as_secs_f64() * 1e3,
            w.as_secs_f64() / nat.as_secs_f64()
        );
    }
}

fn benches(c: &mut Criterion) {
    let policy = sample_policy();
    let ctx = defaults::render_context();
    print_cpu_figures(&policy, &ctx);
    if std::env::var_os("KILN_BENCH_CPU_ONLY").is_some() {
        return;
    }
    print_load_figures();
    let host =
        Arc::new(PluginHost::new(HostConfig::in_memory(), kiln_bundled_plugins::BUNDLED).unwrap());
    let renderer = Renderer::new(host.clone());
    let states = kiln_core::plan::enabled_states(&policy.spec);

    let mut warm = c.benchmark_group("warm_call");
    for &state in &states {
        let mut sctx = ctx.clone();
        sctx.state = state.name().into();
        let objects = state_objects(state, &policy, &sctx);
        host.transform(state.name(), &objects, &policy.spec_json, &sctx)
            .unwrap();
        warm.bench_function(format!("wasm/{state}"), |b| {
            b.iter(|| {
                black_box(
                    host.transform(state.name(), black_box(&objects), &policy.spec_json, &sctx)
                        .unwrap(),
                )
            })
        });
        warm.bench_function(format!("native/{state}"), |b| {
            b.iter(|| black_box(native(state, black_box(&objects), &policy.spec_json, &sctx)))
        });
    }
    warm.finish();

    let mut full = c.benchmark_group("render_sample");
    full.bench_function("wasm", |b| {
        b.iter(|| black_box(renderer.render(black_box(&policy), &ctx)))
    });
    full.bench_function("native", |b| {
        b.iter(|| {
            for &state in &states {
                let mut sctx = ctx.clone();
                sctx.state = state.name().into();
                let objects = state_objects(state, &policy, &sctx);
                black_box(native(state, &objects, &policy.spec_json, &sctx));
            }
        })
    });
    full.finish();
}

criterion_group!(render, benches);
criterion_main!(render);
