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

/// Where [`crd_default`] parks a field's default until [`make_structural`] restores it
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
/// - keep only defaults (see [`crd_default`]); drop every other `default`;
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
        condition_rules(&mut v["properties"]["status"]);
        v
    })
}

/// The validation of a CR `status` with `state` and `metav1.Condition`s, as controller-gen
/// writes it (NVIDIA's NVIDIADriver and GPUCluster CRDs): `status` requires `state`, and each
/// `conditions[]` item has the `status` enum, the `reason` and `type` patterns and the
/// `observedGeneration` minimum.
pub(crate) fn condition_rules(status: &mut Value) {
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
        set(
            "status",
            "enum",
            serde_json::json!(["True", "False", "Unknown"]),
        );
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
}

/// The API server's pruning and defaulting (as [`default_spec`] describes it) of `value` with
/// the structural schema node `schema`; returns the pruned unknown fields as paths below it.
pub fn apply_schema(schema: &Value, value: &mut Value) -> Vec<String> {
    let mut pruned = Vec::new();
    apply(schema, value, "", &mut pruned);
    pruned
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

/// [`check_spec`] for an NVIDIADriver `spec`, with its CRD's schema.
///
/// # Errors
/// The first offending field, e.g. `spec.driverType: unsupported value "cpu", …`.
pub fn check_nvidia_driver_spec(spec: &Value) -> Result<(), SpecError> {
    validate(
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
///   create parent objects: `driver.kernelModuleType` is set only when `driver` exists);
/// - an integral number written with a fraction (`5.0`) where an integer is due becomes `5`.
///
/// Returns the removed unknown fields as paths below `spec` (`operator.foo`, `driver.env[0].x`),
/// in document order, so a caller can warn about likely typos. Values of the wrong type are
/// left alone: [`check_spec`] refuses them.
pub fn default_spec(spec: &mut Value) -> Vec<String> {
    let mut pruned = Vec::new();
    apply(spec_schema(), spec, "", &mut pruned);
    pruned
}

/// Validate `spec` (as stored: after [`default_spec`]) against the CRD's schema, as the API
/// server validates a ClusterPolicy on create and update: so `kiln render` and the operator
/// refuse exactly what `kubectl apply` would. See [`validate`] for the keywords.
///
/// # Errors
/// The first offending field, e.g. `spec.gfd: must be of type object, got array` or
/// `spec.driver.startupProbe.periodSeconds: 0 is less than the minimum 1`.
pub fn check_spec(spec: &Value) -> Result<(), SpecError> {
    validate(spec_schema(), spec, "spec")
}

/// Validate `value` against a structural schema node, as the API server's OpenAPI validation
/// (kube-openapi) does, depth first, stopping at the first error, which names the field
/// (`path`, then `.key` and `[i]` below it):
/// - `type`: `object`, `array`, `string`, `boolean`, `number`, `integer` (a number with no
///   fraction: `5.0` is an integer, as JSON decoding in the API server makes it); `null` is
///   no value of any type (the API server prunes `null` object fields before, as
///   [`default_spec`] does, so a `null` field is taken as absent here; a `null` list item is
///   refused);
/// - `x-kubernetes-int-or-string`: an integer or a string; `anyOf`: at least one branch;
/// - `enum`; `pattern` (strings only; Go's unanchored `MatchString`, with the `regex` crate,
///   whose syntax covers RE2's); `minimum`/`maximum`; `minLength`/`maxLength` (in
///   characters), `minItems`/`maxItems`; `required` (a key that is missing);
/// - `format`: `int32`/`int64` only restate the type (the API server checks no range);
///   `date-time` (status only) is not checked here;
/// - `properties`, `additionalProperties` and `items` recursively; fields the schema does not
///   know are left to pruning ([`default_spec`]), not refused.
///
/// # Errors
/// [`SpecError`] with the field's path.
pub fn validate(schema: &Value, value: &Value, path: &str) -> Result<(), SpecError> {
    let fail = |message: String| {
        Err(SpecError {
            path: path.to_string(),
            message,
        })
    };
    let int_or_string = schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if int_or_string {
        if !(is_integer(value) || value.is_string()) {
            return fail(format!(
                "must be an integer or a string, got {}",
                type_name(value)
            ));
        }
    } else if let Some(ty) = schema.get("type").and_then(Value::as_str) {
        let ok = match ty {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "boolean" => value.is_boolean(),
            "number" => value.is_number(),
            "integer" => is_integer(value),
            _ => true,
        };
        if !ok {
            return fail(format!("must be of type {ty}, got {}", type_name(value)));
        }
    } else if let Some(branches) = schema.get("anyOf").and_then(Value::as_array)
        && !branches.iter().any(|b| validate(b, value, path).is_ok())
    {
        return fail(format!(
            "{} matches none of the allowed forms",
            type_name(value)
        ));
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let names: Vec<String> = allowed.iter().map(Value::to_string).collect();
        return fail(format!(
            "unsupported value {}, expected one of {}",
            shown(value),
            names.join(", ")
        ));
    }
    match value {
        Value::String(s) => {
            if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
                && !pattern_matches(pattern, s)
            {
                return fail(format!(
                    "{} does not match the pattern {pattern}",
                    shown(value)
                ));
            }
            let chars = s.chars().count() as u64;
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                && chars < min
            {
                return fail(format!("must be at least {min} characters long"));
            }
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                && chars > max
            {
                return fail(format!("must be at most {max} characters long"));
            }
        }
        Value::Number(_) => {
            let n = value.as_f64().unwrap_or_default();
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
                && n < min
            {
                return fail(format!("{value} is less than the minimum {min}"));
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
                && n > max
            {
                return fail(format!("{value} is more than the maximum {max}"));
            }
        }
        Value::Object(map) => {
            if let Some(required) = schema.get("required").and_then(Value::as_array) {
                for key in required.iter().filter_map(Value::as_str) {
                    if map.get(key).is_none_or(Value::is_null) {
                        return Err(SpecError {
                            path: format!("{path}.{key}"),
                            message: "required value is missing".into(),
                        });
                    }
                }
            }
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, v) in map.iter().filter(|(_, v)| !v.is_null()) {
                if let Some(child) = props.and_then(|p| p.get(key)).or(additional) {
                    validate(child, v, &format!("{path}.{key}"))?;
                }
            }
        }
        Value::Array(items) => {
            let n = items.len() as u64;
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && n < min
            {
                return fail(format!("must have at least {min} items"));
            }
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && n > max
            {
                return fail(format!("must have at most {max} items"));
            }
            if let Some(item) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    validate(item, v, &format!("{path}[{i}]"))?;
                }
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
    Ok(())
}

/// A JSON integer, or a number with no fraction (`5.0`), as the API server's type check takes it.
fn is_integer(v: &Value) -> bool {
    match v {
        Value::Number(n) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

/// The JSON type of `v`, for messages.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `v` for a message: JSON, control characters escaped, cut to 80 characters.
fn shown(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() > 80 {
        format!("{}…", text.chars().take(80).collect::<String>())
    } else {
        text
    }
}

/// Whether `text` matches the schema `pattern` (unanchored, as Go's `MatchString`). Patterns
/// are compiled once each; one Rust's `regex` cannot compile (none in kiln's CRDs, see the
/// tests) matches nothing, so the value is refused rather than let through unchecked.
fn pattern_matches(pattern: &str, text: &str) -> bool {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    static CACHE: OnceLock<Mutex<HashMap<String, Option<Arc<regex::Regex>>>>> = OnceLock::new();
    let re = CACHE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(pattern.to_string())
        .or_insert_with(|| regex::Regex::new(pattern).ok().map(Arc::new))
        .clone();
    re.is_some_and(|re| re.is_match(text))
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
        Value::Number(n)
            if n.is_f64()
                && (schema.get("type").and_then(Value::as_str) == Some("integer")
                    || schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))) =>
        {
            // `5.0` where an integer is due is stored as `5` (the API server decodes JSON
            // numbers and writes integral ones back as integers).
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15) {
                *value = Value::from(f as i64);
            }
        }
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
    fn types_patterns_and_required_fields_are_checked_as_the_api_server_does() {
        let err = |v: Value| check_spec(&v).unwrap_err().to_string();
        assert_eq!(
            err(json!({"gfd": [false]})),
            "spec.gfd: must be of type object, got array"
        );
        assert_eq!(
            err(json!({"driver": {"startupProbe": {"periodSeconds": 1.5}}})),
            "spec.driver.startupProbe.periodSeconds: must be of type integer, got number"
        );
        assert!(
            err(json!({"dcgmExporter": {"serviceMonitor": {"interval": "15 seconds"}}}))
                .starts_with(
                    "spec.dcgmExporter.serviceMonitor.interval: \"15 seconds\" does not match the pattern ^(0|"
                )
        );
        assert!(
            err(json!({"driver": {"resources": {"limits": {"memory": "lots"}}}}))
                .starts_with("spec.driver.resources.limits.memory: \"lots\" does not match")
        );
        assert_eq!(
            err(json!({"daemonsets": {"podSecurityContext": {"seccompProfile": {}}}})),
            "spec.daemonsets.podSecurityContext.seccompProfile.type: required value is missing"
        );
        assert_eq!(
            err(json!({"driver": {"env": [{"value": "x"}]}})),
            "spec.driver.env[0].name: required value is missing"
        );
        assert_eq!(
            err(json!({"driver": {"env": [null]}})),
            "spec.driver.env[0]: must be of type object, got null"
        );
        assert_eq!(
            err(json!({"driver": {"upgradePolicy": {"maxUnavailable": 1.5}}})),
            "spec.driver.upgradePolicy.maxUnavailable: must be an integer or a string, got number"
        );
        assert_eq!(
            err(json!({"driver": {"image": "!!!"}})),
            "spec.driver.image: \"!!!\" does not match the pattern [a-zA-Z0-9\\-]+"
        );
        assert_eq!(err(json!([1])), "spec: must be of type object, got array");
        // Accepted: integral floats, quantities, durations, int-or-string values of either kind,
        // null fields (pruned), unknown fields (pruned, not refused).
        check_spec(&json!({
            "driver": {"startupProbe": {"periodSeconds": 5.0}, "image": "my/driver",
                       "resources": {"limits": {"memory": "1Gi", "cpu": 2}},
                       "upgradePolicy": {"maxUnavailable": "many"}},
            "dcgmExporter": {"serviceMonitor": {"interval": "1m30s"}},
            "gfd": null, "migg": [1]
        }))
        .unwrap();
    }

    #[test]
    fn integral_floats_are_stored_as_integers() {
        let mut spec = json!({"driver": {"startupProbe": {"periodSeconds": 5.0},
                                         "upgradePolicy": {"maxUnavailable": 2.0}}});
        default_spec(&mut spec);
        assert_eq!(spec["driver"]["startupProbe"]["periodSeconds"], json!(5));
        assert!(spec["driver"]["startupProbe"]["periodSeconds"].is_i64());
        assert!(spec["driver"]["upgradePolicy"]["maxUnavailable"].is_i64());
    }

    #[test]
    fn every_schema_pattern_compiles() {
        fn walk(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    if let Some(Value::String(p)) = m.get("pattern") {
                        out.push(p.clone());
                    }
                    m.values().for_each(|c| walk(c, out));
                }
                Value::Array(a) => a.iter().for_each(|c| walk(c, out)),
                _ => {}
            }
        }
        let mut patterns = Vec::new();
        walk(openapi_schema(), &mut patterns);
        walk(nvidia_driver_openapi_schema(), &mut patterns);
        assert!(patterns.len() > 10, "{patterns:?}");
        for p in patterns {
            assert!(regex::Regex::new(&p).is_ok(), "{p}");
        }
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
