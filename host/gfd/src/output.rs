//! Where the labels go, as NVIDIA's GFD: a NodeFeature object for nfd-master (the Node Feature
//! API, NVIDIA's default since v0.19), a features.d file for nfd-worker, or stdout. GFD never
//! writes the Node itself: its ClusterRole only reads nodes, and NFD turns either output
//! into `nvidia.com/*` node labels.

use std::{io::Write as _, path::Path};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};

use crate::{GfdError, Labels};

/// API group of NFD's NodeFeature.
pub const NODE_FEATURE_GROUP: &str = "nfd.k8s-sigs.io";
/// API version of NFD's NodeFeature.
pub const NODE_FEATURE_VERSION: &str = "v1alpha1";
/// Label on a NodeFeature naming the node its labels are for (NFD's rule).
pub const NODE_NAME_LABEL: &str = "nfd.node.kubernetes.io/node-name";

/// `key=value` lines sorted by key, newline-terminated (the features.d format).
#[must_use]
pub fn render_lines(labels: &Labels) -> String {
    labels.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

/// Writes the features.d file atomically (temp file in the same dir + rename), mode 0644.
/// Only a regular file (or nothing) at `path` is replaced: a device node, directory, socket,
/// FIFO or symlink there is refused (`--output-file /dev/full` once replaced the device node
/// with a regular file).
///
/// # Errors
/// [`GfdError::OutputFile`] naming the file.
pub fn write_features_file(path: &Path, labels: &Labels) -> Result<(), GfdError> {
    let err = |source| GfdError::OutputFile {
        path: path.to_owned(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_file() => {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "not a regular file ({}); refusing to replace it",
                    kiln_input::file_kind(&m.file_type())
                ),
            )));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(err)?;
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name()
            .map_or("gfd".into(), |n| n.to_string_lossy())
    ));
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    f.write_all(render_lines(labels).as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// The NodeFeature `nvidia-features-for-<node>` (NVIDIA's name) in `namespace`, carrying
/// `labels` in `spec.labels` with empty `spec.features`, labelled
/// [`NODE_NAME_LABEL`]`=<node>` and owned by `owners`.
#[must_use]
pub fn node_feature(
    node: &str,
    namespace: &str,
    labels: &Labels,
    owners: &[OwnerReference],
) -> Value {
    let mut obj = json!({
        "apiVersion": format!("{NODE_FEATURE_GROUP}/{NODE_FEATURE_VERSION}"),
        "kind": "NodeFeature",
        "metadata": {
            "name": node_feature_name(node),
            "namespace": namespace,
            "labels": { NODE_NAME_LABEL: node },
        },
        "spec": {
            "features": {"flags": {}, "attributes": {}, "instances": {}},
            "labels": labels,
        },
    });
    if !owners.is_empty() {
        obj["metadata"]["ownerReferences"] = json!(owners);
    }
    obj
}

/// `nvidia-features-for-<node>`.
#[must_use]
pub fn node_feature_name(node: &str) -> String {
    format!("nvidia-features-for-{node}")
}

/// The owners NVIDIA's GFD gives its NodeFeature: the controller of `pod` (its DaemonSet, as
/// controller) and the pod itself, so the object goes when the DaemonSet is deleted.
/// Empty when the pod has no name or uid.
#[must_use]
pub fn owners_of(pod: &Pod) -> Vec<OwnerReference> {
    let meta = &pod.metadata;
    let (Some(name), Some(uid)) = (&meta.name, &meta.uid) else {
        return Vec::new();
    };
    let mut out: Vec<OwnerReference> = meta
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.controller == Some(true))
        .map(|o| OwnerReference {
            block_owner_deletion: None,
            ..o.clone()
        })
        .collect();
    out.push(OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: name.clone(),
        uid: uid.clone(),
        controller: None,
        block_owner_deletion: None,
    });
    out
}

/// Whether `live` lacks what `desired` ([`node_feature`]) sets: its labels, its
/// `nfd.node.kubernetes.io/node-name` label or its owners. A NodeFeature equal in these is
/// not written again.
#[must_use]
pub fn node_feature_differs(live: &Value, desired: &Value) -> bool {
    let meta = |v: &Value, k: &str| v["metadata"][k].clone();
    live["spec"]["labels"] != desired["spec"]["labels"]
        || live["metadata"]["labels"][NODE_NAME_LABEL]
            != desired["metadata"]["labels"][NODE_NAME_LABEL]
        || (desired["metadata"]["ownerReferences"].is_array()
            && meta(live, "ownerReferences") != meta(desired, "ownerReferences"))
}

/// Where a NodeFeature goes: the client, this node, the namespace, and this pod's name (to
/// own the object as NVIDIA's GFD does; `None` leaves it unowned).
#[derive(Clone)]
pub struct NodeFeatureTarget {
    /// The client.
    pub client: kube::Client,
    /// This node's name (`NODE_NAME`).
    pub node: String,
    /// The namespace of the NodeFeature (`NAMESPACE`, GFD's own).
    pub namespace: String,
    /// This pod (`POD_NAME`), for the owner references.
    pub pod: Option<String>,
}

/// Creates or updates this node's NodeFeature (needs `get`/`create`/`update` on
/// `nodefeatures` and `get` on `pods` in the namespace, NVIDIA's GFD Role). Returns whether
/// anything was written.
///
/// # Errors
/// [`GfdError::Kube`] naming the node.
pub async fn write_node_feature(
    target: &NodeFeatureTarget,
    labels: &Labels,
) -> Result<bool, GfdError> {
    let kube_err = |source| GfdError::Kube {
        node: target.node.clone(),
        source,
    };
    let owners = match &target.pod {
        Some(pod) => {
            let pods: Api<Pod> = Api::namespaced(target.client.clone(), &target.namespace);
            owners_of(&pods.get(pod).await.map_err(kube_err)?)
        }
        None => Vec::new(),
    };
    let desired = node_feature(&target.node, &target.namespace, labels, &owners);
    let ar = ApiResource {
        group: NODE_FEATURE_GROUP.into(),
        version: NODE_FEATURE_VERSION.into(),
        api_version: format!("{NODE_FEATURE_GROUP}/{NODE_FEATURE_VERSION}"),
        kind: "NodeFeature".into(),
        plural: "nodefeatures".into(),
    };
    let api: Api<DynamicObject> =
        Api::namespaced_with(target.client.clone(), &target.namespace, &ar);
    let name = node_feature_name(&target.node);
    let as_object = |v: Value| {
        serde_json::from_value::<DynamicObject>(v).map_err(|e| kube_err(kube::Error::SerdeError(e)))
    };
    match api.get_opt(&name).await.map_err(kube_err)? {
        None => {
            api.create(&PostParams::default(), &as_object(desired)?)
                .await
                .map_err(kube_err)?;
            Ok(true)
        }
        Some(live) => {
            let live_json =
                serde_json::to_value(&live).map_err(|e| kube_err(kube::Error::SerdeError(e)))?;
            if !node_feature_differs(&live_json, &desired) {
                return Ok(false);
            }
            let mut next = live_json;
            next["spec"] = desired["spec"].clone();
            next["metadata"]["labels"][NODE_NAME_LABEL] = json!(target.node);
            if desired["metadata"]["ownerReferences"].is_array() {
                next["metadata"]["ownerReferences"] =
                    desired["metadata"]["ownerReferences"].clone();
            }
            api.replace(&name, &PostParams::default(), &as_object(next)?)
                .await
                .map_err(kube_err)?;
            Ok(true)
        }
    }
}
