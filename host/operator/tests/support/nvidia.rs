//! A cluster as NVIDIA GPU Operator v26.7.0 leaves it, for the takeover and migration tests:
//! its operand objects (the goldens of `host/render/tests/data/nvidia-v26.7.0/`, owned by a
//! ClusterPolicy, with NVIDIA's labels and annotations, created by field manager
//! `gpu-operator`), its node labels, and what to compare before and after kiln takes over
//! (ControllerRevisions, DaemonSet generations and templates, operand pods).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kiln_core::spec::ClusterPolicy;
use kiln_testcluster::TestCluster;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

/// The operand namespace of NVIDIA's sample and kiln's default.
pub const NS: &str = "gpu-operator";
/// How long a step may take.
pub const TIMEOUT: Duration = Duration::from_secs(90);
/// The field manager NVIDIA's operator writes with (its binary name, controller-runtime's
/// default).
pub const NVIDIA_MANAGER: &str = "gpu-operator";
/// The sample with every operand on NVIDIA's image: the one variant where kiln's DaemonSets
/// equal NVIDIA's completely (kiln's own image runs other commands in some containers).
pub const VARIANT: &str = "ix-nvidia-images";

fn golden_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../render/tests/data/nvidia-v26.7.0")
}

fn read_json(path: &std::path::Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    Ok(serde_json::from_str(&text)?)
}

/// The variant's policy document (NVIDIA's sample), renamed `name`, as JSON.
pub fn policy(name: &str) -> anyhow::Result<Value> {
    let path = golden_root().join(format!("policies/{VARIANT}.yaml"));
    let mut doc: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path)?)?;
    doc["metadata"] = json!({ "name": name });
    Ok(doc)
}

/// The `--image ENV=IMAGE` facts of the variant (`variants.json`), as the operator's
/// `Config::images`.
pub fn images() -> anyhow::Result<Vec<(String, String)>> {
    let variants = read_json(&golden_root().join("variants.json"))?;
    let flags = variants[VARIANT]["kiln_render_flags"]
        .as_array()
        .context("kiln_render_flags")?;
    let mut out = Vec::new();
    for pair in flags.chunks(2) {
        if pair[0] == "--image" {
            let (env, image) = pair[1]
                .as_str()
                .and_then(|s| s.split_once('='))
                .context("--image ENV=IMAGE")?;
            out.push((env.to_string(), image.to_string()));
        }
    }
    Ok(out)
}

/// NVIDIA's objects for the variant, owned by the ClusterPolicy `owner` (name, uid): every
/// other object first (RuntimeClasses, ServiceAccounts, RBAC, ConfigMaps, Services, which the
/// pods need), then the DaemonSets. `status` is dropped (the API server owns it).
pub fn objects(owner_name: &str, owner_uid: &str) -> anyhow::Result<Vec<Value>> {
    let dir = golden_root().join(VARIANT);
    let index = read_json(&dir.join("_index.json"))?;
    let mut out: Vec<Value> = read_json(&dir.join("_other-objects.json"))?
        .as_array()
        .context("_other-objects.json")?
        .clone();
    for name in index["daemonsets"].as_array().context("daemonsets")? {
        let name = name.as_str().context("daemonset name")?;
        out.push(read_json(&dir.join(format!("{name}.json")))?);
    }
    for o in &mut out {
        if let Some(m) = o.as_object_mut() {
            m.remove("status");
        }
        for r in o["metadata"]["ownerReferences"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            r["name"] = json!(owner_name);
            r["uid"] = json!(owner_uid);
        }
    }
    Ok(out)
}

/// The API of `obj`'s kind, in its namespace when the kind is namespaced.
pub async fn api_for(client: &Client, obj: &Value) -> anyhow::Result<Api<DynamicObject>> {
    let av = obj["apiVersion"].as_str().context("apiVersion")?;
    let kind = obj["kind"].as_str().context("kind")?;
    let (group, version) = av.split_once('/').unwrap_or(("", av));
    let (ar, caps): (ApiResource, _) =
        kube::discovery::pinned_kind(client, &GroupVersionKind::gvk(group, version, kind)).await?;
    Ok(match (caps.scope, obj["metadata"]["namespace"].as_str()) {
        (kube::discovery::Scope::Namespaced, Some(ns)) => {
            Api::namespaced_with(client.clone(), ns, &ar)
        }
        _ => Api::all_with(client.clone(), &ar),
    })
}

/// Creates `objs` (POST, field manager [`NVIDIA_MANAGER`]), as NVIDIA's operator does.
pub async fn create_all(client: &Client, objs: &[Value]) -> anyhow::Result<()> {
    let pp = PostParams {
        field_manager: Some(NVIDIA_MANAGER.into()),
        ..PostParams::default()
    };
    for o in objs {
        let api = api_for(client, o).await?;
        api.create(&pp, &serde_json::from_value(o.clone())?)
            .await
            .with_context(|| format!("create {} {}", o["kind"], o["metadata"]["name"]))?;
    }
    Ok(())
}

/// The ClusterPolicy API over raw JSON (a typed ClusterPolicy would serialize every
/// defaulted field).
pub fn raw_policies(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<ClusterPolicy>(&()))
}

/// Labels every node with an NVIDIA PCI device (NFD's labels) as NVIDIA's operator leaves it: `nvidia.com/gpu.present` and a
/// `nvidia.com/gpu.deploy.<component>=true` per container operand.
pub async fn label_gpu_nodes(client: &Client) -> anyhow::Result<Vec<String>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut labels = serde_json::Map::new();
    labels.insert(kiln_core::labels::GPU_PRESENT.into(), json!("true"));
    for c in kiln_core::labels::CONTAINER_COMPONENTS {
        labels.insert(
            format!("{}{c}", kiln_core::labels::DEPLOY_PREFIX),
            json!("true"),
        );
    }
    let mut gpu = Vec::new();
    for n in nodes.list(&ListParams::default()).await?.items {
        let name = n.metadata.name.clone().unwrap_or_default();
        if !kiln_core::labels::has_gpu_pci_labels(&n.metadata.labels.clone().unwrap_or_default()) {
            continue;
        }
        nodes
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": labels}})),
            )
            .await?;
        gpu.push(name);
    }
    Ok(gpu)
}

/// What must not change when kiln takes over: per DaemonSet its generation, its pod template
/// and its ControllerRevisions (name → revision), and its pods (name → uid).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// DaemonSet → `metadata.generation`.
    pub generations: BTreeMap<String, i64>,
    /// DaemonSet → `spec.template` as stored.
    pub templates: BTreeMap<String, Value>,
    /// ControllerRevision name → (owning DaemonSet, revision).
    pub revisions: BTreeMap<String, (String, i64)>,
    /// Pod name → uid, for every DaemonSet pod of the namespace.
    pub pods: BTreeMap<String, String>,
}

impl Snapshot {
    /// The ControllerRevisions, one line each (`DaemonSet: name (revision N)`).
    pub fn revision_lines(&self) -> String {
        self.revisions
            .iter()
            .map(|(name, (ds, rev))| format!("  {ds}: {name} (revision {rev})\n"))
            .collect()
    }
}

/// Reads a [`Snapshot`] of [`NS`].
pub async fn snapshot(client: &Client) -> anyhow::Result<Snapshot> {
    let lp = ListParams::default();
    let mut s = Snapshot {
        generations: BTreeMap::new(),
        templates: BTreeMap::new(),
        revisions: BTreeMap::new(),
        pods: BTreeMap::new(),
    };
    for ds in Api::<DaemonSet>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
        .items
    {
        let name = ds.metadata.name.clone().unwrap_or_default();
        s.generations
            .insert(name.clone(), ds.metadata.generation.unwrap_or_default());
        let template = ds.spec.map(|sp| sp.template);
        s.templates.insert(name, serde_json::to_value(template)?);
    }
    for cr in Api::<ControllerRevision>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
        .items
    {
        let owner = cr
            .metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .find(|o| o.kind == "DaemonSet")
            .map(|o| o.name)
            .unwrap_or_default();
        s.revisions
            .insert(cr.metadata.name.unwrap_or_default(), (owner, cr.revision));
    }
    for p in Api::<Pod>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
        .items
    {
        let of_daemonset = p
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "DaemonSet");
        if of_daemonset && p.metadata.deletion_timestamp.is_none() {
            s.pods.insert(
                p.metadata.name.unwrap_or_default(),
                p.metadata.uid.unwrap_or_default(),
            );
        }
    }
    Ok(s)
}

/// Waits until every DaemonSet of `names` has a ControllerRevision and its pods (the
/// controller has observed it and scheduled, and kwok readied, a pod on every node it
/// selects), with a driver pod on each of the `gpu_nodes`; then returns the snapshot.
pub async fn settled(
    cluster: &TestCluster,
    client: &Client,
    names: &[String],
    gpu_nodes: usize,
) -> anyhow::Result<Snapshot> {
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    cluster
        .wait_for(
            "NVIDIA's DaemonSets have revisions and pods",
            TIMEOUT,
            || async {
                let s = snapshot(client).await?;
                let mut waiting: Vec<String> = names
                    .iter()
                    .filter(|n| !s.revisions.values().any(|(ds, _)| ds == *n))
                    .map(|n| format!("{n}: no revision"))
                    .collect();
                for ds in dss.list(&ListParams::default()).await?.items {
                    let st = ds.status.clone().unwrap_or_default();
                    let done = st.observed_generation == ds.metadata.generation
                        && st.current_number_scheduled == st.desired_number_scheduled
                        && st.number_ready == st.desired_number_scheduled;
                    if !done {
                        waiting.push(format!(
                            "{}: {}/{} ready",
                            ds.metadata.name.unwrap_or_default(),
                            st.number_ready,
                            st.desired_number_scheduled
                        ));
                    }
                }
                let drivers = s
                    .pods
                    .keys()
                    .filter(|p| p.starts_with("nvidia-driver-daemonset-"))
                    .count();
                if drivers != gpu_nodes {
                    waiting.push(format!("{drivers}/{gpu_nodes} driver pods"));
                }
                Ok(if waiting.is_empty() {
                    Ok(s)
                } else {
                    Err(waiting.join(", "))
                })
            },
        )
        .await
}

/// The names of the DaemonSets among `objs`.
pub fn daemonset_names(objs: &[Value]) -> Vec<String> {
    objs.iter()
        .filter(|o| o["kind"] == "DaemonSet")
        .filter_map(|o| o["metadata"]["name"].as_str().map(String::from))
        .collect()
}

/// Starts kiln's operator in this process on [`NS`], with the variant's images.
pub fn start_operator(client: Client) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let config = kiln_operator::Config {
        namespace: NS.into(),
        metrics_addr: "127.0.0.1:0".into(),
        images: images()?,
        ..kiln_operator::Config::default()
    };
    let (task, _) = super::cluster::start_operator(client, Default::default(), config)?;
    Ok(task)
}

/// The policy's `status.state` and conditions, one line ([`super::cluster::policy_state`]).
pub async fn policy_state(client: &Client, name: &str) -> anyhow::Result<(String, String)> {
    super::cluster::policy_state(&Api::all(client.clone()), name).await
}

/// Waits until every object of `objs` carries kiln's state label and a managedFields entry
/// of kiln's field manager (`Apply`), and the policy is `ready`.
pub async fn adopted(
    cluster: &TestCluster,
    client: &Client,
    policy: &str,
    objs: &[Value],
) -> anyhow::Result<()> {
    cluster
        .wait_for("kiln adopted NVIDIA's objects", TIMEOUT, || async {
            let mut not = Vec::new();
            for o in objs {
                let name = o["metadata"]["name"].as_str().unwrap_or_default();
                let live = api_for(client, o).await?.get(name).await?;
                let labelled = live
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(kiln_core::plan::STATE_LABEL))
                    .is_some();
                let managed = live
                    .metadata
                    .managed_fields
                    .unwrap_or_default()
                    .iter()
                    .any(|m| {
                        m.manager.as_deref() == Some(kiln_operator::apply::FIELD_MANAGER)
                            && m.operation.as_deref() == Some("Apply")
                    });
                if !(labelled && managed) {
                    not.push(format!("{} {name}", o["kind"].as_str().unwrap_or_default()));
                }
            }
            let (state, msg) = policy_state(client, policy).await?;
            Ok(if not.is_empty() && state == "ready" {
                Ok(())
            } else {
                Err(format!("not adopted: {not:?}; policy {state}: {msg}"))
            })
        })
        .await
}

/// Asserts that the takeover changed no DaemonSet: same generations, templates,
/// ControllerRevisions and pods; and that no template carries kiln's state label.
pub fn assert_undisturbed(before: &Snapshot, after: &Snapshot) {
    for (name, t) in &after.templates {
        let labels = &t["metadata"]["labels"];
        assert!(
            labels.get(kiln_core::plan::STATE_LABEL).is_none(),
            "{name}: kiln's state label in the pod template: {labels}"
        );
        if let Some(b) = before.templates.get(name) {
            assert_eq!(b, t, "{name}: pod template changed");
        }
    }
    assert_eq!(
        before.generations, after.generations,
        "DaemonSet generations"
    );
    assert_eq!(before.revisions, after.revisions, "ControllerRevisions");
    assert_eq!(before.pods, after.pods, "operand pods (name → uid)");
}
