//! The GPUCluster controller ([`kiln_operator::controllers::gpucluster`]) against the in-memory
//! API server: what it applies, labels and deletes, its status and conditions through the
//! transitions NVIDIA v26.7.0 has (operands not ready → ready → a ClusterPolicy appears →
//! it goes), and that a reconcile with nothing changed sends no request.

use std::sync::{Arc, Mutex};

use axum::http::Method;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kiln_operator::controllers::gpucluster::live::{DraLive, Meta, dra_kinds};
use kiln_operator::controllers::gpucluster::reconcile::{GpuCaches, GpuContext, reconcile};
use kiln_operator::controllers::gpucluster::{DRA_STATE_LABEL, gpu_cluster_resource};
use kiln_operator::node::SlimNode;
use kiln_operator::store::NamedWriter;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::support::fixtures::node;
use crate::support::mock_api::{Call, Server, calls, client};

const NS: &str = "gpu-operator";
const GC: &str = "/apis/nvidia.com/v1alpha1/gpuclusters/gpu-cluster";

/// The sample GPUCluster (ComputeDomains on, DCGM off, the exporter on).
fn sample() -> Value {
    let mut gc: Value =
        serde_yaml_ng::from_str(include_str!("../../../../deploy/samples/gpucluster.yaml"))
            .unwrap();
    gc["metadata"]["uid"] = json!("gc-uid");
    gc["metadata"]["generation"] = json!(1);
    gc["metadata"]["resourceVersion"] = json!("1");
    gc
}

fn plural(kind: &str) -> String {
    match kind {
        "DeviceClass" => "deviceclasses".into(),
        "ValidatingAdmissionPolicy" => "validatingadmissionpolicies".into(),
        "ValidatingAdmissionPolicyBinding" => "validatingadmissionpolicybindings".into(),
        other => format!("{}s", other.to_lowercase()),
    }
}

fn resource(api_version: &str, kind: &str) -> ApiResource {
    let (g, v) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(g, v, kind), &plural(kind))
}

fn relist<K: kube::Resource + Clone>(w: &mut Writer<K>, objects: Vec<K>)
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    w.apply_watcher_event(&watcher::Event::Init);
    for o in objects {
        w.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    w.apply_watcher_event(&watcher::Event::InitDone);
}

/// The fake cluster and the writers of the controller's stores, which [`Fake::refresh`] fills
/// from the server's objects as the watches would.
struct Fake {
    server: Arc<Mutex<Server>>,
    clusters: Writer<DynamicObject>,
    policies: Writer<Meta>,
    policy_list: Vec<Meta>,
    nodes: NamedWriter<SlimNode>,
    kinds: Vec<(ApiResource, Writer<Meta>)>,
    daemonsets: Writer<DaemonSet>,
    deployments: Writer<Deployment>,
}

impl Fake {
    fn new() -> (Self, Arc<GpuContext>) {
        let server = Arc::new(Mutex::new(Server::default()));
        {
            let mut s = server.lock().unwrap();
            s.insert(node("gpu-1").nfd_gpu().json());
            s.insert(node("cpu-1").json());
            s.insert(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}));
            s.insert(sample());
        }
        let clusters = Writer::<DynamicObject>::new(gpu_cluster_resource());
        let policies = Writer::<Meta>::new(resource("nvidia.com/v1", "ClusterPolicy"));
        let nodes = NamedWriter::<SlimNode>::default();
        let kinds: Vec<(ApiResource, Writer<Meta>)> = dra_kinds("resource.k8s.io/v1")
            .into_iter()
            .filter(|(_, k)| k != "DaemonSet" && k != "Deployment")
            .map(|(a, k)| {
                let ar = resource(&a, &k);
                (ar.clone(), Writer::<Meta>::new(ar))
            })
            .collect();
        let daemonsets = Writer::<DaemonSet>::default();
        let deployments = Writer::<Deployment>::default();
        let live = DraLive::from_parts(
            kinds
                .iter()
                .map(|(ar, w)| (ar.clone(), w.as_reader()))
                .collect(),
            daemonsets.as_reader(),
            deployments.as_reader(),
        );
        let host = kiln_plugin_host::PluginHost::new(
            kiln_plugin_host::HostConfig {
                cache_dir: Some(crate::support::repo().join("target/kiln-test-plugin-cache")),
                ..kiln_plugin_host::HostConfig::default()
            },
            kiln_bundled_plugins::BUNDLED,
        )
        .unwrap();
        let client = client(server.clone());
        let ctx = Arc::new(GpuContext {
            applier: kiln_operator::apply::Applier::new(client.clone()),
            client,
            renderer: kiln_render::Renderer::new(Arc::new(host)),
            namespace: NS.into(),
            kubernetes_version: "v1.36.3".into(),
            images: Vec::new(),
            device_class_api: "resource.k8s.io/v1".into(),
            caches: GpuCaches {
                clusters: clusters.as_reader(),
                policies: policies.as_reader(),
                nodes: nodes.as_reader(),
                live,
            },
            memo: Mutex::default(),
        });
        let mut fake = Fake {
            server,
            clusters,
            policies,
            policy_list: Vec::new(),
            nodes,
            kinds,
            daemonsets,
            deployments,
        };
        fake.refresh();
        (fake, ctx)
    }

    /// The server's objects under `/…/<plural>/` of `ar` carrying [`DRA_STATE_LABEL`].
    fn labelled(&self, plural: &str) -> Vec<Value> {
        let s = self.server.lock().unwrap();
        s.objects
            .iter()
            .filter(|(k, _)| k.contains(&format!("/{plural}/")))
            .filter(|(_, v)| v["metadata"]["labels"][DRA_STATE_LABEL].is_string())
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Every store as a watch would hold the server's objects now.
    fn refresh(&mut self) {
        let objects = self.server.lock().unwrap().objects.clone();
        let gcs: Vec<DynamicObject> = objects
            .iter()
            .filter(|(k, _)| k.starts_with("/apis/nvidia.com/v1alpha1/gpuclusters/"))
            .map(|(_, v)| serde_json::from_value(v.clone()).unwrap())
            .collect();
        relist(&mut self.clusters, gcs);
        relist(&mut self.policies, self.policy_list.clone());
        self.nodes.apply(&watcher::Event::Init);
        for (k, v) in &objects {
            if k.starts_with("/api/v1/nodes/") {
                let n: SlimNode = serde_json::from_value(v.clone()).unwrap();
                self.nodes.apply(&watcher::Event::InitApply(Arc::new(n)));
            }
        }
        self.nodes.apply(&watcher::Event::InitDone);
        for i in 0..self.kinds.len() {
            let plural = self.kinds[i].0.plural.clone();
            let metas: Vec<Meta> = self
                .labelled(&plural)
                .into_iter()
                .map(|v| serde_json::from_value(v).unwrap())
                .collect();
            relist(&mut self.kinds[i].1, metas);
        }
        let ds = self
            .labelled("daemonsets")
            .into_iter()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect();
        relist(&mut self.daemonsets, ds);
        let deploys = self
            .labelled("deployments")
            .into_iter()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect();
        relist(&mut self.deployments, deploys);
    }

    /// Give every labelled DaemonSet (one pod per node its selector matches: the GPU node) and
    /// Deployment a ready status.
    fn operands_ready(&mut self) {
        {
            let mut s = self.server.lock().unwrap();
            for (k, v) in s.objects.iter_mut() {
                if !v["metadata"]["labels"][DRA_STATE_LABEL].is_string() {
                    continue;
                }
                if k.contains("/daemonsets/") {
                    v["status"] = json!({"observedGeneration": 1, "desiredNumberScheduled": 1,
                        "currentNumberScheduled": 1, "numberReady": 1, "numberAvailable": 1,
                        "updatedNumberScheduled": 1, "numberMisscheduled": 0});
                } else if k.contains("/deployments/") {
                    v["status"] = json!({"observedGeneration": 1, "replicas": 1,
                        "readyReplicas": 1, "updatedReplicas": 1, "availableReplicas": 1});
                }
            }
        }
        self.refresh();
    }

    fn calls_since(&self, n: usize) -> Vec<Call> {
        self.server.lock().unwrap().calls[n..].to_vec()
    }

    fn n_calls(&self) -> usize {
        self.server.lock().unwrap().calls.len()
    }

    fn status_line(&self) -> (String, Vec<String>) {
        let s = self.server.lock().unwrap();
        let st = &s.objects[GC]["status"];
        let conds = st["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                format!(
                    "{} {} {}: {}",
                    c["type"].as_str().unwrap(),
                    c["status"].as_str().unwrap(),
                    c["reason"].as_str().unwrap(),
                    c["message"].as_str().unwrap_or_default()
                )
            })
            .collect();
        (st["state"].as_str().unwrap_or_default().to_string(), conds)
    }
}

async fn reconcile_now(ctx: &Arc<GpuContext>) {
    let gc = ctx
        .caches
        .clusters
        .state()
        .pop()
        .expect("the GPUCluster is cached");
    reconcile(gc, ctx.clone()).await.unwrap();
}

fn described(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .filter(|c| c.method != Method::GET)
        .map(|c| format!("{} {}", c.method, c.path))
        .collect()
}

/// The GPUCluster's life against a fake API server: the first reconcile labels the namespace
/// and the GPU node, applies every rendered object labelled and owned, and reports
/// `OperandNotReady`; once the operands are ready the status turns `ready` (`Reconciled`) with
/// one status write, and a reconcile with nothing changed sends no request; disabling the
/// exporter deletes its objects; a ClusterPolicy makes it `notReady` with
/// `PrerequisiteNotMet` naming it (nothing applied or deleted), and its deletion makes it
/// `ready` again.
#[tokio::test]
async fn a_gpucluster_goes_ready_waits_for_a_cluster_policy_and_prunes_what_it_disables() {
    let (mut fake, ctx) = Fake::new();
    reconcile_now(&ctx).await;

    // Namespace, node labels, objects.
    let patches = calls(&fake.server, &Method::PATCH);
    let ns = patches
        .iter()
        .find(|c| c.path == format!("/api/v1/namespaces/{NS}"))
        .expect("the namespace is labelled");
    assert_eq!(
        ns.body["metadata"]["labels"]["resource.kubernetes.io/admin-access"],
        "true"
    );
    let node_patches: Vec<&Call> = patches
        .iter()
        .filter(|c| c.path.starts_with("/api/v1/nodes/"))
        .collect();
    assert_eq!(node_patches.len(), 1, "only the GPU node is labelled");
    assert_eq!(node_patches[0].path, "/api/v1/nodes/gpu-1");
    let labels = &node_patches[0].body["metadata"]["labels"];
    for key in kiln_operator::controllers::gpucluster::labels::DEPLOY_LABELS
        .iter()
        .chain(&["nvidia.com/gpu.present"])
    {
        assert_eq!(labels[*key], "true", "{key}");
    }
    let applied: Vec<&Call> = patches
        .iter()
        .filter(|c| c.body["metadata"]["labels"][DRA_STATE_LABEL].is_string())
        .collect();
    // dra-driver with ComputeDomains (26), dra-validation (3), dcgm-exporter-dra (8).
    assert_eq!(applied.len(), 37);
    for c in &applied {
        let owners = &c.body["metadata"]["ownerReferences"];
        assert_eq!(
            owners,
            &json!([{"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
                "name": "gpu-cluster", "uid": "gc-uid", "controller": true,
                "blockOwnerDeletion": true}]),
            "{}",
            c.path
        );
    }
    assert!(applied.iter().any(|c| c.path
        == "/apis/resource.k8s.io/v1/deviceclasses/gpu.nvidia.com"
        && c.body["apiVersion"] == "resource.k8s.io/v1"));
    assert!(applied.iter().any(|c| c.path
        == "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/resourceslices-policy-nvidia-dra-driver"));
    assert_eq!(
        fake.status_line(),
        (
            "notReady".to_string(),
            vec![
                "Ready False Error: ".to_string(),
                "Error True OperandNotReady: Waiting for operand pods to be ready".to_string()
            ]
        )
    );

    // Nothing changed (the caches now hold what was applied): no request at all.
    fake.refresh();
    let n = fake.n_calls();
    reconcile_now(&ctx).await;
    assert_eq!(described(&fake.calls_since(n)), Vec::<String>::new());
    assert_eq!(fake.calls_since(n).len(), 0, "no reads either");

    // The operands become ready: one status write.
    fake.operands_ready();
    let n = fake.n_calls();
    reconcile_now(&ctx).await;
    assert_eq!(
        described(&fake.calls_since(n)),
        [format!("PATCH {GC}/status")]
    );
    assert_eq!(
        fake.status_line(),
        (
            "ready".to_string(),
            vec![
                "Ready True Reconciled: All resources have been successfully reconciled"
                    .to_string(),
                "Error False Ready: ".to_string()
            ]
        )
    );
    assert_eq!(
        fake.server.lock().unwrap().objects[GC]["status"]["namespace"],
        NS
    );
    fake.refresh();
    let n = fake.n_calls();
    reconcile_now(&ctx).await;
    assert_eq!(fake.calls_since(n).len(), 0, "at rest: no request");

    // The exporter disabled: its 8 objects are deleted, nothing else is written.
    {
        let mut s = fake.server.lock().unwrap();
        let gc = s.objects.get_mut(GC).unwrap();
        gc["spec"]["dcgmExporter"]["enabled"] = json!(false);
        gc["metadata"]["generation"] = json!(2);
    }
    fake.refresh();
    let n = fake.n_calls();
    reconcile_now(&ctx).await;
    let done = described(&fake.calls_since(n));
    assert_eq!(done.len(), 8, "{done:#?}");
    assert!(done.iter().all(|c| c.starts_with("DELETE ")), "{done:#?}");
    assert!(
        done.iter().any(|c| c
            == &format!(
                "DELETE /apis/apps/v1/namespaces/{NS}/daemonsets/nvidia-dcgm-exporter-dra"
            )),
        "{done:#?}"
    );
    assert!(
        done.iter()
            .any(|c| c == "DELETE /apis/rbac.authorization.k8s.io/v1/clusterroles/nvidia-dcgm-exporter-dra-read-pods"),
        "{done:#?}"
    );
    assert_eq!(fake.status_line().0, "ready");

    // A ClusterPolicy appears: notReady naming it; nothing applied or deleted.
    fake.policy_list = vec![
        serde_json::from_value(
            json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "cluster-policy", "creationTimestamp": "2026-01-01T00:00:00Z"}}),
        )
        .unwrap(),
    ];
    fake.refresh();
    let n = fake.n_calls();
    reconcile_now(&ctx).await;
    assert_eq!(
        described(&fake.calls_since(n)),
        [format!("PATCH {GC}/status")]
    );
    assert_eq!(
        fake.status_line(),
        (
            "notReady".to_string(),
            vec![
                "Ready False Error: ".to_string(),
                "Error True PrerequisiteNotMet: A ClusterPolicy CR \"cluster-policy\" exists; a ClusterPolicy CR and GPUCluster CR may not exist at the same time".to_string()
            ]
        )
    );

    // The ClusterPolicy goes: ready again, with nothing to apply.
    fake.policy_list.clear();
    fake.refresh();
    let n = fake.n_calls();
    reconcile_now(&ctx).await;
    assert_eq!(
        described(&fake.calls_since(n)),
        [format!("PATCH {GC}/status")]
    );
    assert_eq!(fake.status_line().0, "ready");
}

/// A GPUCluster whose spec fails the CRD's rules gets `ReconcileFailed` naming the field, and
/// nothing is applied.
#[tokio::test]
async fn an_invalid_gpucluster_reports_the_field_and_applies_nothing() {
    let (mut fake, ctx) = Fake::new();
    {
        let mut s = fake.server.lock().unwrap();
        s.objects.get_mut(GC).unwrap()["spec"]["draDriver"]["gpus"]["kubeletPlugin"]["healthcheck"] =
            json!({"port": 0});
    }
    fake.refresh();
    reconcile_now(&ctx).await;
    assert_eq!(
        described(&fake.calls_since(0)),
        [format!("PATCH {GC}/status")]
    );
    let (state, conds) = fake.status_line();
    assert_eq!(state, "notReady");
    assert!(
        conds[1].starts_with("Error True ReconcileFailed: ")
            && conds[1].contains("healthcheck.port"),
        "{conds:?}"
    );
}
