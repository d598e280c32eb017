//! Plain data returned by a [`crate::GpuInventory`]: identity (changes only with the hardware or
//! MIG layout) and samples (change every read). Units are in the field names.

use serde::Deserialize;

/// Versions of the driver stack, as `nvidia-smi` prints them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SystemInfo {
    /// Kernel driver version, e.g. `550.144.03` (`nvmlSystemGetDriverVersion`).
    pub driver_version: String,
    /// Highest CUDA version the driver supports, `major.minor`, e.g. `12.4`
    /// (`nvmlSystemGetCudaDriverVersion`, 12040 → `12.4`).
    pub cuda_version: String,
    /// NVML library version, e.g. `12.550.144.03` (`nvmlSystemGetNVMLVersion`).
    pub nvml_version: String,
}

/// One physical GPU and, when MIG is on, its MIG devices. `Default` is for tests' struct
/// literals (`..Default::default()`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuDevice {
    /// NVML index (`nvmlDeviceGetIndex`); dcgm-exporter's `gpu` label.
    pub index: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// PCI bus id with an 8-hex-digit domain, e.g. `00000000:8D:00.0`.
    pub pci_bus_id: String,
    /// Total framebuffer memory in bytes.
    pub memory_total_bytes: u64,
    /// CUDA compute capability `(major, minor)`, e.g. `(9, 0)`.
    pub compute_capability: (u32, u32),
    /// `Some(true)` when MIG mode is currently on, `None` where the GPU has no MIG support.
    pub mig_enabled: Option<bool>,
    /// MIG devices of this GPU, empty unless MIG is on.
    pub mig_devices: Vec<MigDevice>,
    /// NUMA node the GPU is attached to (`nvmlDeviceGetNumaNodeId`); `None` on a machine
    /// without NUMA information. The device plugin's `TopologyInfo`.
    pub numa_node: Option<u32>,
    /// GPUs this one reaches over NVLink, with the number of active links to each, in index
    /// order; empty without NVLink. The device plugin's preferred allocation reads it.
    pub nvlinks: Vec<NvLinkPeer>,
    /// Board and firmware strings (DCGM's label fields); each `None` where NVML has none.
    pub info: DeviceInfo,
    /// The multi-node NVLink clique (GPU fabric) the GPU belongs to, when registered in one
    /// (GFD's `nvidia.com/gpu.clique`). nvml-wrapper 0.13 has no safe
    /// `nvmlDeviceGetGpuFabricInfo`, so the NVML backend answers `None`.
    pub clique: Option<Clique>,
    /// Set when the GPU is a vGPU seen from inside a virtual machine (GFD's `vgpu.*` labels).
    pub vgpu: Option<VgpuGuest>,
}

/// One NVLink neighbour of a GPU ([`GpuDevice::nvlinks`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvLinkPeer {
    /// The neighbour's NVML index.
    pub index: u32,
    /// Active NVLinks between the two GPUs (H100 SXM: up to 18 in all).
    pub links: u32,
}

/// Static strings DCGM exports as label fields (`DCGM_FI_DEV_BRAND`, `…_SERIAL`, …).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeviceInfo {
    /// Brand as DCGM names it, e.g. `NVIDIA`, `Tesla`, `Quadro` (`nvmlDeviceGetBrand`).
    pub brand: Option<String>,
    /// Board serial number (`nvmlDeviceGetSerial`).
    pub serial: Option<String>,
    /// VBIOS version (`nvmlDeviceGetVbiosVersion`).
    pub vbios_version: Option<String>,
    /// infoROM image version (`nvmlDeviceGetInforomImageVersion`).
    pub inforom_image_version: Option<String>,
    /// OEM infoROM object version (`nvmlDeviceGetInforomVersion(OEM)`).
    pub inforom_oem_version: Option<String>,
    /// ECC infoROM object version (`nvmlDeviceGetInforomVersion(ECC)`).
    pub inforom_ecc_version: Option<String>,
    /// Power infoROM object version (`nvmlDeviceGetInforomVersion(POWER)`).
    pub inforom_power_version: Option<String>,
}

/// A GPU's place in a multi-node NVLink domain: the cluster UUID and the clique id inside it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Clique {
    /// The NVLink domain (cluster) UUID.
    pub cluster_uuid: String,
    /// The clique id within the domain.
    pub clique_id: u32,
}

/// What a vGPU guest knows of its host (GFD's `vgpu.host-driver-version` / `-branch`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VgpuGuest {
    /// The host's vGPU manager driver version, e.g. `550.54.16`, when known.
    pub host_driver_version: Option<String>,
    /// The host driver's branch, e.g. `r550_00`, when known.
    pub host_driver_branch: Option<String>,
}

/// A MIG device's slice of the GPU (`nvmlDeviceGetAttributes` on the MIG handle; GFD's
/// `nvidia.com/mig-<profile>.multiprocessors` and `.engines.*` labels).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MigAttributes {
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// Video decoders.
    pub decoders: u32,
    /// Video encoders.
    pub encoders: u32,
    /// JPEG decoders.
    pub jpeg_engines: u32,
    /// Optical-flow accelerators.
    pub ofa_engines: u32,
}

/// One MIG device (a GPU instance + compute instance pair).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MigDevice {
    /// `MIG-xxxxxxxx-...`, the id the device plugin hands to the kubelet.
    pub uuid: String,
    /// NVML GPU-instance id (dcgm-exporter's `GPU_I_ID`); `None` where the backend cannot
    /// read it (nvml-wrapper 0.13 has no safe `nvmlDeviceGetGpuInstanceId`).
    #[serde(default)]
    pub gpu_instance_id: Option<u32>,
    /// NVML compute-instance id, when known.
    #[serde(default)]
    pub compute_instance_id: Option<u32>,
    /// Profile name, e.g. `1g.10gb` (dcgm-exporter's `GPU_I_PROFILE`), when known; the NVML
    /// backend takes it from the MIG device's name (`NVIDIA A100-SXM4-40GB MIG 1g.5gb`).
    #[serde(default)]
    pub profile: Option<String>,
    /// The instance's engines and multiprocessors, when known.
    #[serde(default)]
    pub attributes: Option<MigAttributes>,
}

/// One reading of a MIG device's counters ([`crate::GpuInventory::mig_samples`]): the readings
/// NVML answers on the MIG device handle (framebuffer size and use); the rest stay `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MigSample {
    /// The MIG device, `MIG-xxxxxxxx-...` (as in [`MigDevice::uuid`]).
    pub uuid: String,
    /// Its counters; NVML gives `fb_*` per MIG device (bytes of that instance's memory slice).
    pub sample: DeviceSample,
}

/// One reading of a GPU's counters. `None` means the GPU or driver does not provide it
/// (NVML `NOT_SUPPORTED`), which exporters turn into "no sample", never into 0.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeviceSample {
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Memory clock, MHz.
    pub mem_clock_mhz: Option<u32>,
    /// GPU die temperature, °C.
    pub gpu_temp_c: Option<u32>,
    /// Power draw, milliwatts (NVML's unit; 1-second average on Ampere and newer).
    pub power_usage_mw: Option<u32>,
    /// Energy since the driver loaded, millijoules (Volta and newer).
    pub total_energy_mj: Option<u64>,
    /// PCIe replay counter.
    pub pcie_replay_count: Option<u32>,
    /// GPU utilisation over the driver's sample period, percent.
    pub gpu_util_pct: Option<u32>,
    /// Memory-controller utilisation, percent.
    pub mem_copy_util_pct: Option<u32>,
    /// Encoder utilisation, percent.
    pub enc_util_pct: Option<u32>,
    /// Decoder utilisation, percent.
    pub dec_util_pct: Option<u32>,
    /// Framebuffer free, bytes.
    pub fb_free_bytes: Option<u64>,
    /// Framebuffer used, bytes.
    pub fb_used_bytes: Option<u64>,
    /// Framebuffer reserved by the driver, bytes.
    pub fb_reserved_bytes: Option<u64>,
    /// Framebuffer total, bytes.
    pub fb_total_bytes: Option<u64>,
    /// PCIe transmit throughput, KiB/s over NVML's 20 ms window.
    pub pcie_tx_kib_per_s: Option<u32>,
    /// PCIe receive throughput, KiB/s over NVML's 20 ms window.
    pub pcie_rx_kib_per_s: Option<u32>,
    /// Corrected (single-bit) ECC errors since the driver loaded.
    pub ecc_sbe_volatile: Option<u64>,
    /// Uncorrected (double-bit) ECC errors since the driver loaded.
    pub ecc_dbe_volatile: Option<u64>,
    /// Corrected ECC errors over the GPU's lifetime.
    pub ecc_sbe_aggregate: Option<u64>,
    /// Uncorrected ECC errors over the GPU's lifetime.
    pub ecc_dbe_aggregate: Option<u64>,
    /// HBM temperature, °C (NVML field value `NVML_FI_DEV_MEMORY_TEMP`).
    pub memory_temp_c: Option<u32>,
    /// NVLink bandwidth counter set 0, all lanes (`NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL`).
    pub nvlink_bandwidth_total: Option<u64>,
    /// NVLink bandwidth counter set 0, lane 0 (`NVML_FI_DEV_NVLINK_BANDWIDTH_C0_L0`).
    pub nvlink_bandwidth_l0: Option<u64>,
    /// NVLink flow-control CRC errors, all links (`NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL`).
    pub nvlink_crc_flit_errors: Option<u64>,
    /// NVLink data CRC errors, all links (`NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL`).
    pub nvlink_crc_data_errors: Option<u64>,
    /// NVLink replays, all links (`NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL`).
    pub nvlink_replay_errors: Option<u64>,
    /// NVLink recoveries, all links (`NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL`).
    pub nvlink_recovery_errors: Option<u64>,
    /// Rows remapped for correctable errors (`NVML_FI_DEV_REMAPPED_COR`).
    pub remapped_rows_correctable: Option<u64>,
    /// Rows remapped for uncorrectable errors (`NVML_FI_DEV_REMAPPED_UNC`).
    pub remapped_rows_uncorrectable: Option<u64>,
    /// 1 when a row remapping failed, else 0 (`NVML_FI_DEV_REMAPPED_FAILURE`).
    pub row_remap_failure: Option<u64>,
    /// Pages retired for repeated single-bit errors (`nvmlDeviceGetRetiredPages`).
    pub retired_pages_sbe: Option<u64>,
    /// Pages retired for double-bit errors.
    pub retired_pages_dbe: Option<u64>,
    /// 1 when pages are pending retirement, else 0 (`nvmlDeviceGetRetiredPagesPendingStatus`).
    pub retired_pages_pending: Option<u64>,
    /// Time throttled by the power limit since the driver loaded, ns (`nvmlDeviceGetViolationStatus`).
    pub power_violation_ns: Option<u64>,
    /// Time throttled by temperature, ns.
    pub thermal_violation_ns: Option<u64>,
    /// Time throttled by sync boost, ns.
    pub sync_boost_violation_ns: Option<u64>,
    /// Time throttled by the board limit, ns.
    pub board_limit_violation_ns: Option<u64>,
    /// Time throttled for low utilisation, ns.
    pub low_util_violation_ns: Option<u64>,
    /// Time throttled by the board reliability limit, ns.
    pub reliability_violation_ns: Option<u64>,
    /// Ratio (0–1) of time the graphics engine was active over the last collect interval
    /// (GPM `GRAPHICS_UTIL`, Hopper and newer; `None` on the first poll).
    pub gr_engine_active: Option<f64>,
    /// Ratio of cycles an SM had at least one warp assigned (GPM `SM_UTIL`).
    pub sm_active: Option<f64>,
    /// Ratio of resident warps to the SM maximum (GPM `SM_OCCUPANCY`).
    pub sm_occupancy: Option<f64>,
    /// Ratio of cycles any tensor pipe was active (GPM `ANY_TENSOR_UTIL`).
    pub tensor_active: Option<f64>,
    /// Ratio of DRAM bandwidth used (GPM `DRAM_BW_UTIL`).
    pub dram_active: Option<f64>,
    /// Ratio of cycles the FP64 pipes were active (GPM `FP64_UTIL`).
    pub fp64_active: Option<f64>,
    /// Ratio of cycles the FP32 pipes were active (GPM `FP32_UTIL`).
    pub fp32_active: Option<f64>,
    /// Ratio of cycles the FP16 pipes were active (GPM `FP16_UTIL`).
    pub fp16_active: Option<f64>,
}

/// A process with a context on a GPU (`nvmlDeviceGetComputeRunningProcesses` joined with
/// `nvmlDeviceGetProcessUtilization` by pid).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct GpuProcess {
    /// Host pid (visible only when the agent runs with `hostPID`).
    pub pid: u32,
    /// GPU memory used by the process, bytes; `None` where the driver hides it.
    #[serde(default)]
    pub used_memory_bytes: Option<u64>,
    /// SM utilisation attributed to the process over the last sample period, percent.
    #[serde(default)]
    pub sm_util_pct: Option<u32>,
}

/// The processes of one MIG device ([`crate::GpuInventory::mig_processes`]): NVML's compute
/// process list on the MIG device handle, which gives memory but no utilisation per process
/// (dcgm-exporter's `GetAllMIGDevicesProcessMemory` reads the same list).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigProcesses {
    /// The MIG device, `MIG-xxxxxxxx-...` (as in [`MigDevice::uuid`]).
    pub uuid: String,
    /// Its compute processes; [`GpuProcess::sm_util_pct`] is `None` (NVML has no per-process
    /// utilisation on a MIG device). Empty when NVML could not list them for this device.
    pub processes: Vec<GpuProcess>,
}

/// An XID error reported by the driver (`nvmlEventTypeXidCriticalError`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    /// The GPU's NVML index.
    pub index: u32,
    /// The XID number, e.g. 79 ("GPU has fallen off the bus").
    pub xid: u64,
}
