//! The committed CRD matches the Rust types, and stays compatible with upstream's; and kiln
//! refuses exactly the ClusterPolicies the API server refuses with it (a corpus replayed against
//! kiln here, and against testcluster's API server by server-side dry-run in `cluster/crd.rs`).
//!
//! Regenerate with `KILN_UPDATE_CRD=1 cargo test -p kiln-operator --test chart crd::` (or
//! `kiln crdgen > deploy/crds/clusterpolicies.nvidia.com.yaml`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use crate::support::policy_corpus::{Case, Verdict, corpus};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const COMMITTED: &str = "deploy/crds/clusterpolicies.nvidia.com.yaml";

#[test]
fn committed_crd_matches_the_types() {
    let path = repo().join(COMMITTED);
    let generated = kiln_operator::crd::crd_yaml();
    if std::env::var_os("KILN_UPDATE_CRD").is_some() {
        std::fs::write(&path, &generated).unwrap();
        let chart = repo().join("deploy/helm/kiln/crds/clusterpolicies.nvidia.com.yaml");
        std::fs::write(chart, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{COMMITTED} drifted from the Rust types; regenerate with `kiln crdgen > {COMMITTED}`"
    );
}

/// Descriptions (what `kubectl explain` shows) in users' words: no Rust terms. Each entry is a
/// Rust-ism found there before: kube's "Auto-generated derived type", `None`/`Some`,
/// `kiln_core::` paths, intra-doc links, "nil", notes for developers ("CRD enum", "CRD
/// default"), Rust types.
#[test]
fn crd_descriptions_carry_no_rust_terms() {
    const RUST_TEXT: [&str; 12] = [
        "Auto-generated",
        "Some(",
        "kiln_",
        "::",
        "[`",
        "CRD enum",
        "CRD default",
        "CRD pattern",
        "Option<",
        "Vec<",
        "BTreeMap",
        "serde",
    ];
    const RUST_WORDS: [&str; 4] = ["None", "nil", "Self", "struct"];
    fn walk(v: &Value, path: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if k == "description"
                        && let Some(text) = x.as_str()
                    {
                        let words = text.split(|c: char| !c.is_alphanumeric() && c != '_');
                        let hit = RUST_TEXT
                            .iter()
                            .find(|t| text.contains(*t))
                            .copied()
                            .or_else(|| words.into_iter().find(|w| RUST_WORDS.contains(w)));
                        if let Some(hit) = hit {
                            out.push(format!("{path}: {hit:?} in {text:?}"));
                        }
                    }
                    walk(x, &format!("{path}.{k}"), out);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, path, out)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    for crd in [
        serde_json::to_value(kiln_operator::crd::crd()).unwrap(),
        serde_json::to_value(kiln_operator::crd::nvidia_driver_crd()).unwrap(),
        serde_json::to_value(kiln_core::spec::gpucluster::crd()).unwrap(),
    ] {
        let name = crd["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        walk(&crd, &name, &mut found);
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

fn spec_schema(crd: &Value) -> Value {
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec")
        .cloned()
        .unwrap()
}

/// `path → type` for every property under `schema` (arrays descend into `items` as `path[]`).
fn types(schema: &Value, path: &str, out: &mut BTreeMap<String, String>) {
    if let Some(t) = schema.get("type").and_then(Value::as_str) {
        out.insert(path.to_string(), t.to_string());
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            types(v, &format!("{path}.{k}"), out);
        }
    }
    if let Some(items) = schema.get("items") {
        types(items, &format!("{path}[]"), out);
    }
}

/// NVIDIA GPU Operator v26.7.0's ClusterPolicy CRD (a copy of upstream's
/// `clusterpolicies-crd.yaml` kept in the crate's test data).
fn upstream() -> Value {
    serde_yaml_ng::from_str(include_str!(
        "../data/nvidia-v26.7.0-clusterpolicies-crd.yaml"
    ))
    .expect("upstream CRD")
}

/// Every upstream spec field that kiln models keeps its name and type. Known, deliberate
/// differences are listed here with the reason.
#[test]
fn modelled_fields_keep_upstream_types() {
    let up = upstream();
    let ours = serde_json::to_value(kiln_operator::crd::crd()).unwrap();
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    types(&spec_schema(&ours), "spec", &mut a);
    types(&spec_schema(&up), "spec", &mut b);
    let mismatched: Vec<String> = a
        .iter()
        .filter_map(|(p, t)| {
            let u = b.get(p)?;
            (u != t).then(|| format!("{p}: ours {t}, upstream {u}"))
        })
        .collect();
    assert_eq!(mismatched, Vec::<String>::new());
    // No field upstream's CRD lacks (kiln's shared component types' extra fields are left out
    // of the schema, so they are pruned as with upstream's CRD).
    let ours_only: Vec<&str> = a
        .keys()
        .filter(|p| !b.contains_key(*p))
        .map(String::as_str)
        .collect();
    assert_eq!(ours_only, Vec::<&str>::new());
    // Every upstream field is typed (the full comparison, defaults and patterns included, is
    // `crd_fidelity.rs`).
    let upstream_only: Vec<&str> = b
        .keys()
        .filter(|p| !a.contains_key(*p))
        .map(String::as_str)
        .collect();
    assert_eq!(upstream_only, Vec::<&str>::new());
}

#[test]
fn crd_is_cluster_scoped_with_status_and_columns() {
    let crd = serde_json::to_value(kiln_operator::crd::crd()).unwrap();
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(crd["spec"]["group"], "nvidia.com");
    assert_eq!(crd["spec"]["names"]["plural"], "clusterpolicies");
    let v = &crd["spec"]["versions"][0];
    assert_eq!(v["name"], "v1");
    assert!(v["subresources"]["status"].is_object());
    let cols: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols, ["Status", "Reason", "Message", "Age"]);
    let state = &v["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["state"];
    assert_eq!(
        state["enum"],
        serde_json::json!(["ready", "notReady", "ignored"])
    );
}

/// kiln's answer: `Policy::from_object` (what `kiln render` and the operator run), then, for a
/// policy it accepts, the render of every state it enables; the first error.
fn kiln_answer(case: &Case, renderer: &kiln_render::Renderer) -> Result<(), String> {
    let policy = kiln_render::Policy::from_object(&case.object()).map_err(|e| e.to_string())?;
    let ctx = kiln_render::defaults::render_context();
    for (_, result) in renderer.render(&policy, &ctx) {
        result.map_err(|e| format!("render: {e}"))?;
    }
    Ok(())
}

/// Every case: kiln's verdict is the recorded one, a refusal names the recorded field, and kiln
/// is stricter than the API server only where the case says why (an allowlist: an entry whose
/// policy kiln accepts fails, as does a refusal without one). The API server's side of the
/// record is checked live by `cluster/crd.rs`.
#[test]
fn kiln_refuses_what_the_api_server_refuses() {
    let host = Arc::new(
        kiln_plugin_host::PluginHost::new(
            kiln_plugin_host::HostConfig::default(),
            kiln_bundled_plugins::BUNDLED,
        )
        .unwrap(),
    );
    let renderer = kiln_render::Renderer::new(host);
    let mut wrong = Vec::new();
    let cases = corpus();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    for case in &cases {
        let name = &case.name;
        if case.kiln.is_some_and(|k| k != case.api) {
            assert!(
                case.api == Verdict::Accept && case.why.is_some(),
                "{name}: kiln may only be stricter than the API server, with a reason"
            );
        } else {
            assert!(
                case.why.is_none() && case.stage.is_none(),
                "{name}: stale why/stage"
            );
        }
        let answer = kiln_answer(case, &renderer);
        match (case.kiln_verdict(), &answer) {
            (Verdict::Accept, Ok(())) => {}
            (Verdict::Reject, Err(e)) => {
                let at = case.at.as_deref().expect("a rejected case names its field");
                let named = if case.stage.as_deref() == Some("render") {
                    e.starts_with("render: ") && e.contains(&format!("{at}: "))
                } else {
                    e.starts_with(&format!("{at}: "))
                };
                if !named {
                    wrong.push(format!("{name}: expected the error at {at}, got {e}"));
                }
                assert!(e.len() < 400, "{name}: a long message: {e}");
            }
            (want, got) => wrong.push(format!("{name}: expected {want:?}, got {got:?}")),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
