//! Render costs: a warm call of each standard plugin through the Wasm host, the same plugin
//! logic called natively, a full render of the upstream sample (Wasm vs native), and loading
//! all bundled plugins by compiling them versus from the precompiled disk cache.
//!
//! `cargo bench -p kiln-render` (the load figures are printed first, then criterion's).
//! Targets: full render of the sample ≤ 1.4 ms CPU on one thread (issue 16); cache load ≤ 50 ms.
//!
//! Site plugins: `KILN_BENCH_PLUGINS=a.wasm:b.wasm cargo bench -p kiln-render` prints only, for
//! each of those components (installed as drop-ins under their file names, e.g. the templates
//! of `kiln plugin new --lang rust|python|js` built as `host/cli/tests/plugin_author.rs` builds
//! them, with settings `$KILN_BENCH_SETTINGS`, JSON, default the templates'
//! `{"labels":{"team":"gpu"}}`): the time of one call on the sample's `device-plugin` state (the
//! standard plugin's output, as the chain hands it on; median and p99 of
//! `$KILN_BENCH_CALLS`, default 200), and a full render of the sample on one thread without
//! site plugins against one with the plugin after the standard one in every enabled state's
//! chain (median and p99 wall time and median CPU time of `$KILN_BENCH_RENDERS`, default 50).
//! The component costs (size, validation, compile, cache load) are printed by
//! `cargo bench -p kiln-plugin-host` with the same variable.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use kiln_core::State;
use kiln_core::context::TransformContext;
use kiln_plugin_host::{HostConfig, PluginHost};
use kiln_plugin_std::{Outcome, run_operand};
use kiln_render::{Policy, Renderer, assets, defaults, placeholders};
use serde_json::Value;

/// NVIDIA's sample ClusterPolicy (v26.7.0), as a document.
fn sample_doc() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/nvidia-v26.7.0/policies/sample.yaml");
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).expect("the in-repo upstream sample"))
        .unwrap()
}

fn sample_policy() -> Policy {
    Policy::from_object(&sample_doc()).unwrap()
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

/// A state's inputs as the renderer keeps them: objects, their JSON text, and the context.
struct NativeInput {
    state: State,
    objects: Vec<Value>,
    texts: Vec<String>,
    ctx: TransformContext,
}

fn native_inputs(states: &[State], policy: &Policy, ctx: &TransformContext) -> Vec<NativeInput> {
    states
        .iter()
        .map(|&state| {
            let mut sctx = ctx.clone();
            sctx.state = state.name().into();
            let objects = state_objects(state, policy, &sctx);
            let texts = objects.iter().map(Value::to_string).collect();
            NativeInput {
                state,
                objects,
                texts,
                ctx: sctx,
            }
        })
        .collect()
}

/// The same plugin logic, called natively: the SDK entry point on the state's serialized
/// inputs, then each patch applied to a copy of its object (as the renderer does with the
/// Wasm plugins' patches; the renderer also validates each result, which this skips).
fn native(input: &NativeInput, spec: &str) -> Vec<Value> {
    let (state, objects, texts, ctx) = (input.state, &input.objects, &input.texts, &input.ctx);
    macro_rules! dispatch {
        ($($s:ident => $t:path),* $(,)?) => {
            match state { $(State::$s => run_operand::<$t>(&texts, spec, ctx),)* }
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
    // The bundled plugins share one component (the standard bundle): count each once.
    let mut components: Vec<&[u8]> = kiln_bundled_plugins::BUNDLED
        .iter()
        .map(|(_, b)| *b)
        .collect();
    components.sort_by_key(|b| b.as_ptr());
    components.dedup_by_key(|b| b.as_ptr());
    let bytes: usize = components.iter().map(|b| b.len()).sum();
    eprintln!(
        "load of all {} bundled plugins ({} component(s), {:.1} MiB): compile {:.1} ms, from the precompiled disk cache {:.1} ms",
        kiln_bundled_plugins::BUNDLED.len(),
        components.len(),
        bytes as f64 / (1 << 20) as f64,
        compile.as_secs_f64() * 1e3,
        cached.as_secs_f64() * 1e3
    );
}

/// CPU time (user + system) of the calling thread so far (`CLOCK_THREAD_CPUTIME_ID`, ns
/// resolution): the renders run on this one thread, so other threads and processes (the epoch
/// ticker, builds next door) do not count.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// CPU time (and wall time) per full render, all states one after another on this thread, Wasm
/// and native: the thread's CPU clock is less disturbed than criterion's wall-clock figures by
/// other processes, though a busy machine still slows it (shared caches and cores).
fn print_cpu_figures(policy: &Policy, ctx: &TransformContext) {
    let n: u32 = std::env::var("KILN_BENCH_CPU_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
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
    let fueled = host(Some(kiln_plugin_host::DEFAULT_FUEL));
    let states = kiln_core::plan::enabled_states(&policy.spec);
    let wasm = |r: &Renderer| {
        for &s in &states {
            black_box(r.render_state(s, policy, ctx).unwrap());
        }
    };
    let inputs = native_inputs(&states, policy, ctx);
    let native = || {
        for input in &inputs {
            black_box(native(input, &policy.spec_text));
        }
    };
    // Mean CPU and wall time per render over one round of `n / ROUNDS` renders.
    const ROUNDS: u32 = 5;
    let per_render = |f: &dyn Fn()| {
        f();
        let (cpu, wall) = (thread_cpu(), Instant::now());
        for _ in 0..n / ROUNDS {
            f();
        }
        (
            (thread_cpu() - cpu) / (n / ROUNDS),
            wall.elapsed() / (n / ROUNDS),
        )
    };
    let median = |mut v: Vec<(Duration, Duration)>| {
        v.sort();
        v[v.len() / 2]
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let daemonsets = states
        .iter()
        .flat_map(|&s| renderer.render_state(s, policy, ctx).unwrap().objects)
        .filter(|o| o["kind"] == "DaemonSet")
        .count();
    let what = format!(
        "full render of the sample ({} states, {daemonsets} DaemonSets, one thread, median of {ROUNDS} rounds of {})",
        states.len(),
        n / ROUNDS
    );
    // Profiling the Wasm path, or the native one, alone.
    let only = std::env::var("KILN_BENCH_CPU_ONLY").unwrap_or_default();
    if only == "wasm" || only == "native" {
        let (cpu, wall) = median(
            (0..ROUNDS)
                .map(|_| {
                    if only == "wasm" {
                        per_render(&|| wasm(&renderer))
                    } else {
                        per_render(&native)
                    }
                })
                .collect(),
        );
        eprintln!(
            "{what}: {only} {:.2} ms CPU ({:.2} ms wall)",
            ms(cpu),
            ms(wall)
        );
        return;
    }
    // Rounds alternate between the three so that a noisy neighbour on a shared machine hits all
    // of them; the figures are the medians of the rounds.
    let (mut w, mut wf, mut nat) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        w.push(per_render(&|| wasm(&renderer)));
        wf.push(per_render(&|| wasm(&fueled)));
        nat.push(per_render(&native));
    }
    let (w, wf, nat) = (median(w), median(wf), median(nat));
    eprintln!(
        "{what}:\n  wasm   {:.2} ms CPU ({:.2} ms wall)  [target <= 1.4 ms CPU, issue 16]\n  \
         wasm with fuel metering {:.2} ms CPU ({:.2} ms wall)\n  native {:.2} ms CPU ({:.2} ms wall), wasm/native {:.2}",
        ms(w.0),
        ms(w.1),
        ms(wf.0),
        ms(wf.1),
        ms(nat.0),
        ms(nat.1),
        w.0.as_secs_f64() / nat.0.as_secs_f64()
    );
}

/// Median and p99 (nearest rank) of `samples`, which it sorts.
fn median_p99(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort();
    let n = samples.len();
    (samples[n / 2], samples[(n * 99).div_ceil(100).max(1) - 1])
}

fn env_count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// The site-plugin figures of `$KILN_BENCH_PLUGINS` (see the crate documentation above).
fn print_site_plugin_figures(list: &std::ffi::OsStr, ctx: &TransformContext) {
    let (calls, renders) = (
        env_count("KILN_BENCH_CALLS", 200),
        env_count("KILN_BENCH_RENDERS", 50),
    );
    let settings = std::env::var("KILN_BENCH_SETTINGS")
        .unwrap_or_else(|_| r#"{"labels":{"team":"gpu"}}"#.to_string());
    let settings_value: Value = serde_json::from_str(&settings).expect("$KILN_BENCH_SETTINGS");
    let dir = tempfile::tempdir().unwrap();
    let (drop_in, cache) = (dir.path().join("plugins"), dir.path().join("cache"));
    std::fs::create_dir_all(&drop_in).unwrap();
    let names: Vec<String> = std::env::split_paths(list)
        .map(|path| {
            let name = path.file_stem().unwrap().to_str().unwrap().to_string();
            std::fs::copy(&path, drop_in.join(format!("{name}.wasm"))).unwrap();
            name
        })
        .collect();
    let host = PluginHost::new(
        HostConfig {
            drop_in_dir: Some(drop_in),
            cache_dir: Some(cache),
            ..HostConfig::in_memory()
        },
        kiln_bundled_plugins::BUNDLED,
    )
    .unwrap();
    for (name, _) in kiln_bundled_plugins::BUNDLED {
        host.load(name, None).unwrap();
    }
    let renderer = Renderer::new(Arc::new(host));
    let doc = sample_doc();
    let plain = Policy::from_object(&doc).unwrap();
    let states = kiln_core::plan::enabled_states(&plain.spec);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    // Full renders on this thread: (median wall, p99 wall, median CPU) per render.
    let render = |policy: &Policy| {
        let (mut wall, mut cpu) = (Vec::new(), Vec::new());
        for _ in 0..=renders {
            let (c, w) = (thread_cpu(), Instant::now());
            for &s in &states {
                black_box(renderer.render_state(s, policy, ctx).unwrap());
            }
            wall.push(w.elapsed());
            cpu.push(thread_cpu() - c);
        }
        // The first render loads what it needs (the site plugin's first call): left out.
        let (wall, cpu) = (&mut wall[1..], &mut cpu[1..]);
        let (median, p99) = median_p99(wall);
        (median, p99, median_p99(cpu).0)
    };
    let (median, p99, cpu) = render(&plain);
    eprintln!(
        "render of the sample ({} states, one thread, {renders} renders) without site plugins: \
         median {:.2} ms, p99 {:.2} ms wall; median {:.2} ms CPU",
        states.len(),
        ms(median),
        ms(p99),
        ms(cpu)
    );
    let state = State::DevicePlugin;
    let mut sctx = ctx.clone();
    sctx.state = state.name().into();
    sctx.default_workload = kiln_render::default_workload(&plain.spec).into();
    let objects = renderer.render_state(state, &plain, ctx).unwrap().objects;
    for name in names {
        let plugin = renderer.host().load(&name, None).unwrap();
        let input = kiln_plugin_host::CallInput {
            spec: &plain.spec_text,
            settings: Some(&settings),
            policy: &plain.meta,
        };
        let host = renderer.host();
        black_box(host.call_with(&plugin, &objects, &input, &sctx).unwrap());
        let mut times: Vec<Duration> = (0..calls)
            .map(|_| {
                let started = Instant::now();
                black_box(host.call_with(&plugin, &objects, &input, &sctx).unwrap());
                started.elapsed()
            })
            .collect();
        let (call_median, call_p99) = median_p99(&mut times);
        // The plugin after the standard one in every enabled state's chain.
        let chains: serde_json::Map<String, Value> = states
            .iter()
            .map(|s| {
                let entry = serde_json::json!({"name": name, "settings": settings_value});
                (s.name().to_string(), serde_json::json!({"then": [entry]}))
            })
            .collect();
        let mut with = doc.clone();
        with["metadata"]["annotations"][kiln_render::site::PLUGINS_ANNOTATION] =
            Value::String(Value::Object(chains).to_string());
        let (median, p99, cpu) = render(&Policy::from_object(&with).unwrap());
        eprintln!(
            "{name}: call on state {state} ({} objects): median {:.2} ms, p99 {:.2} ms ({calls} calls); \
             render with it in every chain: median {:.2} ms, p99 {:.2} ms wall; median {:.2} ms CPU",
            objects.len(),
            ms(call_median),
            ms(call_p99),
            ms(median),
            ms(p99),
            ms(cpu)
        );
    }
}

fn benches(c: &mut Criterion) {
    let policy = sample_policy();
    let ctx = defaults::render_context();
    if let Some(list) = std::env::var_os("KILN_BENCH_PLUGINS") {
        print_site_plugin_figures(&list, &ctx);
        return;
    }
    print_cpu_figures(&policy, &ctx);
    if std::env::var_os("KILN_BENCH_CPU_ONLY").is_some() {
        return;
    }
    print_load_figures();
    let host =
        Arc::new(PluginHost::new(HostConfig::in_memory(), kiln_bundled_plugins::BUNDLED).unwrap());
    let renderer = Renderer::new(host.clone());
    let states = kiln_core::plan::enabled_states(&policy.spec);

    let inputs = native_inputs(&states, &policy, &ctx);
    let mut warm = c.benchmark_group("warm_call");
    for input in &inputs {
        let state = input.state;
        host.transform(state.name(), &input.objects, &policy.spec_json, &input.ctx)
            .unwrap();
        warm.bench_function(format!("wasm/{state}"), |b| {
            b.iter(|| {
                black_box(
                    host.transform(
                        state.name(),
                        black_box(&input.objects),
                        &policy.spec_json,
                        &input.ctx,
                    )
                    .unwrap(),
                )
            })
        });
        warm.bench_function(format!("native/{state}"), |b| {
            b.iter(|| black_box(native(black_box(input), &policy.spec_text)))
        });
    }
    warm.finish();

    let mut full = c.benchmark_group("render_sample");
    full.bench_function("wasm", |b| {
        b.iter(|| {
            for &s in &states {
                black_box(renderer.render_state(s, black_box(&policy), &ctx).unwrap());
            }
        })
    });
    // `Renderer::render`: one worker thread per core, as `kiln render` runs it.
    full.bench_function("wasm_threaded", |b| {
        b.iter(|| black_box(renderer.render(black_box(&policy), &ctx)))
    });
    full.bench_function("native", |b| {
        b.iter(|| {
            for input in &inputs {
                black_box(native(input, &policy.spec_text));
            }
        })
    });
    full.finish();
}

criterion_group!(render, benches);
criterion_main!(render);
