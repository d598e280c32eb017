//! The chart's life on testcluster with readiness that is real: `helm install --wait`,
//! `helm upgrade --wait` and `helm uninstall`, with the chart's default two replicas.
//!
//! kwok runs no containers, so this test stands in for the kubelet of the operator's pods:
//! the pods carry the testcluster annotation `kiln.dev/testcluster-readiness` (through the
//! chart's `operator.annotations`), for which kwok starts them Running but **NotReady**, and a
//! [`Kubelet`] task here, for every such pod bound to a node, runs one operator replica in
//! this process (`kiln_operator::run_until`, identity = the pod name, the chart's
//! ServiceAccount token, leader election as the chart asks), probes the pod's own
//! `readinessProbe` path on that replica and writes the pod's `Ready` condition from the
//! answer; a deleted pod gets its replica stopped gracefully (what SIGTERM does). So the real
//! Deployment controller and `helm --wait` see exactly the readiness the replicas report:
//! with a standby answering 503 (before the fix) the install times out with one pod Ready.
//!
//! Checked on the way: both replicas serve `/readyz` 200 while only one leads (`kiln_leader`);
//! a gracefully stopped leader releases the Lease, and the other replica takes over (the time
//! from the pod's deletion to the new leader's first repair of a deleted operand is printed);
//! a rolling `helm upgrade --wait`; the pre-upgrade hook's command (`kiln operator
//! apply-crds`) restores a drifted CRD with only the rights the chart gives that hook; after
//! `helm uninstall`, operands are garbage-collected and the post-delete hook's command
//! (`kiln operator cleanup --delete-crd`, rights from the chart) removes the operator's node
//! labels and both CRDs. kwok "completes" the hook Jobs without running them, so their
//! commands are run here, against the same cluster, with tokens of ServiceAccounts bound to
//! the hook RBAC the chart renders.

use crate::support::helm as helm_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use helm_support::{helm, helm_command};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kiln_core::spec::ClusterPolicy;
use kiln_operator::lifecycle::{self, CRD_NAME, CleanupOptions, NVIDIA_DRIVER_CRD_NAME};
use kiln_testcluster::{Options, TestCluster};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::{Mutex, oneshot};

const NS: &str = "gpu-operator";
const RELEASE: &str = "kiln";
const POLICY: &str = "cluster-policy";
/// Makes the chart's operator pods' readiness external (the stand-in kubelet reports it).
const READINESS_ANNOTATION: &str = "operator.annotations.kiln\\.dev/testcluster-readiness=external";
const TIMEOUT: Duration = Duration::from_secs(150);
/// The testcluster annotation for which kwok leaves a pod's readiness to the test.
const EXTERNAL_READINESS: &str = "kiln.dev/testcluster-readiness";
const OPERATOR_PODS: &str = "app.kubernetes.io/name=kiln-operator";

/// One operator replica standing for one pod: its own thread and Tokio runtime, dropped when
/// `run_until` returns, so that nothing it spawned outlives it (as at a process exit).
struct Replica {
    port: u16,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Replica {
    /// Stop gracefully (what SIGTERM does) and wait until its runtime is gone.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

/// Stands in for the kubelet of the operator's pods (see the module docs).
struct Kubelet {
    admin: Client,
    operator: Client,
    host: Arc<kiln_plugin_host::PluginHost>,
    replicas: Mutex<BTreeMap<String, Replica>>,
    /// Pods whose replicas have stopped, in order.
    stopped: Mutex<Vec<String>>,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// GET `path` of 127.0.0.1:`port`: the status code, 0 when nothing answers.
async fn http_get(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return (0, String::new());
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return (0, String::new());
    }
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// The `kiln_leader` gauge of a replica's `/metrics`.
async fn leader_gauge(port: u16) -> Option<i64> {
    let (_, body) = http_get(port, "/metrics").await;
    body.lines()
        .find(|l| l.starts_with("kiln_leader "))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

/// Prints the `kiln_reconcile_duration_seconds` sum and count of `pod`'s replica.
async fn print_reconcile_durations(kubelet: &Kubelet, pod: &str, who: &str) {
    let Some(port) = kubelet.ports().await.get(pod).copied() else {
        return;
    };
    let (_, body) = http_get(port, "/metrics").await;
    for l in body
        .lines()
        .filter(|l| l.starts_with("kiln_reconcile_duration_seconds_"))
        .filter(|l| l.contains("_sum") || l.contains("_count"))
    {
        println!("{who} {pod}: {l}");
    }
}

fn ready_of(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The readiness probe's path (the chart's `readinessProbe.httpGet`) of a pod's container.
fn probe_path(pod: &Pod) -> Option<String> {
    let c = pod.spec.as_ref()?.containers.first()?;
    c.readiness_probe.as_ref()?.http_get.as_ref()?.path.clone()
}

impl Kubelet {
    fn start_replica(&self, pod: &str) -> anyhow::Result<Replica> {
        let port = free_port()?;
        let config = kiln_operator::Config {
            namespace: NS.into(),
            metrics_addr: format!("127.0.0.1:{port}"),
            metrics_auth: kiln_operator::metrics::MetricsAuth::None,
            leader_election: true,
            identity: pod.into(),
            ..kiln_operator::Config::default()
        };
        let renderer = kiln_render::Renderer::new(self.host.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let client = self.operator.clone();
        let name = pod.to_string();
        let thread = std::thread::Builder::new()
            .name(format!("replica-{pod}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("a runtime");
                let shutdown = async move {
                    let _ = stopped.await;
                };
                let run = kiln_operator::run_until(client, renderer, config, shutdown);
                if let Err(e) = rt.block_on(run) {
                    eprintln!("replica {name} stopped: {e}");
                }
                rt.shutdown_background();
            })?;
        Ok(Replica {
            port,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// One pass: start replicas for new pods, stop those of deleted pods, write readiness.
    async fn sync(&self) -> anyhow::Result<()> {
        let pods = Api::<Pod>::namespaced(self.admin.clone(), NS)
            .list(&ListParams::default().labels(OPERATOR_PODS))
            .await?
            .items;
        let live: BTreeMap<String, &Pod> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && p.metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key(EXTERNAL_READINESS))
            })
            .filter_map(|p| Some((p.metadata.name.clone()?, p)))
            .collect();
        let mut replicas = self.replicas.lock().await;
        let gone: Vec<String> = replicas
            .keys()
            .filter(|k| !live.contains_key(*k))
            .cloned()
            .collect();
        for name in gone {
            replicas.remove(&name).expect("listed").stop().await;
            self.stopped.lock().await.push(name);
        }
        for (name, pod) in &live {
            if !replicas.contains_key(name) {
                replicas.insert(name.clone(), self.start_replica(name)?);
            }
            let path = probe_path(pod).context("operator pod without an httpGet readinessProbe")?;
            let (code, _) = http_get(replicas[name].port, &path).await;
            let ready = (200..400).contains(&code);
            if ready != ready_of(pod) {
                let status = if ready { "True" } else { "False" };
                let now = k8s_openapi::jiff::Timestamp::now().to_string();
                let patch = json!({"status": {
                    "conditions": [
                        {"type": "Ready", "status": status, "lastTransitionTime": now},
                        {"type": "ContainersReady", "status": status, "lastTransitionTime": now}
                    ],
                    "containerStatuses": [{"name": "operator", "ready": ready}]
                }});
                Api::<Pod>::namespaced(self.admin.clone(), NS)
                    .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                    .await
                    .with_context(|| format!("pod {name} readiness"))?;
            }
        }
        Ok(())
    }

    fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = me.sync().await {
                    eprintln!("kubelet stand-in: {e:#}");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    }

    async fn ports(&self) -> BTreeMap<String, u16> {
        self.replicas
            .lock()
            .await
            .iter()
            .map(|(k, r)| (k.clone(), r.port))
            .collect()
    }

    async fn stop_all(&self) {
        let mut replicas = self.replicas.lock().await;
        for (_, r) in std::mem::take(&mut *replicas) {
            r.stop().await;
        }
    }
}

async fn lease_holder(admin: &Client) -> anyhow::Result<Option<String>> {
    Ok(Api::<Lease>::namespaced(admin.clone(), NS)
        .get_opt("kiln-operator")
        .await?
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// The objects of `templates/hooks.yaml` rendered with `set` values.
fn rendered_hooks(set: &[&str]) -> anyhow::Result<Vec<Value>> {
    rendered("templates/hooks.yaml", set)
}

/// The objects of chart template `template` rendered with `set` values.
fn rendered(template: &str, set: &[&str]) -> anyhow::Result<Vec<Value>> {
    let home = tempfile::tempdir()?;
    let mut args = vec![
        "template",
        RELEASE,
        "deploy/helm/kiln",
        "--namespace",
        NS,
        "--show-only",
        template,
    ];
    for s in set {
        args.extend(["--set", s]);
    }
    let out = helm_command(None, home.path(), &args)?.output()?;
    anyhow::ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut objs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_slice(&out.stdout) {
        let v: Value = serde::Deserialize::deserialize(doc)?;
        if !v.is_null() {
            objs.push(v);
        }
    }
    Ok(objs)
}

fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

/// The hooks as rendered: Jobs on kiln's image with the subcommand args, hook annotations,
/// and each ServiceAccount's rules.
#[test]
fn the_chart_renders_its_hooks() -> anyhow::Result<()> {
    if helm_support::helm_bin().is_err() {
        eprintln!("testcluster/bin/helm not built; skipping");
        return Ok(());
    }
    let defaults = rendered_hooks(&[])?;
    // The hooks run on the operator's image.
    let operator = rendered("templates/operator.yaml", &[])?;
    let image = find(&operator, "Deployment", "kiln-operator")
        .context("no operator Deployment")?["spec"]["template"]["spec"]["containers"][0]["image"]
        .clone();
    assert!(
        image.as_str().is_some_and(|i| i.contains("kiln")),
        "{image}"
    );
    let job = |objs: &[Value], name: &str| -> anyhow::Result<(Value, Value)> {
        let j = find(objs, "Job", name).with_context(|| format!("no Job {name}"))?;
        let c = &j["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], image, "{name}");
        assert_eq!(j["spec"]["template"]["spec"]["serviceAccountName"], name);
        Ok((
            c["args"].clone(),
            j["metadata"]["annotations"]["helm.sh/hook"].clone(),
        ))
    };
    assert_eq!(
        job(&defaults, "kiln-upgrade-crd")?,
        (json!(["operator", "apply-crds"]), json!("pre-upgrade"))
    );
    assert_eq!(
        job(&defaults, "kiln-cleanup")?,
        (
            json!(["operator", "cleanup", "--namespace", NS]),
            json!("post-delete")
        )
    );
    let rules =
        |objs: &[Value], name: &str| find(objs, "ClusterRole", name).map(|r| r["rules"].clone());
    assert_eq!(
        rules(&defaults, "kiln-upgrade-crd"),
        Some(json!([{"apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "resourceNames": [CRD_NAME, NVIDIA_DRIVER_CRD_NAME, lifecycle::GPU_CLUSTER_CRD_NAME], "verbs": ["get", "patch"]}]))
    );
    assert_eq!(
        rules(&defaults, "kiln-cleanup"),
        Some(json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]}]))
    );
    // The cleanup's node patch policy (the release's own is gone when post-delete hooks run),
    // for the hook's ServiceAccount, bound, and off with operator.nodePatchPolicy.enabled=false.
    let policy = find(&defaults, "ValidatingAdmissionPolicy", "kiln-cleanup")
        .context("no cleanup node policy")?;
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        format!("request.userInfo.username == \"system:serviceaccount:{NS}:kiln-cleanup\"")
    );
    assert_eq!(
        find(
            &defaults,
            "ValidatingAdmissionPolicyBinding",
            "kiln-cleanup"
        )
        .context("no binding")?["spec"]["policyName"],
        "kiln-cleanup"
    );
    let off = rendered_hooks(&["operator.nodePatchPolicy.enabled=false"])?;
    assert!(find(&off, "ValidatingAdmissionPolicy", "kiln-cleanup").is_none());
    assert!(find(&off, "Job", "kiln-cleanup").is_some());
    // Every hook object is a hook of its Job's event, created before the Job.
    for o in &defaults {
        let a = &o["metadata"]["annotations"];
        assert!(a["helm.sh/hook"].is_string(), "{o}");
        assert_eq!(
            a["helm.sh/hook-delete-policy"],
            "before-hook-creation,hook-succeeded"
        );
        let weight: i32 = a["helm.sh/hook-weight"].as_str().unwrap_or("x").parse()?;
        assert_eq!(weight, if o["kind"] == "Job" { 0 } else { -10 }, "{o}");
    }

    let cleanup = rendered_hooks(&["operator.cleanupCRD=true", "operator.upgradeCRD=false"])?;
    assert!(find(&cleanup, "Job", "kiln-upgrade-crd").is_none());
    assert_eq!(
        job(&cleanup, "kiln-cleanup")?.0,
        json!(["operator", "cleanup", "--namespace", NS, "--delete-crd"])
    );
    assert_eq!(
        rules(&cleanup, "kiln-cleanup"),
        Some(json!([
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]},
            {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
             "resourceNames": [CRD_NAME, NVIDIA_DRIVER_CRD_NAME], "verbs": ["get", "delete"]}
        ]))
    );
    Ok(())
}

/// Applies the hook `sa`'s ServiceAccount, RBAC and admission policy objects from `hooks`
/// (without the hook annotations; Helm deletes its own copies once the hook succeeded) and
/// returns a client with that ServiceAccount's token.
async fn hook_client(
    cluster: &TestCluster,
    admin: &Client,
    hooks: &[Value],
    sa: &str,
) -> anyhow::Result<Client> {
    for o in hooks
        .iter()
        .filter(|o| o["metadata"]["name"] == sa && o["kind"] != "Job")
    {
        let mut o = o.clone();
        o["metadata"]
            .as_object_mut()
            .context("metadata")?
            .remove("annotations");
        let (group, version) = match o["apiVersion"].as_str().unwrap_or("").split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (
                String::new(),
                o["apiVersion"].as_str().unwrap_or("").to_string(),
            ),
        };
        let kind = o["kind"].as_str().unwrap_or("").to_string();
        let plural = match kind.as_str() {
            "ServiceAccount" => "serviceaccounts",
            "ClusterRole" => "clusterroles",
            "ClusterRoleBinding" => "clusterrolebindings",
            "Role" => "roles",
            "RoleBinding" => "rolebindings",
            "ValidatingAdmissionPolicy" => "validatingadmissionpolicies",
            "ValidatingAdmissionPolicyBinding" => "validatingadmissionpolicybindings",
            other => anyhow::bail!("unexpected hook kind {other}"),
        };
        let ar = kube::api::ApiResource {
            group,
            version,
            api_version: o["apiVersion"].as_str().unwrap_or("").to_string(),
            kind,
            plural: plural.into(),
        };
        let api: Api<DynamicObject> = match o["metadata"]["namespace"].as_str() {
            Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
            None => Api::all_with(admin.clone(), &ar),
        };
        let name = o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        api.patch(
            &name,
            &PatchParams::apply("kiln-test").force(),
            &Patch::Apply(&o),
        )
        .await
        .with_context(|| format!("apply hook object {name}"))?;
    }
    cluster.service_account_client(NS, sa).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_upgrade_uninstall_with_real_readiness() -> anyhow::Result<()> {
    if helm_support::helm_bin().is_err() {
        eprintln!("testcluster/bin/helm not built; skipping");
        return Ok(());
    }
    let turn = crate::support::cluster::start(Options::default()).await?;
    let cluster = turn.cluster();
    cluster.with_logs(lifecycle_scenario(cluster).await)
}

/// The release's life, in steps on one cluster: install (two replicas, one leader, the policy
/// `ready`), failover, upgrade (with the pre-upgrade hook's CRD apply), uninstall (with the
/// post-delete hook's cleanup).
async fn lifecycle_scenario(cluster: &'static TestCluster) -> anyhow::Result<()> {
    let home = tempfile::tempdir()?;
    let home = home.path();
    let admin = cluster.client().await?;
    let (kubelet, kubelet_task, holder) = install_two_replicas(cluster, home, &admin).await?;
    failover(cluster, &admin, &kubelet, &holder).await?;
    // The hook commands with the hook RBAC the chart renders (cleanupCRD on, as set below).
    let hooks = rendered_hooks(&["operator.cleanupCRD=true"])?;
    upgrade_rolls_and_applies_the_crd(cluster, home, &admin, &hooks).await?;
    uninstall_cleans_up(cluster, home, &admin, &kubelet, &hooks).await?;

    kubelet_task.abort();
    kubelet.stop_all().await;
    Ok(())
}

/// `helm install --wait` of the chart, its two operator pods run by the stand-in kubelet: both
/// Ready through their replicas' own `/readyz`, one holds the Lease and says so in `kiln_leader`,
/// the chart's ClusterPolicy becomes `ready`. Returns the kubelet, its task and the leader's pod.
async fn install_two_replicas(
    cluster: &'static TestCluster,
    home: &std::path::Path,
    admin: &Client,
) -> anyhow::Result<(Arc<Kubelet>, tokio::task::JoinHandle<()>, String)> {
    let admin = admin.clone();
    let annotation = READINESS_ANNOTATION;

    // Helm waits for the pods while this test runs them: install in the background.
    let install = {
        let home = home.to_path_buf();
        tokio::spawn(async move {
            helm(
                cluster,
                &home,
                &[
                    "install",
                    RELEASE,
                    "deploy/helm/kiln",
                    "--namespace",
                    NS,
                    "--create-namespace",
                    "--set-string",
                    annotation,
                    "--wait",
                    "--timeout",
                    "120s",
                ],
            )
            .await
        })
    };
    // The chart's ServiceAccount, once Helm created it.
    let operator = cluster
        .wait_for("the chart's ServiceAccount", TIMEOUT, || async {
            Ok(
                match cluster.service_account_client(NS, "kiln-operator").await {
                    Ok(c) => Ok(c),
                    Err(e) => Err(format!("{e:#}")),
                },
            )
        })
        .await?;
    let host = Arc::new(kiln_plugin_host::PluginHost::new(
        kiln_plugin_host::HostConfig {
            keep_resident_bytes: kiln_operator::PLUGIN_KEEP_RESIDENT_BYTES,
            ..kiln_plugin_host::HostConfig::default()
        },
        kiln_bundled_plugins::BUNDLED,
    )?);
    let kubelet = Arc::new(Kubelet {
        admin: admin.clone(),
        operator,
        host,
        replicas: Mutex::new(BTreeMap::new()),
        stopped: Mutex::new(Vec::new()),
    });
    let kubelet_task = kubelet.spawn();

    // `helm install --wait` finishes: both pods Ready, from their replicas' own /readyz.
    install.await??;
    let ports = kubelet.ports().await;
    assert_eq!(ports.len(), 2, "{ports:?}");
    let pods = Api::<Pod>::namespaced(admin.clone(), NS)
        .list(&ListParams::default().labels(OPERATOR_PODS))
        .await?
        .items;
    assert!(pods.iter().all(ready_of), "both operator pods Ready");
    let holder = cluster
        .wait_for("a leader", TIMEOUT, || async {
            Ok(lease_holder(&admin)
                .await?
                .ok_or_else(|| "no holder".to_string()))
        })
        .await?;
    assert!(
        ports.contains_key(&holder),
        "{holder} leads, not one of {ports:?}"
    );
    for (pod, port) in &ports {
        assert_eq!(http_get(*port, "/readyz").await.0, 200, "{pod} /readyz");
        let want = i64::from(*pod == holder);
        cluster
            .wait_for(format!("kiln_leader {want} on {pod}"), TIMEOUT, || async {
                let got = leader_gauge(*port).await;
                Ok(if got == Some(want) {
                    Ok(())
                } else {
                    Err(format!("{got:?}"))
                })
            })
            .await?;
    }
    let policies: Api<ClusterPolicy> = Api::all(admin.clone());
    cluster
        .wait_for("the chart's ClusterPolicy ready", TIMEOUT, || async {
            let s = policies.get(POLICY).await?.status.unwrap_or_default();
            let state = serde_json::to_value(s.state)?;
            Ok(if state == "ready" {
                Ok(())
            } else {
                Err(format!("{state}"))
            })
        })
        .await?;
    Ok((kubelet, kubelet_task, holder))
}

/// Failover: delete the leader's pod (its replica stops gracefully, as on SIGTERM); the
/// Lease is released, not left to expire; another replica takes over and repairs.
async fn failover(
    cluster: &TestCluster,
    admin: &Client,
    kubelet: &Kubelet,
    holder: &str,
) -> anyhow::Result<()> {
    let admin = admin.clone();
    let holder = holder.to_string();
    let dss: Api<DaemonSet> = Api::namespaced(admin.clone(), NS);
    let victim = dss
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|d| d.metadata.owner_references.is_some())
        .context("no operand DaemonSet")?;
    let ds_name = victim.metadata.name.clone().unwrap_or_default();
    let old_uid = victim.metadata.uid.clone();
    print_reconcile_durations(kubelet, &holder, "old leader").await;
    let t0 = Instant::now();
    Api::<Pod>::namespaced(admin.clone(), NS)
        .delete(&holder, &DeleteParams::default())
        .await?;
    cluster
        .wait_for("the old leader's replica stopped", TIMEOUT, || async {
            Ok(if kubelet.stopped.lock().await.contains(&holder) {
                Ok(())
            } else {
                Err("running".to_string())
            })
        })
        .await?;
    let stopped_after = t0.elapsed();
    let after = lease_holder(&admin).await?;
    assert_ne!(
        after.as_deref(),
        Some(holder.as_str()),
        "the stopped leader must have released the Lease"
    );
    dss.delete(&ds_name, &DeleteParams::default()).await?;
    // Polled every 50 ms (finer than `wait_for`) only to print the figures.
    let (mut took_over, mut repaired) = (None, None);
    let deadline = Instant::now() + TIMEOUT;
    while repaired.is_none() || took_over.is_none() {
        anyhow::ensure!(Instant::now() < deadline, "no failover within {TIMEOUT:?}");
        if took_over.is_none() && lease_holder(&admin).await?.is_some_and(|h| h != holder) {
            took_over = Some(t0.elapsed());
        }
        if repaired.is_none()
            && dss
                .get_opt(&ds_name)
                .await?
                .is_some_and(|d| d.metadata.uid != old_uid)
        {
            repaired = Some(t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let new_holder = lease_holder(&admin).await?;
    assert!(
        new_holder.as_ref().is_some_and(|h| *h != holder),
        "{new_holder:?}"
    );
    let secs = |d: Option<Duration>| d.unwrap_or_default().as_secs_f64();
    print_reconcile_durations(
        kubelet,
        new_holder.as_deref().unwrap_or_default(),
        "new leader",
    )
    .await;
    println!(
        "failover: leader pod {holder} deleted at 0 s; its replica stopped and released the \
         Lease at {:.2} s; {} held the Lease at {:.2} s; {ds_name} (deleted at {:.2} s) \
         recreated at {:.2} s",
        stopped_after.as_secs_f64(),
        new_holder.unwrap_or_default(),
        secs(took_over),
        stopped_after.as_secs_f64(),
        secs(repaired),
    );
    Ok(())
}

/// `helm upgrade --wait`: a changed pod template rolls the Deployment; every new pod must
/// become Ready through its replica before an old one goes.
/// Before it, the CRD is drifted as an older chart would have left it; after it, what the
/// pre-upgrade hook runs, with the hook's rights, restores this build's CRD.
async fn upgrade_rolls_and_applies_the_crd(
    cluster: &TestCluster,
    home: &std::path::Path,
    admin: &Client,
    hooks: &[Value],
) -> anyhow::Result<()> {
    let admin = admin.clone();
    let annotation = READINESS_ANNOTATION;
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    // Drift the CRD as an older chart would have left it: no kiln printer columns.
    let mut drifted = crds.get(CRD_NAME).await?;
    drifted.metadata.managed_fields = None;
    for v in &mut drifted.spec.versions {
        v.additional_printer_columns = None;
    }
    crds.replace(CRD_NAME, &PostParams::default(), &drifted)
        .await?;

    helm(
        cluster,
        home,
        &[
            "upgrade",
            RELEASE,
            "deploy/helm/kiln",
            "--namespace",
            NS,
            "--set-string",
            annotation,
            "--set",
            "operator.cleanupCRD=true",
            "--set",
            "operator.logging.level=debug",
            "--wait",
            "--timeout",
            "120s",
        ],
    )
    .await?;
    let status: Value = serde_json::from_str(
        &helm(cluster, home, &["status", RELEASE, "-n", NS, "-o", "json"]).await?,
    )?;
    assert_eq!(status["info"]["status"], "deployed", "{status}");
    assert_eq!(status["version"], 2, "{status}");
    let pods = Api::<Pod>::namespaced(admin.clone(), NS)
        .list(&ListParams::default().labels(OPERATOR_PODS))
        .await?
        .items;
    let current: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    assert_eq!(current.len(), 2);
    for p in &current {
        assert!(ready_of(p), "{:?} not Ready", p.metadata.name);
        let env = &p.spec.as_ref().context("spec")?.containers[0].env;
        assert!(
            env.iter()
                .flatten()
                .any(|e| e.name == "KILN_LOG" && e.value.as_deref() == Some("debug")),
            "{:?} is not from the upgraded template",
            p.metadata.name
        );
    }
    // What the pre-upgrade hook runs, with the hook's rights: the CRD as this build has it.
    let upgrader = hook_client(cluster, &admin, hooks, "kiln-upgrade-crd").await?;
    lifecycle::apply_crds(&upgrader).await?;
    let columns = |crd: &CustomResourceDefinition| -> Vec<(String, String)> {
        crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| (c.name.clone(), c.json_path.clone()))
            .collect()
    };
    let applied = crds.get(CRD_NAME).await?;
    let want = columns(&kiln_operator::crd::crd());
    assert!(want.iter().any(|(n, _)| n == "Reason"), "{want:?}");
    assert_eq!(columns(&applied), want);
    Ok(())
}

/// `helm uninstall`: the chart's objects go, the operands follow their owner.
/// Then what the post-delete hook runs, with the hook's rights, relabels the nodes and deletes
/// the CRDs.
async fn uninstall_cleans_up(
    cluster: &TestCluster,
    home: &std::path::Path,
    admin: &Client,
    kubelet: &Kubelet,
    hooks: &[Value],
) -> anyhow::Result<()> {
    let admin = admin.clone();
    let policies: Api<ClusterPolicy> = Api::all(admin.clone());
    let dss: Api<DaemonSet> = Api::namespaced(admin.clone(), NS);
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let labelled_before = Api::<Node>::all(admin.clone())
        .list(&ListParams::default().labels("nvidia.com/gpu.present"))
        .await?
        .items
        .len();
    assert_eq!(labelled_before, 5);
    helm(
        cluster,
        home,
        &["uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "90s"],
    )
    .await?;
    assert!(policies.get_opt(POLICY).await?.is_none());
    cluster
        .wait_for("operands garbage-collected", TIMEOUT, || async {
            let left: Vec<String> = dss
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|d| d.metadata.name)
                .collect();
            Ok(if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            })
        })
        .await?;
    cluster
        .wait_for("the operator's replicas stopped", TIMEOUT, || async {
            let n = kubelet.ports().await.len();
            Ok(if n == 0 {
                Ok(())
            } else {
                Err(format!("{n} running"))
            })
        })
        .await?;
    // What the post-delete hook runs, with the hook's rights.
    let cleaner = hook_client(cluster, &admin, hooks, "kiln-cleanup").await?;
    let report = lifecycle::cleanup(
        &cleaner,
        &CleanupOptions {
            delete_crd: true,
            ..CleanupOptions::new(NS)
        },
    )
    .await?;
    assert_eq!(report.nodes_relabelled, 5);
    assert_eq!(report.crds_deleted, [CRD_NAME, NVIDIA_DRIVER_CRD_NAME]);
    // The hook's node patch policy: its token may only remove the operator's labels.
    check_cleanup_policy(cluster, &cleaner).await?;
    for node in Api::<Node>::all(admin.clone())
        .list(&ListParams::default())
        .await?
        .items
    {
        let left: Vec<String> = node
            .metadata
            .labels
            .unwrap_or_default()
            .into_keys()
            .filter(|k| k == "nvidia.com/gpu.present" || k.starts_with("nvidia.com/gpu.deploy."))
            .collect();
        assert!(left.is_empty(), "{:?}: {left:?}", node.metadata.name);
    }
    assert!(crds.get_opt(CRD_NAME).await?.is_none());
    assert!(crds.get_opt(NVIDIA_DRIVER_CRD_NAME).await?.is_none());
    Ok(())
}

/// The cleanup hook's node patch policy (`kiln-cleanup`, rendered by hooks.yaml) against the
/// hook's own token: adding back a label it removes, a dangling ownerReference, a finalizer and
/// a cordon are refused (dry runs, 403 from that policy, waiting until it is in effect);
/// removing a label it owns (the hook's work, done above) is allowed.
async fn check_cleanup_policy(cluster: &TestCluster, cleaner: &Client) -> anyhow::Result<()> {
    let nodes = Api::<Node>::all(cleaner.clone());
    let node = nodes
        .list(
            &ListParams::default().labels(&format!("{}=true", kiln_testcluster::NFD_NVIDIA_LABEL)),
        )
        .await?
        .items
        .into_iter()
        .find_map(|n| n.metadata.name)
        .context("no GPU node")?;
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let needle = "ValidatingAdmissionPolicy 'kiln-cleanup'";
    for (what, body) in [
        (
            "add a label",
            json!({"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}}),
        ),
        (
            "a dangling ownerReference",
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                "name": "kiln-test-gone", "uid": "00000000-0000-0000-0000-000000000001"}]}}),
        ),
        (
            "a finalizer",
            json!({"metadata": {"finalizers": ["example.com/kiln-test"]}}),
        ),
        ("cordon", json!({"spec": {"unschedulable": true}})),
    ] {
        cluster
            .wait_for(format!("cleanup hook: {what} refused"), TIMEOUT, || async {
                Ok(
                    match nodes.patch(&node, &dry, &Patch::Merge(body.clone())).await {
                        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(needle) => {
                            Ok(())
                        }
                        Err(e) => Err(format!("{e}")),
                        Ok(_) => Err("allowed".into()),
                    },
                )
            })
            .await?;
    }
    Ok(())
}
