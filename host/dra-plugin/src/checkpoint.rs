//! The prepared claims on disk (`<plugins dir>/gpu.nvidia.com/checkpoint.json`, NVIDIA's file
//! name), so a restarted plugin answers a repeated NodePrepareResources with what it prepared
//! before (no second preparation) and can still unprepare claims prepared before the restart.
//!
//! The file is JSON `{"version": 1, "checksum": <FNV-1a 64 of the claims' JSON>, "claims":
//! {<uid>: PreparedClaim}}`, written through a temp file that is synced and renamed over it. A
//! file whose checksum does not match is refused ([`CheckpointError::Corrupt`]): the plugin
//! does not start rather than forget or repeat claims (NVIDIA's driver does the same).

use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::config::Sharing;

/// The checkpoint's file name.
pub const FILE_NAME: &str = "checkpoint.json";

/// One device prepared for a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    /// The claim's requests this device was allocated for.
    pub requests: Vec<String>,
    /// Pool (the node's name).
    pub pool: String,
    /// Device name in the slice.
    pub device: String,
    /// The device's UUID (`GPU-…`/`MIG-…`).
    pub uuid: String,
    /// Fully qualified CDI device ids (`k8s.gpu.nvidia.com/claim=<uid>-gpu-0`).
    pub cdi_ids: Vec<String>,
    /// Sharing applied, if any was configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
}

/// One prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Its devices, in allocation order.
    pub devices: Vec<PreparedDevice>,
}

/// Prepared claims by UID.
pub type Claims = BTreeMap<String, PreparedClaim>;

#[derive(Debug, Serialize, Deserialize)]
struct File {
    version: u32,
    checksum: u64,
    claims: Claims,
}

/// Why the checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing the file failed.
    #[error("checkpoint {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a checkpoint of this version, or its checksum does not match.
    #[error("checkpoint {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// FNV-1a (64 bit) of `bytes`.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn checksum(claims: &Claims) -> u64 {
    fnv1a(&serde_json::to_vec(claims).unwrap_or_default())
}

/// Reads the checkpoint at `path`; a missing file is no claims.
///
/// # Errors
/// [`CheckpointError`].
pub fn load(path: &Path) -> Result<Claims, CheckpointError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Claims::new()),
        Err(source) => {
            return Err(CheckpointError::Io {
                path: path.into(),
                source,
            });
        }
    };
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.into(),
        reason,
    };
    let file: File = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
    if file.version != 1 {
        return Err(corrupt(format!("unknown version {}", file.version)));
    }
    if checksum(&file.claims) != file.checksum {
        return Err(corrupt("checksum mismatch".into()));
    }
    Ok(file.claims)
}

/// Writes `claims` to `path` atomically (temp file in the same directory, synced, renamed).
///
/// # Errors
/// [`CheckpointError::Io`].
pub fn save(path: &Path, claims: &Claims) -> Result<(), CheckpointError> {
    let err = |source| CheckpointError::Io {
        path: path.into(),
        source,
    };
    let file = File {
        version: 1,
        checksum: checksum(claims),
        claims: claims.clone(),
    };
    let json = serde_json::to_vec_pretty(&file).map_err(|e| err(std::io::Error::other(e)))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(err)?;
    let tmp = dir.join(format!(".{FILE_NAME}.{}.tmp", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    f.write_all(&json).map_err(err)?;
    f.sync_all().map_err(err)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TimeSlice;

    fn claims() -> Claims {
        [(
            "uid-1".to_owned(),
            PreparedClaim {
                namespace: "ns".into(),
                name: "c".into(),
                devices: vec![PreparedDevice {
                    requests: vec!["gpu".into()],
                    pool: "node".into(),
                    device: "gpu-0".into(),
                    uuid: "GPU-1".into(),
                    cdi_ids: vec!["k8s.gpu.nvidia.com/claim=uid-1-gpu-0".into()],
                    sharing: Some(Sharing::TimeSlicing(TimeSlice::Short)),
                }],
            },
        )]
        .into()
    }

    #[test]
    fn round_trips_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join(FILE_NAME);
        assert!(load(&path).unwrap().is_empty());
        save(&path, &claims()).unwrap();
        assert_eq!(load(&path).unwrap(), claims());
        // No temp file is left behind.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [FILE_NAME]);
    }

    #[test]
    fn an_edited_or_truncated_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        save(&path, &claims()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("gpu-0", "gpu-1")).unwrap();
        assert!(matches!(load(&path), Err(CheckpointError::Corrupt { .. })));
        std::fs::write(&path, &text[..text.len() / 2]).unwrap();
        assert!(matches!(load(&path), Err(CheckpointError::Corrupt { .. })));
    }
}
