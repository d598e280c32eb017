//! deploy/: the operator's RBAC (least privilege, and enough for every operand role in
//! `assets/`), the Helm chart's copies in sync, locked-down operator pods, and the chart's
//! ClusterPolicy accepted by kiln (`helm template`, when `testcluster/bin/helm` is built).
//!
//! The chart is the source: `deploy/helm/kiln/files/{rules,namespace-rules,events-rules}.yaml`
//! hold the rules, `templates/` the objects; `deploy/rbac/` repeats them for namespace
//! `gpu-operator` (written by `deploy/rbac/regenerate.sh`) and these tests keep the copies equal.

mod gpucluster;
mod network_policy;

use crate::support::helm::docs;
use crate::support::rbac;
use crate::support::repo;

use std::collections::BTreeSet;

use serde_json::{Value, json};

const NS: &str = "gpu-operator";

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Value {
    serde_yaml_ng::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The chart's rule files: (ClusterRole `kiln-operator`, Role `kiln-operator` in the operator
/// namespace, Role `kiln-operator-events` in `default`).
fn chart_rules() -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let list = |p: &str| yaml(p).as_array().unwrap().clone();
    (
        list("deploy/helm/kiln/files/rules.yaml"),
        list("deploy/helm/kiln/files/namespace-rules.yaml"),
        list("deploy/helm/kiln/files/events-rules.yaml"),
    )
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn rbac_is_the_charts_and_holds_no_wildcard_escalation_or_foreign_secret() {
    let objects = docs(&read("deploy/rbac/kiln-operator.yaml"));
    let (cluster, namespaced, events) = chart_rules();
    let role = |kind, name| find(&objects, kind, name)["rules"].clone();
    assert_eq!(role("ClusterRole", "kiln-operator"), json!(cluster));
    assert_eq!(role("Role", "kiln-operator"), json!(namespaced));
    assert_eq!(role("Role", "kiln-operator-events"), json!(events));
    assert_eq!(
        find(&objects, "Role", "kiln-operator")["metadata"]["namespace"],
        NS
    );
    assert_eq!(
        find(&objects, "Role", "kiln-operator-events")["metadata"]["namespace"],
        "default"
    );
    for (kind, name, role_kind) in [
        ("ClusterRoleBinding", "kiln-operator", "ClusterRole"),
        ("RoleBinding", "kiln-operator", "Role"),
        ("RoleBinding", "kiln-operator-events", "Role"),
    ] {
        let b = find(&objects, kind, name);
        assert_eq!(
            b["roleRef"],
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name})
        );
        assert_eq!(
            b["subjects"],
            json!([{"kind": "ServiceAccount", "name": "kiln-operator", "namespace": NS}])
        );
    }
    assert_eq!(
        role("ClusterRole", "kiln-metrics-reader"),
        json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );

    for rule in cluster.iter().chain(&namespaced).chain(&events) {
        for key in ["verbs", "resources", "apiGroups", "resourceNames"] {
            assert!(
                !strs(&rule[key]).contains(&"*"),
                "wildcard in {key}: {rule}"
            );
        }
        let verbs = strs(&rule["verbs"]);
        for verb in ["escalate", "impersonate", "deletecollection"] {
            assert!(!verbs.contains(&verb), "{verb}: {rule}");
        }
        let resources = strs(&rule["resources"]);
        if rule["apiGroups"] == json!(["rbac.authorization.k8s.io"])
            && rule.get("resourceNames").is_none()
        {
            // Reads (the labelled-object cache) may be unnamed; of the writes only `create`,
            // which Kubernetes cannot limit by name.
            assert!(
                verbs
                    .iter()
                    .all(|v| ["create", "list", "watch"].contains(v)),
                "RBAC writes must be limited by name: {rule}"
            );
        }
        if resources.contains(&"nodes") {
            assert!(!verbs.contains(&"delete"), "{rule}");
        }
        if resources.contains(&"secrets") {
            assert_eq!(verbs, ["get"], "{rule}");
        }
    }
    let secrets_anywhere = |rules: &[Value]| {
        rules
            .iter()
            .any(|r| strs(&r["resources"]).contains(&"secrets"))
    };
    assert!(
        !secrets_anywhere(&cluster),
        "Secrets only in the operator namespace"
    );
    assert!(secrets_anywhere(&namespaced));
}

#[test]
fn the_charts_crd_is_the_generated_one() {
    assert_eq!(
        read("deploy/helm/kiln/crds/clusterpolicies.nvidia.com.yaml"),
        kiln_operator::crd::crd_yaml(),
        "the chart's CRD copy drifted; copy deploy/crds/clusterpolicies.nvidia.com.yaml"
    );
}

/// The names in the rules that limit RBAC writes by name, per resource.
fn rbac_names(rules: &[Value], resource: &str) -> BTreeSet<String> {
    rules
        .iter()
        .filter(|r| r["apiGroups"] == json!(["rbac.authorization.k8s.io"]))
        .filter(|r| strs(&r["resources"]).contains(&resource))
        .flat_map(|r| strs(&r["resourceNames"]))
        .map(str::to_string)
        .collect()
}

#[test]
fn operator_rbac_covers_every_operand_role_and_binding_in_the_assets() {
    let (cluster, namespaced, _) = chart_rules();
    // In its namespace the operator holds the Role and the ClusterRole.
    let in_ns: Vec<Value> = namespaced.iter().chain(&cluster).cloned().collect();
    let operands = rbac::operand_rbac(NS);
    assert!(operands.len() >= 70, "{} RBAC objects", operands.len());
    let mut names: [BTreeSet<String>; 4] = Default::default();
    // Every gap at once, so one run says everything the rule files lack.
    let mut missing = Vec::new();
    for obj in &operands {
        let kind = obj["kind"].as_str().unwrap();
        let name = obj["metadata"]["name"].as_str().unwrap();
        let (held, resource, idx) = match kind {
            "ClusterRole" => (&cluster, "clusterroles", 0),
            "ClusterRoleBinding" => (&cluster, "clusterrolebindings", 1),
            "Role" => (&in_ns, "roles", 2),
            _ => (&in_ns, "rolebindings", 3),
        };
        names[idx].insert(name.to_string());
        // Server-side apply: GET, then PATCH by name (which creates when absent), and delete.
        let write = json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": [resource],
            "verbs": ["get", "create", "patch", "delete"], "resourceNames": [name]}]);
        let mut gaps = rbac::uncovered(held, &write);
        if kind.ends_with("Role") {
            // Without `escalate` a role may only hold rules its writer holds.
            gaps.extend(rbac::uncovered(held, &obj["rules"]));
        } else {
            let role_kind = obj["roleRef"]["kind"].as_str().unwrap();
            let role = obj["roleRef"]["name"].as_str().unwrap();
            let bind = json!([{"apiGroups": ["rbac.authorization.k8s.io"],
                "resources": [if role_kind == "Role" { "roles" } else { "clusterroles" }],
                "verbs": ["bind"], "resourceNames": [role]}]);
            gaps.extend(rbac::uncovered(held, &bind));
        }
        missing.extend(gaps.into_iter().map(|a| format!("{kind} {name}: {a:?}")));
    }
    assert!(
        missing.is_empty(),
        "the operator's rules (deploy/helm/kiln/files) lack:\n{}",
        missing.join("\n")
    );
    // The name lists hold exactly the assets' names: none stale, none missing.
    let [cr, crb, r, rb] = names;
    assert_eq!(rbac_names(&cluster, "clusterroles"), cr);
    assert_eq!(rbac_names(&cluster, "clusterrolebindings"), crb);
    assert_eq!(rbac_names(&namespaced, "roles"), r);
    assert_eq!(rbac_names(&namespaced, "rolebindings"), rb);
    let scc_names = |rules: &mut dyn Iterator<Item = &Value>| -> BTreeSet<String> {
        rules
            .filter(|r| strs(&r["resources"]).contains(&"securitycontextconstraints"))
            .flat_map(|r| strs(&r["resourceNames"]))
            .map(str::to_string)
            .collect()
    };
    let operand_rules = operands
        .iter()
        .filter(|o| o["kind"] == "Role")
        .flat_map(|o| o["rules"].as_array().unwrap());
    assert_eq!(
        scc_names(&mut namespaced.iter()),
        scc_names(&mut operand_rules.into_iter()),
        "SCC names to `use`"
    );

    // The check itself refuses what the operator must not be able to grant.
    let all = json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
    assert!(!rbac::uncovered(&cluster, &all).is_empty());
    let node_delete = json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["delete"]}]);
    assert_eq!(rbac::uncovered(&cluster, &node_delete).len(), 1);
    let secrets = json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]);
    assert_eq!(rbac::uncovered(&cluster, &secrets).len(), 1);
    let bind_admin = json!([{"apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["cluster-admin"]}]);
    assert_eq!(rbac::uncovered(&cluster, &bind_admin).len(), 1);
}

/// The operator keeps a metadata cache of its labelled objects for every kind the assets use
/// (`kiln_operator::live::asset_kinds`) and decides deletions from it, so it must be able to
/// list and watch each kind: namespaced kinds in its namespace, cluster-scoped ones
/// cluster-wide. Without it stale objects of that kind are never deleted.
#[test]
fn operator_rbac_lists_and_watches_every_asset_kind() {
    let (cluster, namespaced, _) = chart_rules();
    let in_ns: Vec<Value> = namespaced.iter().chain(&cluster).cloned().collect();
    let kinds = kiln_operator::live::asset_kinds();
    assert!(kinds.len() >= 12, "{kinds:?}");
    let mut missing = Vec::new();
    for (api_version, kind) in &kinds {
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        // The asset kinds' plurals: lowercase plus "s", "es" after "ss"; a kind already
        // plural (SecurityContextConstraints) stays as it is.
        let lower = kind.to_lowercase();
        let resource = if lower.ends_with("ss") {
            format!("{lower}es")
        } else if lower.ends_with('s') {
            lower
        } else {
            format!("{lower}s")
        };
        let held = if !kiln_render::placeholders::is_namespaced(kind) {
            &cluster
        } else {
            &in_ns
        };
        let want =
            json!([{"apiGroups": [group], "resources": [resource], "verbs": ["list", "watch"]}]);
        missing.extend(
            rbac::uncovered(held, &want)
                .into_iter()
                .map(|a| format!("{kind}: {a:?}")),
        );
    }
    assert!(
        missing.is_empty(),
        "the operator cannot list/watch:\n{}",
        missing.join("\n")
    );
}

/// The operator's other watches ([`kiln_operator::run::WATCHED_RESOURCES`]): each must be
/// allowed to list and watch, else its store stays at the first list (a refused
/// ControllerRevision watch kept the driver's revisions from ever updating and was retried
/// every 30 s, 2 requests a minute at rest).
#[test]
fn operator_rbac_lists_and_watches_every_watched_resource() {
    let (cluster, namespaced, _) = chart_rules();
    let in_ns: Vec<Value> = namespaced.iter().chain(&cluster).cloned().collect();
    let mut missing = Vec::new();
    for (group, resource, is_namespaced) in kiln_operator::run::WATCHED_RESOURCES {
        let held = if *is_namespaced { &in_ns } else { &cluster };
        let want =
            json!([{"apiGroups": [group], "resources": [resource], "verbs": ["list", "watch"]}]);
        missing.extend(rbac::uncovered(held, &want));
    }
    assert!(
        missing.is_empty(),
        "the operator cannot list/watch: {missing:?}"
    );
    // The check itself: a list-only grant is reported.
    let list_only = json!([{"apiGroups": ["apps"], "resources": ["controllerrevisions"],
        "verbs": ["list"]}]);
    let want = json!([{"apiGroups": ["apps"], "resources": ["controllerrevisions"],
        "verbs": ["list", "watch"]}]);
    assert_eq!(
        rbac::uncovered(list_only.as_array().unwrap(), &want).len(),
        1
    );
}

/// The operator pod: non-root, RuntimeDefault seccomp, and each container without privilege
/// escalation, capabilities or a writable root filesystem.
fn assert_locked_down(deployment: &Value) {
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{pod}");
    assert_eq!(
        pod["securityContext"]["seccompProfile"],
        json!({"type": "RuntimeDefault"})
    );
    let containers: Vec<&Value> = pod["initContainers"]
        .as_array()
        .into_iter()
        .chain(pod["containers"].as_array())
        .flatten()
        .collect();
    assert_eq!(containers.len(), 2);
    for c in containers {
        let sc = &c["securityContext"];
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{c}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{c}");
        assert_eq!(sc["runAsNonRoot"], true, "{c}");
        assert_eq!(sc["capabilities"], json!({"drop": ["ALL"]}), "{c}");
        assert_eq!(
            sc["seccompProfile"],
            json!({"type": "RuntimeDefault"}),
            "{c}"
        );
    }
}

#[test]
fn the_operator_deployment_is_locked_down() {
    let objects = docs(&read("deploy/operator/deployment.yaml"));
    let dep = find(&objects, "Deployment", "kiln-operator");
    assert_locked_down(dep);
    assert_eq!(
        dep.pointer("/spec/template/spec/containers/0/args")
            .unwrap(),
        &json!(["operator", "--leader-elect", "--metrics-auth", "kubernetes"])
    );
}

fn helm_template(extra: &[&str]) -> Option<Vec<Value>> {
    crate::support::helm::template(extra).map(|r| r.unwrap_or_else(|e| panic!("{e}")))
}

#[test]
fn helm_template_renders_a_valid_policy() {
    let Some(objects) = helm_template(&[]) else {
        return;
    };
    // The release's objects; the hook Jobs and their RBAC (helm.sh/hook) are checked by
    // helm_lifecycle.rs.
    let hooked = |o: &Value| o["metadata"]["annotations"]["helm.sh/hook"].is_string();
    let mut hooks: Vec<&str> = objects
        .iter()
        .filter(|o| hooked(o))
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    hooks.sort_unstable();
    assert_eq!(
        hooks,
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "Job",
            "Job",
            "Role",
            "RoleBinding",
            "ServiceAccount",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
    );
    let mut kinds: Vec<&str> = objects
        .iter()
        .filter(|o| !hooked(o))
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            "ClusterPolicy",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "DaemonSet",
            "Deployment",
            "NetworkPolicy",
            "NetworkPolicy",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "ServiceAccount",
            "ServiceAccount",
        ]
        .into_iter()
        // The operator's 8, and kiln's device plugin's node-health and node-events.
        .chain(["ValidatingAdmissionPolicy"; 10])
        .chain(["ValidatingAdmissionPolicyBinding"; 10])
        .collect::<Vec<_>>()
    );
    let cp = find(&objects, "ClusterPolicy", "cluster-policy");
    let policy = kiln_render::Policy::from_object(cp).unwrap();
    assert_eq!(policy.name, "cluster-policy");
    assert_eq!(
        policy.spec.mig.strategy.map(|s| format!("{s:?}")),
        Some("Single".into())
    );
    assert_eq!(policy.spec.dcgm.common.enabled, Some(false));
    // NVIDIA's chart defaults for rolling driver upgrades (its values.yaml `driver.upgradePolicy`,
    // `gpuPodDeletion` rendered as the policy's `podDeletion`).
    assert_eq!(
        cp["spec"]["driver"]["upgradePolicy"],
        json!({"autoUpgrade": true, "maxParallelUpgrades": 1, "maxUnavailable": "25%",
            "waitForCompletion": {"timeoutSeconds": 0, "podSelector": ""},
            "podDeletion": {"force": false, "timeoutSeconds": 300, "deleteEmptyDir": false},
            "drain": {"enable": false, "force": false, "podSelector": "", "timeoutSeconds": 300,
                "deleteEmptyDir": false}})
    );
    // deploy/rbac/*.yaml are the chart's objects, verbatim.
    let copies: Vec<Value> = docs(&read("deploy/rbac/kiln-operator.yaml"))
        .into_iter()
        .chain(docs(&read("deploy/rbac/node-patch-policy.yaml")))
        .chain(docs(&read("deploy/rbac/admission-policies.yaml")))
        .collect();
    for copy in &copies {
        let kind = copy["kind"].as_str().unwrap();
        let name = copy["metadata"]["name"].as_str().unwrap();
        assert_eq!(
            find(&objects, kind, name),
            copy,
            "{kind} {name}: deploy/rbac drifted from the chart; run deploy/rbac/regenerate.sh"
        );
    }
    // NetworkPolicies are not RBAC (deploy/network_policy.rs checks them); the node discovery
    // (templates/discovery.yaml, nfd.enabled) is not the operator's.
    let network = |o: &Value| o["kind"] == "NetworkPolicy";
    let discovery = |o: &Value| o["metadata"]["name"] == "kiln-node-discovery";
    assert_eq!(
        copies.len(),
        objects
            .iter()
            .filter(|o| !hooked(o) && !network(o) && !discovery(o))
            .count()
            - 2,
        "every object but Deployment, policy, NetworkPolicies, node discovery and the hooks"
    );
    let dep = find(&objects, "Deployment", "kiln-operator");
    assert_locked_down(dep);
    assert_eq!(
        dep.pointer("/spec/template/spec/containers/0/args")
            .unwrap(),
        &json!(["operator", "--leader-elect", "--metrics-auth", "kubernetes"])
    );

    let off = helm_template(&[
        "--set",
        "operator.nodePatchPolicy.enabled=false",
        "--set",
        "operator.metricsAuth=none",
    ])
    .unwrap();
    assert!(!off.iter().any(|o| o["kind"] == "ValidatingAdmissionPolicy"
        || o["kind"] == "ValidatingAdmissionPolicyBinding"));
    assert_eq!(
        find(&off, "Deployment", "kiln-operator")
            .pointer("/spec/template/spec/containers/0/args")
            .unwrap(),
        &json!(["operator", "--leader-elect", "--metrics-auth", "none"])
    );
}

/// `files/admission.yaml`, the data of the chart's admission policies, is a copy of the code and
/// the assets it names: the node labels the operator writes, the upgrade's annotation prefix,
/// state label and eviction states, the NFD GPU labels, the GPU resource prefixes, every operand
/// binding with the one ServiceAccount it binds, and the fixed RuntimeClass names.
#[test]
fn admission_policy_data_is_the_codes_and_the_assets() {
    use kiln_core::labels::{GPU_PRESENT, MIG_CONFIG, NFD_GPU_LABELS, known_deploy_keys};
    use kiln_core::upgrade::{self, UpgradeState};
    let data = yaml("deploy/helm/kiln/files/admission.yaml");
    let set = |v: &Value| -> BTreeSet<String> { strs(v).into_iter().map(str::to_string).collect() };

    let owned: BTreeSet<String> = known_deploy_keys()
        .into_iter()
        .chain(kiln_operator::controllers::gpucluster::labels::DEPLOY_LABELS.map(str::to_string))
        .chain([GPU_PRESENT, MIG_CONFIG, upgrade::STATE_LABEL].map(str::to_string))
        .collect();
    assert_eq!(set(&data["nodeLabels"]), owned);
    assert!(
        !owned.contains(kiln_core::labels::DEPLOY_OPERANDS),
        "the user's opt-out"
    );
    let prefix = data["nodeAnnotationPrefix"].as_str().unwrap();
    for annotation in [
        upgrade::SAFE_LOAD_ANNOTATION,
        upgrade::INITIAL_UNSCHEDULABLE,
        upgrade::WAIT_FOR_COMPLETION_START,
        upgrade::VALIDATION_START,
        upgrade::UPGRADE_REQUESTED,
        upgrade::POD_DELETION_START,
        upgrade::DRAIN_START,
    ] {
        assert!(annotation.starts_with(prefix), "{annotation}");
    }
    assert_eq!(data["upgradeStateLabel"], upgrade::STATE_LABEL);
    assert_eq!(
        data["gpuPodDeletionState"],
        UpgradeState::PodDeletionRequired.label()
    );
    assert_eq!(data["drainState"], UpgradeState::DrainRequired.label());
    assert_eq!(strs(&data["gpuNodeLabels"]), NFD_GPU_LABELS);
    assert_eq!(
        strs(&data["gpuResourcePrefixes"]),
        upgrade::GPU_RESOURCE_PREFIXES
    );
    // What kiln's device plugin writes on its Node (kiln_core::gpu_health), as its
    // ServiceAccount (assets/state-device-plugin).
    let health = &data["gpuHealth"];
    assert_eq!(
        health["conditionType"],
        kiln_core::gpu_health::CONDITION_TYPE
    );
    assert_eq!(health["taintKey"], kiln_core::gpu_health::TAINT_KEY);
    let sa = kiln_render::assets::load_state(kiln_core::State::DevicePlugin, true)
        .unwrap()
        .into_iter()
        .find(|a| a.object["kind"] == "ServiceAccount")
        .unwrap();
    assert_eq!(health["serviceAccount"], sa.object["metadata"]["name"]);

    // Every operand binding: the role of its own name, one ServiceAccount.
    let mut bindings: [serde_json::Map<String, Value>; 2] = Default::default();
    for obj in rbac::operand_rbac(NS) {
        let kind = obj["kind"].as_str().unwrap();
        let idx = match kind {
            "ClusterRoleBinding" => 0,
            "RoleBinding" => 1,
            _ => continue,
        };
        let name = obj["metadata"]["name"].as_str().unwrap();
        assert_eq!(obj["roleRef"]["name"], name, "{kind} {name}");
        assert_eq!(
            obj["roleRef"]["kind"],
            kind.trim_end_matches("Binding"),
            "{kind} {name}"
        );
        let subjects = obj["subjects"].as_array().unwrap();
        assert_eq!(subjects.len(), 1, "{kind} {name}");
        let s = &subjects[0];
        assert_eq!(s["kind"], "ServiceAccount", "{kind} {name}");
        let sa = s["name"].as_str().unwrap();
        let subject = match s["namespace"].as_str().unwrap() {
            NS => sa.to_string(),
            other => format!("{other}/{sa}"),
        };
        bindings[idx].insert(name.into(), subject.into());
    }
    let [cluster, namespaced] = bindings;
    assert_eq!(data["clusterRoleBindings"], Value::Object(cluster));
    assert_eq!(data["roleBindings"], Value::Object(namespaced));

    // The RuntimeClasses of the assets with a fixed name (the placeholder one is
    // operator.runtimeClass, which the template adds).
    let fixed: BTreeSet<String> = kiln_core::State::ALL
        .into_iter()
        .flat_map(|s| kiln_render::assets::load_state(s, true).unwrap())
        .filter(|a| a.object["kind"] == "RuntimeClass")
        .filter_map(|a| a.object["metadata"]["name"].as_str().map(str::to_string))
        .filter(|n| n != "FILLED_BY_OPERATOR")
        .collect();
    assert_eq!(set(&data["runtimeClasses"]), fixed);
}

/// The eviction label and annotation the policies read are the ones the operator writes
/// (`kiln_operator::eviction`), and the runtime class of the values is allowed.
#[test]
fn admission_policies_read_what_the_operator_writes() {
    let text = read("deploy/rbac/admission-policies.yaml");
    for key in [
        kiln_operator::eviction::REASON_LABEL,
        kiln_operator::eviction::NODE_ANNOTATION,
    ] {
        assert!(text.contains(&format!("\"{key}\"")), "{key}");
    }
    for reason in [
        kiln_operator::eviction::Reason::GpuPod,
        kiln_operator::eviction::Reason::Drain,
    ] {
        assert!(
            text.contains(&format!("\"{}\"", reason.label())),
            "{reason:?}"
        );
    }
    let Some(objects) = helm_template(&["--set", "operator.runtimeClass=site-gpu"]) else {
        return;
    };
    let rc = find(
        &objects,
        "ValidatingAdmissionPolicy",
        "kiln-operator-runtimeclasses",
    );
    let expr = rc["spec"]["validations"][0]["expression"].as_str().unwrap();
    assert!(
        expr.contains(r#"["kata-nvidia-gpu","nvidia-cdi","nvidia-legacy","site-gpu"]"#),
        "{expr}"
    );
}
