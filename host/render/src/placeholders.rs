//! Host-side placeholder substitution, done before any plugin runs (upstream does the same in
//! its per-kind control functions): namespaced objects go to the operator namespace, and the
//! `FILLED_BY_OPERATOR` placeholders of RBAC subjects, ServiceMonitor namespace selectors and
//! SCC users get the namespace. A RuntimeClass named by the placeholder takes the policy's
//! `operator.runtimeClass` (object identity is the host's job: plugins may not rename objects;
//! the `pre-requisites` plugin sets the handler).

use serde_json::{Value, json};

/// The placeholder text assets carry.
pub const PLACEHOLDER: &str = "FILLED_BY_OPERATOR";

/// Kinds that are cluster-scoped; every other kind in our assets is namespaced.
const CLUSTER_SCOPED: [&str; 8] = [
    "ClusterRole",
    "ClusterRoleBinding",
    "RuntimeClass",
    "SecurityContextConstraints",
    "Namespace",
    "DeviceClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// Whether objects of `kind` live in a namespace.
pub fn is_namespaced(kind: &str) -> bool {
    !CLUSTER_SCOPED.contains(&kind)
}

/// Fill the placeholders of `obj` for operator namespace `ns` and runtime class `runtime_class`.
pub fn fill(obj: &mut Value, ns: &str, runtime_class: &str) {
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if is_namespaced(&kind) {
        obj["metadata"]["namespace"] = json!(ns);
    }
    match kind.as_str() {
        "RoleBinding" | "ClusterRoleBinding" => {
            for s in obj
                .get_mut("subjects")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if s.get("namespace").and_then(Value::as_str) == Some(PLACEHOLDER) {
                    s["namespace"] = json!(ns);
                }
            }
        }
        "ServiceMonitor" => {
            let names = obj
                .pointer_mut("/spec/namespaceSelector/matchNames")
                .and_then(Value::as_array_mut);
            for n in names.into_iter().flatten() {
                if n == PLACEHOLDER {
                    *n = json!(ns);
                }
            }
        }
        "RuntimeClass"
            if obj.pointer("/metadata/name").and_then(Value::as_str) == Some(PLACEHOLDER) =>
        {
            obj["metadata"]["name"] = json!(runtime_class);
        }
        "SecurityContextConstraints" => {
            let name = obj
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            for u in obj
                .get_mut("users")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if u.as_str().is_some_and(|s| s.contains(PLACEHOLDER)) {
                    *u = json!(format!("system:serviceaccount:{ns}:{name}"));
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_namespace_subjects_and_selectors() {
        let mut rb = json!({"kind": "ClusterRoleBinding", "metadata": {"name": "x"},
            "subjects": [{"kind": "ServiceAccount", "name": "x", "namespace": "FILLED_BY_OPERATOR"}]});
        fill(&mut rb, "gpu", "nvidia");
        assert_eq!(rb["subjects"][0]["namespace"], "gpu");
        assert!(rb["metadata"].get("namespace").is_none());
        let mut sm = json!({"kind": "ServiceMonitor", "metadata": {"name": "m"},
            "spec": {"namespaceSelector": {"matchNames": ["FILLED_BY_OPERATOR"]}}});
        fill(&mut sm, "gpu", "nvidia");
        assert_eq!(sm["metadata"]["namespace"], "gpu");
        assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"][0], "gpu");
        let mut scc = json!({"kind": "SecurityContextConstraints", "metadata": {"name": "nvidia-dcgm"},
            "users": ["FILLED_BY_OPERATOR"]});
        fill(&mut scc, "gpu", "nvidia");
        assert_eq!(scc["users"][0], "system:serviceaccount:gpu:nvidia-dcgm");
        let mut rc = json!({"kind": "RuntimeClass", "metadata": {"name": "FILLED_BY_OPERATOR"}, "handler": "FILLED_BY_OPERATOR"});
        fill(&mut rc, "gpu", "nvidia-x");
        assert_eq!(rc["metadata"]["name"], "nvidia-x");
        assert!(rc["metadata"].get("namespace").is_none());
    }
}
