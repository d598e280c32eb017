//! Checks of the sandbox (VM passthrough / vGPU) chain, read from sysfs under the root.

use std::path::{Path, PathBuf};

use crate::{Layout, NotReady, layout::under};

/// An NVIDIA display-class PCI function (`vendor` 0x10de, `class` 0x03xxxx) under
/// `<root>/sys/bus/pci/devices`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciGpu {
    /// The PCI address, e.g. `0000:3b:00.0`.
    pub address: String,
    /// The bound driver's name (`vfio-pci`, `nvidia`), `None` when unbound.
    pub driver: Option<String>,
    /// The directory in sysfs.
    pub path: PathBuf,
}

/// The NVIDIA GPUs on the PCI bus, sorted by address.
#[must_use]
pub fn nvidia_pci_gpus(layout: &Layout) -> Vec<PciGpu> {
    let dir = under(&layout.root, "sys/bus/pci/devices");
    let mut out: Vec<PciGpu> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            let vendor = read_trimmed(&path.join("vendor"))?;
            let class = read_trimmed(&path.join("class"))?;
            (vendor == "0x10de" && class.starts_with("0x03")).then(|| PciGpu {
                address: e.file_name().to_string_lossy().into_owned(),
                driver: std::fs::read_link(path.join("driver"))
                    .ok()
                    .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned())),
                path,
            })
        })
        .collect();
    out.sort_by(|a, b| a.address.cmp(&b.address));
    out
}

fn read_trimmed(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned())
}

/// vfio-pci: every NVIDIA GPU is bound to `vfio-pci` (what vfio-manager sets up). Returns the
/// addresses.
///
/// # Errors
/// [`NotReady::Sysfs`] naming the first GPU bound elsewhere, or saying none was found.
pub fn check_vfio_pci(layout: &Layout) -> Result<Vec<String>, NotReady> {
    let gpus = nvidia_pci_gpus(layout);
    if gpus.is_empty() {
        return Err(NotReady::Sysfs(format!(
            "no NVIDIA GPU under {}",
            under(&layout.root, "sys/bus/pci/devices").display()
        )));
    }
    if let Some(g) = gpus
        .iter()
        .find(|g| g.driver.as_deref() != Some("vfio-pci"))
    {
        return Err(NotReady::Sysfs(format!(
            "GPU {} is bound to {} instead of vfio-pci",
            g.address,
            g.driver.as_deref().unwrap_or("no driver")
        )));
    }
    Ok(gpus.into_iter().map(|g| g.address).collect())
}

/// vgpu-devices: at least one vGPU device exists — an mdev under
/// `<root>/sys/bus/mdev/devices`, or an NVIDIA function whose `nvidia/current_vgpu_type` is
/// not `0` (SR-IOV vGPU on Ampere and newer). Returns how many.
///
/// # Errors
/// [`NotReady::Sysfs`] when there are none.
pub fn check_vgpu_devices(layout: &Layout) -> Result<usize, NotReady> {
    let mdev_dir = under(&layout.root, "sys/bus/mdev/devices");
    let mdevs = std::fs::read_dir(&mdev_dir)
        .map(|d| d.flatten().count())
        .unwrap_or(0);
    let sriov = nvidia_pci_gpus(layout)
        .iter()
        .filter(|g| {
            read_trimmed(&g.path.join("nvidia/current_vgpu_type")).is_some_and(|t| t != "0")
        })
        .count();
    match mdevs + sriov {
        0 => Err(NotReady::Sysfs(format!(
            "no vGPU devices: {} is empty and no NVIDIA function has a vGPU type set",
            mdev_dir.display()
        ))),
        n => Ok(n),
    }
}
