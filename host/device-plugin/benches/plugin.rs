//! Device-plugin figures against the kubelet stand-in: time from start to `Register`, Allocate
//! latency (p50/p99 over 5 000 calls, `KILN_BENCH_CALLS`) with the CPU time a call costs, and
//! the RSS of a real `kiln device-plugin` process.
//!
//! `cargo bench -p kiln-device-plugin --bench plugin`. The process figures need the `kiln`
//! binary: `KILN_BIN=<path>` or `target/{release,debug}/kiln` (build it with
//! `cargo build --release -p kiln-cli`); without it, or with `KILN_BIN` set empty, only the
//! in-process figures print.
//!
//! Latency on a loaded machine is mostly waiting for a CPU (two processes, or client and server
//! tasks, take turns for every call), so compare builds by the CPU figures: in-process, the
//! CPU time of the one thread that runs client and server; for the process, the plugin
//! process's CPU time (user + system, all threads, in clock ticks) and the bench's own thread.

#[path = "../tests/standin/mod.rs"]
mod standin;

use std::{sync::Arc, time::Duration, time::Instant};

use kiln_device_plugin::{
    health::XidFilter,
    proto::{AllocateRequest, ContainerAllocateRequest},
    runtime::{self, ConfigSource, Options},
    settings::Overrides,
};
use kiln_gpu::FakeBackend;

const FIXTURE: &str = r#"
driver_version: "550.144.03"
cuda_version: "12.4"
gpus:
  - {uuid: GPU-11111111-2222-3333-4444-555555555555, name: Tesla T4, memory_total_mib: 15360, compute_capability: "7.5"}
  - {uuid: GPU-22222222-2222-3333-4444-555555555555, name: Tesla T4, memory_total_mib: 15360, compute_capability: "7.5"}
"#;
const CONFIG: &str = "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 5}]}}\n";
/// Allocate calls per case: `KILN_BENCH_CALLS` (default 5,000; fewer for paired rounds on a
/// loaded machine or in a dev build).
fn calls() -> usize {
    std::env::var("KILN_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(5_000)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    if std::env::var_os("KILN_DP_GPU_BACKEND").is_none() {
        rt.block_on(in_process());
    }
    rt.block_on(process());
}

/// Nanoseconds the calling thread has run on a CPU (`/proc/thread-self/schedstat`, field 1).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time (user + system, every thread) process `pid` has used, in nanoseconds, from
/// `/proc/PID/stat` (clock ticks of 10 ms; `None` when unreadable).
fn process_cpu_ns(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks * 10_000_000)
}

/// The bench process's own `VmRSS`/`VmHWM` lines.
fn print_own_rss(what: &str) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    for line in status
        .lines()
        .filter(|l| l.starts_with("VmRSS") || l.starts_with("VmHWM"))
    {
        println!("{what}: bench process {line}");
    }
}

/// Allocate latency over [`calls`] calls; `server` is the plugin process, whose CPU time per
/// call is printed beside the bench thread's.
async fn allocate_p99(k: &standin::Kubelet, endpoint: &str, what: &str, server: Option<u32>) {
    let mut c = k.client(endpoint).await;
    let mut stream = c
        .list_and_watch(kiln_device_plugin::proto::Empty {})
        .await
        .unwrap()
        .into_inner();
    let devices = stream.message().await.unwrap().unwrap().devices;
    let ids: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
    println!(
        "{what}: ListAndWatch {} units, first {:?}",
        ids.len(),
        devices.first()
    );
    let first = c
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![ids[0].clone()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    println!(
        "{what}: Allocate({}) envs {:?}",
        ids[0], first.container_responses[0].envs
    );
    let calls = calls();
    let mut lat = Vec::with_capacity(calls);
    let cpu_before = thread_cpu_ns();
    let server_before = server.and_then(process_cpu_ns);
    for i in 0..calls {
        let id = ids[i % ids.len()].clone();
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![id],
            }],
        };
        let t = Instant::now();
        c.allocate(req).await.unwrap();
        lat.push(t.elapsed());
    }
    let per_call_us = |ns: u64| ns as f64 / calls as f64 / 1e3;
    let cpu = per_call_us(thread_cpu_ns() - cpu_before);
    let server_cpu = server
        .and_then(process_cpu_ns)
        .zip(server_before)
        .map(|(after, before)| format!(", plugin process {:.1} µs", per_call_us(after - before)))
        .unwrap_or_default();
    println!("{what}: Allocate CPU per call: bench thread {cpu:.1} µs{server_cpu}");
    lat.sort();
    println!(
        "{what}: Allocate p50 {:?}, p99 {:?} ({calls} calls over the Unix socket)",
        lat[calls / 2],
        lat[calls * 99 / 100]
    );
}

async fn in_process() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("config.yaml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let k = standin::Kubelet::start(tmp.path());
    let fake = Arc::new(FakeBackend::new(serde_yaml_ng::from_str(FIXTURE).unwrap()));
    let opts = Options {
        overrides: Overrides::default(),
        source: ConfigSource::File(cfg),
        plugin_dir: tmp.path().to_owned(),
        kubelet_socket: Some(k.socket()),
        cdi_root: tmp.path().join("cdi"),
        health_interval: Duration::from_secs(1),
        recovery_after: Duration::from_secs(300),
        xid_filter: XidFilter::default(),
        kubelet_poll: Duration::from_millis(200),
    };
    let t = Instant::now();
    let h = runtime::start(opts, fake, None).await.unwrap();
    let reg = k.next_registration().await;
    println!("in-process: start → Register {:?}", t.elapsed());
    allocate_p99(&k, &reg.endpoint, "in-process", None).await;
    h.shutdown().await;
    print_own_rss("in-process");
}

async fn process() {
    let bin = std::env::var("KILN_BIN")
        .ok()
        .map(|b| (!b.is_empty()).then(|| std::path::PathBuf::from(b)))
        .unwrap_or_else(|| {
            let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
            ["release/kiln", "debug/kiln"]
                .iter()
                .map(|p| root.join(p))
                .find(|p| p.exists())
        });
    let Some(bin) = bin else {
        println!("process: no kiln binary (set KILN_BIN); skipped");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let fixture = tmp.path().join("gpus.yaml");
    std::fs::write(&fixture, FIXTURE).unwrap();
    let cfg = tmp.path().join("config.yaml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let k = standin::Kubelet::start(tmp.path());
    // KILN_DP_GPU_BACKEND=nvml runs the process on the real GPUs (scripts/gpu-check.sh).
    let backend = std::env::var("KILN_DP_GPU_BACKEND")
        .unwrap_or_else(|_| format!("fake:{}", fixture.display()));
    let t = Instant::now();
    let mut child = tokio::process::Command::new(&bin)
        .arg("device-plugin")
        .arg(format!("--gpu-backend={backend}"))
        .arg(format!("--config-file={}", cfg.display()))
        .arg(format!("--kubelet-socket={}", k.socket().display()))
        .arg(format!("--plugin-dir={}", tmp.path().display()))
        .arg(format!("--cdi-root={}", tmp.path().join("cdi").display()))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let reg = k.next_registration().await;
    println!(
        "process ({}): spawn → Register {:?}",
        bin.display(),
        t.elapsed()
    );
    let pid = child.id().unwrap();
    allocate_p99(&k, &reg.endpoint, "process", Some(pid)).await;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    for line in status
        .lines()
        .filter(|l| l.starts_with("VmRSS") || l.starts_with("VmHWM"))
    {
        println!("process: {line}");
    }
    child.kill().await.unwrap();
}
