//! Field-by-field differential test of NVIDIADriver renders against NVIDIA GPU Operator
//! v26.7.0's own (issue 33).
//!
//! `tests/data/nvidia-v26.7.0-nvidiadriver/golden/` holds NVIDIA's 16 golden renders of the
//! NVIDIADriver driver state (its `internal/state/testdata/golden/`, ConfigMap values replaced
//! by a placeholder); `cases.yaml` gives, per golden, the NVIDIADriver and cluster facts that
//! are NVIDIA's test inputs (see its header for how they map). For every case this test renders
//! the CR as `kiln render --nvidia-driver` does (with the policy kiln uses when no ClusterPolicy
//! exists, [`kiln_render::nvidiadriver::standalone_policy`]), normalises both sides with the
//! ClusterPolicy harness's [`super::normalise`] and compares them with [`super::diff`]. Objects
//! are paired by kind and name, and an object whose kind occurs once on each side is paired
//! with its counterpart whatever its name (the name difference is then one line). Each
//! difference is one line, `<golden>/<Kind>/<nvidia name>: <path>: <what>`.
//!
//! The committed allowlist (`tests/data/nvidiadriver-allowlist.yaml`) names every accepted
//! difference with its reason. The test fails on a difference that is not listed and on a
//! listed one that no longer occurs. Run with `--nocapture` for the per-golden counts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use kiln_core::context::{NodeOs, TransformContext};
use kiln_core::driver_digest::Field;
use kiln_core::spec::nvidiadriver::{
    ClusterProxy, KERNEL_LABEL, OS_VERSION_MAJOR_LABEL, OSTREE_VERSION_LABEL, OpenShiftFacts,
    install_state, node_pools_for,
};
use kiln_render::nvidiadriver::{
    NvidiaDriverDoc, derived_policy, render_pools_with, standalone_policy,
};
use kiln_render::{Renderer, defaults};
use serde::Deserialize;
use serde_json::{Value, json};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nvidia-v26.7.0-nvidiadriver")
}

fn allowlist_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nvidiadriver-allowlist.yaml")
}

/// One case of `cases.yaml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    /// `metadata.uid` of the CR (gives NVIDIA's DaemonSet name).
    uid: String,
    /// The pool's OS, `ID:VERSION_ID` (default `ubuntu:22.04`).
    #[serde(default)]
    os: Option<String>,
    /// NFD's `kernel-version.full` of the pool (precompiled).
    #[serde(default)]
    kernel: Option<String>,
    /// The OpenShift version, when the cluster is OpenShift.
    #[serde(default)]
    openshift: Option<String>,
    /// ConfigMaps of the operator namespace, `NAME=KEY1,KEY2`.
    #[serde(default)]
    config_maps: Vec<String>,
    /// Secrets of the operator namespace.
    #[serde(default)]
    secrets: Vec<String>,
    /// NVIDIA's test put its sample additional volumes into the render data (documentation
    /// only: no CR field gives them, the allowlist names what they add).
    #[serde(default)]
    #[allow(dead_code)]
    additional_configs: bool,
    /// The pool's RHCOS version (NFD's OSTREE_VERSION label), on OpenShift.
    #[serde(default)]
    rhcos: Option<String>,
    /// The cluster's Driver Toolkit images by RHCOS version, on OpenShift.
    #[serde(default)]
    toolkit_images: BTreeMap<String, String>,
    /// The cluster proxy, on OpenShift.
    #[serde(default)]
    proxy: Option<Proxy>,
    /// The NVIDIADriver spec.
    spec: Value,
}

/// OpenShift's cluster proxy of a case.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Proxy {
    http_proxy: String,
    https_proxy: String,
    no_proxy: String,
    trusted_ca: String,
}

impl Case {
    /// The OpenShift facts of the case (empty off OpenShift).
    fn openshift(&self) -> OpenShiftFacts {
        OpenShiftFacts {
            toolkit_images: self.toolkit_images.clone(),
            proxy: self.proxy.as_ref().map(|p| ClusterProxy {
                http_proxy: p.http_proxy.clone(),
                https_proxy: p.https_proxy.clone(),
                no_proxy: p.no_proxy.clone(),
                trusted_ca: p.trusted_ca.clone(),
            }),
        }
    }

    /// The node labels of the case's pool: a GPU node with NFD's OS labels (and the kernel,
    /// RHCOS version, and the CR's own selector).
    fn node_labels(
        &self,
        spec: &kiln_core::spec::nvidiadriver::NvidiaDriverSpec,
    ) -> BTreeMap<String, String> {
        let (id, version) = self.os_id_version();
        let mut labels = BTreeMap::from([
            ("nvidia.com/gpu.present".to_string(), "true".to_string()),
            (
                "feature.node.kubernetes.io/system-os_release.ID".into(),
                id.to_string(),
            ),
            (
                "feature.node.kubernetes.io/system-os_release.VERSION_ID".into(),
                version.to_string(),
            ),
            (
                OS_VERSION_MAJOR_LABEL.into(),
                version.split('.').next().unwrap_or_default().to_string(),
            ),
        ]);
        if let Some(k) = &self.kernel {
            labels.insert(KERNEL_LABEL.into(), k.clone());
        }
        if let Some(r) = &self.rhcos {
            labels.insert(OSTREE_VERSION_LABEL.into(), r.clone());
        }
        if let Some(sel) = &spec.node_selector {
            labels.extend(sel.clone());
        }
        labels
    }

    fn os_id_version(&self) -> (&str, &str) {
        self.os
            .as_deref()
            .unwrap_or("ubuntu:22.04")
            .split_once(':')
            .expect("os is ID:VERSION_ID")
    }
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

/// The render context of a case: namespace `test-operator`, containerd, the pool's OS and
/// kernel, OpenShift or not, the ConfigMaps and Secrets that exist.
fn context(case: &Case) -> TransformContext {
    let mut ctx = defaults::render_context();
    ctx.operator_namespace = "test-operator".into();
    ctx.kubernetes_version = "v1.36.3".into();
    ctx.has_service_monitor_crd = false;
    ctx.openshift_version = case.openshift.clone();
    let (id, version) = case.os_id_version();
    ctx.gpu_node_os = Some(NodeOs {
        id: id.into(),
        version_id: version.into(),
    });
    ctx.kernel_version = case.kernel.clone();
    ctx.config_maps = case
        .config_maps
        .iter()
        .map(|c| defaults::config_map_keys(c))
        .collect();
    ctx.secrets = case.secrets.clone();
    ctx
}

/// kiln's objects for one case, as `kiln render --nvidia-driver` renders them with no
/// ClusterPolicy.
fn kiln_objects(renderer: &Renderer, name: &str, case: &Case) -> Vec<Value> {
    let doc = json!({
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": name, "uid": case.uid},
        "spec": case.spec,
    });
    let cr = NvidiaDriverDoc::from_object(&doc).unwrap_or_else(|e| panic!("{name}: {e}"));
    let ctx = context(case);
    let labels = case.node_labels(&cr.spec);
    let pools = node_pools_for(&cr.spec, [labels], case.openshift.is_some());
    assert_eq!(pools.len(), 1, "{name}: one node pool");
    if let Some(why) = kiln_render::nvidiadriver::unsupported(&cr.spec) {
        panic!("{name}: kiln refuses the CR: {why}");
    }
    let derived = derived_policy(&standalone_policy(), &cr.name, &cr.spec)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    render_pools_with(
        renderer,
        &derived,
        &cr.name,
        &cr.uid,
        &cr.spec,
        &pools,
        &ctx,
        &case.openshift(),
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"))
    .into_iter()
    .flat_map(|(_, objects)| objects)
    .collect()
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

fn kind(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or("?")
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or("?")
}

/// Every difference of one golden (see the module doc for the pairing).
pub(super) fn golden_diffs(golden: &str, kiln: &[Value], nvidia: &[Value]) -> Vec<String> {
    let norm = |objs: &[Value]| -> Vec<Value> {
        objs.iter()
            .map(|o| {
                let mut o = o.clone();
                super::normalise(&mut o);
                o
            })
            .collect()
    };
    let (mut ours, theirs) = (norm(kiln), norm(nvidia));
    let mut out = Vec::new();
    let mut unpaired = Vec::new();
    for n in &theirs {
        if let Some(i) = ours
            .iter()
            .position(|k| kind(k) == kind(n) && name(k) == name(n))
        {
            let k = ours.remove(i);
            let mut d = Vec::new();
            super::diff("", &k, n, &mut d);
            out.extend(
                d.into_iter()
                    .map(|l| format!("{golden}/{}/{}: {l}", kind(n), name(n))),
            );
        } else {
            unpaired.push(n);
        }
    }
    for n in unpaired {
        let same_kind = |o: &&Value| kind(o) == kind(n);
        let theirs_of_kind = theirs.iter().filter(same_kind).count();
        let ours_of_kind: Vec<usize> = (0..ours.len()).filter(|i| same_kind(&&ours[*i])).collect();
        if theirs_of_kind == 1 && ours_of_kind.len() == 1 {
            let k = ours.remove(ours_of_kind[0]);
            let mut d = Vec::new();
            super::diff("", &k, n, &mut d);
            out.extend(
                d.into_iter()
                    .map(|l| format!("{golden}/{}/{}: {l}", kind(n), name(n))),
            );
        } else {
            out.push(format!("{golden}/{}/{}: missing", kind(n), name(n)));
        }
    }
    for k in &ours {
        out.push(format!("{golden}/{}/{}: unexpected", kind(k), name(k)));
    }
    out
}

/// `cases.yaml`, its merge keys applied.
fn cases() -> Cases {
    let mut raw: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(data().join("cases.yaml")).unwrap())
            .expect("cases.yaml");
    raw.apply_merge().expect("cases.yaml merge keys");
    serde_yaml_ng::from_value(raw).expect("cases.yaml")
}

/// The golden files' names under `dir` (`<name>.yaml` → `<name>`), shared with the GPUCluster
/// harness.
pub fn golden_names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .trim_end_matches(".yaml")
                .to_string()
        })
        .collect()
}

#[test]
fn kiln_renders_nvidiadrivers_as_nvidia_v26_7_0_field_by_field() {
    let cases = cases();
    let goldens = golden_names(&data().join("golden"));
    assert_eq!(goldens.len(), 16, "NVIDIA's NVIDIADriver goldens");
    assert_eq!(
        cases.cases.keys().cloned().collect::<BTreeSet<_>>(),
        goldens,
        "one case per golden"
    );
    let renderer = Renderer::new(super::super::host());
    let mut all = Vec::new();
    let mut counts = Vec::new();
    for (golden, case) in &cases.cases {
        let d = golden_diffs(
            golden,
            &kiln_objects(&renderer, golden, case),
            &nvidia_objects(golden),
        );
        counts.push(format!("{golden}: {}", d.len()));
        all.extend(d);
    }
    println!(
        "differing fields per NVIDIADriver golden:\n  {}",
        counts.join("\n  ")
    );
    let allowed: Vec<Allowed> =
        serde_yaml_ng::from_str(&std::fs::read_to_string(allowlist_path()).unwrap())
            .expect("allowlist");
    let listed: BTreeSet<&str> = allowed
        .iter()
        .flat_map(|a| a.diffs.iter().map(String::as_str))
        .collect();
    for a in &allowed {
        assert!(
            !a.reason.trim().is_empty(),
            "an allowlist group without a reason"
        );
    }
    let found: BTreeSet<&str> = all.iter().map(String::as_str).collect();
    super::assert_allowlist_matches(&found, &listed);
}

/// kiln's NVIDIADriver `DRIVER_CONFIG_DIGEST` rule ([`install_state`]) reproduces NVIDIA's value
/// in every golden when given NVIDIA's test render data: the golden pod (its images and
/// additional configs are the test's), no `kernelModuleType` or `driverType` unless the test
/// sets one (the test skips the CRD's defaulting), and host root "" (the test's; its template
/// still mounts "/").
/// The main test then sees only the digest differences those inputs explain.
#[test]
fn nvidia_digests_follow_from_nvidias_render_data() {
    let cases = cases();
    for (golden, case) in &cases.cases {
        let doc = json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
            "metadata": {"name": golden, "uid": case.uid}, "spec": case.spec});
        let mut spec = NvidiaDriverDoc::from_object(&doc).unwrap().spec;
        if case.spec.get("kernelModuleType").is_none() {
            spec.kernel_module_type = None;
        }
        let labels = case.node_labels(&spec);
        let pool = node_pools_for(&spec, [labels], case.openshift.is_some()).remove(0);
        let os = case
            .openshift()
            .for_pool(case.openshift.as_deref(), &spec, &pool);
        let ds = nvidia_objects(golden)
            .into_iter()
            .find(|o| kind(o) == "DaemonSet")
            .unwrap();
        let mut pod_json = ds["spec"]["template"]["spec"].clone();
        if let Some(v) = pod_json["volumes"].as_array_mut() {
            v.retain(|v| v["name"] != "host-root");
        }
        let pod = serde_json::from_value(pod_json.clone()).unwrap();
        let want = pod_json["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "nvidia-driver-ctr")
            .and_then(|c| c["env"].as_array())
            .and_then(|e| e.iter().find(|e| e["name"] == "DRIVER_CONFIG_DIGEST"))
            .map(|e| e["value"].clone())
            .unwrap();
        let rdma = spec.rdma.clone().unwrap_or_default();
        let mut state = install_state(&spec, &pool, &rdma, os.as_ref(), &pod);
        if case.spec.get("driverType").is_none() {
            state.set("DriverType", Field::Str(String::new()));
        }
        let got = state.digest();
        assert_eq!(json!(got), want, "{golden}");
    }
}

/// The pairing sees a renamed object as one difference of its name, and an object one side
/// lacks as `missing` / `unexpected`.
#[test]
fn golden_diffs_pair_objects_by_kind_and_name() {
    let sa = |n: &str| json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": n, "namespace": "x"}});
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "x"}});
    let d = golden_diffs("g", &[sa("ours")], &[sa("theirs"), cm.clone()]);
    assert_eq!(
        d,
        vec![
            r#"g/ServiceAccount/theirs: metadata.name: kiln "ours" != nvidia "theirs""#.to_string(),
            "g/ConfigMap/c: missing".to_string(),
        ]
    );
    assert_eq!(
        golden_diffs("g", std::slice::from_ref(&cm), &[]),
        vec!["g/ConfigMap/c: unexpected".to_string()]
    );
    assert!(golden_diffs("g", &[sa("a"), cm.clone()], &[cm, sa("a")]).is_empty());
}
