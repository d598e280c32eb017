//! The worked example of `wit/README.md`, compiled and run natively, so the documented code
//! keeps building as the SDK changes.

use kiln_plugin_sdk::serde_json::{Value, json};
use kiln_plugin_sdk::{Context, Decision, Outcome, TransformError, transform_each};

/// Add `nodeSelector: {pool: gpu-a}` to every DaemonSet of the state; keep everything else.
fn edit(obj: &mut Value, _spec: &Value, _ctx: &Context) -> Result<Decision, TransformError> {
    if obj["kind"] == "DaemonSet" {
        let pod = obj
            .pointer_mut("/spec/template/spec")
            .ok_or_else(|| TransformError::InvalidObject("DaemonSet without a pod spec".into()))?;
        pod["nodeSelector"]["pool"] = json!("gpu-a");
    }
    Ok(Decision::Keep)
}

kiln_plugin_sdk::export_plugin!("site-node-pool", edit);

#[test]
fn worked_example_adds_the_node_selector_and_leaves_other_objects() {
    let ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"app": "d"}}, "template": {"spec": {"containers": []}}}});
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "d"}});
    let out = transform_each(
        &[ds.to_string(), sa.to_string()],
        "{}",
        &Context::default(),
        edit,
    )
    .unwrap();
    assert_eq!(
        out[0],
        Outcome::Patch(
            r#"[{"op":"add","path":"/spec/template/spec/nodeSelector","value":{"pool":"gpu-a"}}]"#
                .into()
        )
    );
    assert_eq!(out[1], Outcome::Patch("[]".into()));
    let bad = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d"}});
    let err = transform_each(&[bad.to_string()], "{}", &Context::default(), edit).unwrap_err();
    assert_eq!(
        err,
        TransformError::InvalidObject("DaemonSet without a pod spec".into())
    );
}
