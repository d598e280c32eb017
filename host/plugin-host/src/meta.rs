//! What a plugin is told about the policy it renders for.

use serde_json::Value;

/// What a `kiln:operand@0.2.0` plugin is told about the policy it renders for (the context's
/// `policy-name` and `policy-annotations`); `0.1.0` plugins get nothing of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyMeta {
    /// `metadata.name` of the policy.
    pub name: String,
    /// `metadata.annotations`, sorted by key.
    pub annotations: Vec<(String, String)>,
}

impl PolicyMeta {
    /// The name and the (string-valued) annotations of a policy's `metadata` object; anything
    /// else there is ignored.
    pub fn from_metadata(metadata: Option<&Value>) -> Self {
        let name = metadata
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut annotations: Vec<(String, String)> = metadata
            .and_then(|m| m.get("annotations"))
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        annotations.sort();
        PolicyMeta { name, annotations }
    }
}
