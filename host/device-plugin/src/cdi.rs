//! The CDI spec for `k8s.device-plugin.nvidia.com/gpu` (reference §4), written atomically
//! (temp file + rename, mode 0644) and regenerated whenever the driver version changes (§4.4;
//! upstream writes it only at plugin start).
//!
//! Content: one device per full GPU / MIG device, named by the runtime id
//! (`deviceIDStrategy`), with its `/dev/nvidiaN` node; common edits with the control nodes
//! that exist, the driver libraries **with the current version suffix** found under the
//! container's driver root, in the standard library directories and the linker's configured
//! ones ([`ld_conf_dirs`]) (host paths rewritten to the host driver root), the GSP firmware
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

/// The dynamic linker's configured library directories under `root`, from `etc/ld.so.conf` and
/// the files it `include`s (glob patterns, as glibc's `ldconfig` expands them), in file order, without a leading `/`, without duplicates and without the
/// [`LIB_DIRS`]. Upstream's CDI generator finds driver libraries through the driver root's
/// linker cache, which is built from these directories, so a driver installed outside the
/// standard directories (e.g. `/usr/local/nvidia/lib64` registered in `ld.so.conf.d`) still
/// has its libraries mounted. Missing or unreadable files yield nothing; includes nest at most
/// 4 deep (a loop ends there).
#[must_use]
pub(crate) fn ld_conf_dirs(root: &Path) -> Vec<String> {
    fn read(root: &Path, file: &Path, depth: usize, out: &mut Vec<String>) {
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            return;
        };
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or_default().trim();
            if let Some(pattern) = line.strip_prefix("include") {
                let pattern = pattern.trim();
                if depth < 4 && !pattern.is_empty() {
                    for f in matching(root, file, pattern) {
                        read(root, &f, depth + 1, out);
                    }
                }
            } else if let Some(dir) = line.strip_prefix('/') {
                let dir = dir.trim_end_matches('/');
                if !dir.is_empty()
                    && !dir.contains("..")
                    && !LIB_DIRS.contains(&dir)
                    && !out.iter().any(|d| d == dir)
                {
                    out.push(dir.to_owned());
                }
            }
        }
    }
    /// Files (relative to `root`, in alphabetical order) an `include` pattern names; a relative
    /// pattern is relative to the including file's directory.
    fn matching(root: &Path, from: &Path, pattern: &str) -> Vec<PathBuf> {
        let pattern = match pattern.strip_prefix('/') {
            Some(abs) => PathBuf::from(abs),
            None => from.parent().unwrap_or(Path::new("")).join(pattern),
        };
        let full = format!(
            "{}/{}",
            glob::Pattern::escape(&root.to_string_lossy()),
            pattern.to_string_lossy()
        );
        glob::glob(&full)
            .map(|paths| {
                paths
                    .filter_map(Result::ok)
                    .filter_map(|p| p.strip_prefix(root).ok().map(Path::to_path_buf))
                    .collect()
            })
            .unwrap_or_default()
    }
    let mut out = Vec::new();
    read(root, Path::new("etc/ld.so.conf"), 0, &mut out);
    out
}

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
    let mut found = std::collections::BTreeSet::new();
    let ld_dirs = ld_conf_dirs(container_driver_root);
    for dir in LIB_DIRS
        .into_iter()
        .chain(ld_dirs.iter().map(String::as_str))
    {
        for lib in DRIVER_LIBS {
            // A library is taken from every standard directory that holds it (as before), and
            // from a linker-configured directory only when no earlier directory had it.
            if !LIB_DIRS.contains(&dir) && found.contains(lib) {
                continue;
            }
            let file = format!("{lib}.{driver_version}");
            if container_driver_root.join(dir).join(&file).exists() {
                found.insert(lib);
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

#[cfg(test)]
mod tests {
    use super::ld_conf_dirs;

    fn write(root: &std::path::Path, path: &str, text: &str) {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn linker_directories_follow_includes_in_order_without_standard_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        // As on a GPU cloud image: the driver in /usr/local/nvidia, registered in ld.so.conf.d.
        write(
            root,
            "etc/ld.so.conf",
            "# libc default configuration\ninclude /etc/ld.so.conf.d/*.conf\n/opt/extra/lib/  # trailing\n",
        );
        write(
            root,
            "etc/ld.so.conf.d/000_cuda.conf",
            "/usr/local/cuda/targets/x86_64-linux/lib\n",
        );
        write(
            root,
            "etc/ld.so.conf.d/nvidia.conf",
            "/usr/local/nvidia/lib64\n/usr/local/nvidia/lib\n",
        );
        write(
            root,
            "etc/ld.so.conf.d/x86_64-linux-gnu.conf",
            "# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n",
        );
        write(root, "etc/ld.so.conf.d/not-a-conf.txt", "/ignored\n");
        // An include loop ends at the depth limit without repeating directories.
        write(
            root,
            "etc/ld.so.conf.d/loop.conf",
            "include loop.conf\n/usr/local/nvidia/lib64\n",
        );
        assert_eq!(
            ld_conf_dirs(root),
            [
                "usr/local/cuda/targets/x86_64-linux/lib",
                "usr/local/nvidia/lib64",
                "usr/local/nvidia/lib",
                "usr/local/lib/x86_64-linux-gnu",
                "opt/extra/lib",
            ]
        );
    }

    #[test]
    fn no_linker_configuration_adds_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(ld_conf_dirs(tmp.path()).is_empty());
        write(
            tmp.path(),
            "etc/ld.so.conf",
            "include /etc/missing/*.conf\n/../escape\n",
        );
        assert!(ld_conf_dirs(tmp.path()).is_empty());
    }
}
