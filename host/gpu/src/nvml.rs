//! [`NvmlBackend`]: the real driver through nvml-wrapper 0.13 (`libnvidia-ml.so.1`, opened at
//! run time). Readings NVML calls "not supported" become `None`; XID events are collected by a
//! background thread waiting on an NVML event set.
//!
//! Besides the per-reading calls, one `sample()` makes one batched `nvmlDeviceGetFieldValues`
//! call (memory temperature, NVLink counters, row remapping) and, on GPUs with GPU Performance
//! Monitoring (Hopper and newer), one `nvmlGpmSampleGet`: the DCGM profiling ratios are computed
//! between this sample and the previous poll's, so they cover one collect interval and are
//! `None` on the first poll.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use nvml_wrapper::{
    Device, GpmSample, Nvml,
    bitmasks::event::EventTypes,
    enum_wrappers::device::{
        Brand, Clock, EccCounter, GpuVirtualizationMode, InfoRom, MemoryError, PcieUtilCounter,
        PerformancePolicy, RetirementCause, TemperatureSensor,
    },
    enums::{device::SampleValue, event::XidError, gpm::GpmMetricId},
    error::NvmlError,
    struct_wrappers::device::ProcessInfo,
    structs::device::FieldId,
    sys_exports::field_id as fid,
};

use crate::{
    DeviceInfo, DeviceSample, GpuDevice, GpuError, GpuInventory, GpuProcess, MigAttributes,
    MigDevice, MigProcesses, MigSample, NvLinkPeer, SystemInfo, VgpuGuest, XidEvent,
};

const SYSTEM: u32 = u32::MAX;

/// The most NVLinks a GPU has (NVML's `NVML_NVLINK_MAX_LINKS`).
const MAX_NVLINKS: u32 = 18;

/// NVML-backed [`GpuInventory`]. Dropping it stops the XID thread.
///
/// NVML itself is initialised once and kept for the life of the process (the agents open one
/// backend at start-up): GPM samples borrow it, and the previous poll's sample of each GPU is
/// kept here for the next poll's ratios.
pub struct NvmlBackend {
    nvml: &'static Nvml,
    /// GPU index → its previous GPM sample.
    gpm: Mutex<BTreeMap<u32, GpmSample<'static>>>,
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
        let nvml: &'static Nvml = Box::leak(Box::new(Nvml::init().map_err(GpuError::NvmlInit)?));
        let xids = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (xids, stop) = (xids.clone(), stop.clone());
            std::thread::Builder::new()
                .name("kiln-nvml-xid".into())
                .spawn(move || watch_xids(nvml, &xids, &stop))
                .ok()
        };
        Ok(Self {
            nvml,
            gpm: Mutex::new(BTreeMap::new()),
            xids,
            stop,
            xid_thread: thread,
        })
    }

    fn device(&self, index: u32) -> Result<Device<'static>, GpuError> {
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
        let mut gpus = (0..count)
            .map(|i| identify(&self.device(i)?, i))
            .collect::<Result<Vec<_>, _>>()?;
        // NVLink neighbours, by the PCI bus id at each active link's far end.
        let bus_ids: Vec<String> = gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
        for g in &mut gpus {
            g.nvlinks = nvlink_peers(&self.device(g.index)?, &bus_ids);
        }
        Ok(gpus)
    }

    fn sample(&self, index: u32) -> Result<DeviceSample, GpuError> {
        let d = self.device(index)?;
        let mut s = read_sample(&d, index)?;
        read_gpm(self.nvml, &d, index, &self.gpm, &mut s);
        Ok(s)
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

    fn mig_processes(&self, index: u32) -> Result<Vec<MigProcesses>, GpuError> {
        let d = self.device(index)?;
        let on =
            optional("nvmlDeviceGetMigMode", index, d.mig_mode())?.is_some_and(|m| m.current == 1);
        if on {
            read_mig_processes(&d, index)
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
                used_memory_bytes: used_memory(p),
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
                    attributes: m.attributes().ok().map(|a| MigAttributes {
                        multiprocessors: a.multiprocessor_count,
                        copy_engines: a.shared_copy_engine_count,
                        decoders: a.shared_decoder_count,
                        encoders: a.shared_encoder_count,
                        jpeg_engines: a.shared_jpeg_count,
                        ofa_engines: a.shared_ofa_count,
                    }),
                });
            }
        }
    }
    let text = |r: Result<String, NvmlError>| r.ok().filter(|s| !s.is_empty());
    let info = DeviceInfo {
        brand: d.brand().ok().map(|b| brand_name(&b).to_owned()),
        serial: text(d.serial()),
        vbios_version: text(d.vbios_version()),
        inforom_image_version: text(d.info_rom_image_version()),
        inforom_oem_version: text(d.info_rom_version(InfoRom::OEM)),
        inforom_ecc_version: text(d.info_rom_version(InfoRom::ECC)),
        inforom_power_version: text(d.info_rom_version(InfoRom::Power)),
    };
    // A vGPU guest: the host driver from the PCI capability, as NVIDIA's GFD reads it (needs
    // the whole configuration space, i.e. a privileged container), else NVML's mode alone.
    let config = std::fs::read(format!(
        "/sys/bus/pci/devices/{}/config",
        crate::vgpu::sysfs_address(&pci_bus_id)
    ));
    let vgpu = config
        .ok()
        .and_then(|c| crate::vgpu::from_pci_config(&c))
        .or_else(|| {
            matches!(d.virtualization_mode(), Ok(GpuVirtualizationMode::Vgpu))
                .then(VgpuGuest::default)
        });
    Ok(GpuDevice {
        index,
        uuid,
        name,
        pci_bus_id,
        memory_total_bytes,
        compute_capability,
        mig_enabled,
        mig_devices,
        numa_node: d.numa_node_id().ok(),
        nvlinks: Vec::new(),
        info,
        clique: None,
        vgpu,
    })
}

/// DCGM's text for a brand (`DCGM_FI_DEV_BRAND`).
fn brand_name(b: &Brand) -> &'static str {
    match b {
        Brand::Quadro => "Quadro",
        Brand::Tesla => "Tesla",
        Brand::NVS => "NVS",
        Brand::GRID => "Grid",
        Brand::GeForce => "GeForce",
        Brand::Titan => "Titan",
        Brand::VApps => "NVIDIA Virtual Applications",
        Brand::VPC => "NVIDIA Virtual PC",
        Brand::VCS => "NVIDIA Virtual Compute Server",
        Brand::VWS => "NVIDIA RTX Virtual Workstation",
        Brand::CloudGaming => "NVIDIA Cloud Gaming",
        Brand::QuadroRTX => "Quadro RTX",
        Brand::NvidiaRTX => "NVIDIA RTX",
        Brand::Nvidia => "NVIDIA",
        Brand::GeForceRTX => "GeForce RTX",
        Brand::TitanRTX => "Titan RTX",
        _ => "Unknown",
    }
}

/// Active NVLinks of `d` grouped by the GPU at the far end (matched by PCI bus id among
/// `bus_ids`, the node's GPUs in index order); links to NVSwitches or CPUs are not counted.
fn nvlink_peers(d: &Device<'_>, bus_ids: &[String]) -> Vec<NvLinkPeer> {
    let mut peers: BTreeMap<u32, u32> = BTreeMap::new();
    for link in 0..MAX_NVLINKS {
        let l = d.link_wrapper_for(link);
        if !l.is_active().unwrap_or(false) {
            continue;
        }
        let Ok(remote) = l.remote_pci_info() else {
            continue;
        };
        if let Some(i) = bus_ids
            .iter()
            .position(|b| b.eq_ignore_ascii_case(&remote.bus_id))
        {
            *peers.entry(i as u32).or_default() += 1;
        }
    }
    peers
        .into_iter()
        .map(|(index, links)| NvLinkPeer { index, links })
        .collect()
}

/// The profile in a MIG device's name: `NVIDIA A100-SXM4-40GB MIG 1g.5gb` → `1g.5gb`.
fn mig_profile(name: &str) -> Option<String> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    let profile = profile.trim();
    (!profile.is_empty()).then(|| profile.to_owned())
}

/// The handles of `d`'s MIG devices with their UUIDs, in slot order; empty slots (and a device
/// whose UUID NVML does not give) skipped, as in `identify`. Errors: the MIG device count
/// failing other than "not supported" (no MIG: no handles).
fn mig_handles<'n>(d: &Device<'n>, index: u32) -> Result<Vec<(Device<'n>, String)>, GpuError> {
    let n = optional(
        "nvmlDeviceGetMaxMigDeviceCount",
        index,
        d.mig_device_count(),
    )?
    .unwrap_or(0);
    Ok((0..n)
        .filter_map(|i| d.mig_device_by_index(i).ok())
        .filter_map(|m| m.uuid().ok().map(|uuid| (m, uuid)))
        .collect())
}

/// Framebuffer readings of each MIG device of `d` (empty slots skipped, as in `identify`).
fn read_mig_samples(d: &Device<'_>, index: u32) -> Result<Vec<MigSample>, GpuError> {
    let mut out = Vec::new();
    for (m, uuid) in mig_handles(d, index)? {
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

/// A process's GPU memory in bytes; `None` where the driver hides it.
fn used_memory(p: &ProcessInfo) -> Option<u64> {
    match p.used_gpu_memory {
        nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
        nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
    }
}

/// Compute processes of each MIG device of `d`, read on the MIG device handle (empty slots
/// skipped, as in `identify`). A device whose list NVML refuses (other than "not supported",
/// which is an empty list) gets an empty list, as dcgm-exporter's
/// `GetAllMIGDevicesProcessMemory` skips it; only the MIG device count failing is an error.
fn read_mig_processes(d: &Device<'_>, index: u32) -> Result<Vec<MigProcesses>, GpuError> {
    let mut out = Vec::new();
    for (m, uuid) in mig_handles(d, index)? {
        let processes = match m.running_compute_processes() {
            Ok(procs) => procs
                .iter()
                .map(|p| GpuProcess {
                    pid: p.pid,
                    used_memory_bytes: used_memory(p),
                    sm_util_pct: None,
                })
                .collect(),
            Err(NvmlError::NotSupported) => Vec::new(),
            Err(e) => {
                tracing::debug!(gpu = index, mig = %uuid, error = %e, "listing a MIG device's processes");
                Vec::new()
            }
        };
        out.push(MigProcesses { uuid, processes });
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
        ..read_extras(d, i)?
    })
}

/// The field-value batch, violation times and retired pages of `d`.
fn read_extras(d: &Device<'_>, i: u32) -> Result<DeviceSample, GpuError> {
    const IDS: [u32; 10] = [
        fid::NVML_FI_DEV_MEMORY_TEMP,
        fid::NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL,
        fid::NVML_FI_DEV_NVLINK_BANDWIDTH_C0_L0,
        fid::NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        fid::NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        fid::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        fid::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
        fid::NVML_FI_DEV_REMAPPED_COR,
        fid::NVML_FI_DEV_REMAPPED_UNC,
        fid::NVML_FI_DEV_REMAPPED_FAILURE,
    ];
    let ids: Vec<FieldId> = IDS.iter().map(|&id| FieldId(id)).collect();
    let values =
        optional("nvmlDeviceGetFieldValues", i, d.field_values_for(&ids))?.unwrap_or_default();
    let mut v = [None; IDS.len()];
    for (slot, sample) in v.iter_mut().zip(values) {
        *slot = sample
            .ok()
            .and_then(|s| s.value.ok())
            .and_then(|x| match x {
                SampleValue::U32(n) => Some(u64::from(n)),
                SampleValue::U64(n) => Some(n),
                SampleValue::I64(n) => u64::try_from(n).ok(),
                SampleValue::F64(f) if f >= 0.0 => Some(f as u64),
                SampleValue::F64(_) => None,
            });
    }
    let violation = |p| {
        optional("nvmlDeviceGetViolationStatus", i, d.violation_status(p))
            .map(|t| t.map(|t| t.violation_time))
    };
    let retired = |c| {
        optional("nvmlDeviceGetRetiredPages", i, d.retired_pages(c))
            .map(|p| p.map(|p| p.len() as u64))
    };
    Ok(DeviceSample {
        memory_temp_c: v[0].and_then(|t| u32::try_from(t).ok()),
        nvlink_bandwidth_total: v[1],
        nvlink_bandwidth_l0: v[2],
        nvlink_crc_flit_errors: v[3],
        nvlink_crc_data_errors: v[4],
        nvlink_replay_errors: v[5],
        nvlink_recovery_errors: v[6],
        remapped_rows_correctable: v[7],
        remapped_rows_uncorrectable: v[8],
        row_remap_failure: v[9],
        retired_pages_sbe: retired(RetirementCause::MultipleSingleBitEccErrors)?,
        retired_pages_dbe: retired(RetirementCause::DoubleBitEccError)?,
        retired_pages_pending: optional(
            "nvmlDeviceGetRetiredPagesPendingStatus",
            i,
            d.are_pages_pending_retired(),
        )?
        .map(u64::from),
        power_violation_ns: violation(PerformancePolicy::Power)?,
        thermal_violation_ns: violation(PerformancePolicy::Thermal)?,
        sync_boost_violation_ns: violation(PerformancePolicy::SyncBoost)?,
        board_limit_violation_ns: violation(PerformancePolicy::BoardLimit)?,
        low_util_violation_ns: violation(PerformancePolicy::LowUtilization)?,
        reliability_violation_ns: violation(PerformancePolicy::Reliability)?,
        ..DeviceSample::default()
    })
}

/// The GPM metrics DCGM's profiling fields map to, in the order [`read_gpm`] stores them.
const GPM_METRICS: [GpmMetricId; 8] = [
    GpmMetricId::GraphicsUtil,
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::Fp64Util,
    GpmMetricId::Fp32Util,
    GpmMetricId::Fp16Util,
];

/// Takes a GPM sample of `d`, fills `s`'s profiling ratios from it and the previous poll's
/// sample (NVML gives percent; DCGM exports ratios), and keeps it for the next poll. GPUs
/// without GPM (before Hopper, vGPU guests) leave them `None`; a failure drops the kept sample.
fn read_gpm(
    nvml: &'static Nvml,
    d: &Device<'static>,
    i: u32,
    kept: &Mutex<BTreeMap<u32, GpmSample<'static>>>,
    s: &mut DeviceSample,
) {
    if !d.gpm_support().unwrap_or(false) {
        return;
    }
    let mut kept = kept
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Ok(now) = d.gpm_sample() else {
        kept.remove(&i);
        return;
    };
    if let Some(prev) = kept.remove(&i)
        && let Ok(results) = nvml_wrapper::gpm::gpm_metrics_get(nvml, &prev, &now, &GPM_METRICS)
    {
        let mut r = results
            .into_iter()
            .map(|m| m.ok().map(|m| (m.value / 100.0).clamp(0.0, 1.0)));
        let mut next = || r.next().flatten();
        s.gr_engine_active = next();
        s.sm_active = next();
        s.sm_occupancy = next();
        s.tensor_active = next();
        s.dram_active = next();
        s.fp64_active = next();
        s.fp32_active = next();
        s.fp16_active = next();
    }
    kept.insert(i, now);
}

/// Registers every GPU for critical-XID events and queues what arrives until `stop` is set.
/// GPUs that cannot deliver events (older boards, vGPU guests) are skipped silently.
fn watch_xids(nvml: &'static Nvml, xids: &Mutex<Vec<XidEvent>>, stop: &AtomicBool) {
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
