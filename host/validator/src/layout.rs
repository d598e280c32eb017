//! Where the validator looks, as container paths under one configurable root (so tests run
//! against a temporary tree), and the host paths it reports to the other operands.

use std::path::{Path, PathBuf};

/// The validations directory inside the root, as upstream's `--output-dir`.
pub const VALIDATIONS_DIR: &str = "run/nvidia/validations";
/// Where the host's `/` is mounted in the validator pod (`host-root` volume).
pub const HOST_ROOT_CTR_PATH: &str = "/host";
/// Where the driver container installs the driver (`driver-install-dir` volume), both on the
/// host and in the validator pod.
pub const DRIVER_INSTALL_DIR: &str = "/run/nvidia/driver";

/// Container paths the validator reads and writes. Every path is `root` joined with the
/// upstream location unless overridden.
///
/// ```text
/// <root>/run/nvidia/validations/      status files (validations_dir)
/// <root>/proc/driver/nvidia/version   loaded kernel module version
/// <root>/host/                        host root (host-installed driver)
/// <root>/run/nvidia/driver/           driver container's install dir
/// <root>/dev/nvidiactl                control device (toolkit check)
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The container root, `/` in production.
    pub root: PathBuf,
    /// Status files; default `<root>/run/nvidia/validations`.
    pub validations_dir: PathBuf,
    /// The host root as mounted in the pod; default `<root>/host`.
    pub host_root: PathBuf,
    /// The driver container's install dir as mounted in the pod; default
    /// `<root>/run/nvidia/driver`.
    pub driver_install_dir: PathBuf,
}

impl Layout {
    /// The upstream layout under `root`.
    #[must_use]
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        Self {
            validations_dir: under(&root, VALIDATIONS_DIR),
            host_root: under(&root, HOST_ROOT_CTR_PATH),
            driver_install_dir: under(&root, DRIVER_INSTALL_DIR),
            root,
        }
    }

    /// `<root>/proc/driver/nvidia/version`: the loaded kernel module's version banner.
    #[must_use]
    pub fn proc_version(&self) -> PathBuf {
        under(&self.root, "proc/driver/nvidia/version")
    }

    /// `<root>/dev/nvidiactl`: present in a container the NVIDIA runtime has set up.
    #[must_use]
    pub fn nvidiactl(&self) -> PathBuf {
        under(&self.root, "dev/nvidiactl")
    }

    /// `<validations_dir>/<name>`.
    #[must_use]
    pub fn status_file(&self, name: &str) -> PathBuf {
        self.validations_dir.join(name)
    }
}

/// `root` joined with `path` taken as relative (a leading `/` is dropped).
#[must_use]
pub fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// Host paths written into `driver-ready` for the toolkit and other operands; they are host
/// paths, not this pod's paths (upstream `HOST_ROOT` / `DRIVER_INSTALL_DIR`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    /// The host's root as the host sees it; `/` unless `hostPaths.rootFS` says otherwise.
    pub host_root: String,
    /// The driver container's install dir on the host; default `/run/nvidia/driver`.
    pub driver_install_dir: String,
}

impl Default for HostPaths {
    fn default() -> Self {
        Self {
            host_root: "/".into(),
            driver_install_dir: DRIVER_INSTALL_DIR.into(),
        }
    }
}
