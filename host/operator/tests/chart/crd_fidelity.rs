//! kiln's ClusterPolicy CRD accepts every field of NVIDIA GPU Operator v26.7.0's, with the same
//! structural schema: for every property path of NVIDIA's `clusterpolicies.nvidia.com` spec
//! (a copy is in `tests/data/`), kiln's generated CRD has the path, with the same type,
//! int-or-string marker, default, enum, pattern, minimum, maximum and required list, and no
//! path NVIDIA's lacks.

use std::collections::{BTreeMap, BTreeSet};

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
    serde_yaml_ng::from_str(include_str!(
        "../data/nvidia-v26.7.0-clusterpolicies-crd.yaml"
    ))
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

/// NVIDIA v26.7.0's `nvidiadrivers.nvidia.com` CRD (a copy, `tests/data/`).
fn upstream_nvidia_driver() -> Value {
    serde_yaml_ng::from_str(include_str!(
        "../data/nvidia-v26.7.0-nvidiadrivers-crd.yaml"
    ))
    .expect("upstream NVIDIADriver CRD")
}

/// Accepted differences between kiln's NVIDIADriver CRD and NVIDIA's, as the lines
/// [`nvidia_driver_crd_differences`] prints them, each with why. The test fails on a difference
/// not listed here and on a listed one that no longer occurs.
const NVIDIA_DRIVER_CRD_ALLOWED: &[(&str, &str)] = &[
    (
        "spec x-kubernetes-validations[0].message",
        "kiln's own wording of the rule's message (the rule is NVIDIA's)",
    ),
    (
        "spec.driverType x-kubernetes-validations[0].message",
        "kiln's own wording of the immutability message (the rule is NVIDIA's)",
    ),
    (
        "spec.usePrecompiled x-kubernetes-validations[0].message",
        "kiln's own wording of the immutability message (the rule is NVIDIA's)",
    ),
];

/// Every difference of kiln's NVIDIADriver CRD from NVIDIA's, one line each: a path (spec and
/// status) one side lacks (`<path>: missing` / `<path>: unexpected`), a compared key that
/// differs (`<path> <key>`), a CEL rule or message that differs
/// (`<path> x-kubernetes-validations[i].rule`), the printer columns (name, type, JSON path),
/// scope, group, names and version flags.
fn nvidia_driver_crd_differences(up: &Value, ours: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let version = |crd: &Value| crd.pointer("/spec/versions/0").cloned().unwrap_or_default();
    let (vu, vk) = (version(up), version(ours));
    for part in ["spec", "status"] {
        let ptr = format!("/schema/openAPIV3Schema/properties/{part}");
        let (Some(su), Some(sk)) = (vu.pointer(&ptr), vk.pointer(&ptr)) else {
            out.push(format!("{part}: missing"));
            continue;
        };
        let (mut theirs, mut mine) = (BTreeMap::new(), BTreeMap::new());
        nodes(su, part, &mut theirs);
        nodes(sk, part, &mut mine);
        let (mut rules_up, mut rules_kiln) = (BTreeMap::new(), BTreeMap::new());
        rules(su, part, &mut rules_up);
        rules(sk, part, &mut rules_kiln);
        for (path, want) in &theirs {
            let Some(got) = mine.get(path) else {
                out.push(format!("{path}: missing"));
                continue;
            };
            for key in KEYS {
                let same = match key {
                    "minimum" | "maximum" => {
                        want.get(key).and_then(Value::as_f64)
                            == got.get(key).and_then(Value::as_f64)
                    }
                    _ => want.get(key) == got.get(key),
                };
                if !same {
                    out.push(format!("{path} {key}"));
                }
            }
        }
        out.extend(
            mine.keys()
                .filter(|p| !theirs.contains_key(*p))
                .map(|p| format!("{p}: unexpected")),
        );
        for path in rules_up
            .keys()
            .chain(rules_kiln.keys())
            .collect::<BTreeSet<_>>()
        {
            let (a, b) = (rules_up.get(path), rules_kiln.get(path));
            let count = a.map_or(0, Vec::len).max(b.map_or(0, Vec::len));
            for i in 0..count {
                for field in ["rule", "message"] {
                    let get =
                        |r: Option<&Vec<Value>>| r.and_then(|r| r.get(i)).map(|r| r[field].clone());
                    if get(a) != get(b) {
                        out.push(format!("{path} x-kubernetes-validations[{i}].{field}"));
                    }
                }
            }
        }
    }
    let columns = |v: &Value| -> Vec<(Value, Value, Value)> {
        v["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| (c["name"].clone(), c["type"].clone(), c["jsonPath"].clone()))
            .collect()
    };
    if columns(&vu) != columns(&vk) {
        out.push(format!(
            "printer columns: upstream {:?}, kiln {:?}",
            columns(&vu),
            columns(&vk)
        ));
    }
    for ptr in [
        "/spec/group",
        "/spec/scope",
        "/spec/names/kind",
        "/spec/names/plural",
        "/spec/names/singular",
        "/spec/names/listKind",
    ] {
        if up.pointer(ptr) != ours.pointer(ptr) {
            out.push(format!(
                "{ptr}: upstream {:?}, kiln {:?}",
                up.pointer(ptr),
                ours.pointer(ptr)
            ));
        }
    }
    for key in ["name", "served", "storage", "subresources"] {
        if vu.get(key) != vk.get(key) {
            out.push(format!(
                "version {key}: upstream {:?}, kiln {:?}",
                vu.get(key),
                vk.get(key)
            ));
        }
    }
    out
}

/// `path → x-kubernetes-validations` for every node under `schema` that has them.
fn rules(schema: &Value, path: &str, out: &mut BTreeMap<String, Vec<Value>>) {
    if let Some(list) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        out.insert(path.to_string(), list.clone());
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            rules(v, &format!("{path}.{k}"), out);
        }
    }
    if let Some(items) = schema.get("items") {
        rules(items, &format!("{path}[]"), out);
    }
}

/// kiln's NVIDIADriver CRD equals NVIDIA v26.7.0's path by path (spec and status: types,
/// int-or-string markers, defaults, enums, patterns, minimums, maximums, required lists, CEL
/// rules), with the same printer columns, names, scope and version, apart from the listed
/// differences ([`NVIDIA_DRIVER_CRD_ALLOWED`]): so the migration guide's CRD swap prunes no
/// field of a stored NVIDIADriver (`spec.upgradePolicy`, `spec.default` and
/// `spec.hostNetwork` included) and kubectl shows the same columns.
#[test]
fn nvidia_driver_crd_matches_nvidia_path_by_path() {
    let up = upstream_nvidia_driver();
    let ours = serde_json::to_value(kiln_operator::crd::nvidia_driver_crd()).unwrap();
    let mut walked = BTreeMap::new();
    nodes(
        up.pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec")
            .unwrap(),
        "spec",
        &mut walked,
    );
    assert!(walked.len() > 180, "walked {} upstream paths", walked.len());
    let found: BTreeSet<String> = nvidia_driver_crd_differences(&up, &ours)
        .into_iter()
        .collect();
    let allowed: BTreeSet<String> = NVIDIA_DRIVER_CRD_ALLOWED
        .iter()
        .map(|(line, _)| line.to_string())
        .collect();
    let unlisted: Vec<&String> = found.difference(&allowed).collect();
    let stale: Vec<&String> = allowed.difference(&found).collect();
    assert!(
        unlisted.is_empty() && stale.is_empty(),
        "differences not in the allowlist: {unlisted:#?}\nallowlist entries that no longer occur: {stale:#?}"
    );
}

/// The comparison sees what it is meant to: a path NVIDIA's CRD has and kiln's lacks, a
/// changed default, enum or rule, and a printer column.
#[test]
fn nvidia_driver_crd_differences_are_found() {
    let up = upstream_nvidia_driver();
    let mut ours = up.clone();
    let spec = ours
        .pointer_mut("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties")
        .unwrap();
    spec.as_object_mut().unwrap().remove("upgradePolicy");
    spec["image"]["default"] = Value::from("other");
    spec["driverType"]["enum"] = serde_json::json!(["gpu", "vgpu"]);
    spec["usePrecompiled"]["x-kubernetes-validations"][0]["rule"] = Value::from("true");
    ours["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array_mut()
        .unwrap()
        .remove(1);
    let found = nvidia_driver_crd_differences(&up, &ours);
    for want in [
        "spec.upgradePolicy: missing",
        "spec.upgradePolicy.autoUpgrade: missing",
        "spec.image default",
        "spec.driverType enum",
        "spec.usePrecompiled x-kubernetes-validations[0].rule",
    ] {
        assert!(found.iter().any(|l| l == want), "{want} not in {found:#?}");
    }
    assert!(found.iter().any(|l| l.starts_with("printer columns")));
    assert!(nvidia_driver_crd_differences(&up, &up).is_empty());
}

/// A value for every property path of `schema`: each object with all its properties, each
/// list with one item, each map with one entry, each scalar of its type (its first enum value
/// where it has one). Used to write an NVIDIADriver that sets every field NVIDIA's CRD has.
fn every_field(schema: &Value) -> Value {
    if let Some(first) = schema.get("enum").and_then(|e| e.get(0)) {
        return first.clone();
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        return Value::Object(
            props
                .iter()
                .map(|(k, v)| (k.clone(), every_field(v)))
                .collect(),
        );
    }
    if let Some(items) = schema.get("items") {
        return Value::Array(vec![every_field(items)]);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        return serde_json::json!({ "key": every_field(values) });
    }
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return Value::from("1");
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("boolean") => Value::Bool(true),
        Some("integer") | Some("number") => Value::from(1),
        Some("array") => Value::Array(Vec::new()),
        Some("object") => serde_json::json!({}),
        _ => Value::from("x"),
    }
}

/// The migration guide's CRD swap (`docs/migrating-from-nvidia.md`, step 5) loses no field of
/// a stored NVIDIADriver: one that sets every field of NVIDIA's CRD keeps each of them through
/// kiln's CRD (its structural pruning prunes nothing, and the typed spec reads it back with
/// `upgradePolicy`, `default` and `hostNetwork` intact).
#[test]
fn an_nvidiadriver_setting_every_nvidia_field_loses_none_under_kilns_crd() {
    let up = upstream_nvidia_driver();
    let schema = up
        .pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec")
        .unwrap();
    let mut spec = every_field(schema);
    // The CRD rule: a default CR sets no nodeSelector.
    spec["default"] = Value::Bool(false);
    let written = spec.clone();
    let pruned = kiln_core::spec::schema::default_nvidia_driver_spec(&mut spec);
    assert_eq!(pruned, Vec::<String>::new(), "fields kiln's CRD prunes");
    assert_eq!(spec, written, "kiln's CRD changed a set field");
    let typed: kiln_core::spec::nvidiadriver::NvidiaDriverSpec =
        serde_json::from_value(spec).expect("the typed spec reads every field");
    let policy = typed.upgrade_policy.as_ref().expect("upgradePolicy kept");
    assert_eq!(policy.drain.as_ref().map(|d| d.enable), Some(true));
    assert_eq!(typed.host_network, Some(true));
    let back = serde_json::to_value(&typed).unwrap();
    let mut lost = Vec::new();
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    leaves(&written, "spec", &mut a);
    leaves(&back, "spec", &mut b);
    for (path, v) in &a {
        if b.get(path) != Some(v) {
            lost.push(format!("{path}: wrote {v}, read back {:?}", b.get(path)));
        }
    }
    assert_eq!(
        lost,
        Vec::<String>::new(),
        "fields the typed spec drops or changes"
    );
}

/// `path → scalar` for every leaf of `v`.
fn leaves(v: &Value, path: &str, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) => m
            .iter()
            .for_each(|(k, c)| leaves(c, &format!("{path}.{k}"), out)),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .for_each(|(i, c)| leaves(c, &format!("{path}[{i}]"), out)),
        other => {
            out.insert(path.to_string(), other.clone());
        }
    }
}
