//! The checks of the toolkit, cuda and plugin steps (one attempt each; retried by
//! [`crate::RetryPolicy`]).

use std::sync::Arc;

use kiln_gpu::GpuInventory;

use crate::{Layout, NodeSource, NotReady};

/// What the toolkit and cuda checks found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuReport {
    /// CUDA version the driver supports (`12.4`).
    pub cuda_version: String,
    /// `(uuid, name)` per GPU, index order.
    pub gpus: Vec<(String, String)>,
}

/// What the cuda step found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaReport {
    /// The prerequisites NVML reports ([`check_cuda`]).
    pub gpu: GpuReport,
    /// The devices a CUDA context was created on, with memory allocated, written and read
    /// back ([`crate::check_cuda_memory`]), in CUDA's order; empty with `WITH_WORKLOAD=false`.
    pub devices: Vec<crate::CudaDevice>,
}

/// Toolkit: the NVIDIA container runtime has set this container up, as upstream checks by
/// running `nvidia-smi` in a pod with `NVIDIA_VISIBLE_DEVICES=all`: `/dev/nvidiactl`,
/// `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools` (CUDA cannot start without them,
/// gpu-operator #2685) are present and the injected NVML opens and lists a GPU.
///
/// # Errors
/// [`NotReady::MissingDeviceNode`], [`NotReady::Nvml`] or [`NotReady::NoGpus`].
pub fn check_toolkit(
    layout: &Layout,
    gpu: &dyn Fn() -> Result<Arc<dyn GpuInventory>, kiln_gpu::GpuError>,
) -> Result<GpuReport, NotReady> {
    let uvm = crate::uvm::UVM_NODES
        .iter()
        .map(|(name, _)| crate::layout::under(&layout.root, &format!("dev/{name}")));
    for node in std::iter::once(layout.nvidiactl()).chain(uvm) {
        if node.symlink_metadata().is_err() {
            return Err(NotReady::MissingDeviceNode { path: node });
        }
    }
    report(&*gpu().map_err(NotReady::Nvml)?)
}

/// Cuda's prerequisites, read through the GPU seam: the driver reports a CUDA version
/// (`nvmlSystemGetCudaDriverVersion`), every GPU has a compute capability, and a GPU in MIG
/// mode has MIG devices (CUDA sees none otherwise). They name a missing piece more plainly
/// than a CUDA error would; the step then uses CUDA itself ([`crate::check_cuda_memory`]).
///
/// # Errors
/// [`NotReady::Nvml`], [`NotReady::NoGpus`] or [`NotReady::Cuda`] naming the GPU.
pub fn check_cuda(
    gpu: &dyn Fn() -> Result<Arc<dyn GpuInventory>, kiln_gpu::GpuError>,
) -> Result<GpuReport, NotReady> {
    let gpu = gpu().map_err(NotReady::Nvml)?;
    let rep = report(&*gpu)?;
    let major = rep
        .cuda_version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(0);
    if major == 0 {
        return Err(NotReady::Cuda(format!(
            "the driver reports no CUDA version ({:?})",
            rep.cuda_version
        )));
    }
    for d in gpu.devices().map_err(NotReady::Nvml)? {
        if d.compute_capability.0 == 0 {
            return Err(NotReady::Cuda(format!(
                "GPU {} ({}) reports no compute capability",
                d.index, d.uuid
            )));
        }
        if d.mig_enabled == Some(true) && d.mig_devices.is_empty() {
            return Err(NotReady::Cuda(format!(
                "GPU {} ({}) is in MIG mode but has no MIG devices",
                d.index, d.uuid
            )));
        }
    }
    Ok(rep)
}

fn report(gpu: &dyn GpuInventory) -> Result<GpuReport, NotReady> {
    let system = gpu.system().map_err(NotReady::Nvml)?;
    let gpus: Vec<(String, String)> = gpu
        .devices()
        .map_err(NotReady::Nvml)?
        .into_iter()
        .map(|d| (d.uuid, d.name))
        .collect();
    if gpus.is_empty() {
        return Err(NotReady::NoGpus);
    }
    Ok(GpuReport {
        cuda_version: system.cuda_version,
        gpus,
    })
}

/// Which GPU resources the plugin step expects, from the plugin's `MIG_STRATEGY`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ExpectedResource {
    /// `nvidia.com/gpu` (or its time-sliced rename `nvidia.com/gpu.shared`): strategies
    /// `none` and `single`.
    #[default]
    Gpu,
    /// Any `nvidia.com/mig-*` (strategy `mixed`).
    MigMixed,
}

impl ExpectedResource {
    /// From the `MIG_STRATEGY` value (`none`, `single`, `mixed`); other values are `Gpu`.
    #[must_use]
    pub fn from_mig_strategy(s: &str) -> Self {
        if s == "mixed" {
            Self::MigMixed
        } else {
            Self::Gpu
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Gpu => "nvidia.com/gpu",
            Self::MigMixed => "nvidia.com/mig-*",
        }
    }

    fn matches(self, name: &str) -> bool {
        match self {
            Self::Gpu => name == "nvidia.com/gpu" || name == "nvidia.com/gpu.shared",
            Self::MigMixed => name.starts_with("nvidia.com/mig-"),
        }
    }
}

/// Plugin: the node advertises the expected GPU resource with allocatable > 0 (upstream
/// waits for this, then runs a pod requesting one GPU). Returns the units advertised.
///
/// # Errors
/// [`NotReady::Kube`] when the node cannot be read, [`NotReady::NoAllocatable`] listing the
/// `nvidia.com/*` entries seen.
pub fn check_plugin(
    nodes: &dyn NodeSource,
    node: &str,
    expected: ExpectedResource,
) -> Result<u64, NotReady> {
    let alloc = nodes.allocatable(node).map_err(|message| NotReady::Kube {
        node: node.to_owned(),
        message,
    })?;
    let units: u64 = alloc
        .iter()
        .filter(|(k, _)| expected.matches(k))
        .map(|(_, v)| v.trim().parse::<u64>().unwrap_or(0))
        .sum();
    if units > 0 {
        return Ok(units);
    }
    let have: Vec<String> = alloc
        .iter()
        .filter(|(k, _)| k.starts_with("nvidia.com/"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    Err(NotReady::NoAllocatable {
        node: node.to_owned(),
        wanted: expected.describe().to_owned(),
        have: if have.is_empty() {
            "none".into()
        } else {
            have.join(", ")
        },
    })
}

/// The label the confidential-computing manager sets once it has applied the node's CC mode.
pub const CC_READY_LABEL: &str = "nvidia.com/cc.ready.state";

/// cc-manager: the node carries [`CC_READY_LABEL`] with a non-empty value (kiln's rule: the
/// manager sets it after applying the mode). Returns the value.
///
/// # Errors
/// [`NotReady::Kube`], or [`NotReady::Sysfs`]-style reason naming the missing label.
pub fn check_cc_manager(nodes: &dyn NodeSource, node: &str) -> Result<String, NotReady> {
    let labels = nodes.labels(node).map_err(|message| NotReady::Kube {
        node: node.to_owned(),
        message,
    })?;
    match labels.get(CC_READY_LABEL) {
        Some(v) if !v.is_empty() => Ok(v.clone()),
        _ => Err(NotReady::Sysfs(format!(
            "node {node} has no {CC_READY_LABEL} label yet (set by the cc-manager)"
        ))),
    }
}
