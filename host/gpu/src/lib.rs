//! `kiln-gpu`: the GPU seam shared by kiln's node agents (exporter, device plugin, GFD).
//!
//! ```text
//!   agent ──► Arc<dyn GpuInventory> ──► NvmlBackend  (libnvidia-ml.so.1, loaded at run time)
//!                                  └──► FakeBackend  (a YAML/JSON fixture file)
//! ```
//!
//! [`open`] picks the backend from a [`BackendSpec`] (`nvml` or `fake:<path>`), which every agent
//! takes as a flag, so each runs and is tested on a machine without a GPU. NVML is opened with
//! `dlopen`, so binaries build and start without NVIDIA bits and fail only in [`open`], with
//! [`GpuError::NvmlInit`].

mod error;
mod fake;
pub mod fixtures;
mod model;
mod nvml;
pub mod vgpu;

use std::{path::PathBuf, str::FromStr, sync::Arc};

pub use error::{GpuError, error_chain};
pub use fake::{FakeBackend, Fixture, FixtureGpu, MAX_FIXTURE_GPUS, MAX_MEMORY_MIB};
pub use model::{
    Clique, DeviceInfo, DeviceSample, GpuDevice, GpuProcess, MigAttributes, MigDevice,
    MigProcesses, MigSample, NvLinkPeer, SystemInfo, VgpuGuest, XidEvent,
};
pub use nvml::NvmlBackend;

/// Read-only access to the node's GPUs. Implementations are cheap to call from a poller thread
/// and never block for long (NVML calls take micro- to milliseconds).
pub trait GpuInventory: Send + Sync {
    /// Driver, CUDA and NVML versions. Called again on every poll so a driver upgrade shows.
    ///
    /// # Errors
    /// [`GpuError::NvmlCall`] when NVML cannot answer.
    fn system(&self) -> Result<SystemInfo, GpuError>;

    /// Every GPU in NVML index order, with its MIG devices.
    ///
    /// # Errors
    /// [`GpuError::NvmlCall`] or [`GpuError::GpuLost`] when a GPU cannot be identified.
    fn devices(&self) -> Result<Vec<GpuDevice>, GpuError>;

    /// Current counters of GPU `index`; unsupported readings are `None`.
    ///
    /// # Errors
    /// [`GpuError::NoSuchDevice`], [`GpuError::GpuLost`], or [`GpuError::NvmlCall`] for
    /// failures other than "not supported".
    fn sample(&self, index: u32) -> Result<DeviceSample, GpuError>;

    /// Counters of each MIG device of GPU `index`, in [`GpuDevice::mig_devices`] order; empty
    /// when MIG is off. Readings NVML has no per-MIG-device answer for are `None`. The default
    /// answers no MIG devices (a backend without MIG support).
    ///
    /// # Errors
    /// As [`GpuInventory::sample`].
    fn mig_samples(&self, index: u32) -> Result<Vec<MigSample>, GpuError> {
        let _ = index;
        Ok(Vec::new())
    }

    /// Compute processes on GPU `index`, with memory and SM utilisation where available.
    ///
    /// # Errors
    /// As [`GpuInventory::sample`].
    fn processes(&self, index: u32) -> Result<Vec<GpuProcess>, GpuError>;

    /// Compute processes of each MIG device of GPU `index`, in [`GpuDevice::mig_devices`]
    /// order (empty slots skipped); empty when MIG is off. A MIG device whose list NVML cannot
    /// give has an empty list, as dcgm-exporter's `GetAllMIGDevicesProcessMemory` skips it. The
    /// default answers no MIG devices (a backend without MIG support).
    ///
    /// # Errors
    /// As [`GpuInventory::sample`], when the GPU's MIG devices cannot be listed at all.
    fn mig_processes(&self, index: u32) -> Result<Vec<MigProcesses>, GpuError> {
        let _ = index;
        Ok(Vec::new())
    }

    /// XID errors seen since the previous call, oldest first (drains them).
    fn drain_xid_events(&self) -> Vec<XidEvent>;
}

/// Which backend to open: `nvml`, or `fake:<fixture path>` (parsed with [`FromStr`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSpec {
    /// The real driver through `libnvidia-ml.so.1`.
    Nvml,
    /// [`FakeBackend`] over the fixture file at this path.
    Fake(PathBuf),
}

impl FromStr for BackendSpec {
    type Err = GpuError;

    fn from_str(s: &str) -> Result<Self, GpuError> {
        match s {
            "nvml" => Ok(Self::Nvml),
            _ => match s.strip_prefix("fake:") {
                Some(path) if !path.is_empty() => Ok(Self::Fake(PathBuf::from(path))),
                _ => Err(GpuError::BadBackendSpec(s.to_owned())),
            },
        }
    }
}

impl std::fmt::Display for BackendSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Nvml => f.write_str("nvml"),
            Self::Fake(p) => write!(f, "fake:{}", p.display()),
        }
    }
}

/// Opens the backend named by `spec`.
///
/// # Errors
/// [`GpuError::NvmlInit`] where NVML cannot load; [`GpuError::FixtureRead`] /
/// [`GpuError::FixtureParse`] for a bad fixture.
pub fn open(spec: &BackendSpec) -> Result<Arc<dyn GpuInventory>, GpuError> {
    Ok(match spec {
        BackendSpec::Nvml => Arc::new(NvmlBackend::init()?),
        BackendSpec::Fake(path) => Arc::new(FakeBackend::from_file(path)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_spec_parses_both_forms_and_rejects_others() {
        assert_eq!("nvml".parse::<BackendSpec>().unwrap(), BackendSpec::Nvml);
        assert_eq!(
            "fake:/tmp/gpus.yaml".parse::<BackendSpec>().unwrap(),
            BackendSpec::Fake("/tmp/gpus.yaml".into())
        );
        assert_eq!(
            BackendSpec::Fake("a.yaml".into()).to_string(),
            "fake:a.yaml"
        );
        for bad in ["", "fake:", "dcgm", "NVML"] {
            assert!(
                matches!(bad.parse::<BackendSpec>(), Err(GpuError::BadBackendSpec(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn opening_nvml_without_a_driver_is_a_typed_init_error() {
        // This machine has no NVIDIA driver; on a GPU machine the open succeeds instead.
        match open(&BackendSpec::Nvml) {
            Err(e @ GpuError::NvmlInit(_)) => {
                // nvml-wrapper's message embeds its cause, which is also its source: the
                // chain prints the `cannot open` text once.
                let chain = crate::error_chain(&e);
                let tail = chain.rsplit(": ").next().unwrap_or_default();
                assert_eq!(chain.matches(tail).count(), 1, "{chain}");
            }
            Err(other) => panic!("expected NvmlInit, got {other}"),
            Ok(inv) => assert!(inv.devices().is_ok()),
        }
    }
}
