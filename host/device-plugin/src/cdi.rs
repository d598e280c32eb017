//! The CDI spec for `k8s.device-plugin.nvidia.com/gpu` (reference §4), written atomically
//! (temp file + rename, mode 0644) and regenerated whenever the driver version changes (§4.4;
//! upstream writes it only at plugin start).
//!
//! Content: one device per full GPU / MIG device, named by the runtime id
//! (`deviceIDStrategy`), with its `/dev/nvidiaN` node; common edits with the control nodes
//! that exist, the driver libraries **with the current version suffix** found under the
//! container's driver root (host paths rewritten to the host driver root), the GSP firmware
//! directory of that version, `NVIDIA_VISIBLE_DEVICES=void`, and an `update-ldcache` hook.
//! The spec's `k8s.device-plugin.nvidia.com/driver-version` annotation records the version.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
};

use serde::Serialize;

use crate::{
    allocate::{CDI_KIND, CONTROL_NODES},
    config::DeviceIdStrategy,
    devices::Resource,
    settings::Settings,
};

/// File name of the GPU spec in the CDI directory.
pub const SPEC_FILE: &str = "k8s.device-plugin.nvidia.com-gpu.json";
/// Default CDI directory.
pub const DEFAULT_CDI_ROOT: &str = "/var/run/cdi";
/// Spec annotation carrying the driver version the spec was generated for.
pub const DRIVER_VERSION_ANNOTATION: &str = "k8s.device-plugin.nvidia.com/driver-version";

/// Libraries bind-mounted by the spec, as `<name>.so.<driver version>`.
const DRIVER_LIBS: [&str; 8] = [
    "libcuda.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-opencl.so",
    "libnvidia-cfg.so",
    "libnvidia-gpucomp.so",
    "libcudadebugger.so",
];
/// Library directories searched under the driver root (upstream's list, §1.2).
const LIB_DIRS: [&str; 6] = [
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
];

/// A CDI spec (the subset kiln writes).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// CDI version (`0.6.0`: spec annotations).
    pub cdi_version: String,
    /// `k8s.device-plugin.nvidia.com/gpu`.
    pub kind: String,
    /// Spec annotations (driver version).
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Devices, sorted by name.
    pub devices: Vec<CdiDevice>,
    /// Edits for every device.
    pub container_edits: Edits,
}

/// One named device.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiDevice {
    /// Runtime id (`GPU-…`, `MIG-…`, `0`, `0:1`).
    pub name: String,
    /// Its edits.
    pub container_edits: Edits,
}

/// Container edits.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Edits {
    /// `KEY=value`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Bind mounts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<CdiMount>,
    /// OCI hooks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

/// A device node.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host.
    pub host_path: String,
}

/// A bind mount.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiMount {
    /// Host path.
    pub host_path: String,
    /// Container path.
    pub container_path: String,
    /// Mount options.
    pub options: Vec<String>,
}

/// An OCI hook.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// `createContainer`.
    pub hook_name: String,
    /// Executable.
    pub path: String,
    /// argv.
    pub args: Vec<String>,
}

/// Builds the spec for `resources` and `driver_version`. Host files are looked up under
/// `container_driver_root` (this container's view of the driver root) and `/dev`.
#[must_use]
pub fn build_spec(
    resources: &[Resource],
    settings: &Settings,
    driver_version: &str,
    container_driver_root: &Path,
) -> Spec {
    let host_root = settings.driver_root.trim_end_matches('/');
    let dev_root = settings.dev_root.trim_end_matches('/');
    let mut devices: Vec<CdiDevice> = Vec::new();
    for r in resources {
        for u in &r.units {
            let name = match settings.device_id_strategy {
                DeviceIdStrategy::Uuid => u.physical.uuid.clone(),
                DeviceIdStrategy::Index => u.physical.index.clone(),
            };
            if devices.iter().any(|d| d.name == name) {
                continue;
            }
            let device_nodes = u
                .physical
                .paths
                .iter()
                .map(|p| DeviceNode {
                    path: p.clone(),
                    host_path: format!("{dev_root}{p}"),
                })
                .collect();
            devices.push(CdiDevice {
                name,
                container_edits: Edits {
                    device_nodes,
                    ..Edits::default()
                },
            });
        }
    }
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    let mut edits = Edits {
        env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
        ..Edits::default()
    };
    edits.device_nodes = CONTROL_NODES
        .iter()
        .filter(|n| Path::new(n).exists())
        .map(|n| DeviceNode {
            path: (*n).into(),
            host_path: format!("{dev_root}{n}"),
        })
        .collect();
    let mut lib_dirs = std::collections::BTreeSet::new();
    for dir in LIB_DIRS {
        for lib in DRIVER_LIBS {
            let file = format!("{lib}.{driver_version}");
            if container_driver_root.join(dir).join(&file).exists() {
                let path = format!("/{dir}/{file}");
                lib_dirs.insert(format!("/{dir}"));
                edits.mounts.push(CdiMount {
                    host_path: format!("{host_root}{path}"),
                    container_path: path,
                    options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
                });
            }
        }
    }
    let firmware = format!("/lib/firmware/nvidia/{driver_version}");
    if container_driver_root
        .join(firmware.trim_start_matches('/'))
        .is_dir()
    {
        edits.mounts.push(CdiMount {
            host_path: format!("{host_root}{firmware}"),
            container_path: firmware,
            options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
        });
    }
    if !lib_dirs.is_empty() {
        let mut args = vec!["nvidia-cdi-hook".to_owned(), "update-ldcache".to_owned()];
        for d in lib_dirs {
            args.extend(["--folder".to_owned(), d]);
        }
        edits.hooks.push(Hook {
            hook_name: "createContainer".into(),
            path: settings.nvidia_cdi_hook_path.clone(),
            args,
        });
    }
    Spec {
        cdi_version: "0.6.0".into(),
        kind: CDI_KIND.into(),
        annotations: [(
            DRIVER_VERSION_ANNOTATION.to_owned(),
            driver_version.to_owned(),
        )]
        .into(),
        devices,
        container_edits: edits,
    }
}

/// Why the spec could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing CDI spec {path}")]
pub struct CdiError {
    /// Target file.
    pub path: PathBuf,
    /// Cause.
    #[source]
    pub source: std::io::Error,
}

/// Writes `spec` to `<dir>/k8s.device-plugin.nvidia.com-gpu.json` through a temp file in the
/// same directory renamed over the target (readers never see a partial file). Returns the path.
///
/// # Errors
/// [`CdiError`] naming the target.
pub fn write_spec(dir: &Path, spec: &Spec) -> Result<PathBuf, CdiError> {
    let path = dir.join(SPEC_FILE);
    let err = |source| CdiError {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let json = serde_json::to_vec_pretty(spec).map_err(|e| err(std::io::Error::other(e)))?;
    let tmp = dir.join(format!(".{SPEC_FILE}.{}.tmp", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    f.write_all(&json).map_err(err)?;
    f.sync_all().map_err(err)?;
    drop(f);
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).map_err(err)?;
    }
    std::fs::rename(&tmp, &path).map_err(err)?;
    Ok(path)
}
