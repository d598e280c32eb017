//! `node-placement`: places the operand pods of a state by settings, without a fork or a
//! compiled plugin per value (gpu-operator #2626 asks for a nodeSelector/affinity per operand).
//!
//! Bundled with kiln; name it in a state's chain with its settings:
//!
//! ```yaml
//! kiln.dev/plugins: |
//!   device-plugin:
//!     then:
//!       - name: node-placement
//!         settings:
//!           nodeSelector: {pool: gpu-a}          # merged into the pod's nodeSelector
//!           tolerations:                         # appended unless already there
//!             - {key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}
//!           affinity:                            # replaces the pod's affinity
//!             nodeAffinity: {...}
//! ```
//!
//! Every DaemonSet and Deployment of the state gets the placement in its pod template; other
//! objects are left alone. Settings are checked when the policy is read (`validate-settings`):
//! a nodeSelector key or value that is not a valid label, a toleration with an unknown
//! `operator` or `effect` (or `Exists` with a value), or an affinity that is not a
//! `core/v1` `Affinity` fails the render with the field named, before any object is touched.

use kiln_plugin_sdk::k8s_openapi::api::core::v1::{Affinity, PodSpec, Toleration};
use kiln_plugin_sdk::serde_json::{self, Value};
use kiln_plugin_sdk::{Call, Decision, FieldError, Plugin, TransformError};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The plugin.
pub struct NodePlacement;

/// Its settings (all optional; none at all leaves the objects unchanged).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Settings {
    /// Labels merged into the pod's `nodeSelector` (a key given here wins).
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations appended to the pod's, each unless an equal one is there.
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
    /// The pod's affinity, replacing any it had.
    #[serde(default)]
    pub affinity: Option<Affinity>,
}

/// Kinds whose pod template is placed.
const KINDS: &[&str] = &["DaemonSet", "Deployment"];

impl Plugin for NodePlacement {
    const NAME: &'static str = "node-placement";
    type Settings = Settings;

    fn validate(settings: &Settings) -> Vec<FieldError> {
        let mut errors = Vec::new();
        for (key, value) in &settings.node_selector {
            if let Err(m) = check_label_key(key) {
                errors.push(FieldError::new(format!("nodeSelector.{key}"), m));
            }
            if let Err(m) = check_label_value(value) {
                errors.push(FieldError::new(format!("nodeSelector.{key}"), m));
            }
        }
        for (i, t) in settings.tolerations.iter().enumerate() {
            let at = |f: &str| format!("tolerations[{i}].{f}");
            match t.operator.as_deref() {
                None | Some("Equal") => {}
                Some("Exists") if t.value.as_deref().is_some_and(|v| !v.is_empty()) => {
                    errors.push(FieldError::new(
                        at("value"),
                        "must be empty when operator is Exists",
                    ));
                }
                Some("Exists") => {}
                Some(other) => errors.push(FieldError::new(
                    at("operator"),
                    format!("{other:?}: expected Equal or Exists"),
                )),
            }
            if let Some(effect) = t.effect.as_deref()
                && !["", "NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect)
            {
                errors.push(FieldError::new(
                    at("effect"),
                    format!("{effect:?}: expected NoSchedule, PreferNoSchedule or NoExecute"),
                ));
            }
            if t.key.as_deref().is_none_or(str::is_empty) && t.operator.as_deref() != Some("Exists")
            {
                errors.push(FieldError::new(
                    at("operator"),
                    "must be Exists when key is empty",
                ));
            }
        }
        errors
    }

    fn edit(obj: &mut Value, call: &Call<'_, Settings>) -> Result<Decision, TransformError> {
        let kind = obj["kind"].as_str().unwrap_or_default().to_string();
        let s = call.settings;
        let nothing =
            s.node_selector.is_empty() && s.tolerations.is_empty() && s.affinity.is_none();
        if nothing || !KINDS.contains(&kind.as_str()) {
            return Ok(Decision::Keep);
        }
        // The pod spec is edited as the typed `core/v1` PodSpec and written back as it
        // serializes, like the standard plugins' DaemonSets (the host does not parse a bundled
        // plugin's output again).
        let slot = obj.pointer_mut("/spec/template/spec").ok_or_else(|| {
            TransformError::InvalidObject(format!("{kind} without spec.template.spec"))
        })?;
        let mut pod: PodSpec = serde_json::from_value(slot.take()).map_err(|e| {
            TransformError::InvalidObject(format!("{kind}: spec.template.spec: {e}"))
        })?;
        if !s.node_selector.is_empty() {
            let selector = pod.node_selector.get_or_insert_with(Default::default);
            selector.extend(s.node_selector.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        if !s.tolerations.is_empty() {
            let list = pod.tolerations.get_or_insert_with(Vec::new);
            for t in &s.tolerations {
                if !list.contains(t) {
                    list.push(t.clone());
                }
            }
        }
        if let Some(affinity) = &s.affinity {
            pod.affinity = Some(affinity.clone());
        }
        *slot = serde_json::to_value(pod).map_err(|e| TransformError::Failed(e.to_string()))?;
        Ok(Decision::Keep)
    }
}

kiln_plugin_sdk::export_plugin_with_settings!(NodePlacement);

/// A label key: an optional DNS subdomain prefix (at most 253 bytes) and `/`, then a name of
/// 1–63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric (apimachinery's
/// `IsQualifiedName`).
fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part.len() <= 63
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !ok {
            return Err(format!(
                "key {key:?}: the prefix must be a DNS subdomain (lowercase, at most 253 bytes)"
            ));
        }
    }
    if name.is_empty() {
        return Err(format!("key {key:?}: the name part must not be empty"));
    }
    check_name_part(name).map_err(|m| format!("key {key:?}: {m}"))
}

/// A label value: empty, or 1–63 alphanumerics, `-`, `_`, `.`, starting and ending
/// alphanumeric (apimachinery's `IsValidLabelValue`).
fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    check_name_part(value).map_err(|m| format!("value {value:?}: {m}"))
}

fn check_name_part(s: &str) -> Result<(), String> {
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    let ok = s.len() <= 63
        && s.bytes()
            .all(|b| alnum(b) || matches!(b, b'-' | b'_' | b'.'))
        && s.bytes().next().is_some_and(alnum)
        && s.bytes().last().is_some_and(alnum);
    if ok {
        Ok(())
    } else {
        Err("at most 63 characters, alphanumerics, '-', '_' or '.', starting and ending alphanumeric".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_plugin_sdk::settings::validate_plugin;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_plugin_cases::<NodePlacement>(
            env!("CARGO_MANIFEST_DIR"),
            4,
        );
    }

    #[test]
    fn every_bad_field_is_named() {
        let errors = validate_plugin::<NodePlacement>(
            r#"{"nodeSelector": {"pool": "a b", "Bad/x": "v"},
                "tolerations": [{"key": "k", "operator": "Exists", "value": "v", "effect": "Never"}]}"#,
        );
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "nodeSelector.Bad/x",
                "nodeSelector.pool",
                "tolerations[0].value",
                "tolerations[0].effect"
            ]
        );
        let errors = validate_plugin::<NodePlacement>(r#"{"affinity": {"nodeAffinity": 3}}"#);
        assert_eq!(errors[0].path, "affinity.nodeAffinity");
        assert!(validate_plugin::<NodePlacement>("null").is_empty());
    }
}
