//! The chart's GPUCluster (`deploy/helm/kiln/templates/gpucluster.yaml`): `gpuCluster.deployCR`
//! and `draDriver.*` mapped as NVIDIA v26.7.0's chart maps them, into a GPUCluster kiln accepts;
//! NVIDIA's template-time refusals; the GPUCluster CRD in `crds/` equal to the one generated from
//! kiln's types (`kiln crdgen --gpu-cluster`) (`helm template`, when `testcluster/bin/helm` is
//! built). On testcluster: the CRD's singleton rule and defaults, and every object kiln renders
//! for the sample GPUCluster accepted by the API server.

use std::process::{Command, Output};

use serde_json::Value;

use super::{helm_template, read, repo};

/// What a GPUCluster install sets: no ClusterPolicy, the driver through the NVIDIADriver CRD,
/// a cluster serving DeviceClasses.
const GPU_CLUSTER: [&str; 8] = [
    "--set",
    "gpuCluster.deployCR=true",
    "--set",
    "clusterPolicy.deployCR=false",
    "--set",
    "driver.nvidiaDriverCRD.enabled=true",
    "--api-versions",
    "resource.k8s.io/v1/DeviceClass",
];

fn helm(extra: &[&str]) -> Option<Output> {
    let helm = repo().join("testcluster/bin/helm");
    if !helm.exists() {
        eprintln!("testcluster/bin/helm not built; skipping");
        return None;
    }
    Some(
        Command::new(&helm)
            .args([
                "template",
                "kiln",
                "deploy/helm/kiln",
                "--namespace",
                super::NS,
            ])
            .args(extra)
            .current_dir(repo())
            .output()
            .unwrap(),
    )
}

#[test]
fn the_chart_maps_dra_driver_into_a_gpucluster_kiln_accepts() {
    let mut args = GPU_CLUSTER.to_vec();
    args.extend([
        "--set",
        "draDriver.featureGates.MPSSupport=true",
        "--set",
        "draDriver.computeDomains.enabled=false",
        "--set",
        "draDriver.gpus.kubeletPlugin.healthcheck.port=52000",
    ]);
    let Some(objects) = helm_template(&args) else {
        return;
    };
    assert!(objects.iter().all(|o| o["kind"] != "ClusterPolicy"));
    let crs: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "GPUCluster")
        .collect();
    assert_eq!(crs.len(), 1);
    let cr = kiln_render::gpucluster::GpuClusterDoc::from_object(crs[0])
        .unwrap_or_else(|e| panic!("kiln refuses the chart's GPUCluster: {e}"));
    assert_eq!(cr.pruned, Vec::<String>::new(), "fields kiln's CRD prunes");
    let d = &cr.spec.dra_driver;
    assert_eq!(
        (d.repository.as_str(), d.image.as_str(), d.version.as_str()),
        ("nvcr.io/nvidia", "dra-driver-nvidia-gpu", "v0.5.0")
    );
    assert_eq!(d.feature_gates_value(), "MPSSupport=true");
    assert!(!d.compute_domains_enabled());
    let gpus = d.gpus.as_ref().and_then(|g| g.kubelet_plugin.as_ref());
    assert_eq!(
        kiln_core::spec::gpucluster::KubeletPluginSpec::health_port(gpus, 51516),
        Some(52000)
    );
    assert_eq!(
        cr.spec.daemonsets.priority_class_name,
        "system-node-critical"
    );
    // The default NVIDIADriver carries the driver.
    assert!(objects.iter().any(|o| o["kind"] == "NVIDIADriver"));
    // Off by default.
    let Some(objects) = helm_template(&[]) else {
        return;
    };
    assert!(objects.iter().all(|o| o["kind"] != "GPUCluster"));
}

/// NVIDIA v26.7.0's own values file (a copy in `tests/data/`) with a GPUCluster install's
/// flags gives a GPUCluster kiln accepts whole, with NVIDIA's DRA driver image.
#[test]
fn nvidias_values_give_a_gpucluster_kiln_accepts() {
    let values = repo().join("host/operator/tests/data/nvidia-v26.7.0-helm-values.yaml");
    let mut args = vec!["-f", values.to_str().unwrap()];
    args.extend(GPU_CLUSTER);
    let Some(objects) = helm_template(&args) else {
        return;
    };
    let cr = objects
        .iter()
        .find(|o| o["kind"] == "GPUCluster")
        .expect("a GPUCluster");
    let cr = kiln_render::gpucluster::GpuClusterDoc::from_object(cr)
        .unwrap_or_else(|e| panic!("kiln refuses the chart's GPUCluster: {e}"));
    assert_eq!(cr.pruned, Vec::<String>::new(), "fields kiln's CRD prunes");
    assert_eq!(cr.spec.dra_driver.image, "dra-driver-nvidia-gpu");
    assert!(cr.spec.dra_driver.compute_domains_enabled());
}

#[test]
fn the_chart_refuses_what_nvidias_refuses() {
    let cases: [(&[&str], &str); 3] = [
        (
            &["--set", "gpuCluster.deployCR=true"],
            "clusterPolicy.deployCR and gpuCluster.deployCR cannot both be true",
        ),
        (
            &[
                "--set",
                "gpuCluster.deployCR=true",
                "--set",
                "clusterPolicy.deployCR=false",
                "--api-versions",
                "resource.k8s.io/v1/DeviceClass",
            ],
            "the NVIDIADriver CRD must be enabled when deploying a GPUCluster CR",
        ),
        (
            &[
                "--set",
                "gpuCluster.deployCR=true",
                "--set",
                "clusterPolicy.deployCR=false",
                "--set",
                "driver.enabled=false",
            ],
            "requires a Kubernetes cluster that supports Dynamic Resource Allocation",
        ),
    ];
    for (args, message) in cases {
        let Some(out) = helm(args) else {
            return;
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(message),
            "{args:?}: expected a refusal with {message:?}, got {stderr}"
        );
    }
    // The driver on the host needs no NVIDIADriver CRD; any served DeviceClass version does.
    let Some(out) = helm(&[
        "--set",
        "gpuCluster.deployCR=true",
        "--set",
        "clusterPolicy.deployCR=false",
        "--set",
        "driver.enabled=false",
        "--api-versions",
        "resource.k8s.io/v1beta1/DeviceClass",
    ]) else {
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `deploy/crds/gpuclusters.nvidia.com.yaml` is `kiln crdgen --gpu-cluster`'s output (the same
/// object), and the chart's `crds/` holds the same file.
#[test]
fn the_committed_gpucluster_crd_is_the_generated_one() {
    let committed = read("deploy/crds/gpuclusters.nvidia.com.yaml");
    assert_eq!(
        committed,
        read("deploy/helm/kiln/crds/gpuclusters.nvidia.com.yaml"),
        "the chart's CRD copy drifted; copy deploy/crds/gpuclusters.nvidia.com.yaml"
    );
    let parsed: Value = serde_yaml_ng::from_str(&committed).unwrap();
    assert_eq!(
        parsed,
        serde_json::to_value(kiln_core::spec::gpucluster::crd()).unwrap(),
        "regenerate: kiln crdgen --gpu-cluster > deploy/crds/gpuclusters.nvidia.com.yaml"
    );
}

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
    let cluster = kiln_testcluster::shared()?;
    cluster.with_logs(accepted(cluster).await)
}

async fn accepted(cluster: &kiln_testcluster::TestCluster) -> anyhow::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams, PostParams};

    let _guard = kiln_testcluster::shared_access().await;
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
    let sample: Value = serde_yaml_ng::from_str(&read("deploy/samples/gpucluster.yaml"))?;
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
