//! Operator benchmark against testcluster (a bench binary, `harness = false`; never part of
//! `cargo test`):
//!
//! ```text
//! cargo bench -p kiln-operator --bench steady_state
//! KILN_BENCH_SIZES=8:5 KILN_BENCH_WINDOW_S=30 cargo bench -p kiln-operator --bench steady_state
//! KILN_BENCH_WRAP="heaptrack -o /tmp/op" …   # the operator under a profiler (RSS figures then
//!                                            # are the wrapper's)
//! KILN_BENCH_SIZES=5000:5000 KILN_BENCH_POLICY_PATCH='{"spec":{…}}' …  # the sample, merge-patched
//! KILN_BENCH_READY_S=900 …   # give up waiting for `ready` after 900 s (default 1200) and print
//!                            # the operator's RSS, CPU and requests so far instead
//! KILN_BENCH_UP_S=600 …      # wait up to 600 s for testcluster's nodes (default 180; 5,000
//!                            # nodes came up in 160-180+ s on 2 cores)
//! KILN_BENCH_AFTER_S=420 …   # print the operator's RSS 420 s after the change rolled out
//!                            # (default 0: not measured)
//! ```
//!
//! For each cluster size `NODES:GPU_NODES` (default `8:5,500:500`) it starts a fresh
//! testcluster with the apiserver audit log on, installs the CRD and `deploy/rbac`, starts the
//! operator as a **separate process** (this binary re-executed in operator mode: the same
//! `kiln_operator::run` with the bundled plugins that `kiln operator` runs) authenticated with
//! a TokenRequest token of the `kiln-operator` ServiceAccount, creates
//! `deploy/samples/clusterpolicy.yaml`, and prints:
//!
//! - **ready latency**: from the instant the last operand DaemonSet became ready (judged by the
//!   operator's own rule, `kiln_operator::readiness`) to the instant the policy's
//!   `status.state` became `ready`, both as seen by this process's watches;
//! - **requests per minute by verb at steady state** attributable to the operator: counted
//!   from the apiserver audit log for the operator's ServiceAccount user (see `audit.rs` for
//!   why not `apiserver_request_total`), over `KILN_BENCH_WINDOW_S` (default 60) seconds after
//!   `KILN_BENCH_SETTLE_S` (default 15) seconds of quiet; other clients are listed for context;
//! - **operator RSS** (`VmRSS` sampled every 500 ms, and the peak `VmHWM`), and its CPU time in
//!   the window, with the machine's load average (the machine may be shared).
//!
//! Then, with the steady-state window running under a **GFD-like churn** (every GPU node's
//! `nvidia.com/gfd.timestamp` rewritten once a minute by the admin), it makes **one policy
//! change** (`devicePlugin.env`) and prints the operator's requests (reads, writes, by verb and
//! resource) and CPU over the whole rollout, and the ready latency after the last DaemonSet.
//!
//! Targets (issue 16): at rest 0 requests/min with the churn running; for the change
//! ≤ (objects changed + status + Events) writes and ≤ 10 reads; ready ≤ 1 s after the last
//! DaemonSet; RSS ≤ 40 MiB at 5,000 nodes. Sizes: `KILN_BENCH_SIZES=500:500,5000:5000`; at
//! 5,000 GPU nodes give the DaemonSets `maxUnavailable: 10%`
//! (`KILN_BENCH_POLICY_PATCH='{"spec":{"daemonsets":{"rollingUpdate":{"maxUnavailable":"10%"}}}}'`):
//! one pod at a time, the DaemonSet controller takes about two hours to roll 5,000 nodes here.

mod audit;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kiln_core::spec::ClusterPolicy;
use kiln_testcluster::{Options, TestCluster};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use serde_json::Value;

// The operator's allocator and settings, as in the `kiln` binary.
kiln_operator::global_allocator!();

const NS: &str = "gpu-operator";
const SA: &str = "kiln-operator";
const USER: &str = "system:serviceaccount:gpu-operator:kiln-operator";
/// Set (to a kubeconfig path) in the re-executed child: run the operator.
const OPERATOR_ENV: &str = "KILN_BENCH_OPERATOR_KUBECONFIG";
const MIB: f64 = 1024.0 * 1024.0;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    if let Some(kubeconfig) = std::env::var_os(OPERATOR_ENV) {
        return operator_mode(Path::new(&kubeconfig));
    }
    let sizes: Vec<(u32, u32)> = std::env::var("KILN_BENCH_SIZES")
        .unwrap_or_else(|_| "8:5,500:500".into())
        .split(',')
        .map(|s| {
            let (n, g) = s
                .split_once(':')
                .context("KILN_BENCH_SIZES: NODES:GPU_NODES,...")?;
            Ok((n.trim().parse()?, g.trim().parse()?))
        })
        .collect::<anyhow::Result<_>>()?;
    let window = Duration::from_secs(env_or("KILN_BENCH_WINDOW_S", 60));
    let settle = Duration::from_secs(env_or("KILN_BENCH_SETTLE_S", 15));
    println!(
        "kiln operator steady-state bench: {} CPUs, load average {}",
        std::thread::available_parallelism().map_or(0, usize::from),
        loadavg()
    );
    precompile_plugins()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    for (nodes, gpu_nodes) in sizes {
        let r = rt.block_on(measure(nodes, gpu_nodes, window, settle))?;
        rows.push(r);
    }
    println!(
        "\n== summary (targets: at rest with GFD churn 0 requests/min; change: writes <= objects changed + status + Events, reads <= 10; ready latency <= 1000 ms; RSS <= 40 MiB at 5,000 nodes)"
    );
    println!(
        "nodes  gpu  ready-latency  rest req/min (watch renewals, writes)  change: reads watches writes  CPU s  rollout s  change-ready-latency  RSS steady  RSS peak  load"
    );
    for r in &rows {
        println!(
            "{:>5} {:>4} {:>11} ms {:>13.1} ({:>5.1}, {:>5.1}) {:>21} {:>7} {:>6} {:>6.2} {:>10.1} {:>18} ms {:>7.1} MiB {:>5.1} MiB  {}",
            r.nodes,
            r.gpu_nodes,
            r.latency_ms,
            r.requests_per_min,
            r.watches_per_min,
            r.writes_per_min,
            r.change.reads,
            r.change.watches,
            r.change.writes,
            r.change.cpu_s,
            r.change.rollout_s,
            r.change.latency_ms,
            r.rss_steady as f64 / MIB,
            r.rss_peak as f64 / MIB,
            r.load
        );
    }
    Ok(())
}

/// Fills the operator's precompiled-plugin cache in this process, as the Deployment's
/// `kiln plugin precompile` init container does, and points the operator at it
/// (`KILN_PLUGIN_CACHE_DIR` in the child's environment): the operator then loads precompiled code
/// and never runs the compiler, in the bench as in a cluster.
fn precompile_plugins() -> anyhow::Result<()> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-operator-bench-plugins");
    let started = Instant::now();
    let host = kiln_plugin_host::PluginHost::new(
        kiln_plugin_host::HostConfig {
            cache_dir: Some(dir.clone()),
            ..kiln_plugin_host::HostConfig::in_memory()
        },
        kiln_bundled_plugins::BUNDLED,
    )?
    .with_bundled_digests(kiln_bundled_plugins::BUNDLED_SHA256);
    let mut compiled = 0;
    for (name, _) in kiln_bundled_plugins::BUNDLED {
        if host.load(name, None)?.cache_hit() == kiln_plugin_host::CacheHit::Compiled {
            compiled += 1;
        }
    }
    println!(
        "plugin cache {} ready ({compiled} of {} compiled now) in {:.1} s",
        dir.display(),
        kiln_bundled_plugins::BUNDLED.len(),
        started.elapsed().as_secs_f64()
    );
    PLUGIN_CACHE
        .set(dir)
        .map_err(|_| anyhow::anyhow!("plugin cache prepared twice"))
}

/// The precompiled-plugin cache the operator child is pointed at.
static PLUGIN_CACHE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The child: the operator as `kiln operator --kubeconfig FILE` runs it.
fn operator_mode(kubeconfig: &Path) -> anyhow::Result<()> {
    let rt = kiln_operator::runtime()?;
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        // As `kiln operator` builds its client.
        let client = kube::Client::try_from(kiln_operator::watch::tune_client(cfg))?;
        let host = Arc::new(
            kiln_plugin_host::PluginHost::new(
                kiln_plugin_host::HostConfig {
                    keep_resident_bytes: kiln_operator::PLUGIN_KEEP_RESIDENT_BYTES,
                    ..kiln_plugin_host::HostConfig::default()
                },
                kiln_bundled_plugins::BUNDLED,
            )?
            .with_bundled_digests(kiln_bundled_plugins::BUNDLED_SHA256),
        );
        let config = kiln_operator::Config {
            namespace: NS.into(),
            metrics_addr: "127.0.0.1:0".into(),
            ..kiln_operator::Config::default()
        };
        kiln_operator::run(client, kiln_render::Renderer::new(host), config).await?;
        anyhow::Ok(())
    })
}

struct Row {
    nodes: u32,
    gpu_nodes: u32,
    latency_ms: i64,
    change: Change,
    watches_per_min: f64,
    writes_per_min: f64,
    requests_per_min: f64,
    rss_steady: u64,
    rss_peak: u64,
    load: String,
}

/// What this process's watches saw: per DaemonSet whether it is ready and since when, and
/// when the policy was first seen `ready`.
#[derive(Default)]
struct Seen {
    daemonsets: BTreeMap<String, (bool, Instant)>,
    policy_ready: Option<Instant>,
    policy_state: String,
    /// When the policy last became `ready` (from another state).
    policy_ready_since: Option<Instant>,
    /// When the policy last left `ready`.
    policy_unready_since: Option<Instant>,
}

type Shared = Arc<Mutex<Seen>>;

async fn measure(
    nodes: u32,
    gpu_nodes: u32,
    window: Duration,
    settle: Duration,
) -> anyhow::Result<Row> {
    println!("\n== {nodes} nodes ({gpu_nodes} GPU nodes)");
    let t = Instant::now();
    let cluster = tokio::task::block_in_place(|| {
        let c = TestCluster::start(Options {
            nodes,
            gpu_nodes,
            up_timeout: Duration::from_secs(env_or(
                "KILN_BENCH_UP_S",
                kiln_testcluster::UP_TIMEOUT.as_secs(),
            )),
            ..Options::default()
        })?;
        let log = c.enable_audit_log()?;
        anyhow::Ok((c, log))
    });
    let (cluster, audit_log) = cluster?;
    println!(
        "cluster up with the audit log on in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let result = run_once(&cluster, &audit_log, nodes, gpu_nodes, window, settle).await;
    tokio::task::block_in_place(move || drop(cluster));
    result
}

async fn run_once(
    cluster: &TestCluster,
    audit_log: &Path,
    nodes: u32,
    gpu_nodes: u32,
    window: Duration,
    settle: Duration,
) -> anyhow::Result<Row> {
    let admin = cluster.client().await?;
    setup(&admin).await?;
    let kubeconfig = cluster
        .service_account_kubeconfig(NS, SA, Duration::from_secs(4 * 3600))
        .await?;
    let seen: Shared = Arc::default();
    let watches = [
        tokio::spawn(watch_daemonsets(admin.clone(), seen.clone())),
        tokio::spawn(watch_policy(admin.clone(), seen.clone())),
    ];
    // `KILN_BENCH_WRAP="heaptrack -o /tmp/op"` runs the operator under a profiler.
    let wrap: Vec<String> = std::env::var("KILN_BENCH_WRAP")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect();
    let exe = std::env::current_exe()?;
    let mut command = match wrap.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    // Its own process group, so a wrapper's child (the operator under heaptrack) is stopped
    // with it at the end, not left running.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command
        .env(OPERATOR_ENV, &kubeconfig)
        .envs(
            PLUGIN_CACHE
                .get()
                .map(|d| (kiln_plugin_host::CACHE_DIR_ENV, d.as_os_str())),
        )
        .stdin(Stdio::null())
        .spawn()
        .context("starting the operator process")?;
    let pid = child.id();
    let samples: Arc<Mutex<Vec<(Instant, u64)>>> = Arc::default();
    let sampler = tokio::spawn(sample_rss(pid, samples.clone()));
    let result = async {
        let created = Instant::now();
        // Created as the JSON document: a typed ClusterPolicy would serialize every defaulted
        // field, which the CRD's patterns refuse for empty images.
        let mut doc: Value = yaml(&std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/samples/clusterpolicy.yaml"),
        )?)?;
        // `KILN_BENCH_POLICY_PATCH`: a JSON merge patch on the sample (say, fewer operands and
        // a wider `daemonsets.rollingUpdate.maxUnavailable` for 5,000 nodes on a small machine).
        if let Ok(patch) = std::env::var("KILN_BENCH_POLICY_PATCH") {
            let patch: Value = serde_json::from_str(&patch).context("KILN_BENCH_POLICY_PATCH")?;
            json_patch::merge(&mut doc, &patch);
            println!("policy: the sample with {patch}");
        }
        let policy: DynamicObject = serde_json::from_value(doc)?;
        Api::<DynamicObject>::all_with(
            admin.clone(),
            &kube::api::ApiResource::erase::<ClusterPolicy>(&()),
        )
        .create(&PostParams::default(), &policy)
        .await?;
        let off_created = audit::offset(audit_log);
        let ready_limit = Duration::from_secs(env_or("KILN_BENCH_READY_S", 1200));
        let Some(ready_at) = wait_ready(&seen, &mut child, ready_limit).await? else {
            // A cluster too big for this machine's control plane to roll out in time: the
            // operator's memory, CPU and requests while it waits are still figures.
            let s = seen.lock().expect("seen");
            println!(
                "policy NOT ready after {} s ({}); DaemonSets ready: {:?}",
                ready_limit.as_secs(),
                s.policy_state,
                s.daemonsets
                    .iter()
                    .map(|(n, (r, _))| (n.as_str(), *r))
                    .collect::<Vec<_>>()
            );
            let minutes = created.elapsed().as_secs_f64() / 60.0;
            let tally = audit::tally(audit_log, off_created, audit::offset(audit_log), USER)?;
            let verbs = tally.verbs_of(USER);
            println!(
                "operator requests since the policy was created: {} ({:.1}/min; by verb per min: {})",
                verbs.values().sum::<u64>(),
                verbs.values().sum::<u64>() as f64 / minutes,
                per_min(&verbs, minutes)
            );
            for (what, n) in &tally.user_detail {
                println!("    {what}: {n}");
            }
            let (rss, peak) = (current_rss(pid).unwrap_or(0), status_field(pid, "VmHWM").unwrap_or(0));
            println!(
                "operator RSS {:.1} MiB now, {:.1} MiB peak (VmHWM); CPU {:.1} s in {:.0} s\n  now: {}",
                rss as f64 / MIB,
                peak as f64 / MIB,
                cpu_seconds(pid),
                created.elapsed().as_secs_f64(),
                rss_breakdown(pid)
            );
            return Ok(Row {
                nodes,
                gpu_nodes,
                latency_ms: -1,
                change: Change::default(),
                watches_per_min: f64::NAN,
                writes_per_min: f64::NAN,
                requests_per_min: f64::NAN,
                rss_steady: rss,
                rss_peak: peak,
                load: format!("not ready after {} s; {}", ready_limit.as_secs(), loadavg()),
            });
        };
        // Let the DaemonSet watch catch up before judging which one became ready last: at
        // 5,000 nodes on a loaded machine its events arrive seconds after the policy's.
        let caught_up = Instant::now() + Duration::from_secs(120);
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let s = seen.lock().expect("seen");
            let not_ready: Vec<&String> =
                s.daemonsets.iter().filter(|(_, (r, _))| !r).map(|(n, _)| n).collect();
            if not_ready.is_empty() {
                break;
            }
            if Instant::now() > caught_up {
                bail!("policy ready but DaemonSets still not ready 120 s later: {not_ready:?}");
            }
        }
        let (latency_ms, count, last) = {
            let s = seen.lock().expect("seen");
            let (last, (_, at)) = s
                .daemonsets
                .iter()
                .max_by_key(|(_, (_, at))| *at)
                .context("no DaemonSets")?;
            let ms = if ready_at >= *at {
                i64::try_from(ready_at.duration_since(*at).as_millis())?
            } else {
                -i64::try_from(at.duration_since(ready_at).as_millis())?
            };
            (ms, s.daemonsets.len(), last.clone())
        };
        let rss_at_ready = current_rss(pid).unwrap_or(0);
        let breakdown_at_ready = rss_breakdown(pid);
        println!(
            "policy created -> ready in {:.1} s ({count} DaemonSets, last ready: {last})",
            ready_at.duration_since(created).as_secs_f64()
        );
        println!("ready latency: last DaemonSet ready -> policy ready = {latency_ms} ms (target <= 1000 ms)");

        let churn = tokio::spawn(gfd_churn(admin.clone()));
        tokio::time::sleep(settle).await;
        let (off0, cpu0, load0, t0) = (audit::offset(audit_log), cpu_seconds(pid), loadavg(), Instant::now());
        tokio::time::sleep(window).await;
        let (off1, cpu1, load1, t1) = (audit::offset(audit_log), cpu_seconds(pid), loadavg(), Instant::now());
        let state = seen.lock().expect("seen").policy_state.clone();
        if state != "ready" {
            bail!("the policy left ready during the window: {state}");
        }
        let minutes = t1.duration_since(t0).as_secs_f64() / 60.0;
        let tally = audit::tally(audit_log, off0, off1, USER)?;
        let verbs = tally.verbs_of(USER);
        let total: u64 = verbs.values().sum();
        let writes = tally.writes_of(USER);
        println!(
            "steady state with GFD churn (every GPU node's {GFD_TIMESTAMP} rewritten once a minute): {:.0} s window after {} s settle; load average {load0} -> {load1}",
            t1.duration_since(t0).as_secs_f64(),
            settle.as_secs()
        );
        println!("operator requests (apiserver audit log, user {USER}):");
        println!(
            "  total {:.1}/min, writes {:.1}/min (target 0); by verb: {}",
            total as f64 / minutes,
            writes as f64 / minutes,
            per_min(&verbs, minutes)
        );
        for (what, n) in &tally.user_detail {
            println!("    {what}: {n}");
        }
        println!("other clients in the same window (context):");
        let mut others: Vec<_> = tally
            .by_client
            .iter()
            .filter(|((u, _), _)| u != USER)
            .map(|((u, a), v)| (v.values().sum::<u64>(), u, a, v))
            .collect();
        others.sort_by_key(|o| std::cmp::Reverse(o.0));
        for (n, u, a, v) in others.iter().take(6) {
            println!("  {:.1}/min {u} [{a}]: {}", *n as f64 / minutes, per_min(v, minutes));
        }
        let window_rss: Vec<u64> = samples
            .lock()
            .expect("samples")
            .iter()
            .filter(|(at, _)| *at >= t0 && *at <= t1)
            .map(|(_, r)| *r)
            .collect();
        let rss_steady = window_rss.iter().copied().max().unwrap_or(0);
        let rss_peak = status_field(pid, "VmHWM").unwrap_or(0);
        println!(
            "operator RSS: {:.1} MiB at ready, {:.1} MiB max in the window, {:.1} MiB peak (VmHWM); CPU {:.2} s in the window",
            rss_at_ready as f64 / MIB,
            rss_steady as f64 / MIB,
            rss_peak as f64 / MIB,
            cpu1 - cpu0
        );
        println!("  at ready: {breakdown_at_ready}");
        println!("  at the window's end: {}", rss_breakdown(pid));
        let change = policy_change(&admin, &seen, &mut child, audit_log, pid).await?;
        // At rest again after the rollout, the GFD churn still running.
        let after = Duration::from_secs(env_or("KILN_BENCH_AFTER_S", 0));
        if !after.is_zero() {
            tokio::time::sleep(after).await;
            println!(
                "operator RSS {} s after the change rolled out: {:.1} MiB; {}",
                after.as_secs(),
                current_rss(pid).unwrap_or(0) as f64 / MIB,
                rss_breakdown(pid)
            );
        }
        churn.abort();
        Ok(Row {
            nodes,
            gpu_nodes,
            latency_ms,
            change,
            watches_per_min: verbs.get("watch").copied().unwrap_or(0) as f64 / minutes,
            writes_per_min: writes as f64 / minutes,
            requests_per_min: total as f64 / minutes,
            rss_steady,
            rss_peak,
            load: format!("{load0} -> {load1}"),
        })
    }
    .await;
    sampler.abort();
    for w in watches {
        w.abort();
    }
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status();
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// GFD's per-node timestamp label (kiln's GFD rewrites it every minute on every GPU node).
const GFD_TIMESTAMP: &str = "nvidia.com/gfd.timestamp";
/// The DaemonSet a `devicePlugin.env` change rolls.
const DEVICE_PLUGIN_DS: &str = "nvidia-device-plugin-daemonset";

/// GFD-like churn, as the admin: every GPU node's [`GFD_TIMESTAMP`] rewritten once a minute,
/// spread evenly over the minute. Runs until aborted.
async fn gfd_churn(admin: kube::Client) {
    use k8s_openapi::api::core::v1::Node;
    let api: Api<Node> = Api::all(admin);
    let Ok(nodes) = api
        .list_metadata(&kube::api::ListParams::default().labels(kiln_testcluster::NFD_NVIDIA_LABEL))
        .await
    else {
        eprintln!("gfd churn: cannot list the GPU nodes");
        return;
    };
    let names: Vec<String> = nodes
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    if names.is_empty() {
        return;
    }
    let gap = Duration::from_secs(60) / u32::try_from(names.len()).unwrap_or(u32::MAX);
    let mut tick = tokio::time::interval(gap);
    loop {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            .to_string();
        for name in &names {
            tick.tick().await;
            let body = serde_json::json!({"metadata": {"labels": {GFD_TIMESTAMP: stamp}}});
            if let Err(e) = api
                .patch(name, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                eprintln!("gfd churn: {name}: {e}");
            }
        }
    }
}

/// What one policy change cost the operator.
#[derive(Debug, Default)]
struct Change {
    /// `get` and `list` requests.
    reads: u64,
    /// Watch (re)connections: each watch is renewed when the API server ends it (every
    /// 290 s, kube-runtime's timeout), whether anything changed or not.
    watches: u64,
    writes: u64,
    cpu_s: f64,
    rollout_s: f64,
    latency_ms: i64,
}

/// Change `devicePlugin.env` on the policy and wait for the device plugin's rollout to finish
/// and the policy to be `ready` again; count the operator's requests and CPU over it.
async fn policy_change(
    admin: &kube::Client,
    seen: &Shared,
    child: &mut Child,
    audit_log: &Path,
    pid: u32,
) -> anyhow::Result<Change> {
    let api: Api<ClusterPolicy> = Api::all(admin.clone());
    let name = "cluster-policy";
    let (off0, cpu0, t0) = (audit::offset(audit_log), cpu_seconds(pid), Instant::now());
    let body = serde_json::json!({"spec": {"devicePlugin": {"env": [
        {"name": "KILN_BENCH_CHANGE", "value": "1"}]}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    println!("\npolicy change: devicePlugin.env set");
    let deadline = Instant::now() + Duration::from_secs(1800);
    // Done when the device plugin DaemonSet left ready and became ready again after the
    // change, and the policy is ready after that.
    let (ds_ready, policy_ready) = loop {
        {
            let s = seen.lock().expect("seen");
            let ds = s.daemonsets.get(DEVICE_PLUGIN_DS).copied();
            let left = s.policy_unready_since.is_some_and(|at| at > t0);
            if let (Some((true, ds_at)), Some(p_at)) = (ds, s.policy_ready_since)
                && ds_at > t0
                && left
                && s.policy_state == "ready"
                && p_at > t0
            {
                break (ds_at, p_at);
            }
        }
        if let Some(status) = child.try_wait()? {
            bail!("the operator process exited: {status}");
        }
        if Instant::now() > deadline {
            bail!("the change did not roll out in 30 min");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The last DaemonSet to become ready after the change (only the device plugin's should
    // have moved).
    let last_ds = {
        let s = seen.lock().expect("seen");
        s.daemonsets
            .values()
            .filter(|(r, at)| *r && *at > t0)
            .map(|(_, at)| *at)
            .max()
            .unwrap_or(ds_ready)
    };
    // Requests the rollout's tail caused (a last status write) land in the log shortly after.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (off1, cpu1) = (audit::offset(audit_log), cpu_seconds(pid));
    let tally = audit::tally(audit_log, off0, off1, USER)?;
    let verbs = tally.verbs_of(USER);
    let writes = tally.writes_of(USER);
    let watches = verbs.get("watch").copied().unwrap_or(0);
    let reads = verbs.values().sum::<u64>() - writes - watches;
    let (mut status_writes, mut event_writes) = (0, 0);
    for (what, n) in &tally.user_detail {
        let Some((verb, resource)) = what.split_once(' ') else {
            continue;
        };
        if audit::WRITE_VERBS.contains(&verb) {
            if resource.ends_with("/status") {
                status_writes += n;
            } else if resource == "events" {
                event_writes += n;
            }
        }
    }
    let object_writes = writes - status_writes - event_writes;
    let latency_ms = if policy_ready >= last_ds {
        i64::try_from(policy_ready.duration_since(last_ds).as_millis())?
    } else {
        -i64::try_from(last_ds.duration_since(policy_ready).as_millis())?
    };
    let change = Change {
        reads,
        watches,
        writes,
        cpu_s: cpu1 - cpu0,
        rollout_s: policy_ready.duration_since(t0).as_secs_f64(),
        latency_ms,
    };
    println!(
        "policy change rolled out in {:.1} s; operator requests {} ({reads} reads (get/list), {watches} watch renewals, {writes} writes = {object_writes} objects + {status_writes} status + {event_writes} Events; targets: reads <= 10, writes <= objects changed + status + Events), CPU {:.2} s; ready latency after the last DaemonSet {latency_ms} ms",
        change.rollout_s,
        reads + watches + writes,
        change.cpu_s,
    );
    println!("  by verb: {verbs:?}");
    for (what, n) in &tally.user_detail {
        println!("    {what}: {n}");
    }
    Ok(change)
}

fn yaml<T: DeserializeOwned>(text: &str) -> anyhow::Result<T> {
    Ok(serde_yaml_ng::from_str(text)?)
}

/// The CRD (established), the operator namespace and `deploy/rbac/kiln-operator.yaml`.
async fn setup(admin: &kube::Client) -> anyhow::Result<()> {
    let ssa = PatchParams::apply("kiln-bench").force();
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let crd = kiln_operator::crd::crd();
    crds.patch("clusterpolicies.nvidia.com", &ssa, &Patch::Apply(&crd))
        .await?;
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": NS}}))?;
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let rbac = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/rbac/kiln-operator.yaml"),
    )?;
    for doc in serde_yaml_ng::Deserializer::from_str(&rbac) {
        let v = <Value as serde::Deserialize>::deserialize(doc)?;
        let name = v["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match v["kind"].as_str() {
            Some("ServiceAccount") => {
                Api::<ServiceAccount>::namespaced(admin.clone(), NS)
                    .patch(&name, &ssa, &Patch::Apply(&v))
                    .await?;
            }
            Some("ClusterRole") => {
                Api::<ClusterRole>::all(admin.clone())
                    .patch(&name, &ssa, &Patch::Apply(&v))
                    .await?;
            }
            Some("ClusterRoleBinding") => {
                Api::<ClusterRoleBinding>::all(admin.clone())
                    .patch(&name, &ssa, &Patch::Apply(&v))
                    .await?;
            }
            // The Role in the operator namespace and the Events Role in `default`.
            Some("Role") => {
                let ns = v["metadata"]["namespace"].as_str().unwrap_or(NS);
                Api::<Role>::namespaced(admin.clone(), ns)
                    .patch(&name, &ssa, &Patch::Apply(&v))
                    .await?;
            }
            Some("RoleBinding") => {
                let ns = v["metadata"]["namespace"].as_str().unwrap_or(NS);
                Api::<RoleBinding>::namespaced(admin.clone(), ns)
                    .patch(&name, &ssa, &Patch::Apply(&v))
                    .await?;
            }
            other => bail!("deploy/rbac/kiln-operator.yaml: unexpected kind {other:?}"),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = crds.get("clusterpolicies.nvidia.com").await?;
        let established = c
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("CRD not established after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Follows the namespace's DaemonSets and records when each became ready or not by the
/// operator's rule. Events are timestamped as they arrive (a task of their own), so a slow
/// judgement never delays the next one's instant; `OnDelete` DaemonSets are judged from pod
/// watches, as the operator judges them, not by listing their pods on every event (at 5,000
/// nodes that was 50 pages of pods per driver DaemonSet event, and the observer fell behind).
async fn watch_daemonsets(client: kube::Client, seen: Shared) {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let (tx, mut events) = futures::channel::mpsc::unbounded();
    tokio::spawn(async move {
        while let Some(ev) = stream.next().await {
            if tx.unbounded_send((Instant::now(), ev)).is_err() {
                break;
            }
        }
    });
    // The pod watches wake whoever judges; nobody here needs waking.
    let (wake, mut wakes) = kiln_operator::live::Wake::channel();
    tokio::spawn(async move { while wakes.next().await.is_some() {} });
    let pods = kiln_operator::readiness::PodWatches::new(client.clone(), wake);
    let no_nodes: &[BTreeMap<String, String>] = &[];
    while let Some((now, ev)) = events.next().await {
        let (ds, deleted) = match ev {
            Ok(watcher::Event::Apply(ds) | watcher::Event::InitApply(ds)) => (ds, false),
            Ok(watcher::Event::Delete(ds)) => (ds, true),
            _ => continue,
        };
        let name = ds.metadata.name.clone().unwrap_or_default();
        if deleted {
            seen.lock().expect("seen").daemonsets.remove(&name);
            continue;
        }
        // The operator's own rule; upstream's part only (no node coverage: the observer
        // holds no nodes).
        let ready = kiln_operator::readiness::judge_daemonset(&name, Some(&ds), 0, &pods, no_nodes)
            .await
            .is_none();
        let mut s = seen.lock().expect("seen");
        let entry = s.daemonsets.entry(name).or_insert((!ready, now));
        if entry.0 != ready {
            *entry = (ready, now);
        }
    }
}

async fn watch_policy(client: kube::Client, seen: Shared) {
    let api: Api<ClusterPolicy> = Api::all(client);
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(ev) = stream.next().await {
        let now = Instant::now();
        let Ok(p) = ev else { continue };
        let state = p
            .status
            .as_ref()
            .and_then(|s| serde_json::to_value(s.state).ok())
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let mut s = seen.lock().expect("seen");
        if state == "ready" && s.policy_ready.is_none() {
            s.policy_ready = Some(now);
        }
        if state == "ready" && s.policy_state != "ready" {
            s.policy_ready_since = Some(now);
        }
        if state != "ready" && s.policy_state == "ready" {
            s.policy_unready_since = Some(now);
        }
        s.policy_state = state;
    }
}

/// When the policy became `ready`; `None` when it is not ready after `timeout`.
async fn wait_ready(
    seen: &Shared,
    child: &mut Child,
    timeout: Duration,
) -> anyhow::Result<Option<Instant>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(at) = seen.lock().expect("seen").policy_ready {
            return Ok(Some(at));
        }
        if let Some(status) = child.try_wait()? {
            bail!("the operator process exited: {status}");
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn per_min(verbs: &BTreeMap<String, u64>, minutes: f64) -> String {
    if verbs.is_empty() {
        return "none".into();
    }
    verbs
        .iter()
        .map(|(v, n)| format!("{v} {:.1}", *n as f64 / minutes))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn sample_rss(pid: u32, samples: Arc<Mutex<Vec<(Instant, u64)>>>) {
    loop {
        if let Some(rss) = current_rss(pid) {
            samples.lock().expect("samples").push((Instant::now(), rss));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A `kB` field of `/proc/PID/status` (`VmRSS`, `VmHWM`), in bytes.
fn status_field(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(&format!("{field}:")))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Where `pid`'s resident memory is (`/proc/PID/smaps`), in MiB: Wasmtime's instance pool
/// (plugin linear memories and tables), other anonymous memory (heap, stacks), the
/// executable's own pages, mmapped precompiled plugins
/// (`*.cwasm`), other files; and the thread count.
fn rss_breakdown(pid: u32) -> String {
    let Ok(smaps) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) else {
        return String::new();
    };
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let (mut anon, mut pool, mut bin, mut cwasm, mut files) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut current, mut huge) = (String::new(), false);
    for line in smaps.lines() {
        let mut parts = line.split_whitespace();
        let first = parts.next().unwrap_or_default();
        if first.contains('-') && !first.ends_with(':') {
            current = parts.nth(4).unwrap_or_default().to_string();
            // Wasmtime's pooling allocator reserves its slots as one anonymous mapping of many
            // GiB; nothing else in the process maps 1 GiB at once.
            huge = first
                .split_once('-')
                .and_then(|(a, b)| {
                    Some(u64::from_str_radix(b, 16).ok()? - u64::from_str_radix(a, 16).ok()?)
                })
                .is_some_and(|len| len >= 1 << 30);
        } else if first == "Rss:" {
            let kb: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            let slot = if current.is_empty() && huge {
                &mut pool
            } else if current.is_empty() || current.starts_with('[') {
                &mut anon
            } else if Path::new(&current) == exe {
                &mut bin
            } else if current.ends_with(".cwasm") {
                &mut cwasm
            } else {
                &mut files
            };
            *slot += kb;
        }
    }
    let threads = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:").map(|v| v.trim().to_string()))
        })
        .unwrap_or_default();
    let mib = |kb: u64| kb as f64 / 1024.0;
    format!(
        "Wasm instance pool {:.1} MiB, other anonymous {:.1} MiB, executable {:.1} MiB, precompiled plugins (.cwasm) {:.1} MiB, other files {:.1} MiB; {threads} threads",
        mib(pool),
        mib(anon),
        mib(bin),
        mib(cwasm),
        mib(files)
    )
}

fn current_rss(pid: u32) -> Option<u64> {
    status_field(pid, "VmRSS")
}

/// User + system CPU seconds of `pid` (`/proc/PID/stat` fields 14 and 15, at 100 ticks/s).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    f.iter().sum::<u64>() as f64 / 100.0
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_default()
}
