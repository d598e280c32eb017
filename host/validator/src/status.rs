//! Status files under the validations directory: the names upstream uses, their content,
//! atomic writes and the removal of stale ones.

use std::{io::Write as _, path::Path};

use crate::{Layout, ValidatorError};

/// One `<component>-ready` file (upstream's file names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusFile {
    /// `driver-ready`: the driver is loaded and usable; holds [`DriverReady`] as `KEY=value`.
    Driver,
    /// `toolkit-ready`: the container toolkit injects the driver into containers.
    Toolkit,
    /// `cuda-ready`: CUDA workloads can run.
    Cuda,
    /// `plugin-ready`: the node advertises GPUs.
    Plugin,
    /// `vfio-pci-ready`: every NVIDIA GPU is bound to vfio-pci (sandbox nodes).
    VfioPci,
    /// `vgpu-manager-ready`: the vGPU manager (host driver) is loaded (sandbox nodes).
    VgpuManager,
    /// `vgpu-devices-ready`: vGPU devices exist (sandbox nodes).
    VgpuDevices,
    /// `cc-manager-ready`: the confidential-computing manager has applied its mode.
    CcManager,
}

impl StatusFile {
    /// Every status file kiln's validator writes, in chain order (driver → toolkit → cuda →
    /// plugin, then the sandbox/vGPU and cc-manager ones). `wait --for` accepts only these
    /// names: nothing else ever appears in the validations directory.
    pub const ALL: [StatusFile; 8] = [
        Self::Driver,
        Self::Toolkit,
        Self::Cuda,
        Self::Plugin,
        Self::VfioPci,
        Self::VgpuManager,
        Self::VgpuDevices,
        Self::CcManager,
    ];

    /// The file names of [`StatusFile::ALL`], in the same order.
    #[must_use]
    pub fn file_names() -> [&'static str; 8] {
        Self::ALL.map(Self::file_name)
    }

    /// The status file called `name` (e.g. `toolkit-ready`); `None` for any other name.
    #[must_use]
    pub fn from_file_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.file_name() == name)
    }

    /// The file name, e.g. `driver-ready`.
    #[must_use]
    pub fn file_name(self) -> &'static str {
        match self {
            Self::Driver => "driver-ready",
            Self::Toolkit => "toolkit-ready",
            Self::Cuda => "cuda-ready",
            Self::Plugin => "plugin-ready",
            Self::VfioPci => "vfio-pci-ready",
            Self::VgpuManager => "vgpu-manager-ready",
            Self::VgpuDevices => "vgpu-devices-ready",
            Self::CcManager => "cc-manager-ready",
        }
    }

    /// The files a step makes stale: its own and those of every later step in its chain
    /// (driver → toolkit → cuda → plugin; vfio-pci / vgpu-manager → vgpu-devices). Upstream
    /// deletes a step's file before validating it; removing the later ones too means a rerun
    /// chain never leaves a later file that predates an earlier one.
    #[must_use]
    pub fn stale_on_start(self) -> &'static [StatusFile] {
        use StatusFile::*;
        match self {
            Driver => &[Driver, Toolkit, Cuda, Plugin],
            Toolkit => &[Toolkit, Cuda, Plugin],
            Cuda => &[Cuda, Plugin],
            Plugin => &[Plugin],
            VgpuManager => &[VgpuManager, VgpuDevices],
            VfioPci => &[VfioPci],
            VgpuDevices => &[VgpuDevices],
            CcManager => &[CcManager],
        }
    }
}

/// Content of `driver-ready`: shell `KEY=value` lines that the toolkit and other operands
/// source (upstream's five keys, in upstream's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverReady {
    /// `IS_HOST_DRIVER`: the driver is installed on the host, not by the driver container.
    pub is_host_driver: bool,
    /// `NVIDIA_DRIVER_ROOT`: host path of the driver's root filesystem.
    pub driver_root: String,
    /// `DRIVER_ROOT_CTR_PATH`: the same, as mounted in operand pods (`/host` or
    /// `/run/nvidia/driver`).
    pub driver_root_ctr_path: String,
    /// `NVIDIA_DEV_ROOT`: host path above `/dev/nvidia*`.
    pub dev_root: String,
    /// `DEV_ROOT_CTR_PATH`: the same, as mounted in operand pods.
    pub dev_root_ctr_path: String,
}

impl DriverReady {
    /// The file content, one `KEY=value` per line, newline-terminated.
    #[must_use]
    pub fn render(&self) -> String {
        format!(
            "IS_HOST_DRIVER={}\nNVIDIA_DRIVER_ROOT={}\nDRIVER_ROOT_CTR_PATH={}\nNVIDIA_DEV_ROOT={}\nDEV_ROOT_CTR_PATH={}\n",
            self.is_host_driver,
            self.driver_root,
            self.driver_root_ctr_path,
            self.dev_root,
            self.dev_root_ctr_path
        )
    }
}

/// Writes `content` to `<validations_dir>/<file>` atomically (temp file + rename), creating
/// the directory.
///
/// # Errors
/// [`ValidatorError::StatusWrite`] naming the file.
pub fn write_status(
    layout: &Layout,
    file: StatusFile,
    content: &str,
) -> Result<(), ValidatorError> {
    let path = layout.status_file(file.file_name());
    let err = |source| ValidatorError::StatusWrite {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(&layout.validations_dir).map_err(err)?;
    let tmp = layout
        .validations_dir
        .join(format!(".{}.tmp", file.file_name()));
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    f.write_all(content.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(err)?;
    tracing::info!(file = %path.display(), "wrote status file");
    Ok(())
}

/// Removes the files `file` makes stale ([`StatusFile::stale_on_start`]); absent files are
/// fine.
///
/// # Errors
/// [`ValidatorError::StatusRemove`] when one exists but cannot be removed.
pub fn remove_stale(layout: &Layout, file: StatusFile) -> Result<(), ValidatorError> {
    for f in file.stale_on_start() {
        remove_file(&layout.status_file(f.file_name()))?;
    }
    Ok(())
}

/// Removes every `*-ready` file in the validations directory (what upstream's validator
/// pod does in its preStop hook: `rm -f /run/nvidia/validations/*-ready`). Returns the names
/// removed, sorted.
///
/// # Errors
/// [`ValidatorError::StatusRemove`] when the directory cannot be listed or a file removed.
pub fn clear_ready_files(layout: &Layout) -> Result<Vec<String>, ValidatorError> {
    let dir = &layout.validations_dir;
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ValidatorError::StatusRemove {
                path: dir.clone(),
                source,
            });
        }
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with("-ready") {
            remove_file(&entry.path())?;
            removed.push(name);
        }
    }
    removed.sort();
    Ok(removed)
}

fn remove_file(path: &Path) -> Result<(), ValidatorError> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            tracing::info!(file = %path.display(), "removed stale status file");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(ValidatorError::StatusRemove {
            path: path.to_owned(),
            source,
        }),
    }
}
