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

/// A YAML stream like [`yaml_stream`], each document headed by a `# Source: …` comment line (as
/// `helm template` names the template a document came from). `docs` pairs the comment text —
/// for `kiln render`, the state and its plugin chain — with the object; a line break in the text
/// is replaced by a space so the comment stays one line.
///
/// # Errors
/// Serialization failures (not expected for JSON values).
pub fn yaml_stream_with_sources<'a>(
    docs: impl IntoIterator<Item = (&'a str, &'a Value)>,
) -> Result<String, serde_yaml_ng::Error> {
    let mut out = String::new();
    for (source, o) in docs {
        out.push_str(
            "---
# Source: ",
        );
        out.push_str(&source.replace(['\n', '\r'], " "));
        out.push('\n');
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
    use serde::Deserialize as _;

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
        let sourced =
            yaml_stream_with_sources([("state-x via x", &objs[0]), ("two\nlines", &objs[1])]);
        assert_eq!(
            sourced.unwrap(),
            "---\n# Source: state-x via x\nkind: A\nmetadata:\n  name: a\n---\n# Source: two lines\nkind: B\n"
        );
        let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(
            &yaml_stream_with_sources([("s", &objs[0]), ("s", &objs[1])]).unwrap(),
        )
        .map(|d| Value::deserialize(d).unwrap())
        .collect();
        assert_eq!(docs, objs, "the comments do not change the documents");
        let l: Value = serde_json::from_str(&json_list(&objs)).unwrap();
        assert_eq!(l["kind"], "List");
        assert_eq!(l["items"][1]["kind"], "B");
    }
}
