//! Typed edits: section patches for DaemonSets, untouched unlisted kinds, compact-text reading.

use super::*;
use serde_json::json;

fn daemonset() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "ds", "namespace": "ns"},
        "spec": {
            "selector": {"matchLabels": {"app": "ds"}},
            "template": {"metadata": {"labels": {"app": "ds"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        }
    })
}

/// Labels DaemonSets `test/seen=yes` and omits ConfigMaps named `drop-me`.
fn label(texts: &[String]) -> Result<Vec<Outcome>, TransformError> {
    transform_typed(
        texts,
        &["ConfigMap"],
        |ds| {
            ds.metadata
                .labels
                .get_or_insert_default()
                .insert("test/seen".into(), "yes".into());
            Ok(())
        },
        |obj| {
            Ok(if obj["metadata"]["name"] == "drop-me" {
                Decision::Omit
            } else {
                Decision::Keep
            })
        },
    )
}

/// A DaemonSet is answered with its changed section only, as the typed object serializes it;
/// compact text and any other text of the same object give the same patch; listed kinds reach
/// `object`, unlisted ones pass unparsed.
#[test]
fn typed_edits_answer_changed_sections() {
    let mut ds = daemonset();
    ds["metadata"]["annotations"] = json!({"tricky": "a}\"b,{[\\", "n": "x\ny"});
    ds["status"] = json!({"numberReady": 1, "currentNumberScheduled": 1,
        "desiredNumberScheduled": 2, "numberMisscheduled": 0});
    let compact = ds.to_string();
    assert!(compact.starts_with(DAEMONSET_PREFIX), "{compact}");
    let pretty = serde_json::to_string_pretty(&ds).unwrap();
    let mut seen = ds["metadata"].clone();
    seen["labels"] = json!({"test/seen": "yes"});
    for text in [compact, pretty] {
        let out = label(&[text]).unwrap();
        let Outcome::Patch(p) = &out[0] else {
            panic!("omitted")
        };
        let ops: Value = serde_json::from_str(p).unwrap();
        assert_eq!(
            ops,
            json!([{"op": "add", "path": "/metadata", "value": seen}])
        );
    }
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa"}});
    let keep = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keep-me"}});
    let drop = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "drop-me"}});
    let texts: Vec<String> = [sa, keep, drop].iter().map(Value::to_string).collect();
    assert_eq!(
        label(&texts).unwrap(),
        vec![
            Outcome::Patch("[]".into()),
            Outcome::Patch("[]".into()),
            Outcome::Omit
        ]
    );
    let err = label(&["[1]".into()]).unwrap_err();
    assert!(
        matches!(&err, TransformError::InvalidObject(m) if m.starts_with("object #0 is not a JSON object")),
        "{err:?}"
    );
}

/// The kind of compact sorted text is read off its start; anything else is left to the parse.
#[test]
fn compact_kind_reads_only_plain_prefixes() {
    assert_eq!(
        compact_kind(r#"{"apiVersion":"v1","kind":"ServiceAccount","metadata":{}}"#),
        Some("ServiceAccount")
    );
    assert_eq!(
        compact_kind(r#"{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role"}"#),
        Some("Role")
    );
    assert_eq!(compact_kind(&daemonset().to_string()), Some("DaemonSet"));
    for other in [
        r#"{"kind":"Role","apiVersion":"v1"}"#,
        r#"{"apiVersion":"v\"1","kind":"Role"}"#,
        r#"{"apiVersion":"v1","kind":"Ro\u006ce"}"#,
        r#"{"apiVersion":"v1","kind":"Role"x}"#,
        r#"{"apiVersion": "v1", "kind": "Role"}"#,
        r#"{"apiVersion":"v1"}"#,
        "[1]",
    ] {
        assert_eq!(compact_kind(other), None, "{other}");
    }
}

/// Strings are skipped to their closing quote over escapes: an escaped quote, an escaped
/// backslash right before the closing quote, and JSON punctuation inside strings do not end a
/// member; an unterminated string is no compact object.
#[test]
fn top_level_members_skip_strings_over_escapes() {
    let text = r#"{"a":"x\"},","b":["\\",{"c":"]}\\\""}],"d":{}}"#;
    let members = top_level_members(text).unwrap();
    assert_eq!(
        members,
        [
            ("a", r#""x\"},""#),
            ("b", r#"["\\",{"c":"]}\\\""}]"#),
            ("d", "{}")
        ]
    );
    let value: Value = serde_json::from_str(text).unwrap();
    for (key, raw) in &members {
        assert_eq!(serde_json::from_str::<Value>(raw).unwrap(), value[*key]);
    }
    assert!(top_level_members(r#"{"a":"open\"}"#).is_none());
    assert!(top_level_members(r#"{"a":"x\}"#).is_none());
}
