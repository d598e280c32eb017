//! A fresh cluster works with one install: testcluster nodes stripped of every Node Feature
//! Discovery label (a cluster without NFD), `helm install` of kiln's chart with its defaults,
//! and the operator (run in this process with the chart's ServiceAccount token) first reports
//! `NFDLabelsMissing` in the policy's status and a Warning Event. kwok runs no containers, so
//! the chart's `kiln-node-discovery` pods are stood in for here: for each of its pods bound to a
//! node, `kiln_discover::run` with a token bound to that pod (so the API server knows its node)
//! against a fake host of that node (an NVIDIA 3D controller on the GPU nodes, an Intel VGA on
//! the others). Then the GPU nodes, and only they, become GPU nodes and get the operands
//! scheduled. On the way, the chart's admission policy refuses a discovery token labelling
//! another node, or writing a label outside `feature.node.kubernetes.io/` and GFD's keys (the
//! operator's `nvidia.com/gpu.deploy.*` included).
//!
//! Then GFD's labels without NFD: the operator's GFD DaemonSet has `USE_NODE_FEATURE_API=false`
//! (from the chart under `nfd.enabled`), so GFD writes the host's features.d file; the file is
//! stood in for on one GPU node's fake host (the `key=value` lines `kiln_gfd::write_features_file`
//! writes, with an operator key smuggled in), and the agent's next round puts GFD's
//! `nvidia.com/gpu.product` and the rest on that node, leaves the operator key alone, and takes
//! them off again once the file is gone.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kiln_core::spec::ClusterPolicy;
use kiln_discover::HostPaths;
use kiln_testcluster::{Options, TestCluster};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

const NS: &str = "gpu-operator";
const TIMEOUT: Duration = Duration::from_secs(120);
const PREFIX: &str = "feature.node.kubernetes.io/";

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `testcluster/bin/helm` with its own home, in the repository root; stdout on success.
async fn helm(cluster: &TestCluster, home: &Path, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = std::process::Command::new(repo().join("testcluster/bin/helm"));
    cmd.args(args)
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .current_dir(repo());
    for (var, sub) in [
        ("HELM_CACHE_HOME", "cache"),
        ("HELM_CONFIG_HOME", "config"),
        ("HELM_DATA_HOME", "data"),
    ] {
        cmd.env(var, home.join(sub));
    }
    let out = tokio::task::spawn_blocking(move || cmd.output()).await??;
    anyhow::ensure!(
        out.status.success(),
        "helm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// A fake host in `dir`: one PCI device `(vendor, class)`, Ubuntu 22.04, kernel 6.8.0-51.
fn fake_host(dir: &Path, vendor: &str, class: &str) -> anyhow::Result<HostPaths> {
    let dev = dir.join("sys/bus/pci/devices/0000:8d:00.0");
    std::fs::create_dir_all(&dev)?;
    std::fs::write(dev.join("vendor"), format!("{vendor}\n"))?;
    std::fs::write(dev.join("class"), format!("{class}\n"))?;
    std::fs::create_dir_all(dir.join("proc/sys/kernel"))?;
    std::fs::write(dir.join("proc/sys/kernel/osrelease"), "6.8.0-51-generic\n")?;
    std::fs::create_dir_all(dir.join("host/etc"))?;
    std::fs::write(
        dir.join("host/etc/os-release"),
        "ID=ubuntu\nVERSION_ID=\"22.04\"\n",
    )?;
    Ok(HostPaths {
        sys: dir.join("sys"),
        proc: dir.join("proc"),
        host_root: dir.join("host"),
        ..HostPaths::default()
    })
}

/// A client with the token of ServiceAccount `kiln-node-discovery` bound to `pod` (what the
/// kubelet mounts into it): the API server adds the pod's node to the request's user.
async fn pod_client(cluster: &TestCluster, admin: &Client, pod: &Pod) -> anyhow::Result<Client> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), NS)
        .create_token_request("kiln-node-discovery", &PostParams::default(), &request)
        .await?
        .status
        .context("no token")?
        .token;
    let mut config = serde_json::to_value(Kubeconfig::read_from(cluster.kubeconfig_path())?)?;
    config["users"] = json!([{"name": "discovery", "user": {"token": token}}]);
    for c in config["contexts"].as_array_mut().context("contexts")? {
        c["context"]["user"] = json!("discovery");
    }
    let kubeconfig: Kubeconfig = serde_json::from_value(config)?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

fn start_operator(client: Client) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let host = Arc::new(kiln_plugin_host::PluginHost::new(
        kiln_plugin_host::HostConfig::default(),
        kiln_bundled_plugins::BUNDLED,
    )?);
    let config = kiln_operator::Config {
        namespace: NS.into(),
        metrics_addr: "127.0.0.1:0".into(),
        ..kiln_operator::Config::default()
    };
    let renderer = kiln_render::Renderer::new(host);
    Ok(tokio::spawn(async move {
        if let Err(e) = kiln_operator::run(client, renderer, config).await {
            eprintln!("operator stopped: {e}");
        }
    }))
}

/// The policy's `(state, reason of the Ready condition, its message)`.
async fn policy_reason(api: &Api<ClusterPolicy>) -> anyhow::Result<(String, String, String)> {
    let status = api.get("cluster-policy").await?.status.unwrap_or_default();
    let state = serde_json::to_value(status.state)?
        .as_str()
        .unwrap_or_default()
        .to_string();
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
    Ok((
        state,
        ready.map(|c| c.reason.clone()).unwrap_or_default(),
        ready.map(|c| c.message.clone()).unwrap_or_default(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_cluster_without_nfd_gets_its_gpu_nodes_served_with_one_install()
-> anyhow::Result<()> {
    if !repo().join("testcluster/bin/helm").is_file() {
        eprintln!("testcluster/bin/helm not built; skipping");
        return Ok(());
    }
    let cluster = TestCluster::start(Options {
        nodes: 3,
        gpu_nodes: 2,
        ..Options::default()
    })?;
    cluster.with_logs(scenario(&cluster).await)
}

async fn scenario(cluster: &TestCluster) -> anyhow::Result<()> {
    let admin = cluster.client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    // A cluster without NFD: no node carries any feature.node.kubernetes.io/ label.
    let mut gpu_nodes = Vec::new();
    let mut all_nodes = Vec::new();
    for n in nodes.list(&ListParams::default()).await?.items {
        let name = n.metadata.name.clone().context("node name")?;
        let strip: serde_json::Map<String, serde_json::Value> = n
            .metadata
            .labels
            .unwrap_or_default()
            .into_keys()
            .filter(|k| k.starts_with(PREFIX))
            .map(|k| (k, serde_json::Value::Null))
            .collect();
        nodes
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": strip}})),
            )
            .await?;
        let has_gpu = n
            .status
            .and_then(|s| s.capacity)
            .is_some_and(|c| c.contains_key("nvidia.com/gpu"));
        if has_gpu {
            gpu_nodes.push(name.clone());
        }
        all_nodes.push(name);
    }
    anyhow::ensure!(
        gpu_nodes.len() == 2 && all_nodes.len() == 3,
        "{all_nodes:?}"
    );

    let home = tempfile::tempdir()?;
    helm(
        cluster,
        home.path(),
        &[
            "install",
            "kiln",
            "deploy/helm/kiln",
            "--namespace",
            NS,
            "--create-namespace",
        ],
    )
    .await?;
    let operator = cluster.service_account_client(NS, "kiln-operator").await?;
    let task = start_operator(operator)?;
    let policies: Api<ClusterPolicy> = Api::all(admin.clone());

    // Before discovery: the status and a Warning Event say why nothing runs.
    let message = cluster
        .wait_for("policy NFDLabelsMissing", TIMEOUT, || async {
            let (state, reason, message) = policy_reason(&policies).await?;
            Ok(if reason == "NFDLabelsMissing" {
                Ok(message)
            } else {
                Err(format!("{state} {reason}: {message}"))
            })
        })
        .await?;
    anyhow::ensure!(message.contains("nfd.enabled=true"), "{message}");
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    cluster
        .wait_for("a Warning Event NFDLabelsMissing", TIMEOUT, || async {
            let found = events
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("NFDLabelsMissing")
                        && e.type_.as_deref() == Some("Warning")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some("cluster-policy")
                });
            Ok(if found {
                Ok(())
            } else {
                Err("no event yet".into())
            })
        })
        .await?;

    // The chart's discovery DaemonSet has a pod on every node; each one labels its own node.
    let pods_api: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let pods = cluster
        .wait_for("a discovery pod on every node", TIMEOUT, || async {
            let pods: Vec<Pod> = pods_api
                .list(&ListParams::default().labels("app.kubernetes.io/name=kiln-node-discovery"))
                .await?
                .items
                .into_iter()
                .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
                .collect();
            Ok(if pods.len() == all_nodes.len() {
                Ok(pods)
            } else {
                Err(format!("{} bound pods", pods.len()))
            })
        })
        .await?;
    let hosts = tempfile::tempdir()?;
    let mut clients = Vec::new();
    for pod in &pods {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .context("nodeName")?;
        let (vendor, class) = if gpu_nodes.contains(&node) {
            ("0x10de", "0x030200")
        } else {
            ("0x8086", "0x030000")
        };
        let paths = fake_host(&hosts.path().join(&node), vendor, class)?;
        let client = pod_client(cluster, &admin, pod).await?;
        kiln_discover::run(&client, &node, &paths, None, std::future::pending())
            .await
            .with_context(|| format!("discovery on {node}"))?;
        clients.push((node, client, paths));
    }

    // Least privilege: a node's agent labels no other node and no label outside NFD's prefix
    // (the admission policy may take a moment to be enforced after the install).
    let (own, client, _) = &clients[0];
    let other = all_nodes
        .iter()
        .find(|n| *n != own)
        .context("another node")?;
    let theirs: Api<Node> = Api::all(client.clone());
    for (target, key, needle) in [
        (
            other.as_str(),
            format!("{PREFIX}pci-10de.present"),
            "only the node its pod runs on",
        ),
        (
            // A key no one else writes: the operator may already have set gpu.present=true,
            // and an unchanged label is no change the policy would refuse.
            own.as_str(),
            "nvidia.com/kiln-discovery-probe".to_string(),
            "only feature.node.kubernetes.io/",
        ),
        (
            // An operator label next to GFD's (the value below is one no one else sets).
            own.as_str(),
            "nvidia.com/gpu.deploy.driver".to_string(),
            "only feature.node.kubernetes.io/",
        ),
    ] {
        cluster
            .wait_for(format!("{key} on {target} refused"), TIMEOUT, || {
                let theirs = theirs.clone();
                let key = key.clone();
                async move {
                    let body = json!({"metadata": {"labels": {key: "kiln-probe"}}});
                    let res = theirs
                        .patch(
                            target,
                            &PatchParams {
                                dry_run: true,
                                ..PatchParams::default()
                            },
                            &Patch::Merge(body),
                        )
                        .await;
                    Ok(match res {
                        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(needle) => {
                            Ok(())
                        }
                        other => Err(format!("{other:?}")),
                    })
                }
            })
            .await?;
    }

    // The operator finds the GPU nodes, and the operands are scheduled on them only.
    cluster
        .wait_for("GPU nodes labelled gpu.present", TIMEOUT, || async {
            let mut present = Vec::new();
            for n in nodes.list(&ListParams::default()).await?.items {
                let labels = n.metadata.labels.unwrap_or_default();
                if labels.get("nvidia.com/gpu.present").map(String::as_str) == Some("true") {
                    present.push(n.metadata.name.unwrap_or_default());
                }
            }
            present.sort();
            let mut want = gpu_nodes.clone();
            want.sort();
            Ok(if present == want {
                Ok(())
            } else {
                Err(format!("{present:?}"))
            })
        })
        .await?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(admin.clone(), NS);
    cluster
        .wait_for(
            "device plugin scheduled on the GPU nodes",
            TIMEOUT,
            || async {
                let scheduled = daemonsets
                    .get_opt("nvidia-device-plugin-daemonset")
                    .await?
                    .and_then(|d| d.status)
                    .map(|s| s.desired_number_scheduled);
                Ok(if scheduled == Some(2) {
                    Ok(())
                } else {
                    Err(format!("{scheduled:?}"))
                })
            },
        )
        .await?;
    let (state, reason, message) = policy_reason(&policies).await?;
    anyhow::ensure!(
        reason != "NFDLabelsMissing" && reason != "NoGPUNodes",
        "{state} {reason}: {message}"
    );
    gfd_labels_reach_the_node(cluster, &daemonsets, &nodes, &clients, &gpu_nodes).await?;
    task.abort();
    Ok(())
}

/// GFD's labels without NFD (see the module docs).
async fn gfd_labels_reach_the_node(
    cluster: &TestCluster,
    daemonsets: &Api<DaemonSet>,
    nodes: &Api<Node>,
    clients: &[(String, Client, HostPaths)],
    gpu_nodes: &[String],
) -> anyhow::Result<()> {
    let env = cluster
        .wait_for("the GFD DaemonSet", TIMEOUT, || async {
            let Some(ds) = daemonsets.get_opt("gpu-feature-discovery").await? else {
                return Ok(Err("not yet".to_string()));
            };
            let spec = ds.spec.and_then(|s| s.template.spec).context("pod spec")?;
            let main = spec
                .containers
                .into_iter()
                .find(|c| c.name == "gpu-feature-discovery")
                .context("GFD container")?;
            Ok(Ok(main.env.unwrap_or_default()))
        })
        .await?;
    anyhow::ensure!(
        env.iter()
            .any(|e| e.name == "USE_NODE_FEATURE_API" && e.value.as_deref() == Some("false")),
        "GFD publishes through NFD's NodeFeature API, which no NFD serves: {env:?}"
    );

    let (node, client, paths) = clients
        .iter()
        .find(|(n, _, _)| gpu_nodes.contains(n))
        .context("a GPU node's agent")?;
    let dir = paths.host_root.join(kiln_discover::local::FEATURES_DIR);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("gfd"),
        "nvidia.com/cuda.driver.major=580\nnvidia.com/gfd.timestamp=1733400000\n\
         nvidia.com/gpu.count=2\nnvidia.com/gpu.deploy.driver=false\n\
         nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3\nnvidia.com/mig.capable=true\n",
    )?;
    kiln_discover::run(client, node, paths, None, std::future::pending()).await?;
    let labels = nodes.get(node).await?.metadata.labels.unwrap_or_default();
    for (key, want) in [
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("nvidia.com/gpu.count", "2"),
        ("nvidia.com/cuda.driver.major", "580"),
        ("nvidia.com/mig.capable", "true"),
        ("nvidia.com/gfd.timestamp", "1733400000"),
        (&format!("{PREFIX}pci-10de.present"), "true"),
    ] {
        anyhow::ensure!(
            labels.get(key).map(String::as_str) == Some(want),
            "{key} on {node}: {labels:?}"
        );
    }
    anyhow::ensure!(
        labels
            .get("nvidia.com/gpu.deploy.driver")
            .map(String::as_str)
            != Some("false"),
        "an operator label came from a features.d file: {labels:?}"
    );

    // GFD's file gone (its DaemonSet removed and the host cleaned): the labels go too.
    std::fs::remove_file(dir.join("gfd"))?;
    kiln_discover::run(client, node, paths, None, std::future::pending()).await?;
    let labels = nodes.get(node).await?.metadata.labels.unwrap_or_default();
    anyhow::ensure!(
        !labels.contains_key("nvidia.com/gpu.product")
            && labels.contains_key(&format!("{PREFIX}pci-10de.present")),
        "{labels:?}"
    );
    Ok(())
}
