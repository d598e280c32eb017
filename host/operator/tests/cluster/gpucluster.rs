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
