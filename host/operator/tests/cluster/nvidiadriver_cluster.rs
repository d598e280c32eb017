//! NVIDIADriver end to end on `kiln-testcluster` (real API server, DaemonSet controller and
//! garbage collector; kwok pods), with the operator run in-process on 4 GPU nodes in two pools:
//! 1. the ClusterPolicy's own driver DaemonSet runs a pod on every GPU node;
//! 2. `driver.useNvidiaDriverCRD: true`: that DaemonSet is deleted with Orphan propagation, and
//!    its pods stay (same UIDs), released by the garbage collector (no owner any more);
//! 3. two NVIDIADrivers with different versions, one per pool: one DaemonSet each, scheduled on
//!    exactly its pool's nodes, with its own image; their upgrades replace the orphaned pods
//!    (the driver pods' anti-affinity keeps the CRs' pods off a node until then), so every
//!    node ends `upgrade-done` running its pool's driver;
//! 4. a third NVIDIADriver selecting every GPU node is refused: `ConflictingNodeSelector`
//!    naming the other two;
//! 5. a `repoConfig` ConfigMap's keys are mounted, and an edit of the ConfigMap alone (the CR
//!    unchanged) reaches the DaemonSet;
//! 6. the ConfigMap watch calls back for referenced ConfigMaps only.
//!
//! A second cluster: one pool's NVIDIADriver gets a new version and upgradePolicy; its nodes
//! upgrade one at a time while the other pool's DaemonSet, pods and nodes stay put.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kiln_core::spec::ClusterPolicy;
use kiln_core::spec::nvidiadriver::{NVIDIADRIVER_LABEL, NVIDIADriver};
use kiln_core::upgrade::{STATE_LABEL, UpgradeState};
use kiln_operator::facts::ConfigMapCache;
use kiln_testcluster::{Options, TestCluster};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "gpu-operator";
const TIMEOUT: Duration = Duration::from_secs(120);

async fn install_crd(
    cluster: &TestCluster,
    client: &Client,
    crd: &CustomResourceDefinition,
) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.name_any();
    crds.patch(
        &name,
        &PatchParams::apply("kiln-test").force(),
        &Patch::Apply(crd),
    )
    .await?;
    cluster
        .wait_for("CRD established", TIMEOUT, || async {
            let c = crds.get(&name).await?;
            let ok = c
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            Ok(if ok {
                Ok(())
            } else {
                Err("not established".to_string())
            })
        })
        .await
}

fn start_operator(client: Client) -> anyhow::Result<tokio::sync::oneshot::Sender<()>> {
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
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let renderer = kiln_render::Renderer::new(host);
    tokio::spawn(async move {
        let stop = async move {
            let _ = rx.await;
        };
        if let Err(e) = kiln_operator::run_until(client, renderer, config, stop).await {
            eprintln!("operator stopped: {e}");
        }
    });
    Ok(tx)
}

/// Both nodes of a pool at once (the CRD's defaults take them one at a time).
fn both_at_once() -> Value {
    json!({"autoUpgrade": true, "maxParallelUpgrades": 2, "maxUnavailable": 2})
}

fn nvidia_driver(
    name: &str,
    version: &str,
    selector: Option<Value>,
    upgrade_policy: Option<Value>,
) -> anyhow::Result<DynamicObject> {
    let mut spec = json!({"repository": "nvcr.io/nvidia", "image": "driver", "version": version});
    if let Some(s) = selector {
        spec["nodeSelector"] = s;
    }
    if let Some(p) = upgrade_policy {
        spec["upgradePolicy"] = p;
    }
    // As JSON (a DynamicObject): the typed spec writes its empty defaults (`manager.image: ""`),
    // which the CRD's patterns refuse.
    Ok(serde_json::from_value(json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
        "metadata": {"name": name}, "spec": spec
    }))?)
}

/// Driver pods by name → (uid, owner kinds).
async fn driver_pods(
    pods: &Api<Pod>,
    selector: &str,
) -> anyhow::Result<BTreeMap<String, (String, Vec<String>)>> {
    Ok(pods
        .list(&ListParams::default().labels(selector))
        .await?
        .items
        .into_iter()
        .map(|p| {
            let owners = p
                .metadata
                .owner_references
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|o| o.kind)
                .collect();
            (
                p.name_any(),
                (p.metadata.uid.clone().unwrap_or_default(), owners),
            )
        })
        .collect())
}

#[tokio::test]
async fn pools_and_orphaning_on_a_real_control_plane() -> anyhow::Result<()> {
    let turn = crate::support::cluster::start(Options {
        nodes: 4,
        gpu_nodes: 4,
        ..Options::default()
    })
    .await?;
    let cluster = turn.cluster();
    let res = scenario(cluster).await;
    cluster.with_logs(res)
}

/// The CRDs, the operator namespace, two pools of two nodes (`pool=a` for the first two names,
/// `pool=b`), the operator, and the sample ClusterPolicy with `driver.useNvidiaDriverCRD:
/// crd`. Returns the operator's stop handle, the policies' API and the sorted node names.
async fn setup(
    cluster: &TestCluster,
    client: &Client,
    crd: bool,
) -> anyhow::Result<(
    tokio::sync::oneshot::Sender<()>,
    Api<DynamicObject>,
    Vec<String>,
)> {
    let client = client.clone();
    install_crd(cluster, &client, &kiln_operator::crd::crd()).await?;
    install_crd(cluster, &client, &kiln_operator::crd::nvidia_driver_crd()).await?;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
        )
        .await?;
    // Two pools of two nodes, Ubuntu 22.04 as NFD reports it.
    let nodes: Api<Node> = Api::all(client.clone());
    let mut names: Vec<String> = nodes
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    names.sort();
    for (i, name) in names.iter().enumerate() {
        let pool = if i < 2 { "a" } else { "b" };
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"pool": pool,
                    "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
                    "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04"}}})),
            )
            .await?;
    }
    let stop = start_operator(client.clone())?;
    let mut doc: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/samples/clusterpolicy.yaml"
    ))?)?;
    doc["metadata"] = json!({"name": "cluster-policy"});
    doc["spec"]["driver"]["useNvidiaDriverCRD"] = json!(crd);
    // As tests/upgrade.rs: the sample's empty ccManager.defaultMode is refused by the spec check.
    doc["spec"]["ccManager"] = json!({"defaultMode": "on"});
    let policies = Api::<DynamicObject>::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<ClusterPolicy>(&()),
    );
    policies
        .create(&PostParams::default(), &serde_json::from_value(doc)?)
        .await?;
    Ok((stop, policies, names))
}

/// A rolling upgrade of one NVIDIADriver pool while the other stays put: the policy hands the
/// driver to NVIDIADrivers from the start, two CRs on two pools of two nodes; pool a's version
/// and upgradePolicy change ([`pool_upgrade`]).
#[tokio::test]
async fn one_pool_upgrades_while_the_other_stays_put() -> anyhow::Result<()> {
    let cluster = TestCluster::start(Options {
        nodes: 4,
        gpu_nodes: 4,
        ..Options::default()
    })?;
    let res = one_pool(&cluster).await;
    cluster.with_logs(res)
}

async fn one_pool(cluster: &TestCluster) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let client = cluster.client().await?;
    let (_stop, _policies, names) = setup(cluster, &client, true).await?;
    let create = Api::<DynamicObject>::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<NVIDIADriver>(&()),
    );
    for (cr, version, pool) in [("pool-a", "570.172.08", "a"), ("pool-b", "580.65.06", "b")] {
        create
            .create(
                &PostParams::default(),
                &nvidia_driver(cr, version, Some(json!({"pool": pool})), None)?,
            )
            .await?;
    }
    pool_upgrade(cluster, &client, &names).await?;
    eprintln!("nvidiadriver pool test: done after {:?}", t0.elapsed());
    Ok(())
}

async fn scenario(cluster: &TestCluster) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let client = cluster.client().await?;
    let (_stop, policies, names) = setup(cluster, &client, false).await?;

    // 1. The policy's own driver pods.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let old = "app=nvidia-driver-daemonset";
    cluster
        .wait_for("a policy driver pod on every node", TIMEOUT, || async {
            let n = driver_pods(&pods, old).await?.len();
            Ok(if n == 4 {
                Ok(())
            } else {
                Err(format!("{n} pods"))
            })
        })
        .await?;
    let before = driver_pods(&pods, old).await?;
    eprintln!(
        "nvidiadriver test: policy driver pods after {:?}",
        t0.elapsed()
    );

    // 2. Hand the driver to NVIDIADrivers: DaemonSet gone, pods kept and released.
    policies
        .patch(
            "cluster-policy",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"driver": {"useNvidiaDriverCRD": true}}})),
        )
        .await?;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    cluster
        .wait_for("the policy's driver DaemonSet deleted", TIMEOUT, || async {
            Ok(match dss.get_opt("nvidia-driver-daemonset").await? {
                None => Ok(()),
                Some(_) => Err("still there".to_string()),
            })
        })
        .await?;
    cluster
        .wait_for("orphaned pods released by the GC", TIMEOUT, || async {
            let now = driver_pods(&pods, old).await?;
            Ok(if now.values().all(|(_, owners)| owners.is_empty()) {
                Ok(())
            } else {
                Err(format!("{now:?}"))
            })
        })
        .await?;
    let after = driver_pods(&pods, old).await?;
    let uids = |m: &BTreeMap<String, (String, Vec<String>)>| {
        m.iter()
            .map(|(n, (u, _))| (n.clone(), u.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        uids(&after),
        uids(&before),
        "the driver pods were orphaned, not deleted"
    );

    // 3. Two pools, two versions.
    let drivers: Api<NVIDIADriver> = Api::all(client.clone());
    let create = Api::<DynamicObject>::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<NVIDIADriver>(&()),
    );
    create
        .create(
            &PostParams::default(),
            &nvidia_driver(
                "pool-a",
                "570.172.08",
                Some(json!({"pool": "a"})),
                Some(both_at_once()),
            )?,
        )
        .await?;
    create
        .create(
            &PostParams::default(),
            &nvidia_driver(
                "pool-b",
                "580.65.06",
                Some(json!({"pool": "b"})),
                Some(both_at_once()),
            )?,
        )
        .await?;
    for (cr, version) in [("pool-a", "570.172.08"), ("pool-b", "580.65.06")] {
        cluster
            .wait_for(
                "the NVIDIADriver's DaemonSet scheduled on its pool",
                TIMEOUT,
                || async {
                    let list = dss
                        .list(&ListParams::default().labels(&format!("{NVIDIADRIVER_LABEL}={cr}")))
                        .await?
                        .items;
                    let [ds] = list.as_slice() else {
                        return Ok(Err(format!("{} DaemonSets", list.len())));
                    };
                    let pod = ds
                        .spec
                        .as_ref()
                        .and_then(|s| s.template.spec.clone())
                        .unwrap_or_default();
                    let image = pod
                        .containers
                        .iter()
                        .find(|c| c.name == "nvidia-driver-ctr")
                        .and_then(|c| c.image.clone())
                        .unwrap_or_default();
                    let desired = ds.status.as_ref().map_or(0, |s| s.desired_number_scheduled);
                    Ok(
                        if image == format!("nvcr.io/nvidia/driver:{version}-ubuntu22.04")
                            && desired == 2
                        {
                            Ok(())
                        } else {
                            Err(format!("{}: {image}, {desired} desired", ds.name_any()))
                        },
                    )
                },
            )
            .await?;
    }
    eprintln!("nvidiadriver test: two pools after {:?}", t0.elapsed());

    // 3b. The pools' upgrades replace the orphaned policy driver pods (their anti-affinity
    //     keeps the CRs' pods off a node until then): every node ends upgrade-done with one
    //     Ready pod of its pool, no orphan left.
    all_on_their_pools(cluster, &client, &names).await?;
    let left = driver_pods(&pods, old).await?;
    assert!(left.is_empty(), "orphaned driver pods left: {left:?}");
    eprintln!(
        "nvidiadriver test: orphans replaced after {:?}",
        t0.elapsed()
    );

    // 4. Overlap refused.
    create
        .create(
            &PostParams::default(),
            &nvidia_driver("everything", "590.1", None, None)?,
        )
        .await?;
    cluster
        .wait_for("the overlapping NVIDIADriver refused", TIMEOUT, || async {
            let d = drivers.get("everything").await?;
            let err = d
                .status
                .unwrap_or_default()
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Error" && c.status == "True");
            Ok(match err {
                Some(c)
                    if c.reason == "ConflictingNodeSelector"
                        && c.message.contains("pool-a")
                        && c.message.contains("pool-b") =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            })
        })
        .await?;
    let everything = dss
        .list(&ListParams::default().labels(&format!("{NVIDIADRIVER_LABEL}=everything")))
        .await?
        .items;
    assert!(
        everything.is_empty(),
        "nothing applied for the overlapping CR"
    );
    eprintln!(
        "nvidiadriver test: overlap refused after {:?}",
        t0.elapsed()
    );

    // 5. A repoConfig ConfigMap: its keys mounted; an edit of the ConfigMap alone (the CR
    //    unchanged) reaches the DaemonSet, through the ConfigMap watch's wake-up.
    drivers.delete("everything", &Default::default()).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let repos = |files: &[&str]| -> anyhow::Result<ConfigMap> {
        let data: BTreeMap<String, String> = files
            .iter()
            .map(|f| {
                (
                    (*f).to_string(),
                    "deb http://mirror.example/ubuntu jammy main".into(),
                )
            })
            .collect();
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "repos", "namespace": NS}, "data": data}))?)
    };
    config_maps
        .create(&PostParams::default(), &repos(&["a.list"])?)
        .await?;
    drivers
        .patch(
            "pool-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"repoConfig": {"name": "repos"}}})),
        )
        .await?;
    let mounted = |want: &'static [&'static str]| {
        let dss = dss.clone();
        async move {
            let list = dss
                .list(&ListParams::default().labels(&format!("{NVIDIADRIVER_LABEL}=pool-a")))
                .await?
                .items;
            let mut got: Vec<String> = list
                .iter()
                .flat_map(|ds| {
                    ds.spec
                        .as_ref()
                        .and_then(|s| s.template.spec.clone())
                        .unwrap_or_default()
                        .containers
                })
                .flat_map(|c| c.volume_mounts.unwrap_or_default())
                .filter(|m| m.name == "repos")
                .filter_map(|m| m.sub_path)
                .collect();
            got.sort();
            Ok::<_, anyhow::Error>(if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            })
        }
    };
    cluster
        .wait_for("the repoConfig keys mounted", TIMEOUT, || {
            mounted(&["a.list"])
        })
        .await?;
    let mut cm = config_maps.get("repos").await?;
    cm.data.get_or_insert_with(Default::default).insert(
        "b.list".into(),
        "deb http://mirror.example/ubuntu jammy universe".into(),
    );
    config_maps
        .replace("repos", &PostParams::default(), &cm)
        .await?;
    let edited = std::time::Instant::now();
    cluster
        .wait_for("the edited ConfigMap's keys mounted", TIMEOUT, || {
            mounted(&["a.list", "b.list"])
        })
        .await?;
    eprintln!(
        "nvidiadriver test: the ConfigMap edit reached the DaemonSet in {:?}",
        edited.elapsed()
    );

    // 6. The ConfigMap watch behind that wake-up calls back for the names asked for only: a
    //    ConfigMap nobody references changes first, then a referenced one; events arrive in
    //    order, so one call means the first did not count.
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = calls.clone();
    let cache = ConfigMapCache::start(
        &client,
        NS,
        move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        },
        &kiln_operator::live::Wake::default(),
    );
    cache.ready().await;
    cache.want("referenced");
    for name in ["unreferenced", "referenced"] {
        let mut cm = repos(&["a.list"])?;
        cm.metadata.name = Some(name.into());
        config_maps.create(&PostParams::default(), &cm).await?;
    }
    cluster
        .wait_for("one change call", TIMEOUT, || async {
            let n = calls.load(std::sync::atomic::Ordering::SeqCst);
            Ok(if n >= 1 {
                Ok(n)
            } else {
                Err(format!("{n} calls"))
            })
        })
        .await?;
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "only the referenced ConfigMap calls back"
    );
    eprintln!("nvidiadriver test: done after {:?}", t0.elapsed());
    Ok(())
}

/// A node's upgrade state label.
fn upgrade_state(n: &Node) -> UpgradeState {
    UpgradeState::from_label(n.labels().get(STATE_LABEL).map(String::as_str))
}

/// Per node: the `(uid, image, ready)` of the pool's driver pods there (`cr` the NVIDIADriver);
/// pods not scheduled are keyed by their conditions (the scheduler's reason, for a failure
/// message).
async fn pool_pods(
    pods: &Api<Pod>,
    cr: &str,
) -> anyhow::Result<BTreeMap<String, Vec<(String, String, bool)>>> {
    let mut out: BTreeMap<String, Vec<(String, String, bool)>> = BTreeMap::new();
    for p in pods
        .list(&ListParams::default().labels(&format!("{NVIDIADRIVER_LABEL}={cr}")))
        .await?
        .items
    {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| {
                format!("{:?}", p.status.as_ref().and_then(|s| s.conditions.clone()))
            });
        let image = p
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|c| c.name == "nvidia-driver-ctr"))
            .and_then(|c| c.image.clone())
            .unwrap_or_default();
        let ready = p.metadata.deletion_timestamp.is_none()
            && p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        out.entry(node).or_default().push((
            p.metadata.uid.clone().unwrap_or_default(),
            image,
            ready,
        ));
    }
    Ok(out)
}

/// Every node `upgrade-done` with one Ready driver pod of its pool (`names`: pool a the first
/// two, pool b the others) and nothing else of the CRs'.
async fn all_on_their_pools(
    cluster: &TestCluster,
    client: &Client,
    names: &[String],
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let (pool_a, pool_b) = names.split_at(2);
    // Every node upgrade-done on its pool's driver, one Ready pod each.
    cluster
        .wait_for(
            "every node upgrade-done, one driver pod Ready",
            TIMEOUT,
            || async {
                let states: BTreeMap<String, UpgradeState> = nodes
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .map(|n| (n.name_any(), upgrade_state(n)))
                    .collect();
                let mut ok = states.values().all(|s| *s == UpgradeState::Done);
                let mut seen = Vec::new();
                for (cr, pool) in [("pool-a", pool_a), ("pool-b", pool_b)] {
                    let pods = pool_pods(&pods, cr).await?;
                    ok &= pool
                        .iter()
                        .all(|n| pods.get(n).is_some_and(|v| v.len() == 1 && v[0].2));
                    seen.push(pods);
                }
                Ok(if ok {
                    Ok(())
                } else {
                    Err(format!("{states:?} {seen:?}"))
                })
            },
        )
        .await?;
    Ok(())
}

/// Pool a's version changes under its own upgradePolicy (one node at a time): its nodes
/// upgrade in turn, each driver pod replaced by one of the new version, at most one of them
/// cordoned at once; pool b's DaemonSet (UID, generation), driver pods (UIDs) and nodes (state,
/// cordon) stay as they were throughout. `names` are the nodes, pool a the first two.
async fn pool_upgrade(
    cluster: &TestCluster,
    client: &Client,
    names: &[String],
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    let (pool_a, pool_b) = names.split_at(2);
    all_on_their_pools(cluster, client, names).await?;
    let pool_b_ds = |list: Vec<DaemonSet>| -> Vec<(String, Option<i64>)> {
        list.iter()
            .map(|d| {
                (
                    d.metadata.uid.clone().unwrap_or_default(),
                    d.metadata.generation,
                )
            })
            .collect()
    };
    let b_label = format!("{NVIDIADRIVER_LABEL}=pool-b");
    let b_ds = pool_b_ds(
        dss.list(&ListParams::default().labels(&b_label))
            .await?
            .items,
    );
    let b_pods = pool_pods(&pods, "pool-b").await?;
    let a_before = pool_pods(&pods, "pool-a").await?;
    Api::<DynamicObject>::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<NVIDIADriver>(&()),
    )
    .patch(
        "pool-a",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"version": "570.195.03",
            "upgradePolicy": {"autoUpgrade": true, "maxParallelUpgrades": 1, "maxUnavailable": 1,
                "drain": {"enable": false}}}})),
    )
    .await?;
    let new_image = "nvcr.io/nvidia/driver:570.195.03-ubuntu22.04";
    let max_cordoned = std::sync::atomic::AtomicUsize::new(0);
    let t = std::time::Instant::now();
    // Ok(Err(why)): pool b moved, fail at once.
    let verdict = cluster
        .wait_for("pool a upgraded, pool b untouched", TIMEOUT, || async {
            let list = nodes.list(&ListParams::default()).await?.items;
            let by_name: BTreeMap<String, &Node> = list.iter().map(|n| (n.name_any(), n)).collect();
            let cordoned = |n: &str| {
                by_name
                    .get(n)
                    .is_some_and(|n| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true))
            };
            let state = |n: &str| {
                by_name
                    .get(n)
                    .map_or(UpgradeState::Unknown, |n| upgrade_state(n))
            };
            let a_cordoned = pool_a.iter().filter(|n| cordoned(n)).count();
            max_cordoned.fetch_max(a_cordoned, std::sync::atomic::Ordering::SeqCst);
            // Pool b: nothing moves.
            for n in pool_b {
                if state(n) != UpgradeState::Done || cordoned(n) {
                    return Ok(Ok(Err(format!("pool b's {n} moved: {:?}", state(n)))));
                }
            }
            let b_now = pool_pods(&pods, "pool-b").await?;
            if b_now != b_pods {
                return Ok(Ok(Err(format!("pool b's driver pods changed: {b_now:?}"))));
            }
            if pool_b_ds(
                dss.list(&ListParams::default().labels(&b_label))
                    .await?
                    .items,
            ) != b_ds
            {
                return Ok(Ok(Err("pool b's DaemonSet changed".to_string())));
            }
            let a_now = pool_pods(&pods, "pool-a").await?;
            let done = pool_a.iter().all(|n| {
                let fresh = a_now.get(n).is_some_and(|v| {
                    v.len() == 1
                        && v[0].1 == new_image
                        && v[0].2
                        && a_before
                            .get(n)
                            .is_none_or(|old| old.iter().all(|o| o.0 != v[0].0))
                });
                fresh && state(n) == UpgradeState::Done && !cordoned(n)
            });
            let states: Vec<(&String, UpgradeState)> =
                pool_a.iter().map(|n| (n, state(n))).collect();
            Ok(if done {
                Ok(Ok(()))
            } else {
                Err(format!("{:.0?}: {states:?} pods {a_now:?}", t.elapsed()))
            })
        })
        .await?;
    verdict.map_err(|why| anyhow::anyhow!(why))?;
    eprintln!(
        "nvidiadriver test: pool a's rolling upgrade took {:?}",
        t.elapsed()
    );
    assert_eq!(
        max_cordoned.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "pool a's nodes upgrade one at a time"
    );
    Ok(())
}
