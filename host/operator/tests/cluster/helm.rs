//! `helm install` of `deploy/helm/kiln` brings the operator up against testcluster.
//!
//! What "up" can honestly mean there: testcluster's nodes are kwok-simulated, so the chart's
//! operator pod is scheduled, bound and reported Running/Ready by kwok, but no container — no
//! `kiln` binary — ever runs in it. So the test proves the two halves separately and joins them
//! through the chart's own credentials:
//!
//! 1. `helm install --wait` succeeds with the chart's default values and every object the
//!    chart owns is in place as rendered: the CRD (Established), the ServiceAccount, the
//!    ClusterRole with exactly `files/rules.yaml`, the binding to that ServiceAccount, the
//!    Deployment with the kiln image, `operator --leader-elect` args and the ServiceAccount,
//!    its two pods bound to nodes, and the chart's ClusterPolicy.
//! 2. The operator then runs out of cluster (in this process, the code `kiln operator` runs)
//!    with **a token of the chart's ServiceAccount** from the TokenRequest API, with leader
//!    election as the chart's Deployment asks. The token is checked to carry no more than the
//!    chart grants (listing Secrets is forbidden), so every write the operator needs — node
//!    labels, server-side apply of every operand kind, status, Events, the Lease — succeeding
//!    proves the chart's RBAC sufficient. The chart's ClusterPolicy reaches `ready`.
//!    Before it starts, the same token is checked against least privilege (server-side dry
//!    runs where a real write would matter): it cannot create a ClusterRole broader than its
//!    own (`*/*/*`), widen an operand role, bind `cluster-admin` or another role it does not
//!    hold, write RBAC objects outside the operand names, read Secrets in `kube-system`,
//!    delete nodes; and each rule of the chart's admission policies is broken with that token
//!    and refused by its policy: a node's ownerReferences, finalizers, taints, labels and
//!    annotations it does not own, cordoning or marking a node without a GPU; binding its own
//!    ClusterRole to `system:authenticated`, an operand role to another subject, a ClusterRole
//!    of another name; a RuntimeClass of another name; deleting a pod outside its namespace;
//!    an eviction without node and reason, of a non-GPU pod, naming another node, or on a node
//!    not in the matching upgrade state. It can write every operand Role, ClusterRole and
//!    binding of `assets/`, patch the node labels, upgrade annotations and cordon it owns, write
//!    RuntimeClass `nvidia-cdi`, delete a pod in its namespace, evict (with
//!    `kiln_operator::eviction`) a GPU pod of a node in `pod-deletion-required` and any pod of
//!    a node in `drain-required`, and read a Secret's metadata in its namespace. `/metrics`
//!    served with the operator's TokenReview/SubjectAccessReview check answers 401 without a
//!    token, 403 to the operator's own token and 200 to one bound to `kiln-metrics-reader`.
//! 3. `helm uninstall` removes the chart's objects, and the garbage collector the operands
//!    (their owner references point at the chart's ClusterPolicy).

use crate::support::helm as helm_support;
use crate::support::rbac;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use helm_support::{helm, repo};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kiln_core::spec::ClusterPolicy;
use kiln_testcluster::{Options, TestCluster};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

const NS: &str = "gpu-operator";
const RELEASE: &str = "kiln";
const POLICY: &str = "cluster-policy";
const TIMEOUT: Duration = Duration::from_secs(150);

/// The operator in this process, as the chart's replica `helm-test-replica` (leader election on).
fn start_operator(client: Client) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let config = kiln_operator::Config {
        namespace: NS.into(),
        metrics_addr: "127.0.0.1:0".into(),
        leader_election: true,
        identity: "helm-test-replica".into(),
        ..kiln_operator::Config::default()
    };
    let (task, _) = crate::support::cluster::start_operator(client, Default::default(), config)?;
    Ok(task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_brings_the_operator_up() -> anyhow::Result<()> {
    let turn = crate::support::cluster::start(Options::default()).await?;
    let cluster = turn.cluster();
    cluster.with_logs(scenario(cluster).await)
}

async fn scenario(cluster: &TestCluster) -> anyhow::Result<()> {
    let home = tempfile::tempdir()?;
    let home = home.path();
    helm(
        cluster,
        home,
        &[
            "install",
            RELEASE,
            "deploy/helm/kiln",
            "--namespace",
            NS,
            "--create-namespace",
            "--wait",
            "--timeout",
            "120s",
        ],
    )
    .await?;
    let status: Value = serde_json::from_str(
        &helm(cluster, home, &["status", RELEASE, "-n", NS, "-o", "json"]).await?,
    )?;
    assert_eq!(status["info"]["status"], "deployed", "{status}");

    let admin = cluster.client().await?;
    check_chart_objects(&admin).await?;

    // The operator, out of cluster, with the chart's ServiceAccount and nothing more.
    let sa = cluster.service_account_client(NS, "kiln-operator").await?;
    let forbidden = Api::<Secret>::namespaced(sa.clone(), NS)
        .list(&ListParams::default())
        .await;
    assert!(
        matches!(&forbidden, Err(kube::Error::Api(s)) if s.code == 403),
        "the ServiceAccount token must not list Secrets: {forbidden:?}"
    );
    check_least_privilege(cluster, &admin, &sa).await?;
    let operator = start_operator(sa)?;

    let policies: Api<ClusterPolicy> = Api::all(admin.clone());
    cluster
        .wait_for("the chart's ClusterPolicy ready", TIMEOUT, || async {
            let p = policies.get(POLICY).await?;
            let s = p.status.unwrap_or_default();
            let state = serde_json::to_value(s.state)?;
            Ok(if state == "ready" {
                Ok(())
            } else {
                Err(format!("{state}: {:?}", s.conditions))
            })
        })
        .await?;
    check_operator_work(&admin).await?;
    operator.abort();

    // Uninstall: the chart's objects go; the operands follow their owner (the ClusterPolicy).
    helm(
        cluster,
        home,
        &["uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "60s"],
    )
    .await?;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), NS);
    assert!(deployments.get_opt("kiln-operator").await?.is_none());
    assert!(policies.get_opt(POLICY).await?.is_none());
    let dss: Api<DaemonSet> = Api::namespaced(admin.clone(), NS);
    cluster
        .wait_for("operands garbage-collected", TIMEOUT, || async {
            let left: Vec<String> = dss
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|d| d.metadata.name)
                .collect();
            Ok(if left.is_empty() {
                Ok(())
            } else {
                Err(format!("left: {left:?}"))
            })
        })
        .await?;
    Ok(())
}

/// The HTTP status of a request's outcome: 200 for success, the API's code for a refusal.
fn code<T: std::fmt::Debug>(what: &str, res: kube::Result<T>) -> anyhow::Result<u16> {
    match res {
        Ok(_) => Ok(200),
        Err(kube::Error::Api(s)) => Ok(s.code),
        Err(e) => Err(anyhow::anyhow!("{what}: {e}")),
    }
}

/// `obj` server-side applied (dry run) through `client` as field manager `kiln`.
async fn dry_apply(client: &Client, obj: &Value) -> kube::Result<DynamicObject> {
    let kind = obj["kind"].as_str().unwrap_or_default();
    let ar = match kind {
        "ClusterRole" => ApiResource::erase::<ClusterRole>(&()),
        "ClusterRoleBinding" => ApiResource::erase::<ClusterRoleBinding>(&()),
        "Role" => ApiResource::erase::<Role>(&()),
        "RoleBinding" => ApiResource::erase::<RoleBinding>(&()),
        _ => panic!("not an RBAC kind: {kind}"),
    };
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let params = PatchParams::apply("kiln").force().dry_run();
    api.patch(name, &params, &Patch::Apply(obj)).await
}

async fn token_of(admin: &Client, name: &str) -> anyhow::Result<String> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), NS)
        .create_token_request(name, &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .context("TokenRequest returned no token")
}

/// Least privilege of the chart's ServiceAccount (`sa`), each refusal with its exact status.
async fn check_least_privilege(
    cluster: &TestCluster,
    admin: &Client,
    sa: &Client,
) -> anyhow::Result<()> {
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let everything = json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
    let authenticated = json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
        "name": "system:authenticated"}]);
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "kiln-test-everything"}, "rules": everything}))?;
    let bind = |name: &str, role: &str| -> anyhow::Result<ClusterRoleBinding> {
        Ok(serde_json::from_value(json!({"metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": authenticated}))?)
    };
    let roles = Api::<ClusterRole>::all(sa.clone());
    let bindings = Api::<ClusterRoleBinding>::all(sa.clone());
    let ns_binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "kiln-test-edit", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": authenticated}))?;
    let nodes = Api::<Node>::all(sa.clone());
    let node = Api::<Node>::all(admin.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find_map(|n| n.metadata.name)
        .context("no node")?;
    let refused = [
        (
            "create a */*/* ClusterRole",
            code("", roles.create(&dry, &role).await)?,
        ),
        (
            "widen the operand ClusterRole nvidia-driver to */*/*",
            code(
                "",
                dry_apply(
                    sa,
                    &json!({"apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole", "metadata": {"name": "nvidia-driver"},
                "rules": everything}),
                )
                .await,
            )?,
        ),
        (
            "bind cluster-admin to system:authenticated",
            code(
                "",
                bindings
                    .create(&dry, &bind("kiln-test-admin", "cluster-admin")?)
                    .await,
            )?,
        ),
        (
            "bind admin to system:authenticated",
            code(
                "",
                bindings
                    .create(&dry, &bind("kiln-test-admin", "admin")?)
                    .await,
            )?,
        ),
        (
            "bind cluster-admin under an operand binding's name",
            code(
                "",
                dry_apply(
                    sa,
                    &json!({"apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding", "metadata": {"name": "nvidia-driver"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
                "subjects": authenticated}),
                )
                .await,
            )?,
        ),
        (
            "bind edit in its own namespace",
            code(
                "",
                Api::<RoleBinding>::namespaced(sa.clone(), NS)
                    .create(&dry, &ns_binding)
                    .await,
            )?,
        ),
        (
            "apply a ClusterRole outside the operand names",
            code(
                "",
                dry_apply(
                    sa,
                    &json!({"apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole", "metadata": {"name": "kiln-test-other"},
                "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]}),
                )
                .await,
            )?,
        ),
        (
            "read a Secret in kube-system",
            code(
                "",
                Api::<Secret>::namespaced(sa.clone(), "kube-system")
                    .get_metadata("kiln-test")
                    .await,
            )?,
        ),
        (
            "delete a node",
            code(
                "",
                nodes
                    .delete(
                        &node,
                        &DeleteParams {
                            dry_run: true,
                            ..DeleteParams::default()
                        },
                    )
                    .await,
            )?,
        ),
    ];
    for (what, status) in &refused {
        assert_eq!(*status, 403, "the operator's token must not {what}");
    }

    check_admission_policies(cluster, admin, sa).await?;

    // Every operand RBAC object of every state: its rules held, its role bindable by name.
    let operands = rbac::operand_rbac(NS);
    assert!(operands.len() >= 70);
    for obj in &operands {
        let what = format!("{} {}", obj["kind"], obj["metadata"]["name"]);
        assert_eq!(code(&what, dry_apply(sa, obj).await)?, 200, "{what}");
    }

    // A Secret's metadata in its own namespace.
    let secrets = Api::<Secret>::namespaced(admin.clone(), NS);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "kiln-test-driver-env"}, "stringData": {"K": "v"}}))?;
    secrets.create(&PostParams::default(), &secret).await?;
    let read = Api::<Secret>::namespaced(sa.clone(), NS)
        .get_metadata("kiln-test-driver-env")
        .await;
    secrets
        .delete("kiln-test-driver-env", &DeleteParams::default())
        .await?;
    assert_eq!(code("", read)?, 200, "Secret metadata in its namespace");

    check_metrics_auth(admin, sa).await
}

/// `/metrics` behind the operator's TokenReview/SubjectAccessReview check, asked with the
/// chart's ServiceAccount (its rights to create the reviews are part of what is proven).
async fn check_metrics_auth(admin: &Client, sa: &Client) -> anyhow::Result<()> {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt as _;

    let scraper: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "kiln-test-scraper"}}))?;
    Api::<ServiceAccount>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &scraper)
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "kiln-test-scraper"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
            "name": "kiln-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "kiln-test-scraper", "namespace": NS}]}))?;
    let crbs = Api::<ClusterRoleBinding>::all(admin.clone());
    crbs.create(&PostParams::default(), &binding).await?;
    let scraper_token = token_of(admin, "kiln-test-scraper").await?;
    let operator_token = token_of(admin, "kiln-operator").await?;

    let router = kiln_operator::metrics::router(
        Arc::new(kiln_operator::metrics::Metrics::new()),
        Some(kiln_operator::metrics::MetricsAuthorizer::new(sa.clone())),
    );
    let mut seen = Vec::new();
    for auth in [
        None,
        Some("Bearer not-a-token".to_string()),
        Some(format!("Bearer {operator_token}")),
        Some(format!("Bearer {scraper_token}")),
    ] {
        let mut req = Request::get("/metrics");
        if let Some(a) = &auth {
            req = req.header("authorization", a);
        }
        let resp = router.clone().oneshot(req.body(Body::empty())?).await?;
        seen.push(resp.status());
    }
    let health = router
        .oneshot(Request::get("/healthz").body(Body::empty())?)
        .await?
        .status();
    crbs.delete("kiln-test-scraper", &DeleteParams::default())
        .await?;
    Api::<ServiceAccount>::namespaced(admin.clone(), NS)
        .delete("kiln-test-scraper", &DeleteParams::default())
        .await?;
    assert_eq!(
        seen,
        [
            StatusCode::UNAUTHORIZED,
            StatusCode::UNAUTHORIZED,
            StatusCode::FORBIDDEN,
            StatusCode::OK
        ]
    );
    assert_eq!(health, StatusCode::OK);
    Ok(())
}

/// Everything the chart installs, as rendered from the default values.
async fn check_chart_objects(admin: &Client) -> anyhow::Result<()> {
    let crd = Api::<CustomResourceDefinition>::all(admin.clone())
        .get("clusterpolicies.nvidia.com")
        .await?;
    let established = crd
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True");
    assert!(established, "CRD not established");
    assert_eq!(
        crd.spec
            .versions
            .iter()
            .map(|v| &v.name)
            .collect::<Vec<_>>(),
        ["v1"]
    );

    assert!(
        Api::<ServiceAccount>::namespaced(admin.clone(), NS)
            .get_opt("kiln-operator")
            .await?
            .is_some()
    );
    let role = Api::<ClusterRole>::all(admin.clone())
        .get("kiln-operator")
        .await?;
    let want: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(
        repo().join("deploy/helm/kiln/files/rules.yaml"),
    )?)?;
    assert_eq!(serde_json::to_value(&role.rules)?, want);
    let ns_role = Api::<Role>::namespaced(admin.clone(), NS)
        .get("kiln-operator")
        .await?;
    let want: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(
        repo().join("deploy/helm/kiln/files/namespace-rules.yaml"),
    )?)?;
    assert_eq!(serde_json::to_value(&ns_role.rules)?, want);
    let binding = Api::<ClusterRoleBinding>::all(admin.clone())
        .get("kiln-operator")
        .await?;
    assert_eq!(
        (
            binding.role_ref.kind.as_str(),
            binding.role_ref.name.as_str()
        ),
        ("ClusterRole", "kiln-operator")
    );
    assert_eq!(
        serde_json::to_value(&binding.subjects)?,
        json!([{"kind": "ServiceAccount", "name": "kiln-operator", "namespace": NS}])
    );

    let dep = Api::<Deployment>::namespaced(admin.clone(), NS)
        .get("kiln-operator")
        .await?;
    let pod_spec = dep
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .context("Deployment without a pod template")?;
    assert_eq!(
        pod_spec.service_account_name.as_deref(),
        Some("kiln-operator")
    );
    let c = &pod_spec.containers[0];
    assert_eq!(c.image.as_deref(), Some("ghcr.io/kiln-dev/kiln:0.1.0"));
    assert_eq!(
        c.args.as_deref(),
        Some(
            &[
                "operator".to_string(),
                "--leader-elect".to_string(),
                "--metrics-auth".to_string(),
                "kubernetes".to_string()
            ][..]
        )
    );
    let env: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert!(env.contains(&"OPERATOR_NAMESPACE"), "{env:?}");
    // The plugin cache: filled by the init container, read by the operator, same volume.
    let cache_env = |c: &k8s_openapi::api::core::v1::Container| {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == "KILN_PLUGIN_CACHE_DIR")
            .and_then(|e| e.value.clone())
    };
    let init = pod_spec.init_containers.as_deref().unwrap_or_default();
    assert_eq!(init.len(), 1, "{init:?}");
    assert_eq!(
        init[0].args.as_deref(),
        Some(&["plugin".to_string(), "precompile".to_string()][..])
    );
    let cache = Some("/var/cache/kiln/plugins".to_string());
    assert_eq!(cache_env(&init[0]), cache);
    assert_eq!(cache_env(c), cache);
    for container in [&init[0], c] {
        let mounts = container.volume_mounts.as_deref().unwrap_or_default();
        assert!(
            mounts
                .iter()
                .any(|m| m.name == "plugin-cache" && Some(m.mount_path.clone()) == cache),
            "{mounts:?}"
        );
    }
    let available = dep.status.and_then(|s| s.available_replicas);
    assert_eq!(available, Some(2));
    let pods = Api::<Pod>::namespaced(admin.clone(), NS)
        .list(&ListParams::default().labels("app.kubernetes.io/name=kiln-operator"))
        .await?
        .items;
    let bound: Vec<(String, String)> = pods
        .iter()
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            let phase = p.status.as_ref()?.phase.clone()?;
            Some((node, phase))
        })
        .collect();
    assert_eq!(bound.len(), 2, "{bound:?}");
    assert!(
        bound.iter().all(|(_, phase)| phase == "Running"),
        "{bound:?}"
    );

    let policy = Api::<ClusterPolicy>::all(admin.clone()).get(POLICY).await?;
    assert_eq!(
        policy
            .metadata
            .labels
            .unwrap_or_default()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("Helm")
    );
    Ok(())
}

/// What the operator, holding only the chart's rights, did: the Lease, node labels, operands
/// applied by field manager `kiln`, and an Event on the policy.
async fn check_operator_work(admin: &Client) -> anyhow::Result<()> {
    let lease = Api::<Lease>::namespaced(admin.clone(), NS)
        .get("kiln-operator")
        .await?;
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("helm-test-replica")
    );
    let present = Api::<Node>::all(admin.clone())
        .list(&ListParams::default().labels("nvidia.com/gpu.present=true"))
        .await?
        .items
        .len();
    assert_eq!(present, 5);
    // The operands (owned by the policy); the chart's own kiln-node-discovery is Helm's.
    let dss: Vec<DaemonSet> = Api::<DaemonSet>::namespaced(admin.clone(), NS)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|d| d.metadata.owner_references.is_some())
        .collect();
    assert!(dss.len() >= 5, "{} DaemonSets", dss.len());
    for ds in &dss {
        let managers: Vec<&str> = ds
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.manager.as_deref())
            .collect();
        assert!(
            managers.contains(&"kiln"),
            "{:?}: {managers:?}",
            ds.metadata.name
        );
    }
    let events = Api::<Event>::all(admin.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let ours = events
        .iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("kiln"))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(POLICY))
        .count();
    assert!(ours >= 1, "no Event from kiln on {POLICY}");
    Ok(())
}

/// Waits until `attempt` (a dry run) is refused with 403 by ValidatingAdmissionPolicy `policy`
/// (the policies, and the objects their params come from, reach the API server's caches a
/// moment after they are written); fails when it keeps succeeding or being refused otherwise.
async fn refused_by<T, F, Fut>(
    cluster: &TestCluster,
    what: &str,
    policy: &str,
    mut attempt: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    let needle = format!("ValidatingAdmissionPolicy '{policy}'");
    cluster
        .wait_for(format!("{what}: refused by {policy}"), TIMEOUT, || {
            let outcome = attempt();
            let needle = needle.clone();
            async move {
                Ok(match outcome.await {
                    Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(&needle) => {
                        Ok(())
                    }
                    Err(e) => Err(format!("{e}")),
                    Ok(_) => Err("allowed".into()),
                })
            }
        })
        .await
}

/// A dry-run merge patch of `node` through `nodes`.
async fn dry_node_patch(nodes: &Api<Node>, node: &str, body: Value) -> kube::Result<Node> {
    let params = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    nodes.patch(node, &params, &Patch::Merge(body)).await
}

/// The operator's eviction of `ns/pod` (`kiln_operator::eviction`'s body), as a dry run.
async fn dry_evict(
    client: &Client,
    ns: &str,
    pod: &str,
    node: &str,
    reason: kiln_operator::eviction::Reason,
) -> kube::Result<Value> {
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    Api::<Pod>::namespaced(client.clone(), ns)
        .create_subresource(
            "eviction",
            pod,
            &params,
            &kiln_operator::eviction::eviction(ns, pod, node, reason),
        )
        .await
}

/// A pod in `ns` bound to `node` (no scheduler), with `resources` as its container's limits.
async fn bound_pod(
    admin: &Client,
    ns: &str,
    name: &str,
    node: &str,
    limits: Value,
) -> anyhow::Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "kiln-test",
            "resources": {"limits": limits}}]}}))?;
    Api::<Pod>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

/// The chart's admission policies (`templates/node-patch-policy.yaml`,
/// `templates/admission-policies.yaml`) against the operator's own token `sa`: each rule
/// broken (a dry run refused with 403 by that rule's policy) and its legitimate use allowed.
async fn check_admission_policies(
    cluster: &TestCluster,
    admin: &Client,
    sa: &Client,
) -> anyhow::Result<()> {
    use kiln_operator::eviction::Reason;
    const NODE_POLICY: &str = "kiln-operator-node-patch";
    let state = kiln_core::upgrade::STATE_LABEL;
    let all = Api::<Node>::all(admin.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let gpu = |n: &&Node| {
        n.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(kiln_testcluster::NFD_NVIDIA_LABEL))
            .map(String::as_str)
            == Some("true")
    };
    let names = |want: bool| -> Vec<String> {
        all.iter()
            .filter(|n| gpu(n) == want)
            .filter_map(|n| n.metadata.name.clone())
            .collect()
    };
    let (gpus, cpus) = (names(true), names(false));
    anyhow::ensure!(gpus.len() >= 2 && !cpus.is_empty(), "{gpus:?} {cpus:?}");
    let (gpu_node, gpu_node2, cpu_node) = (&gpus[0], &gpus[1], &cpus[0]);

    // Nodes: only the labels, annotations and spec.unschedulable the operator owns.
    let nodes = Api::<Node>::all(sa.clone());
    let dangling_owner = json!({"metadata": {"ownerReferences": [{"apiVersion": "v1",
        "kind": "ConfigMap", "name": "kiln-test-gone",
        "uid": "00000000-0000-0000-0000-000000000001"}]}});
    let taint = json!({"spec": {"taints": [
        {"key": "example.com/kiln-test", "value": "x", "effect": "NoSchedule"}]}});
    for (what, node, body) in [
        ("a dangling ownerReference", gpu_node, dangling_owner),
        (
            "a finalizer",
            gpu_node,
            json!({"metadata": {"finalizers": ["example.com/kiln-test"]}}),
        ),
        (
            "a foreign label",
            gpu_node,
            json!({"metadata": {"labels": {"example.com/kiln-test": "x"}}}),
        ),
        (
            "an nvidia.com label it does not own",
            gpu_node,
            json!({"metadata": {"labels": {"nvidia.com/kiln-test": "x"}}}),
        ),
        (
            "a foreign annotation",
            gpu_node,
            json!({"metadata": {"annotations": {"example.com/kiln-test": "x"}}}),
        ),
        ("a taint", gpu_node, taint),
        (
            "cordon a node without a GPU",
            cpu_node,
            json!({"spec": {"unschedulable": true}}),
        ),
        (
            "mark a node without a GPU for draining",
            cpu_node,
            json!({"metadata": {"labels": {state: "drain-required"}}}),
        ),
    ] {
        refused_by(cluster, what, NODE_POLICY, || {
            dry_node_patch(&nodes, node, body.clone())
        })
        .await?;
    }
    // What node labelling and the driver upgrade write (one patch: state, annotation, cordon).
    for (what, body) in [
        (
            "deploy label",
            json!({"metadata": {"labels": {"nvidia.com/gpu.deploy.driver": "true"}}}),
        ),
        (
            "upgrade step",
            json!({"metadata": {"labels": {state: "wait-for-jobs-required"},
            "annotations": {kiln_core::upgrade::WAIT_FOR_COMPLETION_START: "1700000000"}},
            "spec": {"unschedulable": true}}),
        ),
    ] {
        assert_eq!(
            code(what, dry_node_patch(&nodes, gpu_node, body).await)?,
            200,
            "{what}"
        );
    }

    // RBAC: roles and bindings only of the operands, a binding only to its operand's account.
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let authenticated = json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
        "name": "system:authenticated"}]);
    let own_role: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "kiln-test-escalate"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
            "name": "kiln-operator"},
        "subjects": authenticated}))?;
    let bindings = Api::<ClusterRoleBinding>::all(sa.clone());
    refused_by(
        cluster,
        "bind its own ClusterRole to system:authenticated",
        "kiln-operator-rbac-bindings",
        || bindings.create(&dry, &own_role),
    )
    .await?;
    let operand_crb = json!({"apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding", "metadata": {"name": "nvidia-driver"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
            "name": "nvidia-driver"},
        "subjects": authenticated});
    refused_by(
        cluster,
        "bind an operand ClusterRole to system:authenticated",
        "kiln-operator-rbac-bindings",
        || dry_apply(sa, &operand_crb),
    )
    .await?;
    let operand_rb = json!({"apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding", "metadata": {"name": "nvidia-driver", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
            "name": "nvidia-driver"},
        "subjects": [{"kind": "ServiceAccount", "name": "kiln-operator", "namespace": NS}]});
    refused_by(
        cluster,
        "bind an operand Role to the operator's own ServiceAccount",
        "kiln-operator-rbac-bindings",
        || dry_apply(sa, &operand_rb),
    )
    .await?;
    let other_role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "kiln-test-other"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]}))?;
    let roles = Api::<ClusterRole>::all(sa.clone());
    refused_by(
        cluster,
        "create a ClusterRole outside the operand names",
        "kiln-operator-rbac",
        || roles.create(&dry, &other_role),
    )
    .await?;

    // RuntimeClasses: only the names the policy renders.
    let rc = |name: &str| -> anyhow::Result<RuntimeClass> {
        Ok(serde_json::from_value(
            json!({"metadata": {"name": name}, "handler": "runc"}),
        )?)
    };
    let admin_rcs = Api::<RuntimeClass>::all(admin.clone());
    admin_rcs
        .create(&PostParams::default(), &rc("kiln-test-foreign")?)
        .await?;
    let rcs = Api::<RuntimeClass>::all(sa.clone());
    let foreign = rc("kiln-test-other")?;
    refused_by(
        cluster,
        "create a RuntimeClass of another name",
        "kiln-operator-runtimeclasses",
        || rcs.create(&dry, &foreign),
    )
    .await?;
    let dry_delete = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    refused_by(
        cluster,
        "delete a RuntimeClass it does not render",
        "kiln-operator-runtimeclasses",
        || rcs.delete("kiln-test-foreign", &dry_delete),
    )
    .await?;
    admin_rcs
        .delete("kiln-test-foreign", &DeleteParams::default())
        .await?;
    assert_eq!(
        code("", rcs.create(&dry, &rc("nvidia-cdi")?).await)?,
        200,
        "RuntimeClass nvidia-cdi"
    );

    // Pods: deleted only in the operator's namespace; evicted only as the driver upgrade does.
    let ns = kiln_testcluster::namespace(admin, "policy").await?;
    let gpu_limits = json!({"nvidia.com/gpu": "1"});
    bound_pod(admin, &ns, "other-node", gpu_node2, gpu_limits.clone()).await?;
    bound_pod(admin, &ns, "gpu", gpu_node, gpu_limits).await?;
    bound_pod(admin, &ns, "cpu", gpu_node, json!({"cpu": "100m"})).await?;
    bound_pod(
        admin,
        NS,
        "kiln-test-driver",
        gpu_node,
        json!({"cpu": "100m"}),
    )
    .await?;
    let pods = Api::<Pod>::namespaced(sa.clone(), &ns);
    refused_by(
        cluster,
        "delete a pod outside its namespace",
        "kiln-operator-pod-removal",
        || pods.delete("cpu", &dry_delete),
    )
    .await?;
    assert_eq!(
        code(
            "delete a pod in its namespace",
            Api::<Pod>::namespaced(sa.clone(), NS)
                .delete("kiln-test-driver", &dry_delete)
                .await
        )?,
        200,
        "delete a pod in its namespace"
    );
    let plain = kube::api::EvictParams {
        post_options: dry.clone(),
        ..kube::api::EvictParams::default()
    };
    refused_by(
        cluster,
        "evict without naming node and reason",
        "kiln-operator-pod-removal",
        || pods.evict("gpu", &plain),
    )
    .await?;
    refused_by(
        cluster,
        "evict a GPU pod of a node not in pod deletion",
        "kiln-operator-eviction-node",
        || dry_evict(sa, &ns, "gpu", gpu_node, Reason::GpuPod),
    )
    .await?;

    let mark = |node: &str, value: Option<&str>| cluster.label_node(node, &[(state, value)]);
    mark(gpu_node, Some("pod-deletion-required"))?;
    mark(gpu_node2, Some("pod-deletion-required"))?;
    let outcome = async {
        refused_by(
            cluster,
            "evict a pod without a GPU as a GPU pod",
            "kiln-operator-eviction-pod",
            || dry_evict(sa, &ns, "cpu", gpu_node, Reason::GpuPod),
        )
        .await?;
        refused_by(
            cluster,
            "evict a pod naming another node",
            "kiln-operator-eviction-pod",
            || dry_evict(sa, &ns, "other-node", gpu_node, Reason::GpuPod),
        )
        .await?;
        refused_by(
            cluster,
            "drain a node in pod deletion",
            "kiln-operator-eviction-node",
            || dry_evict(sa, &ns, "cpu", gpu_node, Reason::Drain),
        )
        .await?;
        // What the driver upgrade does, for real: a GPU pod of a node in pod deletion evicted,
        // then, the node being drained, any pod of it.
        let evicted = |pod: &'static str, reason: Reason| {
            let ns = ns.clone();
            cluster.wait_for(format!("{pod} evicted ({reason:?})"), TIMEOUT, move || {
                let ns = ns.clone();
                async move {
                    Ok(
                        match kiln_operator::eviction::evict(sa, &ns, pod, gpu_node, reason).await {
                            Ok(()) => Ok(()),
                            Err(e) => Err(format!("{e}")),
                        },
                    )
                }
            })
        };
        evicted("gpu", Reason::GpuPod).await?;
        mark(gpu_node, Some("drain-required"))?;
        evicted("cpu", Reason::Drain).await
    }
    .await;
    mark(gpu_node, None)?;
    mark(gpu_node2, None)?;
    Api::<Pod>::namespaced(admin.clone(), NS)
        .delete("kiln-test-driver", &DeleteParams::default())
        .await?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .delete(&ns, &DeleteParams::default())
        .await?;
    outcome
}
