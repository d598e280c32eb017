//! The operand RBAC objects in `assets/` and Kubernetes' rule-covering check, shared by the
//! `deploy` and `helm` tests.

use kiln_core::State;
use serde_json::Value;

/// Kinds of the RBAC objects the operator applies.
pub const RBAC_KINDS: [&str; 4] = ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"];

/// Every Role, ClusterRole, RoleBinding and ClusterRoleBinding of every state's assets (the
/// OpenShift-only files included, and a GPUCluster's DRA states'), placeholders filled for operator namespace `ns` — what the
/// operator applies before plugins run.
pub fn operand_rbac(ns: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let dra = kiln_core::spec::gpucluster::DraState::ALL
        .into_iter()
        .map(|s| kiln_render::assets::load_dra_state(s).expect("assets parse"));
    for assets in State::ALL
        .into_iter()
        .map(|s| kiln_render::assets::load_state(s, true).expect("assets parse"))
        .chain(dra)
    {
        for asset in assets {
            let mut obj = asset.object;
            let kind = obj["kind"].as_str().unwrap_or_default().to_string();
            if RBAC_KINDS.contains(&kind.as_str()) {
                kiln_render::placeholders::fill(&mut obj, ns, "nvidia");
                out.push(obj);
            }
        }
    }
    out
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// One atom of a rule: a single verb on a single group/resource (and name), or on a single
/// non-resource URL — Kubernetes' `BreakdownRule`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Atom {
    pub group: String,
    pub resource: String,
    pub verb: String,
    pub name: Option<String>,
    pub url: Option<String>,
}

fn breakdown(rule: &Value) -> Vec<Atom> {
    let mut atoms = Vec::new();
    let names = strings(&rule["resourceNames"]);
    for verb in strings(&rule["verbs"]) {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                let atom = |name: Option<&str>| Atom {
                    group: group.into(),
                    resource: resource.into(),
                    verb: verb.into(),
                    name: name.map(str::to_string),
                    url: None,
                };
                if names.is_empty() {
                    atoms.push(atom(None));
                } else {
                    atoms.extend(names.iter().map(|n| atom(Some(n))));
                }
            }
        }
        for url in strings(&rule["nonResourceURLs"]) {
            atoms.push(Atom {
                group: String::new(),
                resource: String::new(),
                verb: verb.into(),
                name: None,
                url: Some(url.into()),
            });
        }
    }
    atoms
}

/// Whether `owner` covers `atom`, as Kubernetes' `ruleCovers` (pkg/registry/rbac/validation):
/// verb, group and resource held (`*` and `*/subresource` forms included), and the name held
/// (an owner rule without names holds every name; one with names never holds "all names").
fn rule_covers(owner: &Value, atom: &Atom) -> bool {
    let has = |key: &str, v: &str| strings(&owner[key]).iter().any(|x| *x == v || *x == "*");
    if !has("verbs", &atom.verb) {
        return false;
    }
    if let Some(url) = &atom.url {
        return strings(&owner["nonResourceURLs"])
            .iter()
            .any(|o| *o == url || (o.ends_with('*') && url.starts_with(o.trim_end_matches('*'))));
    }
    let resources = strings(&owner["resources"]);
    let resource_ok = resources.iter().any(|r| {
        *r == "*"
            || *r == atom.resource
            || atom
                .resource
                .split_once('/')
                .is_some_and(|(_, sub)| *r == format!("*/{sub}"))
    });
    let owner_names = strings(&owner["resourceNames"]);
    let name_ok = owner_names.is_empty()
        || atom
            .name
            .as_deref()
            .is_some_and(|n| owner_names.contains(&n));
    has("apiGroups", &atom.group) && resource_ok && name_ok
}

/// The atoms of `servant` (a list of PolicyRules) that no rule of `owner` covers: empty when a
/// subject holding `owner` may create a role with `servant` without `escalate` (Kubernetes'
/// `ConfirmNoEscalation` → `Covers`).
pub fn uncovered(owner: &[Value], servant: &Value) -> Vec<Atom> {
    servant
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(breakdown)
        .filter(|atom| !owner.iter().any(|o| rule_covers(o, atom)))
        .collect()
}
