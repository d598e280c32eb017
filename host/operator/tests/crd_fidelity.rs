//! kiln's ClusterPolicy CRD accepts every field of NVIDIA GPU Operator v26.7.0's, with the same
//! structural schema: for every property path of NVIDIA's `clusterpolicies.nvidia.com` spec
//! (a copy is in `tests/data/`), kiln's generated CRD has the path, with the same type,
//! int-or-string marker, default, enum, pattern, minimum, maximum and required list, and no
//! path NVIDIA's lacks.

use std::collections::BTreeMap;

use serde_json::Value;

fn spec_schema(crd: &Value) -> &Value {
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec")
        .expect("a spec schema")
}

/// What is compared at each path.
const KEYS: [&str; 8] = [
    "type",
    "x-kubernetes-int-or-string",
    "default",
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "required",
];

/// `path → {key: value}` for every node under `schema` (`a.b` for properties, `a[]` for array
/// items, `a{}` for map values).
fn nodes(schema: &Value, path: &str, out: &mut BTreeMap<String, BTreeMap<&'static str, Value>>) {
    let facts = KEYS
        .iter()
        .filter_map(|k| schema.get(*k).map(|v| (*k, v.clone())))
        .collect();
    out.insert(path.to_string(), facts);
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            nodes(v, &format!("{path}.{k}"), out);
        }
    }
    if let Some(items) = schema.get("items") {
        nodes(items, &format!("{path}[]"), out);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        nodes(values, &format!("{path}{{}}"), out);
    }
}

fn upstream() -> Value {
    serde_yaml_ng::from_str(include_str!("data/nvidia-v26.7.0-clusterpolicies-crd.yaml"))
        .expect("upstream CRD")
}

#[test]
fn every_upstream_property_path_matches() {
    let up = upstream();
    let ours = serde_json::to_value(kiln_operator::crd::crd()).unwrap();
    let (mut theirs, mut mine) = (BTreeMap::new(), BTreeMap::new());
    nodes(spec_schema(&up), "spec", &mut theirs);
    nodes(spec_schema(&ours), "spec", &mut mine);
    assert!(theirs.len() > 600, "walked {} upstream paths", theirs.len());
    let mut missing = Vec::new();
    let mut different = Vec::new();
    for (path, want) in &theirs {
        let Some(got) = mine.get(path) else {
            missing.push(path.clone());
            continue;
        };
        for key in KEYS {
            // The spec's top-level `required` list is deliberately not copied (see below).
            if path == "spec" && key == "required" {
                continue;
            }
            // `minimum`/`maximum` are float64 in the API (`JSONSchemaProps`): `1` and `1.0`
            // are the same bound.
            let same = match key {
                "minimum" | "maximum" => {
                    want.get(key).and_then(Value::as_f64) == got.get(key).and_then(Value::as_f64)
                }
                _ => want.get(key) == got.get(key),
            };
            if !same {
                different.push(format!(
                    "{path} {key}: upstream {:?}, kiln {:?}",
                    want.get(key),
                    got.get(key)
                ));
            }
        }
    }
    assert_eq!(missing, Vec::<String>::new(), "paths kiln's CRD lacks");
    let extra: Vec<&String> = mine.keys().filter(|p| !theirs.contains_key(*p)).collect();
    assert_eq!(
        extra,
        Vec::<&String>::new(),
        "paths NVIDIA's CRD lacks (it prunes them)"
    );
    assert_eq!(different, Vec::<String>::new(), "paths that differ");
}

/// Unknown fields are pruned (the spec does not preserve unknown fields anywhere), so
/// `kubectl apply` of NVIDIA's sample with strict field validation is accepted, and a typo is
/// refused (or pruned, without strict validation), as with NVIDIA's CRD.
#[test]
fn no_unknown_fields_are_preserved_in_the_spec() {
    let ours = serde_json::to_value(kiln_operator::crd::crd()).unwrap();
    let text = spec_schema(&ours).to_string();
    assert!(!text.contains("x-kubernetes-preserve-unknown-fields"));
    assert!(!text.contains("nullable"));
}

/// NVIDIA's spec requires `daemonsets`, `dcgm`, `dcgmExporter`, `devicePlugin`, `driver`,
/// `gfd`, `nodeStatusExporter`, `operator` and `toolkit`; kiln accepts a policy without them
/// (each has a documented nil default), so minimal policies keep working. This is the only
/// difference from NVIDIA's schema the test above allows.
#[test]
fn top_level_required_list_is_the_one_deliberate_difference() {
    let up = upstream();
    let ours = serde_json::to_value(kiln_operator::crd::crd()).unwrap();
    assert_eq!(
        spec_schema(&up)["required"],
        serde_json::json!([
            "daemonsets",
            "dcgm",
            "dcgmExporter",
            "devicePlugin",
            "driver",
            "gfd",
            "nodeStatusExporter",
            "operator",
            "toolkit"
        ])
    );
    assert!(spec_schema(&ours).get("required").is_none());
}

/// `kiln render` and the operator read a policy as the API server stores it: for every variant
/// of the fidelity data, `Policy::from_object` of the policy as written gives NVIDIA's
/// `defaultedPolicy` (kiln-core's test data, `host/core/tests/data/defaulting/`).
#[test]
fn policies_are_read_with_the_crd_defaults() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/tests/data/defaulting");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let Some(variant) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".yaml"))
        else {
            continue;
        };
        let written: Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let stored: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("{variant}.defaulted.json"))).unwrap(),
        )
        .unwrap();
        let policy = kiln_render::Policy::from_object(&written).unwrap();
        assert_eq!(policy.spec_json, stored["spec"], "{variant}");
        assert!(policy.pruned.is_empty(), "{variant}: {:?}", policy.pruned);
        seen += 1;
    }
    assert_eq!(seen, 12);
}
