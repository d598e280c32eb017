//! [`NvmlBackend`]: the real driver through nvml-wrapper 0.13 (`libnvidia-ml.so.1`, opened at
//! run time). Readings NVML calls "not supported" become `None`; XID events are collected by a
//! background thread waiting on an NVML event set.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use nvml_wrapper::{
    Device, Nvml,
    bitmasks::event::EventTypes,
    enum_wrappers::device::{Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor},
    enums::event::XidError,
    error::NvmlError,
    struct_wrappers::device::ProcessInfo,
};

use crate::{
    DeviceSample, GpuDevice, GpuError, GpuInventory, GpuProcess, MigDevice, MigSample, SystemInfo,
    XidEvent,
};

const SYSTEM: u32 = u32::MAX;

/// NVML-backed [`GpuInventory`]. Dropping it stops the XID thread.
pub struct NvmlBackend {
    nvml: Arc<Nvml>,
    xids: Arc<Mutex<Vec<XidEvent>>>,
    stop: Arc<AtomicBool>,
    xid_thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend").finish_non_exhaustive()
    }
}

impl NvmlBackend {
    /// Loads `libnvidia-ml.so.1`, initialises NVML and starts the XID event thread.
    ///
    /// # Errors
    /// [`GpuError::NvmlInit`] when the library is missing (`LibloadingError`), the driver is not
    /// loaded, or a required symbol is absent.
    pub fn init() -> Result<Self, GpuError> {
        let nvml = Arc::new(Nvml::init().map_err(GpuError::NvmlInit)?);
        let xids = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (nvml, xids, stop) = (nvml.clone(), xids.clone(), stop.clone());
            std::thread::Builder::new()
                .name("kiln-nvml-xid".into())
                .spawn(move || watch_xids(&nvml, &xids, &stop))
                .ok()
        };
        Ok(Self {
            nvml,
            xids,
            stop,
            xid_thread: thread,
        })
    }

    fn device(&self, index: u32) -> Result<Device<'_>, GpuError> {
        self.nvml.device_by_index(index).map_err(|e| match e {
            NvmlError::InvalidArg | NvmlError::NotFound => GpuError::NoSuchDevice(index),
            other => call_error("nvmlDeviceGetHandleByIndex", index, other),
        })
    }
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.xid_thread.take() {
            let _ = t.join();
        }
    }
}

fn call_error(call: &'static str, index: u32, source: NvmlError) -> GpuError {
    match source {
        NvmlError::GpuLost | NvmlError::ResetRequired => GpuError::GpuLost { index },
        source => GpuError::NvmlCall {
            call,
            index,
            source,
        },
    }
}

/// `Ok(None)` for answers that mean "this GPU/driver does not have it".
fn optional<T>(
    call: &'static str,
    index: u32,
    r: Result<T, NvmlError>,
) -> Result<Option<T>, GpuError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(
            NvmlError::NotSupported
            | NvmlError::NoPermission
            | NvmlError::NotFound
            | NvmlError::NoData
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_),
        ) => Ok(None),
        Err(e) => Err(call_error(call, index, e)),
    }
}

impl GpuInventory for NvmlBackend {
    fn system(&self) -> Result<SystemInfo, GpuError> {
        let n = &self.nvml;
        let driver_version = n
            .sys_driver_version()
            .map_err(|e| call_error("nvmlSystemGetDriverVersion", SYSTEM, e))?;
        let cuda = n
            .sys_cuda_driver_version()
            .map_err(|e| call_error("nvmlSystemGetCudaDriverVersion", SYSTEM, e))?;
        let cuda_version = format!(
            "{}.{}",
            nvml_wrapper::cuda_driver_version_major(cuda),
            nvml_wrapper::cuda_driver_version_minor(cuda)
        );
        let nvml_version = n
            .sys_nvml_version()
            .map_err(|e| call_error("nvmlSystemGetNVMLVersion", SYSTEM, e))?;
        Ok(SystemInfo {
            driver_version,
            cuda_version,
            nvml_version,
        })
    }

    fn devices(&self) -> Result<Vec<GpuDevice>, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| call_error("nvmlDeviceGetCount", SYSTEM, e))?;
        (0..count).map(|i| identify(&self.device(i)?, i)).collect()
    }

    fn sample(&self, index: u32) -> Result<DeviceSample, GpuError> {
        read_sample(&self.device(index)?, index)
    }

    fn mig_samples(&self, index: u32) -> Result<Vec<MigSample>, GpuError> {
        let d = self.device(index)?;
        let on =
            optional("nvmlDeviceGetMigMode", index, d.mig_mode())?.is_some_and(|m| m.current == 1);
        if on {
            read_mig_samples(&d, index)
        } else {
            Ok(Vec::new())
        }
    }

    fn processes(&self, index: u32) -> Result<Vec<GpuProcess>, GpuError> {
        let d = self.device(index)?;
        let procs = optional(
            "nvmlDeviceGetComputeRunningProcesses",
            index,
            d.running_compute_processes(),
        )?
        .unwrap_or_default();
        let utils = optional(
            "nvmlDeviceGetProcessUtilization",
            index,
            d.process_utilization_stats(None),
        )?
        .unwrap_or_default();
        Ok(procs
            .iter()
            .map(|p: &ProcessInfo| GpuProcess {
                pid: p.pid,
                used_memory_bytes: match p.used_gpu_memory {
                    nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                    nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                },
                // The newest sample per pid wins.
                sm_util_pct: utils
                    .iter()
                    .filter(|u| u.pid == p.pid)
                    .max_by_key(|u| u.timestamp)
                    .map(|u| u.sm_util),
            })
            .collect())
    }

    fn drain_xid_events(&self) -> Vec<XidEvent> {
        std::mem::take(
            &mut *self
                .xids
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

fn identify(d: &Device<'_>, index: u32) -> Result<GpuDevice, GpuError> {
    let uuid = d
        .uuid()
        .map_err(|e| call_error("nvmlDeviceGetUUID", index, e))?;
    let name = d
        .name()
        .map_err(|e| call_error("nvmlDeviceGetName", index, e))?;
    let pci_bus_id = optional("nvmlDeviceGetPciInfo", index, d.pci_info())?
        .map(|p| p.bus_id)
        .unwrap_or_default();
    let memory_total_bytes =
        optional("nvmlDeviceGetMemoryInfo", index, d.memory_info())?.map_or(0, |m| m.total);
    let cc = optional(
        "nvmlDeviceGetCudaComputeCapability",
        index,
        d.cuda_compute_capability(),
    )?;
    let compute_capability = cc.map_or((0, 0), |c| (c.major.max(0) as u32, c.minor.max(0) as u32));
    let mig_enabled =
        optional("nvmlDeviceGetMigMode", index, d.mig_mode())?.map(|m| m.current == 1);
    let mut mig_devices = Vec::new();
    if mig_enabled == Some(true) {
        let n = optional(
            "nvmlDeviceGetMaxMigDeviceCount",
            index,
            d.mig_device_count(),
        )?
        .unwrap_or(0);
        for i in 0..n {
            // Empty slots answer NotFound / InvalidArg; skip them.
            let Ok(m) = d.mig_device_by_index(i) else {
                continue;
            };
            if let Ok(uuid) = m.uuid() {
                mig_devices.push(MigDevice {
                    uuid,
                    gpu_instance_id: None,
                    compute_instance_id: None,
                    profile: m.name().ok().as_deref().and_then(mig_profile),
                });
            }
        }
    }
    Ok(GpuDevice {
        index,
        uuid,
        name,
        pci_bus_id,
        memory_total_bytes,
        compute_capability,
        mig_enabled,
        mig_devices,
    })
}

/// The profile in a MIG device's name: `NVIDIA A100-SXM4-40GB MIG 1g.5gb` → `1g.5gb`.
fn mig_profile(name: &str) -> Option<String> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    let profile = profile.trim();
    (!profile.is_empty()).then(|| profile.to_owned())
}

/// Framebuffer readings of each MIG device of `d` (empty slots skipped, as in `identify`).
fn read_mig_samples(d: &Device<'_>, index: u32) -> Result<Vec<MigSample>, GpuError> {
    let n = optional(
        "nvmlDeviceGetMaxMigDeviceCount",
        index,
        d.mig_device_count(),
    )?
    .unwrap_or(0);
    let mut out = Vec::new();
    for i in 0..n {
        let Ok(m) = d.mig_device_by_index(i) else {
            continue;
        };
        let Ok(uuid) = m.uuid() else { continue };
        let mem = optional("nvmlDeviceGetMemoryInfo", index, m.memory_info())?;
        out.push(MigSample {
            uuid,
            sample: DeviceSample {
                fb_free_bytes: mem.as_ref().map(|m| m.free),
                fb_used_bytes: mem.as_ref().map(|m| m.used),
                fb_reserved_bytes: mem.as_ref().map(|m| m.reserved),
                fb_total_bytes: mem.as_ref().map(|m| m.total),
                ..DeviceSample::default()
            },
        });
    }
    Ok(out)
}

fn read_sample(d: &Device<'_>, i: u32) -> Result<DeviceSample, GpuError> {
    let mem = optional("nvmlDeviceGetMemoryInfo", i, d.memory_info())?;
    let util = optional("nvmlDeviceGetUtilizationRates", i, d.utilization_rates())?;
    let ecc = |kind, counter| {
        optional(
            "nvmlDeviceGetTotalEccErrors",
            i,
            d.total_ecc_errors(kind, counter),
        )
    };
    Ok(DeviceSample {
        sm_clock_mhz: optional("nvmlDeviceGetClockInfo", i, d.clock_info(Clock::SM))?,
        mem_clock_mhz: optional("nvmlDeviceGetClockInfo", i, d.clock_info(Clock::Memory))?,
        gpu_temp_c: optional(
            "nvmlDeviceGetTemperature",
            i,
            d.temperature(TemperatureSensor::Gpu),
        )?,
        power_usage_mw: optional("nvmlDeviceGetPowerUsage", i, d.power_usage())?,
        total_energy_mj: optional(
            "nvmlDeviceGetTotalEnergyConsumption",
            i,
            d.total_energy_consumption(),
        )?,
        pcie_replay_count: optional("nvmlDeviceGetPcieReplayCounter", i, d.pcie_replay_counter())?,
        gpu_util_pct: util.as_ref().map(|u| u.gpu),
        mem_copy_util_pct: util.as_ref().map(|u| u.memory),
        enc_util_pct: optional(
            "nvmlDeviceGetEncoderUtilization",
            i,
            d.encoder_utilization(),
        )?
        .map(|u| u.utilization),
        dec_util_pct: optional(
            "nvmlDeviceGetDecoderUtilization",
            i,
            d.decoder_utilization(),
        )?
        .map(|u| u.utilization),
        fb_free_bytes: mem.as_ref().map(|m| m.free),
        fb_used_bytes: mem.as_ref().map(|m| m.used),
        fb_reserved_bytes: mem.as_ref().map(|m| m.reserved),
        fb_total_bytes: mem.as_ref().map(|m| m.total),
        pcie_tx_kib_per_s: optional(
            "nvmlDeviceGetPcieThroughput",
            i,
            d.pcie_throughput(PcieUtilCounter::Send),
        )?,
        pcie_rx_kib_per_s: optional(
            "nvmlDeviceGetPcieThroughput",
            i,
            d.pcie_throughput(PcieUtilCounter::Receive),
        )?,
        ecc_sbe_volatile: ecc(MemoryError::Corrected, EccCounter::Volatile)?,
        ecc_dbe_volatile: ecc(MemoryError::Uncorrected, EccCounter::Volatile)?,
        ecc_sbe_aggregate: ecc(MemoryError::Corrected, EccCounter::Aggregate)?,
        ecc_dbe_aggregate: ecc(MemoryError::Uncorrected, EccCounter::Aggregate)?,
    })
}

/// Registers every GPU for critical-XID events and queues what arrives until `stop` is set.
/// GPUs that cannot deliver events (older boards, vGPU guests) are skipped silently.
fn watch_xids(nvml: &Nvml, xids: &Mutex<Vec<XidEvent>>, stop: &AtomicBool) {
    let Ok(mut set) = nvml.create_event_set() else {
        return;
    };
    let count = nvml.device_count().unwrap_or(0);
    let mut registered = 0;
    for i in 0..count {
        let Ok(d) = nvml.device_by_index(i) else {
            continue;
        };
        let supported = d.supported_event_types().unwrap_or(EventTypes::empty());
        if !supported.contains(EventTypes::CRITICAL_XID_ERROR) {
            tracing::info!(gpu = i, "XID events unavailable on this GPU");
            continue;
        }
        // `register_events` consumes the set and drops it on failure, losing earlier
        // registrations, so stop there and watch what was registered so far.
        match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                set = s;
                registered += 1;
            }
            Err(e) => {
                tracing::warn!(gpu = i, error = %e.error, "XID registration failed; XIDs not collected");
                return;
            }
        }
    }
    if registered == 0 {
        return;
    }
    while !stop.load(Ordering::Relaxed) {
        match set.wait(1000) {
            Ok(ev) => {
                let Some(XidError::Value(xid)) = ev.event_data else {
                    continue;
                };
                let index = ev.device.index().unwrap_or(u32::MAX);
                xids.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(XidEvent { index, xid });
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::warn!(error = %e, "NVML event wait failed; XID collection stopped");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn mig_profile_comes_from_the_mig_device_name() {
        assert_eq!(
            super::mig_profile("NVIDIA A100-SXM4-40GB MIG 1g.5gb").as_deref(),
            Some("1g.5gb")
        );
        assert_eq!(
            super::mig_profile("NVIDIA H100 80GB HBM3 MIG 3g.40gb+me").as_deref(),
            Some("3g.40gb+me")
        );
        assert_eq!(super::mig_profile("NVIDIA H100 80GB HBM3"), None);
        assert_eq!(super::mig_profile("X MIG "), None);
    }
}
