//! The driver step: find the driver (host-installed or driver container), check that NVML
//! opens and that the library's version equals the loaded kernel module's, and describe the
//! driver root for `driver-ready`.
//!
//! Upstream runs `nvidia-smi` chrooted into `/host`, then into `/run/nvidia/driver`, and on a
//! version mismatch only reports "no driver on host". kiln opens NVML through the GPU seam and
//! compares versions itself, so the mismatch is reported as such, with both versions.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use kiln_gpu::{GpuError, GpuInventory};

use crate::{DriverReady, HostPaths, Layout, NotReady, layout::HOST_ROOT_CTR_PATH};

/// Library directories searched, relative to a driver root, in order.
pub const LIBRARY_DIRS: &[&str] = &[
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib/x86_64-linux-gnu",
    "lib64",
    "usr/local/nvidia/lib64",
];

/// The NVML library's file name, as the dynamic loader asks for it.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// Where the driver was found, as this pod sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverRoot {
    /// `true` for a host-installed driver (`/host`), `false` for the driver container's
    /// install dir.
    pub is_host_driver: bool,
    /// The root in this pod's file system (under [`Layout::root`]).
    pub path: PathBuf,
    /// `<path>/<lib dir>/libnvidia-ml.so.1`.
    pub nvml_library: PathBuf,
}

impl DriverRoot {
    /// The library version from the file `libnvidia-ml.so.1` links to
    /// (`libnvidia-ml.so.550.144.03` → `550.144.03`); `None` when it is not a link to a
    /// versioned file.
    #[must_use]
    pub fn library_version(&self) -> Option<String> {
        let target = std::fs::read_link(&self.nvml_library).ok()?;
        let name = target.file_name()?.to_str()?;
        let version = name.strip_prefix("libnvidia-ml.so.")?;
        is_version(version).then(|| version.to_owned())
    }
}

/// What a successful driver check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverReport {
    /// Where the driver is.
    pub root: DriverRoot,
    /// The kernel module's (= library's) version.
    pub version: String,
    /// UUIDs of the GPUs NVML lists, in index order.
    pub gpus: Vec<String>,
}

/// Parses the version from `/proc/driver/nvidia/version`: the first whitespace-separated
/// token of the `NVRM version:` line that is a dotted number (`550.144.03`), which covers both
/// the proprietary ("Kernel Module  550.144.03  …") and open ("Open Kernel Module for x86_64
/// 550.144.03  Release Build …") banners.
///
/// # Errors
/// A reason naming what was missing.
pub fn parse_proc_version(text: &str) -> Result<String, String> {
    let line = text
        .lines()
        .find(|l| l.starts_with("NVRM version:"))
        .ok_or("no `NVRM version:` line")?;
    line.split_whitespace()
        .find(|t| is_version(t))
        .map(str::to_owned)
        .ok_or_else(|| format!("no version number in {line:?}"))
}

fn is_version(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// Reads the loaded kernel module's version.
///
/// # Errors
/// [`NotReady::NoKernelModule`] when the file is absent, [`NotReady::BadProcVersion`] when it
/// cannot be read or parsed.
pub fn kernel_module_version(layout: &Layout) -> Result<String, NotReady> {
    let path = layout.proc_version();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(NotReady::NoKernelModule { path });
        }
        Err(e) => {
            return Err(NotReady::BadProcVersion {
                path,
                reason: e.to_string(),
            });
        }
    };
    parse_proc_version(&text).map_err(|reason| NotReady::BadProcVersion { path, reason })
}

/// `<root>/<dir>/libnvidia-ml.so.1` for the first [`LIBRARY_DIRS`] entry that has it.
#[must_use]
pub fn find_nvml_library(root: &Path) -> Option<PathBuf> {
    LIBRARY_DIRS
        .iter()
        .map(|d| root.join(d).join(NVML_LIBRARY))
        .find(|p| p.symlink_metadata().is_ok())
}

/// Upstream's order: a host-installed driver first, then the driver container's.
///
/// # Errors
/// [`NotReady::NoDriverFiles`] naming both places.
pub fn find_driver_root(layout: &Layout) -> Result<DriverRoot, NotReady> {
    [
        (true, &layout.host_root),
        (false, &layout.driver_install_dir),
    ]
    .into_iter()
    .find_map(|(is_host_driver, path)| {
        find_nvml_library(path).map(|nvml_library| DriverRoot {
            is_host_driver,
            path: path.clone(),
            nvml_library,
        })
    })
    .ok_or_else(|| NotReady::NoDriverFiles {
        host_root: layout.host_root.clone(),
        driver_install_dir: layout.driver_install_dir.clone(),
    })
}

/// Opens the GPU backend for a driver root (NVML from that root, or a fake in tests).
pub type GpuOpener<'a> = dyn Fn(&DriverRoot) -> Result<Arc<dyn GpuInventory>, GpuError> + 'a;

/// One attempt of the driver step.
///
/// 1. the kernel module is loaded (its version from `/proc/driver/nvidia/version`);
/// 2. the driver's files are on the host or in the driver container's install dir;
/// 3. NVML opens — if not, and the library file's version differs from the kernel's, that
///    mismatch is the reason (NVML's own init error for it is "Driver/library version
///    mismatch", without versions);
/// 4. NVML's driver version equals the kernel module's;
/// 5. NVML lists at least one GPU (as `nvidia-smi` fails with "No devices were found").
///
/// # Errors
/// The [`NotReady`] reason of the first check that fails.
pub fn check_driver(layout: &Layout, open: &GpuOpener<'_>) -> Result<DriverReport, NotReady> {
    let kernel = kernel_module_version(layout)?;
    let root = find_driver_root(layout)?;
    let mismatch = |library: String, library_source: String| NotReady::VersionMismatch {
        library,
        library_source,
        kernel: kernel.clone(),
        proc_path: layout.proc_version(),
    };
    let gpu = match open(&root) {
        Ok(gpu) => gpu,
        Err(e) => {
            return Err(match root.library_version() {
                Some(lib) if lib != kernel => {
                    mismatch(lib, root.nvml_library.display().to_string())
                }
                _ => NotReady::Nvml(e),
            });
        }
    };
    let system = gpu.system().map_err(NotReady::Nvml)?;
    if system.driver_version != kernel {
        return Err(mismatch(
            system.driver_version,
            "libnvidia-ml, nvmlSystemGetDriverVersion".into(),
        ));
    }
    let gpus: Vec<String> = gpu
        .devices()
        .map_err(NotReady::Nvml)?
        .into_iter()
        .map(|d| d.uuid)
        .collect();
    if gpus.is_empty() {
        return Err(NotReady::NoGpus);
    }
    Ok(DriverReport {
        root,
        version: kernel,
        gpus,
    })
}

/// The `driver-ready` content for a found driver. A host driver is `/` (or `HOST_ROOT`) on
/// the host and `/host` in pods. A driver container's root is its install dir in both; its
/// devices are under that dir when it has `dev/nvidiactl`, else on the host's `/dev`.
#[must_use]
pub fn driver_ready(layout: &Layout, root: &DriverRoot, host: &HostPaths) -> DriverReady {
    if root.is_host_driver {
        return DriverReady {
            is_host_driver: true,
            driver_root: host.host_root.clone(),
            driver_root_ctr_path: HOST_ROOT_CTR_PATH.into(),
            dev_root: host.host_root.clone(),
            dev_root_ctr_path: HOST_ROOT_CTR_PATH.into(),
        };
    }
    let ctr_path = crate::layout::DRIVER_INSTALL_DIR.to_owned();
    let (dev_root, dev_root_ctr_path) = if layout.driver_install_dir.join("dev/nvidiactl").exists()
    {
        (host.driver_install_dir.clone(), ctr_path.clone())
    } else {
        (host.host_root.clone(), HOST_ROOT_CTR_PATH.to_owned())
    };
    DriverReady {
        is_host_driver: false,
        driver_root: host.driver_install_dir.clone(),
        driver_root_ctr_path: ctr_path,
        dev_root,
        dev_root_ctr_path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_version_parses_proprietary_and_open_banners() {
        let prop = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.144.03  Thu Nov 28 08:09:50 UTC 2024\nGCC version:  gcc version 12.2.0\n";
        assert_eq!(parse_proc_version(prop).unwrap(), "550.144.03");
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Jan 23 2025\n";
        assert_eq!(parse_proc_version(open).unwrap(), "570.86.15");
        assert!(parse_proc_version("GCC version: 12.2.0\n").is_err());
        assert!(
            parse_proc_version("NVRM version: NVIDIA UNIX Kernel Module\n")
                .unwrap_err()
                .contains("no version number")
        );
    }
}
