//! Migration from a running NVIDIA GPU Operator v26.7 Helm release to kiln (issue 14, item
//! 3), on testcluster, following `docs/migrating-from-nvidia.md` step by step.
//!
//! Before: NVIDIA's release `gpu-operator` (a stand-in chart, `tests/data/nvidia-release/`,
//! with the objects of NVIDIA's chart that matter here: the operator Deployment, its RBAC and
//! the ClusterPolicy `cluster-policy` with Helm's ownership metadata), NVIDIA's CRD installed
//! outside the release as Helm installs a chart's `crds/`, and the operands NVIDIA's operator
//! created (the goldens of the `ix-nvidia-images` variant, owned by the policy) with their
//! ControllerRevisions and pods.
//!
//! Steps: 1. scale NVIDIA's operator to 0; 2. `helm install kiln deploy/helm/kiln
//! --take-ownership --set clusterPolicy.adoptExisting=true`; 3. kiln's operator (in this
//! process: the chart's pods are only simulated by kwok) adopts the operands; 4. NVIDIA's
//! release is removed without `helm uninstall` (its objects still its own are deleted, then its
//! release records); 5. kiln's CRD replaces NVIDIA's.
//!
//! After: the policy belongs to the `kiln` release with its spec unchanged, NVIDIA's
//! operator Deployment is gone, kiln owns every operand, and no DaemonSet changed (same
//! generations, templates, ControllerRevisions, pods).
//!
//! Rollback (the guide's "after step 4" case): NVIDIA's chart installed again with
//! `--take-ownership`, kiln's release removed the same way: the policy is NVIDIA's release's
//! again with the same spec, node labels stay, and still no DaemonSet changed.

use crate::support;
use crate::support::helm::helm;
use crate::support::nvidia;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kiln_testcluster::{Options, TestCluster};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde::Deserialize as _;
use serde_json::{Value, json};

const POLICY: &str = "cluster-policy";
const NVIDIA_RELEASE: &str = "gpu-operator";
const KILN_RELEASE: &str = "kiln";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidia_release_migrates_to_kiln_without_a_rollout() -> anyhow::Result<()> {
    let turn = crate::support::cluster::start(Options::default()).await?;
    let cluster = turn.cluster();
    cluster.with_logs(scenario(cluster).await)
}

/// The policy's Helm ownership: (release-name, release-namespace, managed-by).
fn helm_owner(policy: &Value) -> (String, String, String) {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let m = &policy["metadata"];
    (
        s(&m["annotations"]["meta.helm.sh/release-name"]),
        s(&m["annotations"]["meta.helm.sh/release-namespace"]),
        s(&m["labels"]["app.kubernetes.io/managed-by"]),
    )
}

/// The guide's `remove_release`: deletes the objects of `release`'s stored manifest whose live
/// `meta.helm.sh/release-name` is still `release`, then its release records (no hooks run).
/// Returns `Kind name` of each deleted object.
async fn remove_release(
    cluster: &TestCluster,
    client: &kube::Client,
    home: &std::path::Path,
    release: &str,
) -> anyhow::Result<Vec<String>> {
    let ns = nvidia::NS;
    let manifest = helm(
        cluster,
        home,
        &["get", "manifest", release, "--namespace", ns],
    )
    .await?;
    let mut deleted = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&manifest) {
        let mut obj = Value::deserialize(doc)?;
        if !obj.is_object() {
            continue;
        }
        if obj["metadata"]["namespace"].is_null() {
            obj["metadata"]["namespace"] = json!(ns);
        }
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let Ok(api) = nvidia::api_for(client, &obj).await else {
            continue; // a kind this cluster does not serve: nothing was created
        };
        let Some(live) = api.get_opt(&name).await? else {
            continue;
        };
        let owner =
            serde_json::to_value(&live)?["metadata"]["annotations"]["meta.helm.sh/release-name"]
                .clone();
        if owner == release {
            api.delete(&name, &DeleteParams::background()).await?;
            deleted.push(format!(
                "{} {name}",
                obj["kind"].as_str().unwrap_or_default()
            ));
        }
    }
    Api::<Secret>::namespaced(client.clone(), ns)
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("owner=helm,name={release}")),
        )
        .await?;
    Ok(deleted)
}

async fn scenario(cluster: &TestCluster) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let client = cluster.client().await?;
    let home = tempfile::tempdir()?;
    let home = home.path();
    let ns = nvidia::NS;

    // NVIDIA's release, its CRD and its operands.
    let nvidia_crd: Value = serde_yaml_ng::from_str(include_str!(
        "../data/nvidia-v26.7.0-clusterpolicies-crd.yaml"
    ))?;
    support::cluster::install_crd(cluster, &client, &nvidia_crd, nvidia::TIMEOUT).await?;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let values = home.join("nvidia-values.json");
    std::fs::write(
        &values,
        serde_json::to_string(&json!({"spec": nvidia::policy(POLICY)?["spec"]}))?,
    )?;
    let values = values.to_string_lossy().into_owned();
    helm(
        cluster,
        home,
        &[
            "install",
            NVIDIA_RELEASE,
            "host/operator/tests/data/nvidia-release",
            "--namespace",
            ns,
            "-f",
            &values,
        ],
    )
    .await?;
    let policies = nvidia::raw_policies(&client);
    let policy = serde_json::to_value(policies.get(POLICY).await?)?;
    assert_eq!(
        helm_owner(&policy),
        (NVIDIA_RELEASE.into(), ns.into(), "Helm".into())
    );
    let uid = policy["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let gpu_nodes = nvidia::label_gpu_nodes(&client).await?;
    let objs = nvidia::objects(POLICY, &uid)?;
    nvidia::create_all(&client, &objs).await?;
    let names = nvidia::daemonset_names(&objs);
    let before = nvidia::settled(cluster, &client, &names, gpu_nodes.len()).await?;
    println!("ControllerRevisions before:\n{}", before.revision_lines());

    // 1. NVIDIA's operator stops.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    deployments
        .patch(
            NVIDIA_RELEASE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await?;

    // 2. kiln's release adopts the policy as it is.
    let out = helm(
        cluster,
        home,
        &[
            "install",
            KILN_RELEASE,
            "deploy/helm/kiln",
            "--namespace",
            ns,
            "--take-ownership",
            "--set",
            "clusterPolicy.adoptExisting=true",
            // NFD stays (step 0): kiln's own node discovery is not wanted beside it.
            "--set",
            "nfd.enabled=false",
        ],
    )
    .await?;
    println!("{out}");
    let adopted = serde_json::to_value(policies.get(POLICY).await?)?;
    assert_eq!(
        helm_owner(&adopted),
        (KILN_RELEASE.into(), ns.into(), "Helm".into())
    );
    assert_eq!(adopted["spec"], policy["spec"], "the policy's spec changed");

    // 3. kiln's operator adopts the operands.
    let operator = nvidia::start_operator(client.clone())?;
    nvidia::adopted(cluster, &client, POLICY, &objs).await?;

    // 4. NVIDIA's release goes without `helm uninstall`, which would delete every object of
    // its stored manifest, the policy kiln's release now owns included (and with it, through
    // the garbage collector, every operand): its objects that are still its own are deleted,
    // then its release records.
    let deleted = remove_release(cluster, &client, home, NVIDIA_RELEASE).await?;
    println!("deleted NVIDIA's release objects: {deleted:?}");
    assert!(
        !deleted.iter().any(|d| d.starts_with("ClusterPolicy")),
        "{deleted:?}"
    );
    cluster
        .wait_for(
            "NVIDIA's operator Deployment gone",
            nvidia::TIMEOUT,
            || async {
                Ok(match deployments.get_opt(NVIDIA_RELEASE).await? {
                    None => Ok(()),
                    Some(_) => Err("still there".to_string()),
                })
            },
        )
        .await?;
    let kept = serde_json::to_value(policies.get(POLICY).await?)?;
    assert_eq!(kept["metadata"]["uid"], policy["metadata"]["uid"]);
    assert_eq!(kept["spec"], policy["spec"]);

    // 5. kiln's CRD replaces NVIDIA's (same schema, defaults and validation).
    let kiln_crd: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(
        support::repo().join("deploy/crds/clusterpolicies.nvidia.com.yaml"),
    )?)?;
    support::cluster::install_crd(cluster, &client, &kiln_crd, nvidia::TIMEOUT).await?;
    let replaced = serde_json::to_value(policies.get(POLICY).await?)?;
    assert_eq!(
        replaced["spec"], policy["spec"],
        "kiln's CRD defaults differ"
    );

    // A reconcile after all of it (woken by a node label) still changes nothing.
    nvidia::adopted(cluster, &client, POLICY, &objs).await?;
    cluster.label_node(&gpu_nodes[0], &[("kiln.dev/poke", Some("1"))])?;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let after = nvidia::snapshot(&client).await?;
    println!("ControllerRevisions after:\n{}", after.revision_lines());
    nvidia::assert_undisturbed(&before, &after);
    let releases = helm(cluster, home, &["list", "--namespace", ns, "--short"]).await?;
    assert_eq!(releases.trim(), KILN_RELEASE, "{releases}");
    println!(
        "migration: {} objects adopted, 0 templates changed, {} pods kept ({:.1} s)",
        objs.len(),
        after.pods.len(),
        started.elapsed().as_secs_f64()
    );

    // Rollback after step 4 (the guide's second case): kiln stops, NVIDIA's chart is installed
    // over the same objects, kiln's release is removed the same way. The policy goes back to
    // NVIDIA's release with the same spec, the node labels stay (kiln's cleanup hook does not
    // run), and still no DaemonSet changed.
    operator.abort();
    let policy_now = serde_json::to_value(policies.get(POLICY).await?)?;
    helm(
        cluster,
        home,
        &[
            "install",
            NVIDIA_RELEASE,
            "host/operator/tests/data/nvidia-release",
            "--namespace",
            ns,
            "-f",
            &values,
            "--take-ownership",
        ],
    )
    .await?;
    let deleted = remove_release(cluster, &client, home, KILN_RELEASE).await?;
    println!("rollback: deleted kiln's release objects: {deleted:?}");
    let back = serde_json::to_value(policies.get(POLICY).await?)?;
    assert_eq!(
        helm_owner(&back),
        (NVIDIA_RELEASE.into(), ns.into(), "Helm".into())
    );
    assert_eq!(back["metadata"]["uid"], policy["metadata"]["uid"]);
    assert_eq!(
        back["spec"], policy_now["spec"],
        "rollback changed the spec"
    );
    let labelled = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(&gpu_nodes[0])
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(
        labelled
            .get("nvidia.com/gpu.deploy.driver")
            .map(String::as_str),
        Some("true")
    );
    let releases = helm(cluster, home, &["list", "--namespace", ns, "--short"]).await?;
    assert_eq!(releases.trim(), NVIDIA_RELEASE, "{releases}");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    nvidia::assert_undisturbed(&before, &nvidia::snapshot(&client).await?);
    println!(
        "rollback: policy back with NVIDIA's release, 0 templates changed ({:.1} s in all)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
