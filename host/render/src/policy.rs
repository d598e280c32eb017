//! A ClusterPolicy document as `kiln render` and the operator receive it.

use kiln_core::spec::{ClusterPolicySpec, SpecError};
use serde_json::Value;

use crate::site::{PLUGINS_ANNOTATION, PluginConfig};

/// Why a ClusterPolicy document is rejected. Messages name the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The document is not a mapping.
    #[error("not a Kubernetes object (expected a mapping with apiVersion, kind, metadata, spec)")]
    NotAnObject,
    /// `apiVersion` is not `nvidia.com/v1`; the value as found (a string quoted, another
    /// type as JSON, `nothing` when missing).
    #[error("apiVersion: expected nvidia.com/v1, got {0}")]
    ApiVersion(String),
    /// `kind` is not `ClusterPolicy`; the value as found.
    #[error("kind: expected ClusterPolicy, got {0}")]
    Kind(String),
    /// `metadata.name` is not a DNS-1123 subdomain (as the API server requires; control
    /// characters included), or `metadata.namespace` not a DNS-1123 label.
    #[error("metadata{field}: {message}")]
    Metadata {
        /// `.name`, `.namespace`, or empty for `metadata` itself.
        field: &'static str,
        /// What is wrong (apimachinery's rule).
        message: String,
    },
    /// A spec field that names a Kubernetes object (`operator.runtimeClass`, a ConfigMap or
    /// Secret reference, an image pull secret, a priority class) is not a DNS-1123 subdomain.
    #[error("{path}: {message}")]
    ObjectName {
        /// Field path, `spec.operator.runtimeClass` style.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A spec field is invalid.
    #[error("{0}")]
    Spec(#[from] SpecError),
    /// The `kiln.dev/plugins` annotation is invalid.
    #[error("metadata.annotations: {0}")]
    Plugins(String),
}

/// A parsed ClusterPolicy: its name, the spec JSON as the API server stores it (CRD defaults
/// applied, unknown fields pruned; handed to plugins), the typed spec, and the site plugin
/// configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// `metadata.name`.
    pub name: String,
    /// `spec` as written (`{}` when absent) after the CRD's structural defaulting and pruning,
    /// i.e. as the API server stores it.
    pub spec_json: Value,
    /// [`Policy::spec_json`] as JSON text, serialized once by [`Policy::from_object`]: what
    /// plugins receive. Build a changed policy through `from_object` so the two agree.
    pub spec_text: String,
    /// The typed spec.
    pub spec: ClusterPolicySpec,
    /// Spec fields the CRD does not know (likely typos), as paths below `spec`: removed, as the
    /// API server prunes them (see [`kiln_core::spec::schema::default_spec`]).
    pub pruned: Vec<String>,
    /// Site plugins and pins from the `kiln.dev/plugins` annotation.
    pub plugins: PluginConfig,
    /// The policy's name and annotations, as `kiln:operand@0.2.0` plugins see them.
    pub meta: kiln_plugin_host::PolicyMeta,
}

impl Policy {
    /// Validate and parse a ClusterPolicy object (`apiVersion: nvidia.com/v1`, `kind:
    /// ClusterPolicy`), including the cross-field rules of [`ClusterPolicySpec::validate`].
    ///
    /// # Errors
    /// [`PolicyError`], naming the field.
    pub fn from_object(doc: &Value) -> Result<Policy, PolicyError> {
        let obj = doc.as_object().ok_or(PolicyError::NotAnObject)?;
        let api = obj.get("apiVersion");
        if api.and_then(Value::as_str) != Some("nvidia.com/v1") {
            return Err(PolicyError::ApiVersion(shown(api)));
        }
        let kind = obj.get("kind");
        if kind.and_then(Value::as_str) != Some("ClusterPolicy") {
            return Err(PolicyError::Kind(shown(kind)));
        }
        check_metadata(obj.get("metadata"))?;
        let mut spec_json = match obj.get("spec") {
            None | Some(Value::Null) => Value::Object(Default::default()),
            Some(v) => v.clone(),
        };
        // What the API server does on create/update, so an offline policy equals the stored one.
        let pruned = kiln_core::spec::schema::default_spec(&mut spec_json);
        check_object_names(&spec_json, "spec", None)?;
        let spec = ClusterPolicySpec::from_json(&spec_json)?;
        kiln_core::spec::check_values(&spec_json)?;
        spec.validate()?;
        let meta = obj.get("metadata");
        let name = meta
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let plugins = match meta
            .and_then(|m| m.pointer(&format!("/annotations/{}", escape(PLUGINS_ANNOTATION))))
        {
            Some(Value::String(s)) => PluginConfig::parse(s).map_err(PolicyError::Plugins)?,
            Some(other) => {
                return Err(PolicyError::Plugins(format!(
                    "{PLUGINS_ANNOTATION} must be a string, got {other}"
                )));
            }
            None => PluginConfig::default(),
        };
        Ok(Policy {
            name,
            spec_text: spec_json.to_string(),
            spec_json,
            spec,
            pruned,
            plugins,
            meta: kiln_plugin_host::PolicyMeta::from_metadata(meta),
        })
    }
}

/// Keys of `spec`, at any depth, that are not ClusterPolicy fields kiln knows (likely typos such
/// as `migg` or `dcgmExporter.enabeld`), as dotted paths below `spec` (`dcgmExporter.enabeld`,
/// `driver.env[0].nam`), sorted. They are kept and handed to plugins, so this is a warning, not
/// an error; a typo in a nested key would otherwise silently lose the setting.
///
/// Rule: a key is known when it survives a round trip through [`ClusterPolicySpec`] (parse, then
/// serialize). Keys whose value is empty (`null`, `""`, `[]`, `{}`) are not reported, since the
/// typed spec may omit empty values when serializing. When the spec does not parse, only
/// top-level keys are checked (the parse error itself names the bad field).
pub fn unknown_spec_keys(spec: &Value) -> Vec<String> {
    let default = serde_json::to_value(ClusterPolicySpec::default()).unwrap_or_default();
    let mut known = match ClusterPolicySpec::from_json(spec) {
        Ok(typed) => serde_json::to_value(typed).unwrap_or_default(),
        Err(_) => {
            // Only the top level: compare with the default spec's keys.
            let mut unknown: Vec<String> = spec
                .as_object()
                .into_iter()
                .flat_map(|m| m.keys())
                .filter(|k| default.get(k.as_str()).is_none() && !is_ignored_top_level(k))
                .cloned()
                .collect();
            unknown.sort();
            return unknown;
        }
    };
    // Every top-level field is known even where the round trip leaves it out.
    if let (Some(k), Some(d)) = (known.as_object_mut(), default.as_object()) {
        for (key, value) in d {
            k.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
    let mut unknown = Vec::new();
    collect_unknown(spec, &known, "", &mut unknown);
    unknown.sort();
    unknown
}

/// Deprecated upstream top-level fields kiln accepts and ignores.
fn is_ignored_top_level(key: &str) -> bool {
    matches!(key, "psp" | "psa")
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// Walks `input` beside its round-tripped form `known`, recording input keys `known` lacks.
fn collect_unknown(input: &Value, known: &Value, path: &str, out: &mut Vec<String>) {
    match (input, known) {
        (Value::Object(i), Value::Object(k)) => {
            for (key, value) in i {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match k.get(key) {
                    Some(kv) => collect_unknown(value, kv, &child, out),
                    None if path.is_empty() && is_ignored_top_level(key) => {}
                    // Below the top level the typed spec may omit empty values.
                    None if !path.is_empty() && is_empty(value) => {}
                    None => out.push(child),
                }
            }
        }
        (Value::Array(i), Value::Array(k)) => {
            for (n, (iv, kv)) in i.iter().zip(k).enumerate() {
                collect_unknown(iv, kv, &format!("{path}[{n}]"), out);
            }
        }
        _ => {}
    }
}

/// An identity field's value for an error: a string quoted and escaped, another type as JSON
/// with its type, `nothing` when missing; cut to 100 characters.
fn shown(v: Option<&Value>) -> String {
    let text = match v {
        None => return "nothing (the field is missing)".into(),
        Some(Value::String(s)) => format!("{s:?}"),
        Some(other @ Value::Number(_)) => format!("{other} (a number, not a string)"),
        Some(other) => format!("{other} (not a string)"),
    };
    if text.chars().count() > 100 {
        format!("{}…", text.chars().take(100).collect::<String>())
    } else {
        text
    }
}

/// `metadata.name` (when present) must be a DNS-1123 subdomain and `metadata.namespace` (when
/// present) a DNS-1123 label, as the API server requires: no control characters, no upper
/// case, at most 253 / 63 characters.
fn check_metadata(meta: Option<&Value>) -> Result<(), PolicyError> {
    use kiln_input::k8s::{dns1123_subdomain_error, is_dns1123_label};
    let Some(meta) = meta.filter(|m| !m.is_null()) else {
        return Ok(());
    };
    let Some(meta) = meta.as_object() else {
        return Err(PolicyError::Metadata {
            field: "",
            message: format!("must be a mapping, got {}", shown(Some(meta))),
        });
    };
    let bad = |field, message| Err(PolicyError::Metadata { field, message });
    match meta.get("name") {
        None | Some(Value::Null) => {}
        Some(Value::String(n)) => {
            if let Some(why) = dns1123_subdomain_error(n) {
                return bad(".name", why);
            }
        }
        Some(other) => {
            return bad(
                ".name",
                format!("must be a string, got {}", shown(Some(other))),
            );
        }
    }
    match meta.get("namespace") {
        None | Some(Value::Null) => {}
        Some(Value::String(n)) if is_dns1123_label(n) => {}
        Some(other) => {
            return bad(
                ".namespace",
                format!("{} is not a DNS-1123 label", shown(Some(other))),
            );
        }
    }
    Ok(())
}

/// Spec fields whose string value names a Kubernetes object, which the API server requires to
/// be a DNS-1123 subdomain: `runtimeClass`, `configMapName`, `secretName`,
/// `priorityClassName`, `name` inside a `config`/`*Config` object, and the entries of
/// `imagePullSecrets`. Empty values mean "unset" and pass. Checked before the typed parse, so
/// a control character in a name is refused here with its path, not passed into objects.
fn check_object_names(v: &Value, path: &str, key: Option<&str>) -> Result<(), PolicyError> {
    let names_object = |k: &str, parent: Option<&str>| {
        matches!(
            k,
            "runtimeClass" | "configMapName" | "secretName" | "priorityClassName"
        ) || (k == "name" && parent.is_some_and(|p| p == "config" || p.ends_with("Config")))
    };
    let check = |at: &str, s: &str| match kiln_input::k8s::dns1123_subdomain_error(s) {
        Some(message) if !s.is_empty() => Err(PolicyError::ObjectName {
            path: at.to_owned(),
            message,
        }),
        _ => Ok(()),
    };
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let at = format!("{path}.{k}");
                match child {
                    Value::String(s) if names_object(k, key) => check(&at, s)?,
                    Value::Array(items) if k == "imagePullSecrets" => {
                        for (i, item) in items.iter().enumerate() {
                            let at = format!("{at}[{i}]");
                            match item {
                                Value::String(s) => check(&at, s)?,
                                Value::Object(o) => {
                                    if let Some(Value::String(s)) = o.get("name") {
                                        check(&format!("{at}.name"), s)?;
                                    }
                                }
                                _ => {}
                            }
                        }
                    }
                    _ => check_object_names(child, &at, Some(k))?,
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                check_object_names(item, &format!("{path}[{i}]"), None)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// JSON-pointer escaping of one token (`/` → `~1`).
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rejects_wrong_identity_and_names_fields() {
        assert_eq!(
            Policy::from_object(&json!([])).unwrap_err(),
            PolicyError::NotAnObject
        );
        let e =
            Policy::from_object(&json!({"apiVersion": "nvidia.com/v2", "kind": "ClusterPolicy"}))
                .unwrap_err();
        assert_eq!(
            e.to_string(),
            "apiVersion: expected nvidia.com/v1, got \"nvidia.com/v2\""
        );
        let e = Policy::from_object(&json!({"apiVersion": "nvidia.com/v1", "kind": "Pod"}))
            .unwrap_err();
        assert_eq!(e.to_string(), "kind: expected ClusterPolicy, got \"Pod\"");
        let e = Policy::from_object(&json!({"apiVersion": 12345, "kind": "ClusterPolicy"}))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "apiVersion: expected nvidia.com/v1, got 12345 (a number, not a string)"
        );
        let e = Policy::from_object(&json!({"kind": "ClusterPolicy"})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "apiVersion: expected nvidia.com/v1, got nothing (the field is missing)"
        );
        let e = Policy::from_object(&json!({"apiVersion": "nvidia.com/v1", "kind": ["x"]}))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "kind: expected ClusterPolicy, got [\"x\"] (not a string)"
        );
        let e = Policy::from_object(
            &json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
            "spec": {"mig": {"strategy": "double"}}}),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("spec.mig.strategy: unsupported value \"double\""),
            "{e}"
        );
    }

    #[test]
    fn names_follow_dns_1123_and_control_characters_are_refused() {
        let policy = |meta: Value| {
            Policy::from_object(
                &json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": meta}),
            )
        };
        assert_eq!(
            policy(json!({"name": "cluster-policy"})).unwrap().name,
            "cluster-policy"
        );
        let e = policy(json!({"name": "bad\u{1b}[31mname"})).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "metadata.name: \"bad\\u{1b}[31mname\" is not a lowercase RFC 1123 subdomain"
            ),
            "{e}"
        );
        assert!(policy(json!({"name": "a".repeat(254)})).is_err());
        assert!(policy(json!({"name": "Upper"})).is_err());
        let e = policy(json!({"name": 7})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "metadata.name: must be a string, got 7 (a number, not a string)"
        );
        let e = policy(json!({"name": "p", "namespace": "gpu\noperator"})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "metadata.namespace: \"gpu\\noperator\" is not a DNS-1123 label"
        );
        assert!(policy(json!({"name": "p", "namespace": "gpu-operator"})).is_ok());
    }

    #[test]
    fn spec_fields_naming_objects_must_be_dns_names() {
        let policy = |spec: Value| {
            Policy::from_object(
                &json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "spec": spec}),
            )
        };
        let e = policy(json!({"operator": {"runtimeClass": "nvidia\u{7}"}})).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("spec.operator.runtimeClass: \"nvidia\\u{7}\" is not a lowercase"),
            "{e}"
        );
        let e = policy(json!({"devicePlugin": {"config": {"name": "a b", "default": ""}}}))
            .unwrap_err();
        assert!(
            e.to_string().starts_with("spec.devicePlugin.config.name: "),
            "{e}"
        );
        let e = policy(json!({"driver": {"imagePullSecrets": ["ok", "Bad"]}})).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("spec.driver.imagePullSecrets[1]: "),
            "{e}"
        );
        // Unset (empty) and valid names pass; env var names are not object names.
        assert!(
            policy(json!({"operator": {"runtimeClass": ""},
                "devicePlugin": {"config": {"name": "time-slicing", "default": ""}},
                "validator": {"env": [{"name": "WITH_WORKLOAD", "value": "false"}]}}))
            .is_ok()
        );
    }

    #[test]
    fn unknown_top_level_keys_are_listed() {
        let spec = json!({"mig": {}, "migg": {}, "psa": {}, "devicePlugin": {}, "zzz": 1});
        assert_eq!(unknown_spec_keys(&spec), ["migg", "zzz"]);
    }

    #[test]
    fn unknown_nested_keys_are_listed_with_their_path() {
        let spec = json!({
            "dcgmExporter": {"enabeld": false, "enabled": true},
            "mig": {"stratgy": "mixed"},
            "driver": {"env": [{"name": "A", "value": "1", "valeu": "x"}]},
            "daemonsets": {"labels": {"any-label": "x"}},
            "devicePlugin": {"config": {"name": "c", "default": ""}},
            "psp": {"enabled": false}
        });
        assert_eq!(
            unknown_spec_keys(&spec),
            ["dcgmExporter.enabeld", "driver.env[0].valeu", "mig.stratgy"]
        );
    }

    #[test]
    fn the_upstream_sample_has_no_unknown_keys() {
        // NVIDIA GPU Operator v26.7.0's sample ClusterPolicy, copied into the crate's test data.
        let doc: Value = serde_yaml_ng::from_str(include_str!(
            "../tests/data/nvidia-v26.7.0/policies/sample.yaml"
        ))
        .unwrap();
        let policy = Policy::from_object(&doc).unwrap();
        assert_eq!(unknown_spec_keys(&policy.spec_json), Vec::<String>::new());
    }

    #[test]
    fn reads_plugins_annotation() {
        let p = Policy::from_object(&json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "p", "annotations": {"kiln.dev/plugins": "dcgm:\n  then: [{name: extra}]\n"}}}))
        .unwrap();
        assert_eq!(p.name, "p");
        assert_eq!(p.plugins.chain(kiln_core::State::Dcgm).len(), 2);
        assert_eq!(p.spec_json, json!({}));
    }
}
