//! End-to-end: the operator, run in-process, against the real control plane of
//! `kiln-testcluster` (8 nodes, 5 GPU nodes). One scenario, in order, on one cluster:
//! sample policy → labels on the GPU nodes only, validator init-container order, `ready`;
//! disabling dcgmExporter deletes its objects and returns to `ready`; a second policy is
//! `ignored`, naming the active one, and takes over once the active one is deleted; a referenced ConfigMap is read from the cluster and its keys
//! mounted; what another field manager adds to an operand DaemonSet is removed within one
//! reconcile, with an Event, and a clean full reconcile leaves the DaemonSets untouched.

use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node};
use kiln_core::spec::ClusterPolicy;
use kiln_testcluster::{Options, TestCluster};
use kube::Client;
use kube::api::DynamicObject;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::support::cluster::{install_crd, policy_crd, policy_state, start_operator, wait_state};
use crate::support::fixtures::{NS, sample_policy};

const TIMEOUT: Duration = Duration::from_secs(150);

/// What the steps share: the cluster, a client of it (a new one after the apiserver restart),
/// and the sample policy under test.
struct Run<'a> {
    cluster: &'a TestCluster,
    client: Client,
    policies: Api<ClusterPolicy>,
    /// The ClusterPolicy API over raw JSON (a typed ClusterPolicy would serialize every
    /// defaulted field, which the CRD's patterns refuse for empty images).
    raw_policies: Api<DynamicObject>,
    nodes: Api<Node>,
    /// The DaemonSets in the operator namespace.
    dss: Api<DaemonSet>,
    /// The sample policy's name and document (metadata reduced to the name).
    name: String,
    doc: Value,
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
    let turn = crate::support::cluster::start(Options::default()).await?;
    let cluster = turn.cluster();
    cluster.with_logs(scenario(cluster).await)
}

/// The steps in order, on one cluster and one operator: each leaves the policy `ready`.
async fn scenario(cluster: &TestCluster) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    install_crd(cluster, &client, &policy_crd()?, TIMEOUT).await?;
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
    let (operator, host) = start_operator(
        client.clone(),
        kiln_plugin_host::HostConfig {
            drop_in_dir: Some(plugins.path().to_path_buf()),
            ..kiln_plugin_host::HostConfig::default()
        },
        kiln_operator::Config {
            namespace: NS.into(),
            metrics_addr: "127.0.0.1:0".into(),
            ..kiln_operator::Config::default()
        },
    )?;
    let mut doc = sample_policy();
    let name = doc["metadata"]["name"]
        .as_str()
        .unwrap_or("cluster-policy")
        .to_string();
    doc["metadata"] = json!({"name": name});
    let mut run = Run {
        cluster,
        policies: Api::all(client.clone()),
        raw_policies: Api::all_with(
            client.clone(),
            &kube::api::ApiResource::erase::<ClusterPolicy>(&()),
        ),
        nodes: Api::all(client.clone()),
        dss: Api::namespaced(client.clone(), NS),
        client,
        name,
        doc,
    };
    run.raw_policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(run.doc.clone())?,
        )
        .await?;

    gpu_nodes_are_labelled_and_the_policy_ready(&run).await?;
    plugins_are_released_between_reconciles(&run, &host).await?;
    validator_init_containers_run_in_chain_order(&run).await?;
    a_steady_state_reconcile_writes_nothing(&run).await?;
    additive_drift(cluster, &run.client, &run.name).await?;
    per_node_opt_outs_are_honoured(&run).await?;
    a_new_gpu_node_runs_the_operands(&run).await?;
    bad_input_is_refused_or_named(&run).await?;
    a_plugin_fault_marks_only_its_state(&run).await?;
    a_referenced_config_map_is_read_from_the_cluster(&run).await?;
    disabling_a_state_deletes_its_objects(&run).await?;
    a_second_policy_is_ignored(&run).await?;
    an_apiserver_restart_mid_reconcile_converges(&mut run).await?;
    the_second_policy_takes_over(&run).await?;

    operator.abort();
    Ok(())
}

/// Labels: every GPU node carries gpu.present and all container deploy labels; CPU nodes none.
async fn gpu_nodes_are_labelled_and_the_policy_ready(run: &Run<'_>) -> anyhow::Result<()> {
    let cluster = run.cluster;
    let policies = run.policies.clone();
    let nodes = run.nodes.clone();
    let name = run.name.clone();
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

    let msg = wait_state(cluster, &policies, &name, "ready", TIMEOUT).await?;
    assert!(msg.contains("Ready=True Reconciled"), "{msg}");
    Ok(())
}

/// Between reconciles the operator keeps no plugin loaded (they reload from the disk cache).
async fn plugins_are_released_between_reconciles(
    run: &Run<'_>,
    host: &kiln_plugin_host::PluginHost,
) -> anyhow::Result<()> {
    let cluster = run.cluster;
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
    Ok(())
}

/// Validator init containers run in the readiness-chain order.
async fn validator_init_containers_run_in_chain_order(run: &Run<'_>) -> anyhow::Result<()> {
    let dss = run.dss.clone();
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
    Ok(())
}

/// Steady state: a reconcile woken by a node label change writes nothing. The driver upgrade
/// loop labels every GPU node `upgrade-done` after `ready` and then writes its counts, so
/// wait for those first (and for the counts to name no state no node is in).
async fn a_steady_state_reconcile_writes_nothing(run: &Run<'_>) -> anyhow::Result<()> {
    let cluster = run.cluster;
    let client = run.client.clone();
    let policies = run.policies.clone();
    let nodes = run.nodes.clone();
    let name = run.name.clone();
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
    Ok(())
}

/// Per-node opt-outs: operands=false empties gpu-node-5; dcgm-exporter=false on gpu-node-4
/// removes only that operand there.
async fn per_node_opt_outs_are_honoured(run: &Run<'_>) -> anyhow::Result<()> {
    let cluster = run.cluster;
    let client = run.client.clone();
    let nodes = run.nodes.clone();
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
    Ok(())
}

/// A sixth GPU node is labelled and runs the operands with no policy change.
async fn a_new_gpu_node_runs_the_operands(run: &Run<'_>) -> anyhow::Result<()> {
    let cluster = run.cluster;
    let client = run.client.clone();
    let policies = run.policies.clone();
    let nodes = run.nodes.clone();
    let name = run.name.clone();
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
    wait_state(cluster, &policies, &name, "ready", TIMEOUT).await?;
    Ok(())
}

/// Bad input: an unknown enum value is refused by the CRD schema; a cross-field error gets
/// Error naming the field and deletes nothing.
async fn bad_input_is_refused_or_named(run: &Run<'_>) -> anyhow::Result<()> {
    let cluster = run.cluster;
    let client = run.client.clone();
    let policies = run.policies.clone();
    let dss = run.dss.clone();
    let name = run.name.clone();
    let doc = run.doc.clone();
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
    wait_state(cluster, &policies, &name, "ready", TIMEOUT).await?;
    Ok(())
}

/// A plugin fault: a site plugin that traps after dcgm-exporter's standard plugin. Only that
/// state is notReady, the plugin is named, and its last applied objects stay.
async fn a_plugin_fault_marks_only_its_state(run: &Run<'_>) -> anyhow::Result<()> {
    let cluster = run.cluster;
    let policies = run.policies.clone();
    let dss = run.dss.clone();
    let name = run.name.clone();
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
    wait_state(cluster, &policies, &name, "ready", TIMEOUT).await?;
    Ok(())
}

/// Referenced ConfigMaps are read from the cluster: while driver.kernelModuleConfig names a
/// ConfigMap that does not exist, only the driver state fails, naming the field; once it
/// exists (picked up by the notReady requeue) each of its keys is mounted under /drivers.
async fn a_referenced_config_map_is_read_from_the_cluster(run: &Run<'_>) -> anyhow::Result<()> {
    let cluster = run.cluster;
    let client = run.client.clone();
    let policies = run.policies.clone();
    let dss = run.dss.clone();
    let name = run.name.clone();
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
    wait_state(cluster, &policies, &name, "ready", TIMEOUT).await?;
    Ok(())
}

/// Disabling dcgmExporter deletes its objects; the policy returns to ready.
async fn disabling_a_state_deletes_its_objects(run: &Run<'_>) -> anyhow::Result<()> {
    let cluster = run.cluster;
    let policies = run.policies.clone();
    let dss = run.dss.clone();
    let name = run.name.clone();
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
    wait_state(cluster, &policies, &name, "ready", TIMEOUT).await?;
    Ok(())
}

/// A second, newer policy is ignored and names the active one.
async fn a_second_policy_is_ignored(run: &Run<'_>) -> anyhow::Result<()> {
    let cluster = run.cluster;
    let policies = run.policies.clone();
    let raw_policies = run.raw_policies.clone();
    let name = run.name.clone();
    let doc = run.doc.clone();
    let mut second = doc.clone();
    second["metadata"] = json!({"name": "second"});
    raw_policies
        .create(&PostParams::default(), &serde_json::from_value(second)?)
        .await?;
    let msg = wait_state(cluster, &policies, "second", "ignored", TIMEOUT).await?;
    assert!(
        msg.contains(&format!("\"{name}\" is the active policy")),
        "{msg}"
    );
    let (state, _) = policy_state(&policies, &name).await?;
    assert_eq!(state, "ready");
    Ok(())
}

/// kube-apiserver restarted mid-reconcile: re-enabling dcgmExporter still converges, with
/// exactly one DaemonSet per operand.
async fn an_apiserver_restart_mid_reconcile_converges(run: &mut Run<'_>) -> anyhow::Result<()> {
    let cluster = run.cluster;
    let policies = run.policies.clone();
    let dss = run.dss.clone();
    let name = run.name.clone();
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
    wait_state(cluster, &policies, &name, "ready", TIMEOUT).await?;
    let mut want = before;
    want.push("nvidia-dcgm-exporter".into());
    want.sort();
    assert_eq!(daemonset_names(&dss).await?, want);
    run.client = client;
    run.policies = policies;
    run.dss = dss;
    Ok(())
}

/// The active policy deleted: the second, ignored until now, takes over.
async fn the_second_policy_takes_over(run: &Run<'_>) -> anyhow::Result<()> {
    let cluster = run.cluster;
    let policies = run.policies.clone();
    let name = run.name.clone();
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
