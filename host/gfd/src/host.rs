//! Facts GFD reads from the host's files: the machine type and each GPU's PCI class.

use std::path::Path;

use kiln_gpu::GpuDevice;

use crate::GpuMode;

/// The most bytes read from a host fact file (machine type, PCI class): 4 KiB, a sysfs page.
const MAX_FACT_BYTES: u64 = 4096;

/// The machine-type file's content, `None` when unreadable, not a regular file or over 4 KiB
/// (the label is then `unknown`).
#[must_use]
pub fn read_machine(path: &Path) -> Option<String> {
    kiln_input::read_bounded(path, MAX_FACT_BYTES).ok()
}

/// `gpu.mode` of each GPU from `<sys>/bus/pci/devices/<addr>/class` (0x0302xx compute,
/// 0x0300xx graphics). NVML's bus id `00000000:8D:00.0` is sysfs's `0000:8d:00.0`.
#[must_use]
pub fn read_pci_modes(sys: &Path, gpus: &[GpuDevice]) -> Vec<GpuMode> {
    gpus.iter()
        .map(|g| {
            let id = g.pci_bus_id.to_ascii_lowercase();
            let addr = id
                .strip_prefix("0000")
                .filter(|a| a.len() == 12)
                .unwrap_or(&id);
            let class = kiln_input::read_bounded(
                &sys.join("bus/pci/devices").join(addr).join("class"),
                MAX_FACT_BYTES,
            );
            match class.as_deref().map(str::trim) {
                Ok(c) if c.starts_with("0x0302") => GpuMode::Compute,
                Ok(c) if c.starts_with("0x0300") => GpuMode::Graphics,
                _ => GpuMode::Unknown,
            }
        })
        .collect()
}
