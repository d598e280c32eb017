//! Output formats of `kiln render`: a YAML stream or a JSON `v1 List`.

use serde_json::{Value, json};

/// A YAML stream: each object as one document, separated by `---`.
///
/// # Errors
/// Serialization failures (not expected for JSON values).
pub fn yaml_stream(objects: &[Value]) -> Result<String, serde_yaml_ng::Error> {
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(o)?);
    }
    Ok(out)
}

/// A `v1 List` holding the objects, pretty-printed JSON.
pub fn json_list(objects: &[Value]) -> String {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let mut s = serde_json::to_string_pretty(&list).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        let objs = [
            json!({"kind": "A", "metadata": {"name": "a"}}),
            json!({"kind": "B"}),
        ];
        assert_eq!(
            yaml_stream(&objs).unwrap(),
            "---\nkind: A\nmetadata:\n  name: a\n---\nkind: B\n"
        );
        let l: Value = serde_json::from_str(&json_list(&objs)).unwrap();
        assert_eq!(l["kind"], "List");
        assert_eq!(l["items"][1]["kind"], "B");
    }
}
