//! Rolling driver upgrade benchmark against testcluster (a bench binary, `harness = false`;
//! never part of `cargo test`; prints figures, asserts nothing about time):
//!
//! ```text
//! cargo bench -p kiln-operator --bench upgrade
//! KILN_BENCH_UPGRADE_NODES=20 KILN_BENCH_UPGRADE_PARALLEL=4 cargo bench -p kiln-operator --bench upgrade
//! ```
//!
//! Starts a testcluster of `KILN_BENCH_UPGRADE_NODES` (default 100) GPU nodes with the
//! apiserver audit log on, runs the operator as a separate process (this binary re-executed,
//! `kiln_operator::run` with the bundled plugins) with the token of a ServiceAccount bound to
//! `cluster-admin` (so its requests are told apart in the audit log), creates the sample
//! policy with `maxParallelUpgrades: KILN_BENCH_UPGRADE_PARALLEL` (default 10), waits until
//! every node is `upgrade-done`, changes `driver.version`, and measures until every node is
//! `upgrade-done` again on the new driver revision:
//!
//! - wall time of the rolling upgrade;
//! - the operator's API requests in that window, by verb and resource (audit log), its writes,
//!   and requests per minute;
//! - the operator's CPU seconds in the window (`/proc/PID/stat`) and the machine's load average.

#[path = "steady_state/audit.rs"]
mod audit;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kiln_core::spec::ClusterPolicy;
use kiln_core::upgrade::{STATE_LABEL, UpgradeState};
use kiln_testcluster::{Options, TestCluster};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NS: &str = "gpu-operator";
const SA: &str = "kiln-upgrade-bench";
const USER: &str = "system:serviceaccount:gpu-operator:kiln-upgrade-bench";
const OPERATOR_ENV: &str = "KILN_BENCH_OPERATOR_KUBECONFIG";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    if let Ok(kc) = std::env::var(OPERATOR_ENV) {
        return operator_mode(Path::new(&kc));
    }
    // `cargo bench` passes `--bench`; nothing else is taken.
    let nodes: u32 = env_or("KILN_BENCH_UPGRADE_NODES", 100);
    let parallel: u32 = env_or("KILN_BENCH_UPGRADE_PARALLEL", 10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(measure(nodes, parallel))
}

/// The child: the operator as `kiln operator --kubeconfig FILE` runs it.
fn operator_mode(kubeconfig: &Path) -> anyhow::Result<()> {
    let rt = kiln_operator::runtime()?;
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        let client = kube::Client::try_from(cfg)?;
        let host = Arc::new(kiln_plugin_host::PluginHost::new(
            kiln_plugin_host::HostConfig {
                keep_resident_bytes: kiln_operator::PLUGIN_KEEP_RESIDENT_BYTES,
                ..kiln_plugin_host::HostConfig::default()
            },
            kiln_bundled_plugins::BUNDLED,
        )?);
        let config = kiln_operator::Config {
            namespace: NS.into(),
            metrics_addr: "127.0.0.1:0".into(),
            ..kiln_operator::Config::default()
        };
        kiln_operator::run(client, kiln_render::Renderer::new(host), config).await?;
        anyhow::Ok(())
    })
}

async fn measure(nodes: u32, parallel: u32) -> anyhow::Result<()> {
    println!("== rolling driver upgrade: {nodes} GPU nodes, maxParallelUpgrades {parallel}");
    let (cluster, log) = tokio::task::block_in_place(|| {
        let c = TestCluster::start(Options {
            nodes,
            gpu_nodes: nodes,
            ..Options::default()
        })?;
        let log = c.enable_audit_log()?;
        anyhow::Ok((c, log))
    })?;
    let res = run(&cluster, &log, nodes, parallel).await;
    tokio::task::block_in_place(move || drop(cluster));
    res
}

async fn run(cluster: &TestCluster, log: &Path, nodes: u32, parallel: u32) -> anyhow::Result<()> {
    let admin = cluster.client().await?;
    Api::<CustomResourceDefinition>::all(admin.clone())
        .patch(
            "clusterpolicies.nvidia.com",
            &PatchParams::apply("kiln-bench").force(),
            &Patch::Apply(&kiln_operator::crd::crd()),
        )
        .await?;
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
        )
        .await?;
    Api::<ServiceAccount>::namespaced(admin.clone(), NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": SA}}))?,
        )
        .await?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": SA},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": NS}]
            }))?,
        )
        .await?;
    let kubeconfig = cluster
        .service_account_kubeconfig(NS, SA, Duration::from_secs(4 * 3600))
        .await?;
    let mut child = Command::new(std::env::current_exe()?)
        .env(OPERATOR_ENV, &kubeconfig)
        .stdin(Stdio::null())
        .spawn()
        .context("starting the operator process")?;
    let pid = child.id();
    let res = async {
        let mut doc: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/samples/clusterpolicy.yaml"),
        )?)?;
        doc["spec"]["driver"]["version"] = json!("570.10.01");
        doc["spec"]["driver"]["repository"] = json!("nvcr.io/nvidia");
        doc["spec"]["driver"]["image"] = json!("driver");
        // The operator's spec check currently refuses the typed default `ccManager.defaultMode: ""`.
        doc["spec"]["ccManager"] = json!({"defaultMode": "on"});
        doc["spec"]["driver"]["upgradePolicy"]["maxParallelUpgrades"] = json!(parallel);
        // Until the CRD is established the resource is not served (404).
        let raw = Api::<DynamicObject>::all_with(admin.clone(), &kube::api::ApiResource::erase::<ClusterPolicy>(&()));
        let obj: DynamicObject = serde_json::from_value(doc)?;
        let mut tries = 0;
        while let Err(e) = raw.create(&PostParams::default(), &obj).await {
            tries += 1;
            if tries > 60 {
                return Err(e.into());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let t = Instant::now();
        wait_done(&admin, nodes, None, Duration::from_secs(1200), &mut child).await?;
        println!("policy created -> every node upgrade-done in {:.1} s", t.elapsed().as_secs_f64());
        tokio::time::sleep(Duration::from_secs(5)).await;

        let before = new_revision(&admin, "570.10.01", "").await?;
        let (off0, cpu0, load0, t0) = (audit::offset(log), cpu_seconds(pid), loadavg(), Instant::now());
        Api::<ClusterPolicy>::all(admin.clone())
            .patch(
                "cluster-policy",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"driver": {"version": "570.20.02"}}})),
            )
            .await?;
        let revision = new_revision(&admin, "570.20.02", &before).await?;
        wait_done(&admin, nodes, Some(&revision), Duration::from_secs(3600), &mut child).await?;
        let (off1, cpu1, load1, t1) = (audit::offset(log), cpu_seconds(pid), loadavg(), Instant::now());
        let secs = t1.duration_since(t0).as_secs_f64();
        let tally = audit::tally(log, off0, off1, USER)?;
        let verbs = tally.verbs_of(USER);
        let total: u64 = verbs.values().sum();
        let writes = tally.writes_of(USER);
        println!("rolling upgrade of {nodes} nodes (maxParallelUpgrades {parallel}): {secs:.1} s");
        println!(
            "operator requests in the window: {total} ({:.0}/min), writes {writes} ({:.1} per node)",
            total as f64 / (secs / 60.0),
            writes as f64 / f64::from(nodes)
        );
        println!("  by verb: {verbs:?}");
        let mut detail: Vec<(&String, &u64)> = tally.user_detail.iter().collect();
        detail.sort_by(|a, b| b.1.cmp(a.1));
        for (what, n) in detail {
            println!("  {n:>6}  {what}");
        }
        println!(
            "operator CPU: {:.1} s in {secs:.0} s ({:.0}% of one core); load average {load0} -> {load1}",
            cpu1 - cpu0,
            100.0 * (cpu1 - cpu0) / secs
        );
        anyhow::Ok(())
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    res
}

/// The driver DaemonSet's newest revision hash once its template carries `version` and the
/// hash is not `not` (the DaemonSet controller writes the revision after the template).
async fn new_revision(admin: &kube::Client, version: &str, not: &str) -> anyhow::Result<String> {
    let dss: Api<DaemonSet> = Api::namespaced(admin.clone(), NS);
    let revs: Api<k8s_openapi::api::apps::v1::ControllerRevision> =
        Api::namespaced(admin.clone(), NS);
    for _ in 0..600 {
        let ds = dss.get("nvidia-driver-daemonset").await?;
        let has = ds
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .is_some_and(|p| {
                p.containers
                    .iter()
                    .any(|c| c.image.as_deref().is_some_and(|i| i.contains(version)))
            });
        let uid = ds.metadata.uid.clone().unwrap_or_default();
        if has {
            let newest = revs
                .list(&ListParams::default().labels("app=nvidia-driver-daemonset"))
                .await?
                .items
                .into_iter()
                .filter(|r| r.owner_references().iter().any(|o| o.uid == uid))
                .max_by_key(|r| r.revision);
            if let Some(h) = newest
                .and_then(|r| r.labels().get("controller-revision-hash").cloned())
                .filter(|h| h != not)
            {
                return Ok(h);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!("the driver DaemonSet never showed {version}")
}

/// Every node `upgrade-done` and uncordoned (with a driver pod of `revision` when given).
async fn wait_done(
    admin: &kube::Client,
    nodes: u32,
    revision: Option<&str>,
    limit: Duration,
    child: &mut std::process::Child,
) -> anyhow::Result<()> {
    let na: Api<Node> = Api::all(admin.clone());
    let pa: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let t = Instant::now();
    let mut last = String::new();
    while t.elapsed() < limit {
        if let Some(status) = child.try_wait()? {
            bail!("the operator exited: {status}");
        }
        let list = na.list(&ListParams::default()).await?;
        let mut by: BTreeMap<&str, usize> = BTreeMap::new();
        let mut ok = list.items.len() == nodes as usize;
        for n in &list.items {
            let st = UpgradeState::from_label(n.labels().get(STATE_LABEL).map(String::as_str));
            *by.entry(st.name()).or_default() += 1;
            let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
            ok &= st == UpgradeState::Done && !cordoned;
        }
        if ok && let Some(rev) = revision {
            let current = pa
                .list(&ListParams::default().labels(&format!(
                    "app=nvidia-driver-daemonset,controller-revision-hash={rev}"
                )))
                .await?
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .count();
            ok = current == nodes as usize;
        }
        if ok {
            return Ok(());
        }
        let now = format!("{by:?}");
        if now != last {
            println!("  {:>6.1} s  {now}", t.elapsed().as_secs_f64());
            last = now;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    bail!("not every node upgrade-done after {limit:?}: {last}")
}

/// User + system CPU seconds of `pid` (`/proc/PID/stat` utime and stime, 100 ticks/s).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
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
