//! The state bundles under `assets/state-<name>/`, embedded in the binary at build time.
//!
//! Files are read in sorted path order (the numeric prefixes fix the apply order, as upstream);
//! a file whose name contains `openshift` is used only on OpenShift.

use std::sync::OnceLock;

use include_dir::{Dir, include_dir};
use kiln_core::State;
use kiln_core::spec::gpucluster::DraState;
use serde_json::Value;

static ASSETS: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/../../assets");

/// Why a state's bundle cannot be loaded (a build defect: assets are checked by tests).
#[derive(Debug, Clone, thiserror::Error)]
pub enum AssetError {
    /// No `assets/state-<name>` folder.
    #[error("no assets folder for state {0}")]
    MissingFolder(State),
    /// No `assets/state-<name>` folder for a GPUCluster's DRA state.
    #[error("no assets folder for state {0}")]
    MissingDraFolder(DraState),
    /// A file is not valid YAML of one object.
    #[error("assets/{path}: {message}")]
    Invalid {
        /// File path under `assets/`.
        path: String,
        /// Parser message.
        message: String,
    },
}

/// One object of a bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct Asset {
    /// Path under `assets/`, e.g. `state-dcgm/0500_daemonset.yaml`.
    pub path: String,
    /// The object as JSON.
    pub object: Value,
}

/// The objects of `state`, in apply order; `openshift` files only when `openshift` is true.
/// Parsed once per process and cloned afterwards (YAML parsing would otherwise dominate a
/// render).
///
/// # Errors
/// [`AssetError`] when the folder is missing or a file does not parse.
pub fn load_state(state: State, openshift: bool) -> Result<Vec<Asset>, AssetError> {
    type Parsed = Result<Vec<Asset>, AssetError>;
    static CACHE: OnceLock<Vec<Parsed>> = OnceLock::new();
    let all = CACHE.get_or_init(|| State::ALL.iter().map(|&s| parse_state(s)).collect());
    let idx = State::ALL
        .iter()
        .position(|&s| s == state)
        .expect("State::ALL lists every state");
    match &all[idx] {
        Ok(assets) => Ok(assets
            .iter()
            .filter(|a| openshift || !a.path.contains("openshift"))
            .cloned()
            .collect()),
        Err(e) => Err(e.clone()),
    }
}

/// The objects of a GPUCluster's DRA state, in apply order (as [`load_state`]; the DRA states
/// have no OpenShift files).
///
/// # Errors
/// [`AssetError`] when the folder is missing or a file does not parse.
pub fn load_dra_state(state: DraState) -> Result<Vec<Asset>, AssetError> {
    type Parsed = Result<Vec<Asset>, AssetError>;
    static CACHE: OnceLock<Vec<Parsed>> = OnceLock::new();
    let all = CACHE.get_or_init(|| {
        DraState::ALL
            .iter()
            .map(|&s| {
                let dir = ASSETS
                    .get_dir(s.folder())
                    .ok_or(AssetError::MissingDraFolder(s))?;
                parse_dir(dir)
            })
            .collect()
    });
    let idx = DraState::ALL
        .iter()
        .position(|&s| s == state)
        .expect("DraState::ALL lists every DRA state");
    all[idx].clone()
}

fn parse_state(state: State) -> Result<Vec<Asset>, AssetError> {
    let dir = ASSETS
        .get_dir(state.folder())
        .ok_or(AssetError::MissingFolder(state))?;
    parse_dir(dir)
}

fn parse_dir(dir: &Dir<'static>) -> Result<Vec<Asset>, AssetError> {
    let mut files: Vec<_> = dir
        .files()
        .filter(|f| {
            f.path()
                .extension()
                .is_some_and(|e| e == "yaml" || e == "yml")
        })
        .collect();
    files.sort_by_key(|f| f.path());
    files
        .into_iter()
        .map(|f| {
            let path = f.path().to_string_lossy().into_owned();
            let text = f.contents_utf8().unwrap_or_default();
            let object: Value = serde_yaml_ng::from_str(text).map_err(|e| AssetError::Invalid {
                path: path.clone(),
                message: e.to_string(),
            })?;
            Ok(Asset { path, object })
        })
        .collect()
}

/// Names of the `state-*` folders present in the embedded assets (for consistency tests).
pub fn folders() -> Vec<String> {
    let mut v: Vec<String> = ASSETS
        .dirs()
        .filter_map(|d| d.path().file_name()?.to_str().map(str::to_string))
        .filter(|n| n.starts_with("state-"))
        .collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every DaemonSet of every state parses as a typed `apps/v1` DaemonSet (catches YAML 1.1
    /// surprises such as an octal `0755` read as a string) and has a selector.
    #[test]
    fn every_daemonset_asset_is_a_valid_daemonset() {
        let mut seen = 0;
        for state in State::ALL {
            for a in load_state(state, true).unwrap() {
                assert!(
                    a.object["metadata"]["name"].is_string(),
                    "{}: no metadata.name",
                    a.path
                );
                if a.object["kind"] == "DaemonSet" {
                    let ds: k8s_openapi::api::apps::v1::DaemonSet =
                        serde_json::from_value(a.object.clone())
                            .unwrap_or_else(|e| panic!("{}: {e}", a.path));
                    assert!(
                        ds.spec.unwrap().selector.match_labels.is_some(),
                        "{}: no selector",
                        a.path
                    );
                    seen += 1;
                }
            }
        }
        assert_eq!(seen, 18, "DaemonSets across all states");
    }
}
