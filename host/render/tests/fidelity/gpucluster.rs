//! Field-by-field differential test of GPUCluster renders against NVIDIA GPU Operator v26.7.0's
//! own (issue 38).
//!
//! `tests/data/nvidia-v26.7.0-gpucluster/golden/` holds NVIDIA's 8 golden renders of the
//! GPUCluster's DRA states (dra-driver, dra-validation, dcgm and dcgm-exporter; its
//! `internal/state/testdata/golden/gpucluster-*.yaml`); `cases.yaml` gives, per golden, the
//! state, the operator's fallback images and the GPUCluster spec, which are NVIDIA's test inputs.
//! For every case this test renders the state as `kiln render --gpu-cluster` does
//! ([`kiln_render::gpucluster::render_state`]), normalises both sides with the ClusterPolicy
//! harness's [`super::normalise`] and pairs and compares the objects as the NVIDIADriver test
//! does ([`super::nvidiadriver::golden_diffs`]). Each difference is one line,
//! `<golden>/<Kind>/<nvidia name>: <path>: <what>`.
//!
//! The committed allowlist (`tests/data/gpucluster-allowlist.yaml`) names every accepted
//! difference with its reason; the test fails on a difference that is not listed and on a listed
//! one that no longer occurs. Run with `--nocapture` for the per-golden counts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use kiln_core::context::TransformContext;
use kiln_core::spec::gpucluster::DraState;
use kiln_render::gpucluster::{DEVICE_CLASS_API, GpuClusterDoc, render_state};
use kiln_render::{Renderer, defaults};
use serde::Deserialize;
use serde_json::{Value, json};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nvidia-v26.7.0-gpucluster")
}

fn allowlist_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpucluster-allowlist.yaml")
}

fn kiln_image_allowlist_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpucluster-kiln-image-allowlist.yaml")
}

/// One case of `cases.yaml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    /// The DRA state NVIDIA rendered.
    state: String,
    /// The operator's fallback images, `[ENV, image]`.
    images: Vec<(String, String)>,
    /// The GPUCluster spec.
    spec: Value,
}

#[derive(Debug, Deserialize)]
struct Cases {
    cases: BTreeMap<String, Case>,
}

/// One group of the allowlist: why, and the exact difference lines.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Allowed {
    reason: String,
    diffs: Vec<String>,
}

/// The render context of a case: namespace `test-operator`, no ServiceMonitor CRD, the
/// case's fallback images.
fn context(case: &Case) -> TransformContext {
    let mut ctx = defaults::render_context();
    ctx.operator_namespace = "test-operator".into();
    ctx.has_service_monitor_crd = false;
    for (env, image) in &case.images {
        defaults::set_fallback_image(&mut ctx, env, image);
    }
    ctx
}

/// kiln's objects for one case.
fn kiln_objects(renderer: &Renderer, golden: &str, case: &Case) -> Vec<Value> {
    let doc = json!({
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster"},
        "spec": case.spec,
    });
    let cr = GpuClusterDoc::from_object(&doc).unwrap_or_else(|e| panic!("{golden}: {e}"));
    let state: DraState = case
        .state
        .parse()
        .unwrap_or_else(|e| panic!("{golden}: {e}"));
    assert!(state.enabled(&cr.spec), "{golden}: {state} is not enabled");
    render_state(renderer, &cr, state, &context(case), DEVICE_CLASS_API)
        .unwrap_or_else(|e| panic!("{golden}: {e}"))
}

/// NVIDIA's objects of one golden.
fn nvidia_objects(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(data().join("golden").join(format!("{name}.yaml")))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{name}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

#[test]
fn kiln_renders_gpuclusters_as_nvidia_v26_7_0_field_by_field() {
    let mut raw: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(data().join("cases.yaml")).unwrap())
            .expect("cases.yaml");
    raw.apply_merge().expect("cases.yaml merge keys");
    let cases: Cases = serde_yaml_ng::from_value(raw).expect("cases.yaml");
    let goldens = super::nvidiadriver::golden_names(&data().join("golden"));
    assert_eq!(goldens.len(), 8, "NVIDIA's GPUCluster goldens");
    assert_eq!(
        cases.cases.keys().cloned().collect::<BTreeSet<_>>(),
        goldens,
        "one case per golden"
    );
    let renderer = Renderer::new(super::super::host());
    let mut all = Vec::new();
    let mut counts = Vec::new();
    for (golden, case) in &cases.cases {
        let d = super::nvidiadriver::golden_diffs(
            golden,
            &kiln_objects(&renderer, golden, case),
            &nvidia_objects(golden),
        );
        counts.push(format!("{golden}: {}", d.len()));
        all.extend(d);
    }
    println!(
        "differing fields per GPUCluster golden:\n  {}",
        counts.join("\n  ")
    );
    let allowed: Vec<Allowed> =
        serde_yaml_ng::from_str(&std::fs::read_to_string(allowlist_path()).unwrap())
            .expect("allowlist");
    for a in &allowed {
        assert!(
            !a.reason.trim().is_empty(),
            "an allowlist group without a reason"
        );
    }
    let listed: BTreeSet<&str> = allowed
        .iter()
        .flat_map(|a| a.diffs.iter().map(String::as_str))
        .collect();
    let found: BTreeSet<&str> = all.iter().map(String::as_str).collect();
    super::assert_allowlist_matches(&found, &listed);
}

/// The dra-driver goldens without ComputeDomains rendered with kiln's image as the DRA driver
/// image (`kiln dra-plugin` in the `gpus` container, issue 39): every difference from NVIDIA's
/// render lies in the `gpus` container and is listed in `gpucluster-kiln-image-allowlist.yaml`
/// (which fails on unlisted and stale lines alike).
#[test]
fn kilns_dra_plugin_differs_from_nvidias_only_in_the_gpus_container() {
    let mut raw: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(data().join("cases.yaml")).unwrap())
            .expect("cases.yaml");
    raw.apply_merge().expect("cases.yaml merge keys");
    let cases: Cases = serde_yaml_ng::from_value(raw).expect("cases.yaml");
    let renderer = Renderer::new(super::super::host());
    let (repository, version) = defaults::KILN_IMAGE
        .rsplit_once(':')
        .expect("kiln's image has a tag");
    let (repository, image) = repository
        .rsplit_once('/')
        .expect("kiln's image has a path");
    let mut all = Vec::new();
    let mut rendered = 0;
    for (golden, case) in &cases.cases {
        let cd = &case.spec["draDriver"]["computeDomains"]["enabled"];
        if case.state != "dra-driver" || cd.as_bool() == Some(true) {
            continue;
        }
        let mut spec = case.spec.clone();
        spec["draDriver"]["repository"] = json!(repository);
        spec["draDriver"]["image"] = json!(image);
        spec["draDriver"]["version"] = json!(version);
        let kiln_case = Case {
            state: case.state.clone(),
            images: case.images.clone(),
            spec,
        };
        let d = super::nvidiadriver::golden_diffs(
            golden,
            &kiln_objects(&renderer, golden, &kiln_case),
            &nvidia_objects(golden),
        );
        for line in &d {
            assert!(
                line.contains(".containers[gpus]."),
                "a kiln-image difference outside the gpus container: {line}"
            );
        }
        all.extend(d);
        rendered += 1;
    }
    assert_eq!(rendered, 2, "the dra-driver goldens without ComputeDomains");
    let allowed: Vec<Allowed> =
        serde_yaml_ng::from_str(&std::fs::read_to_string(kiln_image_allowlist_path()).unwrap())
            .expect("kiln-image allowlist");
    assert!(allowed.iter().all(|a| !a.reason.trim().is_empty()));
    let listed: BTreeSet<&str> = allowed
        .iter()
        .flat_map(|a| a.diffs.iter().map(String::as_str))
        .collect();
    let found: BTreeSet<&str> = all.iter().map(String::as_str).collect();
    super::assert_allowlist_matches(&found, &listed);
}

/// The DeviceClass apiVersion is the discovered one, not the assets'.
#[test]
fn device_classes_take_the_discovered_api_version() {
    let doc = json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster"},
        "spec": {"draDriver": {"repository": "r", "image": "dra", "version": "v1"}}});
    let cr = GpuClusterDoc::from_object(&doc).unwrap();
    let mut ctx = defaults::render_context();
    ctx.operator_namespace = "ns".into();
    let objects = render_state(
        &Renderer::new(super::super::host()),
        &cr,
        DraState::DraDriver,
        &ctx,
        "resource.k8s.io/v1beta2",
    )
    .unwrap();
    let classes: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "DeviceClass")
        .collect();
    assert_eq!(classes.len(), 3, "gpu, mig and vfio without ComputeDomains");
    assert!(
        classes
            .iter()
            .all(|o| o["apiVersion"] == "resource.k8s.io/v1beta2")
    );
    let vap = objects
        .iter()
        .find(|o| o["kind"] == "ValidatingAdmissionPolicy")
        .unwrap();
    assert_eq!(
        vap["spec"]["matchConditions"][0]["expression"],
        r#"request.userInfo.username == "system:serviceaccount:ns:nvidia-dra-driver-kubeletplugin""#
    );
}
