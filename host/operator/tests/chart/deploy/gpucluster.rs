//! The chart's GPUCluster (`deploy/helm/kiln/templates/gpucluster.yaml`): `gpuCluster.deployCR`
//! and `draDriver.*` mapped as NVIDIA v26.7.0's chart maps them, into a GPUCluster kiln accepts;
//! NVIDIA's template-time refusals; the GPUCluster CRD in `crds/` equal to the one generated from
//! kiln's types (`kiln crdgen --gpu-cluster`) (`helm template`, when `testcluster/bin/helm` is
//! built). The API server's side is `cluster/gpucluster.rs`.

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
