//! End-to-end: the operator, run in-process, against the real control plane of
//! `kiln-testcluster` (8 nodes, 5 GPU nodes). One scenario, in order, on one cluster:
//! sample policy → labels on the GPU nodes only, validator init-container order, `ready`;
//! disabling dcgmExporter deletes its objects and returns to `ready`; a second policy is
//! `ignored`, naming the active one, and takes over once the active one is deleted; a referenced ConfigMap is read from the cluster and its keys
//! mounted; what another field manager adds to an operand DaemonSet is removed within one
//! reconcile, with an Event, and a clean full reconcile leaves the DaemonSets untouched.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kiln_core::spec::ClusterPolicy;
use kiln_testcluster::{TestCluster, exclusive, shared};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NS: &str = "gpu-operator";
const TIMEOUT: Duration = Duration::from_secs(150);

fn sample() -> anyhow::Result<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/samples/clusterpolicy.yaml"
    );
    Ok(serde_yaml_ng::from_str(&std::fs::read_to_string(path)?)?)
}

async fn install_crd(cluster: &TestCluster, client: &Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = kiln_operator::crd::crd();
    crds.patch(
        "clusterpolicies.nvidia.com",
        &PatchParams::apply("kiln-test").force(),
        &Patch::Apply(&crd),
    )
    .await?;
    cluster
        .wait_for("CRD established", TIMEOUT, || {
            let crds = crds.clone();
            async move {
                let c = crds.get("clusterpolicies.nvidia.com").await?;
                let ok = c
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok(if ok {
                    Ok(())
                } else {
                    Err("not established".into())
                })
            }
        })
        .await
}

/// A drop-in plugin named `boom` that traps on every call (plugin-host's hostile fixture
/// `trap.wat` in its component shell), written into `dir`.
fn write_trapping_plugin(dir: &std::path::Path) -> anyhow::Result<()> {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugin-host/tests/fixtures");
    let core = std::fs::read_to_string(format!("{fixtures}/trap.wat"))?;
    let shell = std::fs::read_to_string(format!("{fixtures}/shell.wat"))?;
    let text = shell
        .replace("@OUTER@", "")
        .replace("@CORE@", &core)
        .replace("@NAMELEN@", "4")
        .replace("@NAME@", "boom");
    std::fs::write(dir.join("boom.wasm"), wat::parse_str(&text)?)?;
    Ok(())
}

/// Starts the operator in this process; returns its task and its plugin host (to look at
/// which plugins it keeps loaded).
fn start_operator(
    client: Client,
    plugins: &std::path::Path,
) -> anyhow::Result<(
    tokio::task::JoinHandle<()>,
    Arc<kiln_plugin_host::PluginHost>,
)> {
    let cfg = kiln_plugin_host::HostConfig {
        drop_in_dir: Some(plugins.to_path_buf()),
        keep_resident_bytes: kiln_operator::PLUGIN_KEEP_RESIDENT_BYTES,
        ..kiln_plugin_host::HostConfig::default()
    };
    let host = Arc::new(kiln_plugin_host::PluginHost::new(
        cfg,
        kiln_bundled_plugins::BUNDLED,
    )?);
    let renderer = kiln_render::Renderer::new(host.clone());
    let config = kiln_operator::Config {
        namespace: NS.into(),
        metrics_addr: "127.0.0.1:0".into(),
        ..kiln_operator::Config::default()
    };
    let task = tokio::spawn(async move {
        if let Err(e) = kiln_operator::run(client, renderer, config).await {
            eprintln!("operator stopped: {e}");
        }
    });
    Ok((task, host))
}

async fn policy_state(api: &Api<ClusterPolicy>, name: &str) -> anyhow::Result<(String, String)> {
    let p = api.get(name).await?;
    let s = p.status.unwrap_or_default();
    let state = serde_json::to_value(s.state)?
        .as_str()
        .unwrap_or_default()
        .to_string();
    let msg = s
        .conditions
        .iter()
        .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
        .collect::<Vec<_>>()
        .join(" | ");
    Ok((state, msg))
}

async fn wait_state(
    cluster: &TestCluster,
    api: &Api<ClusterPolicy>,
    name: &str,
    want: &str,
) -> anyhow::Result<String> {
    cluster
        .wait_for(format!("ClusterPolicy {name} {want}"), TIMEOUT, || async {
            let (state, msg) = policy_state(api, name).await?;
            Ok(if state == want {
                Ok(msg)
            } else {
                Err(format!("{state}: {msg}"))
            })
        })
        .await
}

/// Sorted names of the DaemonSets in the operator namespace.
async fn daemonset_names(dss: &Api<DaemonSet>) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = dss
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|d| d.metadata.name)
        .collect();
    names.sort();
    Ok(names)
}

/// Names of the operand pods (namespace gpu-operator) bound to `node`.
async fn operand_pods(client: &Client, node: &str) -> anyhow::Result<Vec<String>> {
    use k8s_openapi::api::core::v1::Pod;
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    Ok(Api::<Pod>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect())
}

/// Resource versions of the policy and every operand ConfigMap/ServiceAccount, and the
/// generations of the DaemonSets (their resourceVersion moves with pod status).
async fn snapshot(client: &Client, policy: &str) -> anyhow::Result<Vec<String>> {
    use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
    let lp = ListParams::default();
    let p = Api::<ClusterPolicy>::all(client.clone())
        .get(policy)
        .await?;
    let mut out = vec![format!(
        "policy {:?} {}",
        p.metadata.resource_version,
        serde_json::to_string(&p.status)?
    )];
    for cm in Api::<ConfigMap>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
        .items
    {
        out.push(format!(
            "cm {} {:?}",
            cm.metadata.name.unwrap_or_default(),
            cm.metadata.resource_version
        ));
    }
    for sa in Api::<ServiceAccount>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
        .items
    {
        out.push(format!(
            "sa {} {:?}",
            sa.metadata.name.unwrap_or_default(),
            sa.metadata.resource_version
        ));
    }
    for ds in Api::<DaemonSet>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
        .items
    {
        out.push(format!(
            "ds {} {:?}",
            ds.metadata.name.unwrap_or_default(),
            ds.metadata.generation
        ));
    }
    for n in Api::<Node>::all(client.clone()).list(&lp).await?.items {
        let mut l = n.metadata.labels.unwrap_or_default();
        l.remove("kiln.dev/poke");
        out.push(format!(
            "node {} {:?}",
            n.metadata.name.unwrap_or_default(),
            l
        ));
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_end_to_end() -> anyhow::Result<()> {
    let cluster = shared()?;
    let _guard = exclusive().await;
    cluster.with_logs(scenario(cluster).await)
}

async fn scenario(cluster: &TestCluster) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    install_crd(cluster, &client).await?;
    let nss: Api<Namespace> = Api::all(client.clone());
    if nss.get_opt(NS).await?.is_none() {
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
        )
        .await?;
    }
    let plugins = tempfile::tempdir()?;
    write_trapping_plugin(plugins.path())?;
    let (operator, host) = start_operator(client.clone(), plugins.path())?;
    let policies: Api<ClusterPolicy> = Api::all(client.clone());
    let mut doc = sample()?;
    let name = doc["metadata"]["name"]
        .as_str()
        .unwrap_or("cluster-policy")
        .to_string();
    doc["metadata"] = json!({"name": name});
    // Created as the JSON document (a typed ClusterPolicy would serialize every defaulted
    // field, which the CRD's patterns refuse for empty images).
    let raw_policies = Api::<kube::api::DynamicObject>::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<ClusterPolicy>(&()),
    );
    raw_policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(doc.clone())?,
        )
        .await?;

    // Labels: every GPU node carries gpu.present and all container deploy labels; CPU nodes none.
    let nodes: Api<Node> = Api::all(client.clone());
    cluster
        .wait_for("GPU nodes labelled", TIMEOUT, || async {
            let list = nodes.list(&ListParams::default()).await?;
            let mut bad = Vec::new();
            for n in &list.items {
                let l = n.metadata.labels.clone().unwrap_or_default();
                let name = n.metadata.name.clone().unwrap_or_default();
                let gpu = name.starts_with("gpu-node-");
                let deploy = kiln_core::labels::CONTAINER_COMPONENTS
                    .iter()
                    .filter(|c| {
                        l.get(&format!("nvidia.com/gpu.deploy.{c}"))
                            .map(String::as_str)
                            == Some("true")
                    })
                    .count();
                let present = l.get("nvidia.com/gpu.present").map(String::as_str) == Some("true");
                if gpu != present || (gpu && deploy != 9) || (!gpu && deploy != 0) {
                    bad.push(format!("{name}: present={present} deploy={deploy}"));
                }
            }
            Ok(if bad.is_empty() && list.items.len() == 8 {
                Ok(())
            } else {
                Err(bad.join(", "))
            })
        })
        .await?;

    let msg = wait_state(cluster, &policies, &name, "ready").await?;
    assert!(msg.contains("Ready=True Reconciled"), "{msg}");

    // Between reconciles the operator keeps no plugin loaded (they reload from the disk cache).
    assert!(
        host.has_disk_cache(),
        "the test host should have a disk cache"
    );
    cluster
        .wait_for("plugins released after the reconcile", TIMEOUT, || async {
            let loaded = host.loaded_plugins();
            Ok(if loaded.is_empty() {
                Ok(())
            } else {
                Err(format!("still loaded: {loaded:?}"))
            })
        })
        .await?;

    // Validator init containers run in the readiness-chain order.
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    let inits = |ds: DaemonSet| -> Vec<String> {
        ds.spec
            .and_then(|s| s.template.spec)
            .and_then(|p| p.init_containers)
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.name)
            .collect()
    };
    assert_eq!(
        inits(dss.get("nvidia-operator-validator").await?),
        [
            "driver-validation",
            "toolkit-validation",
            "cuda-validation",
            "plugin-validation"
        ]
    );
    // config-manager-init follows only when devicePlugin.config is set (not in the sample).
    let dp = inits(dss.get("nvidia-device-plugin-daemonset").await?);
    assert_eq!(
        dp.first().map(String::as_str),
        Some("toolkit-validation"),
        "{dp:?}"
    );
    assert_eq!(
        inits(dss.get("nvidia-dcgm-exporter").await?),
        ["toolkit-validation"]
    );

    // Steady state: a reconcile woken by a node label change writes nothing. The driver upgrade
    // loop labels every GPU node `upgrade-done` after `ready` and then writes its counts, so
    // wait for those first (and for the counts to name no state no node is in).
    cluster
        .wait_for("the driver upgrade counts settled", TIMEOUT, || async {
            let p = policies.get(&name).await?;
            let du = p.status.and_then(|s| s.driver_upgrade);
            Ok(match du {
                Some(d)
                    if d.total_nodes > 0
                        && d.upgrades_done == d.total_nodes
                        && d.nodes.len() == 1
                        && d.nodes.get("upgrade-done") == Some(&d.total_nodes) =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            })
        })
        .await?;
    let before = snapshot(&client, &name).await?;
    let cpu = "cpu-node-1";
    nodes
        .patch(
            cpu,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"kiln.dev/poke": "1"}}})),
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = snapshot(&client, &name).await?;
    let changed: Vec<String> = after
        .iter()
        .zip(&before)
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("{b} -> {a}"))
        .collect();
    assert!(
        changed.is_empty(),
        "a steady-state reconcile wrote: {changed:?}"
    );

    additive_drift(cluster, &client, &name).await?;

    // Per-node opt-outs: operands=false empties gpu-node-5; dcgm-exporter=false on gpu-node-4
    // removes only that operand there.
    cluster.label_node(
        "gpu-node-5",
        &[("nvidia.com/gpu.deploy.operands", Some("false"))],
    )?;
    cluster.label_node(
        "gpu-node-4",
        &[("nvidia.com/gpu.deploy.dcgm-exporter", Some("false"))],
    )?;
    cluster
        .wait_for("opt-outs honoured", TIMEOUT, || async {
            let on5 = operand_pods(&client, "gpu-node-5").await?;
            let on4 = operand_pods(&client, "gpu-node-4").await?;
            let l5 = nodes
                .get("gpu-node-5")
                .await?
                .metadata
                .labels
                .unwrap_or_default();
            let deploy5 = l5
                .keys()
                .filter(|k| {
                    k.starts_with("nvidia.com/gpu.deploy.")
                        && *k != "nvidia.com/gpu.deploy.operands"
                })
                .count();
            let ok = on5.is_empty()
                && deploy5 == 0
                && !on4.iter().any(|p| p.starts_with("nvidia-dcgm-exporter-"))
                && on4
                    .iter()
                    .any(|p| p.starts_with("nvidia-device-plugin-daemonset-"));
            Ok(if ok {
                Ok(())
            } else {
                Err(format!(
                    "gpu-node-5: {on5:?} ({deploy5} deploy labels); gpu-node-4: {on4:?}"
                ))
            })
        })
        .await?;

    // A sixth GPU node is labelled and runs the operands with no policy change.
    cluster.add_node("gpu-node-6", 1)?;
    cluster
        .wait_for("gpu-node-6 runs the operands", TIMEOUT, || async {
            let pods = operand_pods(&client, "gpu-node-6").await?;
            let labelled = nodes
                .get("gpu-node-6")
                .await?
                .metadata
                .labels
                .unwrap_or_default()
                .get("nvidia.com/gpu.deploy.device-plugin")
                .map(String::as_str)
                == Some("true");
            let ok = labelled
                && pods
                    .iter()
                    .any(|p| p.starts_with("nvidia-device-plugin-daemonset-"));
            Ok(if ok {
                Ok(())
            } else {
                Err(format!("labelled={labelled} pods={pods:?}"))
            })
        })
        .await?;
    wait_state(cluster, &policies, &name, "ready").await?;

    // Bad input: an unknown enum value is refused by the CRD schema; a cross-field error gets
    // Error naming the field and deletes nothing.
    let mut bad = doc.clone();
    bad["metadata"] = json!({"name": "bad-enum"});
    bad["spec"]["mig"] = json!({"strategy": "double"});
    let refused = Api::<kube::api::DynamicObject>::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<ClusterPolicy>(&()),
    )
    .create(&PostParams::default(), &serde_json::from_value(bad)?)
    .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422),
        "{refused:?}"
    );
    let nri = json!({"spec": {"cdi": {"enabled": false, "nriPluginEnabled": true}}});
    policies
        .patch(&name, &PatchParams::default(), &Patch::Merge(nri))
        .await?;
    cluster
        .wait_for(
            "Error naming spec.cdi.nriPluginEnabled",
            TIMEOUT,
            || async {
                let (state, msg) = policy_state(&policies, &name).await?;
                let ok = state == "notReady"
                    && msg.contains("ReconcileFailed: spec.cdi.nriPluginEnabled");
                Ok(if ok {
                    Ok(())
                } else {
                    Err(format!("{state}: {msg}"))
                })
            },
        )
        .await?;
    assert!(
        dss.get_opt("nvidia-device-plugin-daemonset")
            .await?
            .is_some()
    );
    let fixed = json!({"spec": {"cdi": {"enabled": true, "nriPluginEnabled": false}}});
    policies
        .patch(&name, &PatchParams::default(), &Patch::Merge(fixed))
        .await?;
    wait_state(cluster, &policies, &name, "ready").await?;

    // A plugin fault: a site plugin that traps after dcgm-exporter's standard plugin. Only that
    // state is notReady, the plugin is named, and its last applied objects stay.
    let annotate = |v: Value| json!({"metadata": {"annotations": {"kiln.dev/plugins": v}}});
    let chain = "dcgm-exporter:\n  then:\n    - name: boom\n";
    policies
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(annotate(json!(chain))),
        )
        .await?;
    cluster
        .wait_for("dcgm-exporter failed, naming boom", TIMEOUT, || async {
            let (state, msg) = policy_state(&policies, &name).await?;
            let ok = state == "notReady"
                && msg.contains("states not ready: [dcgm-exporter];")
                && msg.contains("plugin \"boom\" trapped");
            Ok(if ok {
                Ok(())
            } else {
                Err(format!("{state}: {msg}"))
            })
        })
        .await?;
    assert!(dss.get_opt("nvidia-dcgm-exporter").await?.is_some());
    policies
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(annotate(Value::Null)),
        )
        .await?;
    wait_state(cluster, &policies, &name, "ready").await?;

    // Referenced ConfigMaps are read from the cluster: while driver.kernelModuleConfig names a
    // ConfigMap that does not exist, only the driver state fails, naming the field; once it
    // exists (picked up by the notReady requeue) each of its keys is mounted under /drivers.
    let kmod = |v: Value| json!({"spec": {"driver": {"kernelModuleConfig": v}}});
    policies
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(kmod(json!({"name": "kernel-module-params"}))),
        )
        .await?;
    cluster
        .wait_for(
            "driver failed, naming kernelModuleConfig",
            TIMEOUT,
            || async {
                let (state, msg) = policy_state(&policies, &name).await?;
                let ok = state == "notReady"
                    && msg.contains("states not ready: [driver];")
                    && msg.contains("spec.driver.kernelModuleConfig.name");
                Ok(if ok {
                    Ok(())
                } else {
                    Err(format!("{state}: {msg}"))
                })
            },
        )
        .await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "kernel-module-params"},
            "data": {"nvidia.conf": "NVreg_EnableGpuFirmware=0"}
        }))?,
    )
    .await?;
    cluster
        .wait_for("driver mounts /drivers/nvidia.conf", TIMEOUT, || async {
            let ds = dss.get("nvidia-driver-daemonset").await?;
            let mounts: Vec<String> = ds
                .spec
                .and_then(|s| s.template.spec)
                .map(|p| p.containers)
                .unwrap_or_default()
                .into_iter()
                .flat_map(|c| c.volume_mounts.unwrap_or_default())
                .map(|m| m.mount_path)
                .collect();
            Ok(if mounts.iter().any(|m| m == "/drivers/nvidia.conf") {
                Ok(())
            } else {
                Err(format!("mounts: {mounts:?}"))
            })
        })
        .await?;
    // The driver DaemonSet updates OnDelete, so its pods stay on the old revision (notReady
    // until an upgrade replaces them); dropping the reference restores that revision.
    policies
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(kmod(Value::Null)),
        )
        .await?;
    wait_state(cluster, &policies, &name, "ready").await?;

    // Disabling dcgmExporter deletes its objects; the policy returns to ready.
    policies
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"dcgmExporter": {"enabled": false}}})),
        )
        .await?;
    cluster
        .wait_for("dcgm-exporter DaemonSet deleted", TIMEOUT, || async {
            Ok(match dss.get_opt("nvidia-dcgm-exporter").await? {
                None => Ok(()),
                Some(_) => Err("still there".to_string()),
            })
        })
        .await?;
    wait_state(cluster, &policies, &name, "ready").await?;

    // A second, newer policy is ignored and names the active one.
    let mut second = doc.clone();
    second["metadata"] = json!({"name": "second"});
    raw_policies
        .create(&PostParams::default(), &serde_json::from_value(second)?)
        .await?;
    let msg = wait_state(cluster, &policies, "second", "ignored").await?;
    assert!(
        msg.contains(&format!("\"{name}\" is the active policy")),
        "{msg}"
    );
    let (state, _) = policy_state(&policies, &name).await?;
    assert_eq!(state, "ready");

    // kube-apiserver restarted mid-reconcile: re-enabling dcgmExporter still converges, with
    // exactly one DaemonSet per operand.
    let before: Vec<String> = daemonset_names(&dss).await?;
    policies
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"dcgmExporter": {"enabled": true}}})),
        )
        .await?;
    cluster.restart_apiserver()?;
    let client = cluster.client().await?;
    let policies: Api<ClusterPolicy> = Api::all(client.clone());
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    cluster
        .wait_for("dcgm-exporter back after the restart", TIMEOUT, || async {
            Ok(match dss.get_opt("nvidia-dcgm-exporter").await? {
                Some(_) => Ok(()),
                None => Err("absent".to_string()),
            })
        })
        .await?;
    wait_state(cluster, &policies, &name, "ready").await?;
    let mut want = before;
    want.push("nvidia-dcgm-exporter".into());
    want.sort();
    assert_eq!(daemonset_names(&dss).await?, want);

    // The active policy deleted: the second, ignored until now, takes over.
    policies.delete(&name, &DeleteParams::default()).await?;
    cluster
        .wait_for("the second policy active", TIMEOUT, || async {
            let (state, msg) = policy_state(&policies, "second").await?;
            Ok(if state != "ignored" && !state.is_empty() {
                Ok(())
            } else {
                Err(format!("{state}: {msg}"))
            })
        })
        .await?;

    operator.abort();
    Ok(())
}

/// Additive drift (issue 40): another field manager adds a privileged sidecar and a label to
/// the exporter's DaemonSet (server-side apply, manager `intruder`) and an env var to its
/// container (a strategic-merge patch, manager `intruder-edit`). kiln removes all three within
/// a reconcile, names them in `DriftRemoved` Events on the DaemonSet, and its spec is kiln's
/// again (the server's defaults included); a full reconcile with nothing to remove (the
/// policy's labels changed) then changes no DaemonSet generation.
async fn additive_drift(
    cluster: &TestCluster,
    client: &Client,
    policy: &str,
) -> anyhow::Result<()> {
    use k8s_openapi::api::events::v1::Event;
    const DS: &str = "nvidia-dcgm-exporter";
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    let before = dss.get(DS).await?;
    let spec = |d: &DaemonSet| serde_json::to_value(&d.spec).unwrap_or_default();
    let main = before
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| p.containers[0].name.clone())
        .unwrap_or_default();
    dss.patch(
        DS,
        &PatchParams::apply("intruder"),
        &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": DS, "namespace": NS, "labels": {"team": "ml"}},
            "spec": {"template": {"spec": {"containers": [
                {"name": "sidecar", "image": "busybox",
                    "securityContext": {"privileged": true}}]}}}})),
    )
    .await?;
    dss.patch(
        DS,
        &PatchParams {
            field_manager: Some("intruder-edit".into()),
            ..PatchParams::default()
        },
        &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
            {"name": main, "env": [{"name": "INJECTED", "value": "1"}]}]}}}})),
    )
    .await?;
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let notes = || async {
        let list = events.list(&ListParams::default()).await?;
        anyhow::Ok(
            list.items
                .into_iter()
                .filter(|e| {
                    e.reason.as_deref() == Some("DriftRemoved")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(DS)
                })
                .filter_map(|e| e.note)
                .collect::<Vec<String>>()
                .join("\n"),
        )
    };
    cluster
        .wait_for(
            "the intruders' fields removed",
            Duration::from_secs(30),
            || async {
                let now = dss.get(DS).await?;
                let labels = now.metadata.labels.clone().unwrap_or_default();
                let notes = notes().await?;
                let named = [
                    "set by intruder: ",
                    "spec.template.spec.containers[name=sidecar]",
                    "metadata.labels.team",
                    "set by intruder-edit: ",
                    &format!("spec.template.spec.containers[name={main}].env[name=INJECTED]"),
                ]
                .iter()
                .all(|n| notes.contains(n));
                Ok(
                    if spec(&now) == spec(&before) && !labels.contains_key("team") && named {
                        Ok(())
                    } else {
                        Err(format!(
                            "labels {labels:?}, same spec {}, managed {}, events: {notes}",
                            spec(&now) == spec(&before),
                            serde_json::to_string(&now.metadata.managed_fields)?
                        ))
                    },
                )
            },
        )
        .await?;
    // A clean full reconcile (the policy's labels are part of what it renders from): nothing
    // to remove, no DaemonSet's generation moves.
    let generations = || async {
        let list = dss.list(&ListParams::default()).await?;
        anyhow::Ok(
            list.items
                .into_iter()
                .map(|d| (d.metadata.name.unwrap_or_default(), d.metadata.generation))
                .collect::<Vec<_>>(),
        )
    };
    let settled = generations().await?;
    Api::<ClusterPolicy>::all(client.clone())
        .patch(
            policy,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"kiln.dev/poke": "drift"}}})),
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        generations().await?,
        settled,
        "a clean reconcile rolled a DaemonSet"
    );
    let managers: Vec<String> = dss
        .get(DS)
        .await?
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        !managers.iter().any(|m| m.starts_with("intruder")),
        "{managers:?}"
    );
    Ok(())
}
