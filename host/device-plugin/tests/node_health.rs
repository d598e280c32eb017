//! GPU health on a real API server (testcluster): an injected fatal XID on the fake GPUs sets
//! the Node's `GPUHealthy=False` condition, kiln's NoSchedule taint and a Warning Event, next to
//! an administrator's taint and cordon; recovery clears kiln's taint and condition and leaves
//! theirs.

use std::time::{Duration, Instant};

use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kiln_core::gpu_health::{CONDITION_TYPE, REASON_UNHEALTHY, TAINT_KEY};
use kiln_device_plugin::{
    health::{HealthTracker, XidFilter},
    node_health::{apply, unhealthy_gpus},
};
use kiln_gpu::{FakeBackend, GpuInventory};
use kiln_testcluster::{shared, shared_access};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const FIXTURE: &str = r#"
driver_version: "550.144.03"
cuda_version: "12.4"
gpus:
  - {uuid: GPU-11111111-2222-3333-4444-555555555555, name: NVIDIA H100 80GB HBM3, memory_total_mib: 81559, compute_capability: "9.0"}
  - {uuid: GPU-22222222-2222-3333-4444-555555555555, name: NVIDIA H100 80GB HBM3, memory_total_mib: 81559, compute_capability: "9.0"}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_xid_reaches_the_node_and_recovery_clears_only_kilns_marks()
-> anyhow::Result<()> {
    let cluster = shared()?;
    let _guard = shared_access().await;
    let client = cluster.client().await?;
    let name = "gpu-health-node";
    cluster.add_node(name, 2)?;
    let nodes: Api<Node> = Api::all(client.clone());
    // The administrator's own taint and cordon.
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true, "taints": [
                {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
            ]}})),
        )
        .await?;

    let fake = FakeBackend::new(serde_yaml_ng::from_str(FIXTURE)?);
    let gpus = fake.devices()?;
    let mut tracker = HealthTracker::new(XidFilter::default(), Duration::ZERO);
    fake.inject_xid(1, 48);
    fake.set_lost(1, true); // still failing: not recovered by the probe
    assert!(tracker.poll(&fake));
    let bad = unhealthy_gpus(&tracker.faults(), &gpus);
    let plan = apply(
        client.clone(),
        name,
        &bad,
        true,
        "default",
        "kiln-device-plugin",
    )
    .await?;
    assert!(plan.event.is_some());

    let n = nodes.get(name).await?;
    let cond = n.status.unwrap().conditions.unwrap();
    let c = cond.iter().find(|c| c.type_ == CONDITION_TYPE).unwrap();
    assert_eq!(c.status, "False");
    assert_eq!(
        c.message.as_deref(),
        Some("unhealthy: GPU 1 (GPU-22222222-2222-3333-4444-555555555555): XID 48")
    );
    let spec = n.spec.unwrap();
    // The node lifecycle controller taints a cordoned node (`node.kubernetes.io/unschedulable`)
    // when it gets to it; that taint is the cluster's, not the administrator's or kiln's.
    let keys: Vec<String> = spec
        .taints
        .unwrap()
        .into_iter()
        .map(|t| t.key)
        .filter(|k| !k.starts_with("node.kubernetes.io/"))
        .collect();
    assert_eq!(keys, ["dedicated", TAINT_KEY]);
    assert_eq!(spec.unschedulable, Some(true));
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let warned = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .any(|e| {
            e.reason.as_deref() == Some(REASON_UNHEALTHY)
                && e.regarding.and_then(|r| r.name).as_deref() == Some(name)
        });
    assert!(warned, "a Warning Event on the node");

    // Again with nothing new: no write.
    let again = apply(
        client.clone(),
        name,
        &bad,
        true,
        "default",
        "kiln-device-plugin",
    )
    .await?;
    assert!(again.condition.is_none() && again.taints.is_none() && again.event.is_none());

    // Recovery: the GPU answers again and the quiet time has passed.
    fake.set_lost(1, false);
    let started = Instant::now();
    assert!(
        tracker.poll(&fake),
        "recovered after {:?}",
        started.elapsed()
    );
    let good = unhealthy_gpus(&tracker.faults(), &gpus);
    assert!(good.is_empty());
    apply(
        client.clone(),
        name,
        &good,
        true,
        "default",
        "kiln-device-plugin",
    )
    .await?;
    let n = nodes.get(name).await?;
    let cond = n.status.unwrap().conditions.unwrap();
    assert_eq!(
        cond.iter()
            .find(|c| c.type_ == CONDITION_TYPE)
            .unwrap()
            .status,
        "True"
    );
    let spec = n.spec.unwrap();
    // The node lifecycle controller taints a cordoned node (`node.kubernetes.io/unschedulable`)
    // when it gets to it; that taint is the cluster's, not the administrator's or kiln's.
    let keys: Vec<String> = spec
        .taints
        .unwrap()
        .into_iter()
        .map(|t| t.key)
        .filter(|k| !k.starts_with("node.kubernetes.io/"))
        .collect();
    assert_eq!(keys, ["dedicated"], "only kiln's taint removed");
    assert_eq!(
        spec.unschedulable,
        Some(true),
        "the cordon is the administrator's"
    );
    cluster.delete_node(name)?;
    Ok(())
}

/// The namespace of `deploy/rbac/node-patch-policy.yaml` (the chart rendered for it).
const POLICY_NAMESPACE: &str = "gpu-operator";
/// The device plugin's ServiceAccount (assets/state-device-plugin).
const SERVICE_ACCOUNT: &str = "nvidia-device-plugin";

/// The YAML documents of `text`, as JSON.
fn documents(text: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    use serde::Deserialize as _;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(serde_json::Value::deserialize)
        .filter(|v| !matches!(v, Ok(serde_json::Value::Null)))
        .map(|v| Ok(v?))
        .collect()
}

/// Server-side applies `obj` (any kind the cluster serves) as the admin.
async fn apply_object(client: &kube::Client, obj: &serde_json::Value) -> anyhow::Result<()> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let (group, version) = match obj["apiVersion"].as_str().unwrap().split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", obj["apiVersion"].as_str().unwrap()),
    };
    let kind = obj["kind"].as_str().unwrap();
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let name = obj["metadata"]["name"].as_str().unwrap();
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None if matches!(kind, "Role" | "RoleBinding" | "ServiceAccount" | "Pod") => {
            Api::namespaced_with(client.clone(), POLICY_NAMESPACE, &ar)
        }
        None => Api::all_with(client.clone(), &ar),
    };
    api.patch(
        name,
        &PatchParams::apply("kiln-test").force(),
        &Patch::Apply(obj),
    )
    .await?;
    Ok(())
}

/// A client with a token of the device plugin's ServiceAccount bound to pod `pod` (the API
/// server adds the pod's node name to such a token, which the admission policy reads).
async fn pod_bound_client(
    cluster: &kiln_testcluster::TestCluster,
    admin: &kube::Client,
    pod: &k8s_openapi::api::core::v1::Pod,
) -> anyhow::Result<kube::Client> {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    use k8s_openapi::api::core::v1::ServiceAccount;
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), POLICY_NAMESPACE)
        .create_token_request(SERVICE_ACCOUNT, &kube::api::PostParams::default(), &request)
        .await?
        .status
        .map(|s| s.token)
        .ok_or_else(|| anyhow::anyhow!("no token"))?;
    let mut config = serde_json::to_value(Kubeconfig::read_from(cluster.kubeconfig_path())?)?;
    config["users"] = json!([{"name": "device-plugin", "user": {"token": token}}]);
    for c in config["contexts"].as_array_mut().into_iter().flatten() {
        c["context"]["user"] = "device-plugin".into();
    }
    let kubeconfig: Kubeconfig = serde_json::from_value(config)?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// Whether `result` is a 403 naming the device plugin's admission policy for nodes.
fn refused_by_policy<T>(result: &Result<T, kube::Error>) -> bool {
    refused_by(result, "kiln-device-plugin-node-health")
}

/// Whether `result` is a 403 naming admission policy `policy`.
fn refused_by<T>(result: &Result<T, kube::Error>, policy: &str) -> bool {
    matches!(result, Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains(policy))
}

/// The device plugin's own RBAC (assets/state-device-plugin, as kiln renders it for kiln's
/// image) and the chart's admission policy (deploy/rbac/node-patch-policy.yaml): with a token
/// of its ServiceAccount bound to a pod on its node, the health report (condition, taint,
/// Event) succeeds and recovers; the same token cannot write another node, a label, a foreign
/// taint or another condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_plugins_own_rights_report_health_on_its_node_and_nothing_else()
-> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    let cluster = shared()?;
    let _guard = shared_access().await;
    let admin = cluster.client().await?;
    let (own, other) = ("gpu-health-own", "gpu-health-other");
    cluster.add_node(own, 1)?;
    cluster.add_node(other, 1)?;
    apply_object(
        &admin,
        &serde_json::to_value(Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(POLICY_NAMESPACE.into()),
                ..Default::default()
            },
            ..Default::default()
        })?,
    )
    .await?;
    let mut objects = vec![json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": SERVICE_ACCOUNT}})];
    for text in [
        include_str!("../../../assets/state-device-plugin/0300_clusterrole.yaml"),
        include_str!("../../../assets/state-device-plugin/0310_clusterrolebinding.yaml"),
        include_str!("../../../assets/state-device-plugin/0200_role.yaml"),
        include_str!("../../../assets/state-device-plugin/0210_rolebinding.yaml"),
        include_str!("../../../deploy/rbac/node-patch-policy.yaml"),
    ] {
        objects.extend(documents(text)?);
    }
    for obj in &mut objects {
        // The assets' placeholder namespace of the binding subjects.
        let subjects = obj.get_mut("subjects").and_then(|s| s.as_array_mut());
        for s in subjects.into_iter().flatten() {
            s["namespace"] = POLICY_NAMESPACE.into();
        }
        apply_object(&admin, obj).await?;
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "nvidia-device-plugin-health-test"},
        "spec": {"nodeName": own, "serviceAccountName": SERVICE_ACCOUNT,
            "containers": [{"name": "plugin", "image": "kiln-test"}]}}))?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), POLICY_NAMESPACE);
    let _ = pods
        .delete(
            "nvidia-device-plugin-health-test",
            &kube::api::DeleteParams::default(),
        )
        .await;
    let pod = loop {
        match pods.create(&kube::api::PostParams::default(), &pod).await {
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            r => break r?,
        }
    };
    let sa = pod_bound_client(cluster, &admin, &pod).await?;
    let sa_nodes: Api<Node> = Api::all(sa.clone());

    // The policy is in force once it refuses a write of another node.
    let condition = |status: &str| {
        json!({"status": {"conditions": [{"type": CONDITION_TYPE, "status": status,
            "reason": "KilnTest", "message": "kiln test"}]}})
    };
    let started = Instant::now();
    loop {
        let r = sa_nodes
            .patch_status(
                other,
                &PatchParams::default(),
                &Patch::Strategic(condition("False")),
            )
            .await;
        if refused_by_policy(&r) {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "another node's status was not refused by the policy: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // What the health report writes, with the plugin's own rights.
    let fake = FakeBackend::new(serde_yaml_ng::from_str(FIXTURE)?);
    let gpus = fake.devices()?;
    let bad = unhealthy_gpus(&[(0, 79)], &gpus);
    let plan = apply(sa.clone(), own, &bad, true, "default", "kiln-device-plugin").await?;
    assert!(plan.condition.is_some() && plan.taints.is_some() && plan.event.is_some());
    let n = nodes_of(&admin).get(own).await?;
    assert!(
        n.spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == TAINT_KEY)
    );
    let plan = apply(sa.clone(), own, &[], true, "default", "kiln-device-plugin").await?;
    assert!(plan.condition.is_some() && plan.taints.is_some());

    // Everything else is refused.
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let r = sa_nodes
        .patch(
            own,
            &dry,
            &Patch::Merge(json!({"metadata": {"labels": {"example.com/kiln-test": "x"}}})),
        )
        .await;
    assert!(refused_by_policy(&r), "a label: {r:?}");
    let r = sa_nodes
        .patch(
            own,
            &dry,
            &Patch::Merge(json!({"spec": {"taints": [
                {"key": "example.com/kiln-test", "effect": "NoSchedule"}]}})),
        )
        .await;
    assert!(refused_by_policy(&r), "a foreign taint: {r:?}");
    let r = sa_nodes
        .patch(
            own,
            &dry,
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await;
    assert!(refused_by_policy(&r), "a cordon: {r:?}");
    let r = sa_nodes
        .patch_status(
            own,
            &dry,
            &Patch::Strategic(json!({"status": {"conditions": [{"type": "Ready",
                "status": "False", "reason": "KilnTest"}]}})),
        )
        .await;
    assert!(refused_by_policy(&r), "another condition: {r:?}");
    let r = sa_nodes
        .patch(
            other,
            &dry,
            &Patch::Merge(json!({"spec": {"taints": [
                {"key": TAINT_KEY, "effect": "NoSchedule"}]}})),
        )
        .await;
    assert!(refused_by_policy(&r), "kiln's taint on another node: {r:?}");
    let event = |node: &str| -> anyhow::Result<Event> {
        Ok(serde_json::from_value(json!({
            "metadata": {"generateName": "kiln-test-"},
            "eventTime": "2026-01-01T00:00:00.000000Z", "type": "Warning", "reason": "KilnTest",
            "action": "Test", "reportingController": "kiln-test", "reportingInstance": "kiln-test",
            "regarding": {"kind": "Node", "apiVersion": "v1", "name": node}}))?)
    };
    let create = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    let r = Api::<Event>::namespaced(sa.clone(), "default")
        .create(&create, &event(other)?)
        .await;
    assert!(
        refused_by(&r, "kiln-device-plugin-node-events"),
        "an Event about another node: {r:?}"
    );
    let r = Api::<Event>::namespaced(sa.clone(), "kube-system")
        .create(&create, &event(own)?)
        .await;
    assert!(
        refused_by(&r, "kiln-device-plugin-node-events"),
        "an Event outside default: {r:?}"
    );

    pods.delete(
        "nvidia-device-plugin-health-test",
        &kube::api::DeleteParams::default(),
    )
    .await?;
    cluster.delete_node(own)?;
    cluster.delete_node(other)?;
    Ok(())
}

fn nodes_of(client: &kube::Client) -> Api<Node> {
    Api::all(client.clone())
}
