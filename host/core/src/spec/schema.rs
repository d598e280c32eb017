//! The ClusterPolicy CRD's OpenAPI schema, derived from the types in this module's parent, and
//! the API server's structural defaulting and pruning applied with it.
//!
//! One source of truth for defaults: a field's CRD default is its serde default (a
//! `#[serde(default = "…")]` function), which schemars emits as `default` for fields marked
//! `#[schemars(transform = crd_default)]`. Every other derived default (serde's `Default` for
//! strings, lists, …) is dropped: upstream's CRD has none there. [`default_spec`] walks the
//! resulting schema exactly as the API server does on create/update, so `kiln render` gives an
//! offline policy the same fields the stored object has.
//!
//! The schema follows NVIDIA GPU Operator v26.7.0's `clusterpolicies.nvidia.com` (types,
//! defaults, enums, patterns, minimums; `host/operator/tests/crd_fidelity.rs` checks every
//! property path against a copy of it). Unknown fields are pruned, as for NVIDIA's CRD: the spec
//! does not preserve unknown fields.

use std::sync::OnceLock;

use kube::core::schema::{OptionalEnum, OptionalIntOrString, StructuralSchemaRewriter};
use schemars::generate::SchemaSettings;
use schemars::transform::AddNullable;
use schemars::{Schema, SchemaGenerator, json_schema};
use serde_json::{Map, Value};

use super::{ClusterPolicy, SpecError};

/// Where [`crd_default`] parks a field's CRD default until [`make_structural`] restores it
/// (all other `default`s are dropped there).
const CRD_DEFAULT: &str = "x-kiln-crd-default";

/// schemars field transform: keep this field's serde default as its CRD `default`.
pub(crate) fn crd_default(schema: &mut Schema) {
    if let Some(obj) = schema.as_object_mut()
        && let Some(default) = obj.remove("default")
    {
        obj.insert(CRD_DEFAULT.into(), default);
    }
}

/// Kubernetes' quantity syntax (`500m`, `1Gi`, `1e3`), the pattern of CRD quantities.
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// Schema of `resources.limits`/`requests`: `{name: quantity}`, each an int-or-string matching
/// [`QUANTITY_PATTERN`] (as controller-gen writes `corev1.ResourceList`).
pub(crate) fn quantity_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": true
        }
    })
}

/// Make a derived schema node structural and upstream-like, recursively:
/// - keep only CRD defaults (see [`crd_default`]); drop every other `default`;
/// - drop `nullable` (upstream's CRD has none: the API server prunes `null`s) and a `null`
///   entry of `enum`, and the `uint*` formats schemars gives unsigned integers (upstream writes
///   `minimum: 0` instead);
/// - a node with no `type`, `properties`, combinator or int-or-string marker (a
///   `serde_json::Value` field) keeps unknown fields (`x-kubernetes-preserve-unknown-fields`),
///   as a structural schema requires.
pub fn make_structural(node: &mut Value) {
    structural(node, false);
}

/// [`make_structural`]; `in_combinator`: `node` is an `anyOf`/`oneOf`/`allOf` branch, which
/// needs no type of its own.
fn structural(node: &mut Value, in_combinator: bool) {
    let Some(obj) = node.as_object_mut() else {
        return;
    };
    if obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        // As controller-gen writes it (the API server accepts this form and the bare marker).
        obj.remove("type");
        obj.insert(
            "anyOf".into(),
            serde_json::json!([{"type": "integer"}, {"type": "string"}]),
        );
    }
    for key in ["minimum", "maximum"] {
        // schemars writes `0.0`; upstream (and the API server's echo) has `0`.
        if let Some(n) = obj.get(key).and_then(Value::as_f64)
            && n.fract() == 0.0
        {
            obj.insert(key.into(), Value::from(n as i64));
        }
    }
    obj.remove("default");
    if let Some(default) = obj.remove(CRD_DEFAULT) {
        obj.insert("default".into(), default);
    }
    obj.remove("nullable");
    if let Some(list) = obj.get_mut("enum").and_then(Value::as_array_mut) {
        list.retain(|v| !v.is_null());
    }
    if obj
        .get("format")
        .and_then(Value::as_str)
        .is_some_and(|f| f.starts_with("uint"))
    {
        obj.remove("format");
        obj.entry("minimum").or_insert(Value::from(0));
    }
    let typed = [
        "type",
        "properties",
        "anyOf",
        "oneOf",
        "allOf",
        "x-kubernetes-int-or-string",
    ]
    .iter()
    .any(|k| obj.contains_key(*k));
    if !typed && !in_combinator {
        obj.insert(
            "x-kubernetes-preserve-unknown-fields".into(),
            Value::Bool(true),
        );
    }
    if let Some(props) = obj.get_mut("properties").and_then(Value::as_object_mut) {
        props.values_mut().for_each(make_structural);
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = obj.get_mut(key).filter(|c| c.is_object()) {
            make_structural(child);
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(list) = obj.get_mut(key).and_then(Value::as_array_mut) {
            list.iter_mut().for_each(|n| structural(n, true));
        }
    }
}

/// The CRD's `openAPIV3Schema` (spec and status), structural (see [`make_structural`]).
///
/// Generated as kube's `CustomResource` derive generates it (same schemars settings and
/// transforms), but kept as JSON until [`make_structural`] has run: the typed
/// `JSONSchemaProps` would drop the markers [`crd_default`] leaves.
pub fn openapi_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let mut v = structural_schema_for::<ClusterPolicy>();
        for (component, field) in NOT_IN_UPSTREAM {
            if let Some(props) = v
                .pointer_mut(&format!(
                    "/properties/spec/properties/{component}/properties"
                ))
                .and_then(Value::as_object_mut)
            {
                props.remove(field);
            }
        }
        v
    })
}

/// The structural, upstream-like schema of the custom resource `K` (spec and status), generated
/// as kube's `CustomResource` derive generates it (same schemars settings and transforms) and
/// then passed through [`make_structural`].
pub fn structural_schema_for<K: schemars::JsonSchema>() -> Value {
    let generator = SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .with_transform(AddNullable::default())
        .with_transform(StructuralSchemaRewriter)
        .with_transform(OptionalEnum)
        .with_transform(OptionalIntOrString)
        .into_generator();
    let mut v =
        serde_json::to_value(generator.into_root_schema_for::<K>()).expect("a schema serializes");
    if let Some(props) = v.get_mut("properties").and_then(Value::as_object_mut) {
        props.values_mut().for_each(make_structural);
    }
    v
}

/// The NVIDIADriver CRD's `openAPIV3Schema` (spec and status), structural, with what the
/// derive cannot express, as NVIDIA v26.7.0's CRD has it (`host/operator/tests/crd_fidelity.rs`
/// compares every path):
/// - `spec` requires `default`, `driverType` and `image` (each has a default, so an object
///   without them is defaulted, never refused) and has the rule that a `default: true` CR sets
///   no `nodeSelector`;
/// - `status` requires `state`;
/// - `status.conditions[]` carries the validation of `metav1.Condition` (`status` enum,
///   `reason` and `type` patterns, `observedGeneration` minimum).
pub fn nvidia_driver_openapi_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let mut v = structural_schema_for::<super::nvidiadriver::NVIDIADriver>();
        let spec = &mut v["properties"]["spec"];
        spec["required"] = serde_json::json!(["default", "driverType", "image"]);
        spec["x-kubernetes-validations"] = serde_json::json!([{
            "rule": "has(self.default) && self.default ? !has(self.nodeSelector) || size(self.nodeSelector) == 0 : true",
            "message": "a default NVIDIADriver (spec.default: true) cannot set spec.nodeSelector"
        }]);
        let status = &mut v["properties"]["status"];
        status["required"] = serde_json::json!(["state"]);
        if let Some(cond) = status
            .pointer_mut("/properties/conditions/items/properties")
            .and_then(Value::as_object_mut)
        {
            let mut set = |field: &str, key: &str, value: Value| {
                if let Some(node) = cond.get_mut(field).and_then(Value::as_object_mut) {
                    node.insert(key.into(), value);
                }
            };
            set("status", "enum", serde_json::json!(["True", "False", "Unknown"]));
            set("observedGeneration", "minimum", Value::from(0));
            set(
                "reason",
                "pattern",
                Value::from("^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
            );
            set(
                "type",
                "pattern",
                Value::from(
                    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
                ),
            );
        }
        v
    })
}

/// [`default_spec`] for an NVIDIADriver `spec`, with its CRD's schema
/// ([`nvidia_driver_openapi_schema`]); returns the pruned unknown fields.
pub fn default_nvidia_driver_spec(spec: &mut Value) -> Vec<String> {
    let mut pruned = Vec::new();
    apply(
        &nvidia_driver_openapi_schema()["properties"]["spec"],
        spec,
        "",
        &mut pruned,
    );
    pruned
}

/// [`check_spec`] for an NVIDIADriver `spec` (enums, minimums, maximums).
///
/// # Errors
/// The first offending field, e.g. `spec.driverType: unsupported value "cpu", …`.
pub fn check_nvidia_driver_spec(spec: &Value) -> Result<(), SpecError> {
    check(
        &nvidia_driver_openapi_schema()["properties"]["spec"],
        spec,
        "spec",
    )
}

/// Fields kiln's shared component types carry (through the flattened
/// [`super::ComponentSpec`] and [`super::DriverManagedSpec`]) that NVIDIA's CRD does not have:
/// left out of the schema, so the API server and [`default_spec`] prune them as with NVIDIA's
/// CRD; the typed spec keeps them at their defaults (nothing reads them).
const NOT_IN_UPSTREAM: [(&str, &str); 6] = [
    ("gds", "resources"),
    ("gds", "hostNetwork"),
    ("gdrcopy", "resources"),
    ("gdrcopy", "hostNetwork"),
    ("validator", "enabled"),
    ("vfioManager", "kernelModuleConfig"),
];

/// The schema of `spec`.
pub fn spec_schema() -> &'static Value {
    &openapi_schema()["properties"]["spec"]
}

/// Apply the API server's structural pruning and defaulting to a ClusterPolicy `spec`, in
/// place, with the CRD's schema ([`spec_schema`]), as it happens when the object is created or
/// updated through the API:
/// - a field the schema does not know is removed (unless its node preserves unknown fields);
/// - a `null` is removed, or replaced by the field's default when it has one;
/// - a missing field with a default gets it, in every object that is present (defaults do not
///   create parent objects: `driver.kernelModuleType` is set only when `driver` exists).
///
/// Returns the removed unknown fields as paths below `spec` (`operator.foo`, `driver.env[0].x`),
/// in document order, so a caller can warn about likely typos. Values of the wrong type are
/// left alone: the typed parse ([`super::ClusterPolicySpec::from_json`]) rejects them.
pub fn default_spec(spec: &mut Value) -> Vec<String> {
    let mut pruned = Vec::new();
    apply(spec_schema(), spec, "", &mut pruned);
    pruned
}

/// Check `spec` against the schema's `enum`, `minimum` and `maximum` keywords, which the API
/// server enforces on create/update (`driver.startupProbe.periodSeconds: 0`,
/// `ccManager.defaultMode: maybe` are refused). Type errors are left to the typed parse
/// ([`super::ClusterPolicySpec::from_json`], which calls this); `pattern`s are not checked.
///
/// # Errors
/// The first offending field, e.g. `spec.driver.startupProbe.periodSeconds: 0 is less than
/// the minimum 1`.
pub fn check_spec(spec: &Value) -> Result<(), SpecError> {
    check(spec_schema(), spec, "spec")
}

fn check(schema: &Value, value: &Value, path: &str) -> Result<(), SpecError> {
    let fail = |message: String| SpecError {
        path: path.to_string(),
        message,
    };
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !value.is_null()
        && !allowed.contains(value)
    {
        let names: Vec<String> = allowed.iter().map(Value::to_string).collect();
        return Err(fail(format!(
            "unsupported value {value}, expected one of {}",
            names.join(", ")
        )));
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
            && n < min
        {
            return Err(fail(format!("{value} is less than the minimum {min}")));
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
            && n > max
        {
            return Err(fail(format!("{value} is more than the maximum {max}")));
        }
    }
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, v) in map {
                if let Some(child) = props.and_then(|p| p.get(key)).or(additional) {
                    check(child, v, &format!("{path}.{key}"))?;
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    check(item, v, &format!("{path}[{i}]"))?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn apply(schema: &Value, value: &mut Value, path: &str, pruned: &mut Vec<String>) {
    match value {
        Value::Object(map) => object(schema, map, path, pruned),
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    apply(item_schema, item, &format!("{path}[{i}]"), pruned);
                }
            }
        }
        _ => {}
    }
}

fn object(schema: &Value, map: &mut Map<String, Value>, path: &str, pruned: &mut Vec<String>) {
    let preserve = schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    if props.is_none() && additional.is_none() {
        // An opaque object (preserved as written) or a type mismatch the typed parse reports.
        return;
    }
    let child_schema =
        |key: &str| -> Option<&Value> { props.and_then(|p| p.get(key)).or(additional) };
    // Pruning: unknown fields, and nulls where the field is not nullable and has no default.
    map.retain(|key, v| {
        let Some(child) = child_schema(key) else {
            if preserve {
                return true;
            }
            pruned.push(join(path, key));
            return false;
        };
        let nullable = child.get("nullable").and_then(Value::as_bool) == Some(true);
        !(v.is_null() && !nullable && child.get("default").is_none())
    });
    // Defaulting: missing fields, and non-nullable nulls, get the field's default.
    if let Some(props) = props {
        for (key, child) in props {
            let Some(default) = child.get("default") else {
                continue;
            };
            let nullable = child.get("nullable").and_then(Value::as_bool) == Some(true);
            match map.get(key) {
                None => {
                    map.insert(key.clone(), default.clone());
                }
                Some(Value::Null) if !nullable => {
                    map.insert(key.clone(), default.clone());
                }
                Some(_) => {}
            }
        }
    }
    for (key, v) in map.iter_mut() {
        if let Some(child) = child_schema(key) {
            apply(child, v, &join(path, key), pruned);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_fill_present_objects_only() {
        let mut spec = json!({"driver": {}, "cdi": {"enabled": false}});
        assert!(default_spec(&mut spec).is_empty());
        assert_eq!(spec["driver"]["kernelModuleType"], "auto");
        assert_eq!(
            spec["cdi"],
            json!({"enabled": false, "default": false, "nriPluginEnabled": false})
        );
        // No parent, no default.
        assert!(spec.get("toolkit").is_none());
        assert!(spec["driver"].get("upgradePolicy").is_none());
    }

    #[test]
    fn nested_defaults_and_nulls() {
        let mut spec = json!({
            "driver": {"upgradePolicy": {"drain": null, "podDeletion": {}}},
            "validator": {"plugin": null},
            "devicePlugin": {"mps": {"root": null}}
        });
        default_spec(&mut spec);
        assert_eq!(
            spec["driver"]["upgradePolicy"],
            json!({"autoUpgrade": false, "maxParallelUpgrades": 1, "maxUnavailable": "25%",
                   "podDeletion": {"force": false, "timeoutSeconds": 300, "deleteEmptyDir": false}})
        );
        assert_eq!(spec["validator"], json!({}));
        assert_eq!(spec["devicePlugin"]["mps"]["root"], "/run/nvidia/mps");
    }

    #[test]
    fn unknown_fields_are_pruned_and_named() {
        let mut spec = json!({
            "migg": {"strategy": "single"},
            "driver": {"env": [{"name": "A", "valu": "1"}]},
            "operator": {"initContainer": {"image": "x", "tag": "y"}}
        });
        let pruned = default_spec(&mut spec);
        assert_eq!(
            pruned,
            ["migg", "driver.env[0].valu", "operator.initContainer.tag"]
        );
        assert_eq!(spec["driver"]["env"], json!([{"name": "A"}]));
        assert_eq!(spec["operator"]["initContainer"], json!({"image": "x"}));
        // Fields only kiln's shared types have are pruned too, as NVIDIA's CRD prunes them.
        let mut spec =
            json!({"gds": {"enabled": true, "hostNetwork": true}, "validator": {"enabled": false}});
        assert_eq!(
            default_spec(&mut spec),
            ["gds.hostNetwork", "validator.enabled"]
        );
        assert_eq!(spec, json!({"gds": {"enabled": true}, "validator": {}}));
    }

    #[test]
    fn relabelings_get_the_default_action() {
        let mut spec = json!({"dcgmExporter": {"serviceMonitor": {"relabelings": [
            {"sourceLabels": ["a"], "targetLabel": "b"}, {"action": "drop"}
        ]}}});
        default_spec(&mut spec);
        let r = &spec["dcgmExporter"]["serviceMonitor"]["relabelings"];
        assert_eq!(r[0]["action"], "replace");
        assert_eq!(r[1]["action"], "drop");
    }

    #[test]
    fn enums_and_minimums_are_checked() {
        let err = |v: Value| check_spec(&v).unwrap_err().to_string();
        assert_eq!(
            err(json!({"driver": {"startupProbe": {"periodSeconds": 0}}})),
            "spec.driver.startupProbe.periodSeconds: 0 is less than the minimum 1"
        );
        assert_eq!(
            err(json!({"ccManager": {"defaultMode": "maybe"}})),
            "spec.ccManager.defaultMode: unsupported value \"maybe\", expected one of \"on\", \"off\", \"devtools\""
        );
        assert!(
            err(json!({"dcgmExporter": {"serviceMonitor": {"relabelings": [{"action": "x"}]}}}))
                .starts_with(
                    "spec.dcgmExporter.serviceMonitor.relabelings[0].action: unsupported value"
                )
        );
        assert!(
            check_spec(&json!({"driver": {"startupProbe": {"periodSeconds": 1}},
            "migManager": {"config": {"default": ""}}}))
            .is_ok()
        );
    }

    #[test]
    fn schema_is_structural_without_spec_wide_preserve() {
        let spec = spec_schema();
        assert!(spec.get("x-kubernetes-preserve-unknown-fields").is_none());
        let text = spec.to_string();
        assert!(!text.contains("nullable"), "no nullable");
        assert!(!text.contains(CRD_DEFAULT), "markers restored");
        assert!(!text.contains("x-kubernetes-preserve-unknown-fields"));
    }
}
