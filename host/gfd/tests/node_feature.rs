//! The NodeFeature output against a real API server (testcluster): `write_node_feature`
//! creates NVIDIA's object, writes nothing when the labels are unchanged, and updates it when
//! they change. NFD's CRD is stood in by one that keeps any spec (only the round trip is under
//! test; nfd-master, which turns it into node labels, is NFD's).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kiln_gfd::{Labels, NodeFeatureTarget, write_node_feature};
use kiln_testcluster::{namespace, shared, shared_access};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::json;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (format!("nvidia.com/{k}"), (*v).to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_feature_is_created_kept_and_updated() -> anyhow::Result<()> {
    let cluster = shared()?;
    let _guard = shared_access().await;
    let client = cluster.client().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "nodefeatures.nfd.k8s-sigs.io"},
        "spec": {
            "group": "nfd.k8s-sigs.io",
            "scope": "Namespaced",
            "names": {"kind": "NodeFeature", "plural": "nodefeatures", "singular": "nodefeature", "listKind": "NodeFeatureList"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }}}]
        }
    });
    crds.patch(
        "nodefeatures.nfd.k8s-sigs.io",
        &PatchParams::apply("kiln-test").force(),
        &Patch::Apply(&crd),
    )
    .await?;
    let ns = namespace(&client, "gfd").await?;
    let target = NodeFeatureTarget {
        client: client.clone(),
        node: "gpu-node-1".into(),
        namespace: ns.clone(),
        pod: None,
    };
    let first = labels(&[("gpu.count", "1"), ("gpu.product", "NVIDIA-H100-80GB-HBM3")]);
    // The CRD may take a moment to be served.
    let created = cluster
        .wait_for(
            "NodeFeature created",
            kiln_testcluster::DEFAULT_TIMEOUT,
            || async {
                Ok(write_node_feature(&target, &first)
                    .await
                    .map_err(|e| format!("{e:?}")))
            },
        )
        .await?;
    assert!(created);
    assert!(
        !write_node_feature(&target, &first).await?,
        "unchanged labels rewritten"
    );
    let second = labels(&[("gpu.count", "2"), ("gpu.product", "NVIDIA-H100-80GB-HBM3")]);
    assert!(write_node_feature(&target, &second).await?);
    let ar = ApiResource {
        group: "nfd.k8s-sigs.io".into(),
        version: "v1alpha1".into(),
        api_version: "nfd.k8s-sigs.io/v1alpha1".into(),
        kind: "NodeFeature".into(),
        plural: "nodefeatures".into(),
    };
    let live = Api::<DynamicObject>::namespaced_with(client, &ns, &ar)
        .get("nvidia-features-for-gpu-node-1")
        .await?;
    let live = serde_json::to_value(live)?;
    assert_eq!(
        live["metadata"]["labels"]["nfd.node.kubernetes.io/node-name"],
        "gpu-node-1"
    );
    assert_eq!(
        live["spec"]["labels"],
        json!({"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    );
    Ok(())
}
