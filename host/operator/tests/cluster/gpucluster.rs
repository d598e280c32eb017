//! kiln's GPUCluster on a real control plane: the CRD's singleton rule and defaults, and every
//! object kiln renders for the sample GPUCluster accepted by the API server (the chart's side is
//! `chart/deploy/gpucluster.rs`).

use serde_json::Value;

use crate::support;
use crate::support::repo;

/// The kind's plural, for the kinds `kiln render --gpu-cluster` gives.
fn plural(kind: &str) -> String {
    match kind {
        "DeviceClass" => "deviceclasses".into(),
        "ValidatingAdmissionPolicy" => "validatingadmissionpolicies".into(),
        "ValidatingAdmissionPolicyBinding" => "validatingadmissionpolicybindings".into(),
        "ClusterPolicy" => "clusterpolicies".into(),
        other => format!("{}s", other.to_lowercase()),
    }
}

fn api_of(client: &kube::Client, obj: &Value) -> kube::Api<kube::api::DynamicObject> {
    let (group, version) = obj["apiVersion"]
        .as_str()
        .unwrap()
        .rsplit_once('/')
        .unwrap_or(("", obj["apiVersion"].as_str().unwrap()));
    let kind = obj["kind"].as_str().unwrap();
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, &plural(kind));
    match obj["metadata"]["namespace"].as_str() {
        Some(ns) => kube::Api::namespaced_with(client.clone(), ns, &ar),
        None => kube::Api::all_with(client.clone(), &ar),
    }
}

/// On a real control plane (testcluster): kiln's GPUCluster CRD is served and enforces the
/// singleton rule; the sample GPUCluster is stored with exactly the defaults kiln applies
/// offline; and every object `kiln render --gpu-cluster` gives for it (DeviceClasses at
/// `resource.k8s.io/v1`, the admission policy's CEL, the admin-access ResourceClaimTemplates
/// in a namespace labelled for admin access, the DaemonSets and the controller Deployment) is
/// accepted by the API server (server-side apply, dry run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_api_server_accepts_the_gpucluster_and_its_rendered_objects() -> anyhow::Result<()> {
    let turn = support::cluster::start(kiln_testcluster::Options {
        nodes: 1,
        gpu_nodes: 0,
        ..kiln_testcluster::Options::default()
    })
    .await?;
    accepted(turn.cluster()).await
}

async fn accepted(cluster: &kiln_testcluster::TestCluster) -> anyhow::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams, PostParams};

    let client = cluster.client().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = kiln_core::spec::gpucluster::crd();
    crds.patch(
        "gpuclusters.nvidia.com",
        &PatchParams::apply("kiln").force(),
        &Patch::Apply(&crd),
    )
    .await?;
    cluster
        .wait_for(
            "the GPUCluster CRD to be Established",
            kiln_testcluster::DEFAULT_TIMEOUT,
            || {
                let crds = crds.clone();
                async move {
                    let crd = crds.get("gpuclusters.nvidia.com").await?;
                    let established = crd
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True");
                    Ok(if established {
                        Ok(())
                    } else {
                        Err("not Established".to_string())
                    })
                }
            },
        )
        .await?;
    let sample: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(
        repo().join("deploy/samples/gpucluster.yaml"),
    )?)?;
    let gpuclusters = api_of(&client, &sample);
    let mut other = sample.clone();
    other["metadata"]["name"] = "mine".into();
    let refused = gpuclusters
        .create(&PostParams::default(), &serde_json::from_value(other)?)
        .await
        .expect_err("a GPUCluster not named gpu-cluster");
    assert!(
        refused.to_string().contains("GPUCluster is a singleton"),
        "{refused}"
    );
    let stored = gpuclusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(sample.clone())?,
        )
        .await?;
    let cr = kiln_render::gpucluster::GpuClusterDoc::from_object(&sample)?;
    let offline: Value = serde_json::from_str(&cr.spec_text)?;
    assert_eq!(
        stored.data["spec"], offline,
        "the API server's defaults vs kiln's offline ones"
    );
    gpuclusters
        .delete("gpu-cluster", &Default::default())
        .await?;

    let ns = kiln_testcluster::namespace(&client, "dra").await?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {
                "resource.kubernetes.io/admin-access": "true"}}})),
        )
        .await?;
    let host = kiln_plugin_host::PluginHost::new(
        kiln_plugin_host::HostConfig {
            cache_dir: Some(repo().join("target/kiln-test-plugin-cache")),
            ..kiln_plugin_host::HostConfig::in_memory()
        },
        kiln_bundled_plugins::BUNDLED,
    )?;
    let renderer = kiln_render::Renderer::new(std::sync::Arc::new(host));
    let mut ctx = kiln_render::defaults::render_context();
    ctx.operator_namespace = ns.clone();
    let mut refused = Vec::new();
    let mut applied = 0;
    for (state, objects) in kiln_render::gpucluster::render(
        &renderer,
        &cr,
        &ctx,
        kiln_render::gpucluster::DEVICE_CLASS_API,
    ) {
        for obj in objects.map_err(|e| anyhow::anyhow!("{state}: {e}"))? {
            let name = obj["metadata"]["name"].as_str().unwrap().to_string();
            let result = api_of(&client, &obj)
                .patch(
                    &name,
                    &PatchParams::apply("kiln").force().dry_run(),
                    &Patch::Apply(&obj),
                )
                .await;
            match result {
                Ok(_) => applied += 1,
                Err(e) => refused.push(format!("{state}: {} {name}: {e}", obj["kind"])),
            }
        }
    }
    assert_eq!(
        refused,
        Vec::<String>::new(),
        "objects the API server refuses"
    );
    // dra-driver with ComputeDomains (26), dra-validation (3), dcgm-exporter-dra (8).
    assert_eq!(applied, 37);
    Ok(())
}

/// Every request a client sends (`METHOD path?query`), recorded by a tower layer.
#[derive(Clone, Default)]
struct Requests(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

/// The service [`Requests`] wraps.
#[derive(Clone)]
struct Recorded<S>(S, Requests);

impl<S> tower::Layer<S> for Requests {
    type Service = Recorded<S>;
    fn layer(&self, inner: S) -> Recorded<S> {
        Recorded(inner, self.clone())
    }
}

impl<S, B> tower::Service<axum::http::Request<B>> for Recorded<S>
where
    S: tower::Service<axum::http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }
    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        (self.1)
            .0
            .lock()
            .unwrap()
            .push(format!("{} {}", req.method(), req.uri()));
        self.0.call(req)
    }
}

impl Requests {
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    /// The requests from the `from`-th on that are not watches.
    fn since(&self, from: usize) -> Vec<String> {
        self.0.lock().unwrap()[from..]
            .iter()
            .filter(|r| !r.contains("watch=true"))
            .cloned()
            .collect()
    }
}

/// The GPUCluster's `status.state` and its conditions on one line.
async fn gpu_cluster_state(
    api: &kube::Api<kube::api::DynamicObject>,
) -> anyhow::Result<(String, String)> {
    let gc = api.get("gpu-cluster").await?;
    let status = gc.data.get("status").cloned().unwrap_or_default();
    let conditions = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}={} {}: {}",
                c["type"].as_str().unwrap_or_default(),
                c["status"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default(),
                c["message"].as_str().unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join(" | ");
    Ok((
        status["state"].as_str().unwrap_or_default().to_string(),
        conditions,
    ))
}

/// A ResourceSlice of `node` offering one GPU as NVIDIA's kubelet plugin publishes it (driver
/// `gpu.nvidia.com`, the attribute the `gpu.nvidia.com` DeviceClass selects on).
fn resource_slice(node: &str) -> Value {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-gpu.nvidia.com")},
        "spec": {
            "driver": "gpu.nvidia.com", "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {
                "type": {"string": "gpu"}, "index": {"int": 0},
                "productName": {"string": "NVIDIA H100 80GB HBM3"}}}]
        }
    })
}

/// Done-when of the GPUCluster controller on a real control plane: a GPUCluster and an
/// NVIDIADriver (no ClusterPolicy) bring the DRA kubelet plugin's DaemonSet ready on every GPU
/// node (the controller labels them), the DeviceClasses and the ResourceSlice admission policy
/// exist, the operator namespace is labelled for admin access; once a ResourceSlice offers each
/// node's GPU (published here, as NVIDIA's kubelet plugin would) the validator and exporter
/// claims are allocated and the status turns `ready` (`Reconciled`), and a workload pod with a
/// ResourceClaim for `gpu.nvidia.com` is scheduled. At rest the operator sends no request but
/// watches (counted by a layer on its client). A ClusterPolicy created then turns the
/// GPUCluster `notReady` with `PrerequisiteNotMet` naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpucluster_and_an_nvidiadriver_bring_up_dra_and_yield_to_a_cluster_policy()
-> anyhow::Result<()> {
    let turn = support::cluster::start(kiln_testcluster::Options {
        nodes: 3,
        gpu_nodes: 2,
        ..kiln_testcluster::Options::default()
    })
    .await?;
    let cluster = turn.cluster();
    cluster.with_logs(dra_stack(cluster).await)
}

async fn dra_stack(cluster: &'static kiln_testcluster::TestCluster) -> anyhow::Result<()> {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
    use kube::api::{Api, PostParams};
    use std::time::Duration;

    let timeout = Duration::from_secs(40);
    let admin = cluster.client().await?;
    for crd in [
        serde_json::to_value(kiln_operator::crd::crd())?,
        serde_json::to_value(kiln_operator::crd::nvidia_driver_crd())?,
        serde_json::to_value(kiln_core::spec::gpucluster::crd())?,
    ] {
        support::cluster::install_crd(cluster, &admin, &crd, timeout).await?;
    }
    let ns = kiln_testcluster::namespace(&admin, "gpuc").await?;
    // The operator, in-process, its requests recorded.
    let requests = Requests::default();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(cluster.kubeconfig_path())?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    let client = kube::client::ClientBuilder::try_from(kiln_operator::watch::tune_client(config))?
        .with_layer(&requests)
        .build();
    let (_operator, _host) = support::cluster::start_operator(
        client,
        kiln_plugin_host::HostConfig {
            cache_dir: Some(repo().join("target/kiln-test-plugin-cache")),
            ..kiln_plugin_host::HostConfig::default()
        },
        kiln_operator::Config {
            namespace: ns.clone(),
            metrics_addr: "127.0.0.1:0".into(),
            ..kiln_operator::Config::default()
        },
    )?;

    let mut driver: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(
        repo().join("deploy/samples/nvidiadriver.yaml"),
    )?)?;
    driver["spec"]
        .as_object_mut()
        .unwrap()
        .remove("nodeSelector");
    let gc: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(
        repo().join("deploy/samples/gpucluster.yaml"),
    )?)?;
    api_of(&admin, &driver)
        .create(
            &PostParams::default(),
            &serde_json::from_value(driver.clone())?,
        )
        .await?;
    let gcs = api_of(&admin, &gc);
    gcs.create(&PostParams::default(), &serde_json::from_value(gc.clone())?)
        .await?;

    // The DRA kubelet plugin on both GPU nodes (labelled by the controller), the driver too.
    let daemonsets: Api<DaemonSet> = Api::namespaced(admin.clone(), &ns);
    for selector in [
        "kiln.dev/dra-state=dra-driver",
        "kiln.dev/nvidiadriver=gpu-pool-a",
    ] {
        cluster
            .wait_for(
                format!("the DaemonSet {selector} ready on 2 nodes"),
                timeout,
                || {
                    let daemonsets = daemonsets.clone();
                    async move {
                        let listed = daemonsets
                            .list(&kube::api::ListParams::default().labels(selector))
                            .await?
                            .items;
                        let Some(d) = listed.into_iter().next() else {
                            return Ok(Err("not there".to_string()));
                        };
                        let s = d.status.unwrap_or_default();
                        Ok(if s.number_ready == 2 && s.desired_number_scheduled == 2 {
                            Ok(())
                        } else {
                            Err(format!(
                                "{} of {} ready",
                                s.number_ready, s.desired_number_scheduled
                            ))
                        })
                    }
                },
            )
            .await?;
    }
    let nodes: Api<Node> = Api::all(admin.clone());
    let gpu_nodes: Vec<String> = nodes
        .list(&kube::api::ListParams::default().labels("nvidia.com/gpu.deploy.dra-driver=true"))
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert_eq!(gpu_nodes.len(), 2, "{gpu_nodes:?}");
    let namespace = Api::<Namespace>::all(admin.clone()).get(&ns).await?;
    assert_eq!(
        namespace.metadata.labels.unwrap_or_default()["resource.kubernetes.io/admin-access"],
        "true"
    );
    for obj in [
        serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com"}}),
        serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "mig.nvidia.com"}}),
        serde_json::json!({"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "resourceslices-policy-nvidia-dra-driver"}}),
        serde_json::json!({"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "resourceslices-policy-nvidia-dra-driver"}}),
    ] {
        let name = obj["metadata"]["name"].as_str().unwrap();
        let live = api_of(&admin, &obj).get(name).await?;
        assert_eq!(
            live.metadata.labels.unwrap_or_default()["kiln.dev/dra-state"],
            "dra-driver",
            "{name}"
        );
    }

    // The kubelet plugin's part: one GPU a node in a ResourceSlice.
    for node in &gpu_nodes {
        let slice = resource_slice(node);
        api_of(&admin, &slice)
            .create(
                &PostParams::default(),
                &serde_json::from_value(slice.clone())?,
            )
            .await?;
    }
    let line = cluster
        .wait_for("the GPUCluster ready", timeout, || {
            let gcs = gcs.clone();
            async move {
                let (state, line) = gpu_cluster_state(&gcs).await?;
                Ok(if state == "ready" {
                    Ok(line)
                } else {
                    Err(format!("{state}: {line}"))
                })
            }
        })
        .await?;
    assert_eq!(
        line,
        "Ready=True Reconciled: All resources have been successfully reconciled | Error=False Ready: "
    );

    // A workload claiming a GPU through the DeviceClass is scheduled.
    let work = kiln_testcluster::namespace(&admin, "work").await?;
    let template = serde_json::json!({"apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate", "metadata": {"name": "one-gpu", "namespace": work},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu",
            "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}});
    api_of(&admin, &template)
        .create(
            &PostParams::default(),
            &serde_json::from_value(template.clone())?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &work);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "cuda"},
            "spec": {"containers": [{"name": "cuda", "image": "nvcr.io/nvidia/cuda:12.8.0-base",
                "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]}}))?,
    )
    .await?;
    let on = cluster
        .wait_for("the workload pod scheduled", timeout, || {
            let pods = pods.clone();
            async move {
                let p = pods.get("cuda").await?;
                Ok(p.spec
                    .and_then(|s| s.node_name)
                    .ok_or_else(|| "not scheduled".to_string()))
            }
        })
        .await?;
    assert!(gpu_nodes.contains(&on), "{on}");

    // At rest: the operator sends nothing but watches.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let from = requests.len();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let at_rest = requests.since(from);
    eprintln!(
        "operator requests in 10 s at rest with a GPUCluster: {} ({} in all, watches included)",
        at_rest.len(),
        requests.len() - from
    );
    assert_eq!(at_rest, Vec::<String>::new(), "requests at rest");

    // A ClusterPolicy appears: the GPUCluster yields, naming it.
    let mut policy: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(
        repo().join("deploy/samples/clusterpolicy.yaml"),
    )?)?;
    policy["metadata"]["name"] = "cluster-policy".into();
    api_of(&admin, &policy)
        .create(
            &PostParams::default(),
            &serde_json::from_value(policy.clone())?,
        )
        .await?;
    let line = cluster
        .wait_for("the GPUCluster notReady", timeout, || {
            let gcs = gcs.clone();
            async move {
                let (state, line) = gpu_cluster_state(&gcs).await?;
                Ok(if state == "notReady" {
                    Ok(line)
                } else {
                    Err(format!("{state}: {line}"))
                })
            }
        })
        .await?;
    assert_eq!(
        line,
        "Ready=False Error:  | Error=True PrerequisiteNotMet: A ClusterPolicy CR \"cluster-policy\" exists; a ClusterPolicy CR and GPUCluster CR may not exist at the same time"
    );
    Ok(())
}
