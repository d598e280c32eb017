//! Where the labels go: straight onto this Node (a JSON merge patch of `metadata.labels`,
//! never a full update), a features.d file for nfd-worker, or stdout.

use std::{io::Write as _, path::Path};

use k8s_openapi::api::core::v1::Node;
use serde_json::{Map, Value, json};

use crate::{GfdError, Labels};

/// Annotation on the Node listing the label keys GFD wrote last (comma-separated, sorted), so
/// the next pass removes the ones it no longer produces and never touches others.
pub const OWNED_LABELS_ANNOTATION: &str = "nvidia.com/gfd.labels";

/// `key=value` lines sorted by key, newline-terminated (the features.d format).
#[must_use]
pub fn render_lines(labels: &Labels) -> String {
    labels.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

/// Writes the features.d file atomically (temp file in the same dir + rename), mode 0644.
///
/// # Errors
/// [`GfdError::OutputFile`] naming the file.
pub fn write_features_file(path: &Path, labels: &Labels) -> Result<(), GfdError> {
    let err = |source| GfdError::OutputFile {
        path: path.to_owned(),
        source,
    };
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

/// The merge patch that makes the node carry `labels`: sets every label, deletes (`null`) the
/// keys listed in the node's [`OWNED_LABELS_ANNOTATION`] that are no longer produced, and
/// records the new key list. Keys GFD never wrote (the operator's `nvidia.com/gpu.deploy.*`,
/// `nvidia.com/gpu.present`, the config label) are left alone. `None` when nothing changes.
#[must_use]
pub fn make_node_patch(node: &Node, labels: &Labels) -> Option<Value> {
    let current = node.metadata.labels.clone().unwrap_or_default();
    let owned_before: Vec<String> = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(OWNED_LABELS_ANNOTATION))
        .map(|s| {
            s.split(',')
                .filter(|k| !k.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let mut patch_labels = Map::new();
    for (k, v) in labels {
        if current.get(k) != Some(v) {
            patch_labels.insert(k.clone(), json!(v));
        }
    }
    for k in owned_before.iter().filter(|k| !labels.contains_key(*k)) {
        if current.contains_key(k) {
            patch_labels.insert(k.clone(), Value::Null);
        }
    }
    let owned_now = labels.keys().cloned().collect::<Vec<_>>().join(",");
    let annotation_changed = owned_before.join(",") != owned_now;
    if patch_labels.is_empty() && !annotation_changed {
        return None;
    }
    let mut meta = Map::new();
    if !patch_labels.is_empty() {
        meta.insert("labels".into(), Value::Object(patch_labels));
    }
    if annotation_changed {
        meta.insert(
            "annotations".into(),
            json!({ OWNED_LABELS_ANNOTATION: owned_now }),
        );
    }
    Some(json!({ "metadata": meta }))
}

/// Reads this node and applies [`make_node_patch`] as a merge patch (needs `get` and `patch`
/// on `nodes`, which kiln's GFD ClusterRole grants). Returns whether anything was patched.
///
/// # Errors
/// [`GfdError::Kube`] naming the node.
pub async fn patch_node(
    client: &kube::Client,
    node: &str,
    labels: &Labels,
) -> Result<bool, GfdError> {
    let api: kube::Api<Node> = kube::Api::all(client.clone());
    let kube_err = |source| GfdError::Kube {
        node: node.to_owned(),
        source,
    };
    let current = api.get(node).await.map_err(kube_err)?;
    let Some(patch) = make_node_patch(&current, labels) else {
        return Ok(false);
    };
    api.patch(
        node,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .map_err(kube_err)?;
    Ok(true)
}
