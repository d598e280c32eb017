//! End-to-end checks of the test cluster itself: the real DaemonSet controller's counts
//! on simulated GPU nodes, CRDs with server-side apply, and persistence across an
//! apiserver restart. One cluster serves the whole binary.

use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kiln_testcluster::{
    DEFAULT_TIMEOUT, NFD_NVIDIA_LABEL, TestCluster, exclusive, namespace, shared, shared_access,
};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::json;

const FIELD_MANAGER: &str = "kiln";

#[tokio::test]
async fn daemonset_on_gpu_nodes_counts_ready_pods() -> anyhow::Result<()> {
    let cluster = shared()?;
    cluster.with_logs(daemonset_on_gpu_nodes_counts_ready_pods_body(cluster).await)
}

async fn daemonset_on_gpu_nodes_counts_ready_pods_body(
    cluster: &TestCluster,
) -> anyhow::Result<()> {
    let _guard = shared_access().await;
    let client = cluster.client().await?;
    let ns = namespace(&client, "ds").await?;
    let expected = cluster.options().gpu_nodes as i32;

    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": { "name": "gpu-probe", "namespace": ns },
        "spec": {
            "selector": { "matchLabels": { "app": "gpu-probe" } },
            "template": {
                "metadata": { "labels": { "app": "gpu-probe" } },
                "spec": {
                    "nodeSelector": { NFD_NVIDIA_LABEL: "true" },
                    "containers": [{ "name": "probe", "image": "registry.invalid/kiln/probe:1" }]
                }
            }
        }
    }))?;
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &ds)
        .await
        .context("creating the DaemonSet")?;

    let wait_ready = |want: i32| {
        let api = api.clone();
        cluster.wait_for(
            format!("DaemonSet gpu-probe to have numberReady == {want}"),
            DEFAULT_TIMEOUT,
            move || {
                let api = api.clone();
                async move {
                    let ds = api.get("gpu-probe").await?;
                    let s = ds.status.unwrap_or_default();
                    let done = s.desired_number_scheduled == want
                        && s.number_ready == want
                        && s.updated_number_scheduled == Some(want)
                        && s.number_unavailable.unwrap_or(0) == 0;
                    Ok(if done {
                        Ok(s)
                    } else {
                        Err(format!(
                            "desired={} ready={} updated={:?} unavailable={:?}",
                            s.desired_number_scheduled,
                            s.number_ready,
                            s.updated_number_scheduled,
                            s.number_unavailable
                        ))
                    })
                }
            },
        )
    };

    let status = wait_ready(expected).await?;
    assert_eq!(status.number_ready, 5, "5 GPU nodes of 8");
    assert_eq!(status.desired_number_scheduled, 5);

    cluster.add_node("gpu-node-added", 1)?;
    let node: Node = Api::<Node>::all(client.clone())
        .get("gpu-node-added")
        .await?;
    let gpus = node
        .status
        .and_then(|s| s.capacity)
        .and_then(|c| c.get("nvidia.com/gpu").cloned());
    assert_eq!(
        gpus.map(|q| q.0),
        Some("1".to_string()),
        "the new node reports nvidia.com/gpu"
    );

    let status = wait_ready(expected + 1).await?;
    assert_eq!(status.number_ready, 6, "6 after adding a GPU node");
    assert_eq!(status.updated_number_scheduled, Some(6));
    Ok(())
}

const CRD_YAML: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gpuprobes.testcluster.kiln.dev
spec:
  group: testcluster.kiln.dev
  scope: Namespaced
  names:
    kind: GpuProbe
    plural: gpuprobes
    singular: gpuprobe
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources:
      status: {}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              driverVersion: {type: string}
              replicas: {type: integer}
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
"#;

async fn install_crd(client: &kube::Client) -> anyhow::Result<ApiResource> {
    let crd: CustomResourceDefinition = serde_yaml_ng::from_str(CRD_YAML)?;
    let name = crd.metadata.name.clone().unwrap_or_default();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await
    .context("applying the CRD")?;
    let cluster = shared()?;
    cluster
        .wait_for("the CRD to be Established", DEFAULT_TIMEOUT, || {
            let api = api.clone();
            let name = name.clone();
            async move {
                let crd = api.get(&name).await?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok(if established {
                    Ok(())
                } else {
                    Err("not Established".to_string())
                })
            }
        })
        .await?;
    let gvk = GroupVersionKind::gvk("testcluster.kiln.dev", "v1alpha1", "GpuProbe");
    Ok(ApiResource::from_gvk_with_plural(&gvk, "gpuprobes"))
}

#[tokio::test]
async fn crd_and_server_side_apply_record_kiln_field_manager() -> anyhow::Result<()> {
    let cluster = shared()?;
    cluster.with_logs(crd_and_server_side_apply_record_kiln_field_manager_body(cluster).await)
}

async fn crd_and_server_side_apply_record_kiln_field_manager_body(
    cluster: &TestCluster,
) -> anyhow::Result<()> {
    let _guard = shared_access().await;
    let client = cluster.client().await?;
    let ns = namespace(&client, "ssa").await?;
    let ar = install_crd(&client).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let apply = |driver: &str, replicas: i64| {
        json!({
            "apiVersion": "testcluster.kiln.dev/v1alpha1",
            "kind": "GpuProbe",
            "metadata": { "name": "probe" },
            "spec": { "driverVersion": driver, "replicas": replicas }
        })
    };
    let pp = PatchParams::apply(FIELD_MANAGER);

    // The discovery cache of a just-Established CRD can lag briefly: retry the create.
    let created = cluster
        .wait_for(
            "the first apply of the custom object",
            Duration::from_secs(60),
            || {
                let api = api.clone();
                let pp = pp.clone();
                let obj = apply("550.54.15", 1);
                async move {
                    match api.patch("probe", &pp, &Patch::Apply(&obj)).await {
                        Ok(o) => Ok(Ok(o)),
                        Err(e) => Ok(Err(e.to_string())),
                    }
                }
            },
        )
        .await?;
    assert_eq!(created.data["spec"]["driverVersion"], "550.54.15");

    let changed = api
        .patch("probe", &pp, &Patch::Apply(&apply("570.86.10", 2)))
        .await?;
    assert_eq!(changed.data["spec"]["driverVersion"], "570.86.10");
    assert_eq!(changed.data["spec"]["replicas"], 2);
    assert!(
        changed.metadata.generation > created.metadata.generation,
        "generation moves on a spec change: {:?} -> {:?}",
        created.metadata.generation,
        changed.metadata.generation
    );

    let fetched = api.get("probe").await?;
    let managed = fetched.metadata.managed_fields.unwrap_or_default();
    let kiln = managed
        .iter()
        .find(|m| m.manager.as_deref() == Some(FIELD_MANAGER))
        .with_context(|| {
            format!("no managedFields entry for manager {FIELD_MANAGER}: {managed:?}")
        })?;
    assert_eq!(kiln.operation.as_deref(), Some("Apply"));
    let fields = serde_json::to_string(&kiln.fields_v1)?;
    assert!(
        fields.contains("f:driverVersion"),
        "kiln owns spec.driverVersion: {fields}"
    );
    assert_eq!(
        managed
            .iter()
            .filter(|m| m.manager.as_deref() == Some(FIELD_MANAGER))
            .count(),
        1,
        "one entry for kiln: {managed:?}"
    );

    // A second manager taking a field kiln owns is a conflict unless forced.
    let other = json!({
        "apiVersion": "testcluster.kiln.dev/v1alpha1",
        "kind": "GpuProbe",
        "metadata": { "name": "probe" },
        "spec": { "driverVersion": "1.0.0" }
    });
    let conflict = api
        .patch(
            "probe",
            &PatchParams::apply("someone-else"),
            &Patch::Apply(&other),
        )
        .await;
    match conflict {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 409, "conflict expected: {s:?}"),
        other => panic!("expected a 409 conflict, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn objects_survive_apiserver_restart() -> anyhow::Result<()> {
    let cluster = shared()?;
    cluster.with_logs(objects_survive_apiserver_restart_body(cluster).await)
}

async fn objects_survive_apiserver_restart_body(cluster: &TestCluster) -> anyhow::Result<()> {
    let _guard = exclusive().await;
    let ns = {
        let client = cluster.client().await?;
        let ns = namespace(&client, "restart").await?;
        let cm: ConfigMap = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": "survivor", "namespace": ns },
            "data": { "driver": "570.86.10" }
        }))?;
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .patch(
                "survivor",
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(&cm),
            )
            .await?;
        ns
    };

    cluster.restart_apiserver()?;

    let client = cluster.client().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm = cluster
        .wait_for(
            "the ConfigMap after the restart",
            Duration::from_secs(60),
            || {
                let cms = cms.clone();
                async move {
                    match cms.get_opt("survivor").await {
                        Ok(Some(cm)) => Ok(Ok(cm)),
                        Ok(None) => anyhow::bail!("ConfigMap survivor is gone after the restart"),
                        Err(e) => Ok(Err(e.to_string())),
                    }
                }
            },
        )
        .await?;
    assert_eq!(
        cm.data
            .unwrap_or_default()
            .get("driver")
            .map(String::as_str),
        Some("570.86.10")
    );

    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    assert!(
        nodes.items.len() >= cluster.options().nodes as usize,
        "nodes kept: {}",
        nodes.items.len()
    );
    Ok(())
}
