//! A standard operand's answer per object: section patches for DaemonSets, untouched unlisted
//! kinds.

use super::*;
use serde_json::json;

/// How the kiln host's compact, sorted text of a DaemonSet starts (the SDK's fast path).
const DAEMONSET_PREFIX: &str = r#"{"apiVersion":"apps/v1","kind":"DaemonSet","#;

/// Labels DaemonSets `test/seen=<state>` and omits ConfigMaps named `drop-me`.
struct Labeler;

impl Operand for Labeler {
    const NAME: &'static str = "labeler";
    const OBJECT_KINDS: &'static [&'static str] = &["ConfigMap"];

    fn daemonset(
        ds: &mut DaemonSet,
        _spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        ds.metadata
            .labels
            .get_or_insert_default()
            .insert("test/seen".into(), ctx.state.clone());
        Ok(())
    }

    fn object(
        obj: &mut Value,
        _spec: &ClusterPolicySpec,
        _ctx: &TransformContext,
    ) -> Result<Decision, TransformError> {
        Ok(if obj["metadata"]["name"] == "drop-me" {
            Decision::Omit
        } else {
            Decision::Keep
        })
    }
}

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

fn ctx() -> TransformContext {
    TransformContext {
        state: "test".into(),
        ..TransformContext::default()
    }
}

fn run(texts: &[String]) -> Vec<Outcome> {
    run_operand::<Labeler>(texts, "{}", &ctx()).unwrap()
}

fn ops(outcome: &Outcome) -> Value {
    match outcome {
        Outcome::Patch(p) => serde_json::from_str(p).unwrap(),
        Outcome::Omit => panic!("omitted"),
    }
}

#[test]
fn daemonset_patch_replaces_only_changed_sections() {
    let compact = daemonset().to_string();
    assert!(compact.starts_with(DAEMONSET_PREFIX), "{compact}");
    let out = ops(&run(std::slice::from_ref(&compact))[0]);
    // Only the label changed: `/spec` keeps its input JSON.
    assert_eq!(out.as_array().unwrap().len(), 1, "{out}");
    assert_eq!(out[0]["op"], "add");
    assert_eq!(out[0]["path"], "/metadata");
    assert_eq!(out[0]["value"]["labels"]["test/seen"], "test");
    assert_eq!(out[0]["value"]["name"], "ds");
    // A spec that changes the pod template patches `/spec` as well.
    let spec = r#"{"daemonsets": {"priorityClassName": "gpu-critical"}}"#;
    let both =
        ops(&run_operand::<Labeler>(std::slice::from_ref(&compact), spec, &ctx()).unwrap()[0]);
    assert_eq!(both[1]["path"], "/spec", "{both}");
    assert_eq!(
        both[1]["value"]["template"]["spec"]["priorityClassName"],
        "gpu-critical"
    );
    assert_eq!(
        both[1]["value"]["selector"],
        json!({"matchLabels": {"app": "ds"}})
    );
    // The same object written another way (pretty, other member order) takes the general
    // path and gets the same patch.
    let mut reordered = serde_json::Map::new();
    for key in ["spec", "metadata", "kind", "apiVersion"] {
        reordered.insert(key.into(), daemonset()[key].clone());
    }
    let pretty = serde_json::to_string_pretty(&reordered).unwrap();
    assert!(!pretty.starts_with(DAEMONSET_PREFIX));
    assert_eq!(ops_of(&pretty), out);
}

fn ops_of(text: &str) -> Value {
    ops(&run(&[text.to_string()])[0])
}

#[test]
fn unlisted_kinds_pass_unparsed_and_listed_kinds_reach_object() {
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa"}});
    let keep = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keep-me"}});
    let drop = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "drop-me"}});
    let texts: Vec<String> = [sa, keep, drop].iter().map(Value::to_string).collect();
    assert_eq!(
        run(&texts),
        vec![
            Outcome::Patch("[]".into()),
            Outcome::Patch("[]".into()),
            Outcome::Omit
        ]
    );
}

#[test]
fn bad_objects_are_named() {
    let err = run_operand::<Labeler>(&["[1]".into()], "{}", &ctx()).unwrap_err();
    assert!(
        matches!(&err, TransformError::InvalidObject(m) if m.starts_with("object #0 is not a JSON object")),
        "{err:?}"
    );
    let not_ds = r#"{"apiVersion":"apps/v1","kind":"DaemonSet","spec":{"selector":7}}"#;
    let err = run_operand::<Labeler>(&[not_ds.into()], "{}", &ctx()).unwrap_err();
    assert!(
        matches!(&err, TransformError::InvalidObject(m) if m.starts_with("object #0 is not a DaemonSet")),
        "{err:?}"
    );
}

/// Edits Services without listing the kind.
struct Forgetful;

impl Operand for Forgetful {
    const NAME: &'static str = "forgetful";

    fn daemonset(
        _ds: &mut DaemonSet,
        _spec: &ClusterPolicySpec,
        _ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        Ok(())
    }

    fn object(
        obj: &mut Value,
        _spec: &ClusterPolicySpec,
        _ctx: &TransformContext,
    ) -> Result<Decision, TransformError> {
        obj["spec"] = json!({"type": "NodePort"});
        Ok(Decision::Keep)
    }
}

#[test]
#[should_panic(expected = "OBJECT_KINDS) do not list")]
fn debug_builds_catch_an_unlisted_kind_that_object_edits() {
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}});
    let _ = run_operand::<Forgetful>(&[svc.to_string()], "{}", &ctx());
}

/// Compact text (the kiln host's) is compared section by section as text, any other text as
/// typed objects: both answer the same patch, also with strings that hold JSON punctuation and
/// a `status` that stays.
#[test]
fn text_and_typed_comparisons_agree() {
    let mut ds = daemonset();
    ds["metadata"]["annotations"] = json!({"tricky": "a}\"b,{[\\", "n": "x\ny"});
    ds["status"] = json!({"currentNumberScheduled": 1, "desiredNumberScheduled": 2,
        "numberMisscheduled": 0, "numberReady": 1});
    let compact = ds.to_string();
    let pretty = serde_json::to_string_pretty(&ds).unwrap();
    for spec in [
        "{}",
        r#"{"daemonsets": {"priorityClassName": "gpu-critical"}}"#,
    ] {
        let text =
            ops(&run_operand::<Labeler>(std::slice::from_ref(&compact), spec, &ctx()).unwrap()[0]);
        let typed =
            ops(&run_operand::<Labeler>(std::slice::from_ref(&pretty), spec, &ctx()).unwrap()[0]);
        assert_eq!(text, typed, "{spec}");
        assert!(
            text.as_array()
                .unwrap()
                .iter()
                .all(|op| op["path"] != "/status"),
            "{text}"
        );
    }
}
