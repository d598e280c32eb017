//! kiln's GPUCluster CRD equals NVIDIA GPU Operator v26.7.0's `gpuclusters.nvidia.com` (a copy
//! is in `tests/data/gpucluster/`): names, scope, version, printer columns, the singleton rule,
//! and, for every property path of the schema (spec and status), the same type, int-or-string
//! marker, default, enum, pattern, minimum, maximum, format, required list and CEL rules, and
//! no path NVIDIA's lacks. NVIDIA's sample GPUCluster loses no field to kiln's pruning.

use std::collections::BTreeMap;

use kiln_core::spec::gpucluster::{GpuClusterSpec, crd, default_spec};
use serde_json::Value;

/// What is compared at each path.
const KEYS: [&str; 10] = [
    "type",
    "x-kubernetes-int-or-string",
    "x-kubernetes-validations",
    "default",
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "format",
    "required",
];

fn upstream() -> Value {
    serde_yaml_ng::from_str(include_str!(
        "data/gpucluster/nvidia-v26.7.0-gpuclusters-crd.yaml"
    ))
    .expect("upstream CRD")
}

fn ours() -> Value {
    serde_json::to_value(crd()).expect("the CRD serializes")
}

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

/// Every difference between two GPUCluster CRDs, one line each: `<path>: missing` (NVIDIA has
/// it, kiln not), `<path>: unexpected`, `<path> <key>: nvidia …, kiln …`, and the differences
/// of names, scope, versions and printer columns.
fn differences(up: &Value, ours: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for pointer in ["/spec/group", "/spec/names", "/spec/scope"] {
        if up.pointer(pointer) != ours.pointer(pointer) {
            out.push(format!(
                "{pointer}: nvidia {:?}, kiln {:?}",
                up.pointer(pointer),
                ours.pointer(pointer)
            ));
        }
    }
    for key in [
        "name",
        "served",
        "storage",
        "subresources",
        "additionalPrinterColumns",
    ] {
        let pointer = format!("/spec/versions/0/{key}");
        if up.pointer(&pointer) != ours.pointer(&pointer) {
            out.push(format!(
                "{pointer}: nvidia {:?}, kiln {:?}",
                up.pointer(&pointer),
                ours.pointer(&pointer)
            ));
        }
    }
    let schema = |crd: &Value| {
        let mut walked = BTreeMap::new();
        nodes(
            crd.pointer("/spec/versions/0/schema/openAPIV3Schema")
                .expect("a schema"),
            "",
            &mut walked,
        );
        walked
    };
    let (theirs, mine) = (schema(up), schema(ours));
    for (path, want) in &theirs {
        let Some(got) = mine.get(path) else {
            out.push(format!("{path}: missing"));
            continue;
        };
        for key in KEYS {
            let same = match key {
                // float64 in the API: `1` and `1.0` are the same bound.
                "minimum" | "maximum" => {
                    want.get(key).and_then(Value::as_f64) == got.get(key).and_then(Value::as_f64)
                }
                _ => want.get(key) == got.get(key),
            };
            if !same {
                out.push(format!(
                    "{path} {key}: nvidia {:?}, kiln {:?}",
                    want.get(key),
                    got.get(key)
                ));
            }
        }
    }
    out.extend(
        mine.keys()
            .filter(|p| !theirs.contains_key(*p))
            .map(|p| format!("{p}: unexpected")),
    );
    out
}

#[test]
fn gpucluster_crd_matches_nvidia_path_by_path() {
    let up = upstream();
    let mut walked = BTreeMap::new();
    nodes(
        up.pointer("/spec/versions/0/schema/openAPIV3Schema")
            .unwrap(),
        "",
        &mut walked,
    );
    assert!(walked.len() > 180, "walked {} upstream paths", walked.len());
    assert_eq!(differences(&up, &ours()), Vec::<String>::new());
}

/// The comparison sees what it is meant to: a missing path, a changed default, a lost CEL
/// rule, an extra path and a printer column.
#[test]
fn differences_are_found() {
    let up = upstream();
    let mut other = up.clone();
    let root = other
        .pointer_mut("/spec/versions/0/schema/openAPIV3Schema")
        .unwrap();
    root.as_object_mut()
        .unwrap()
        .remove("x-kubernetes-validations");
    let spec = &mut root["properties"]["spec"]["properties"];
    spec["draDriver"]["properties"]
        .as_object_mut()
        .unwrap()
        .remove("featureGates");
    spec["hostPaths"]["properties"]["kubeletRootDir"]["default"] = Value::from("/var/lib/k");
    spec["hostPaths"]["properties"]["rootFS"] = serde_json::json!({"type": "string"});
    other["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array_mut()
        .unwrap()
        .pop();
    let found = differences(&up, &other);
    for want in [
        " x-kubernetes-validations: nvidia",
        ".spec.draDriver.featureGates: missing",
        ".spec.draDriver.featureGates{}: missing",
        ".spec.hostPaths.kubeletRootDir default: nvidia",
        ".spec.hostPaths.rootFS: unexpected",
        "/spec/versions/0/additionalPrinterColumns: nvidia",
    ] {
        assert!(
            found.iter().any(|l| l.starts_with(want)),
            "{want} not in {found:#?}"
        );
    }
    assert!(differences(&up, &up).is_empty());
}

/// NVIDIA's sample GPUCluster keeps every field through kiln's CRD but `hostPaths.rootFS`,
/// which NVIDIA's CRD does not have either (the API server prunes it there too), and reads
/// into the typed spec.
#[test]
fn nvidias_sample_is_pruned_only_where_nvidias_crd_prunes_it() {
    let sample: Value = serde_yaml_ng::from_str(include_str!(
        "data/gpucluster/nvidia-v26.7.0-gpucluster-sample.yaml"
    ))
    .unwrap();
    let mut spec = sample["spec"].clone();
    let pruned = default_spec(&mut spec);
    assert_eq!(pruned, ["hostPaths.rootFS"]);
    let typed: GpuClusterSpec = serde_json::from_value(spec).expect("the typed spec");
    assert_eq!(typed.dra_driver.image, "dra-driver-nvidia-gpu");
    assert!(typed.dra_driver.compute_domains_enabled());
    assert_eq!(typed.host_paths.kubelet_root_dir, "/var/lib/kubelet");
    assert_eq!(typed.daemonsets.priority_class_name, "system-node-critical");
}
