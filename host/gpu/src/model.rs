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

/// One physical GPU and, when MIG is on, its MIG devices.
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

/// One MIG device (a GPU instance + compute instance pair).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
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

/// An XID error reported by the driver (`nvmlEventTypeXidCriticalError`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    /// The GPU's NVML index.
    pub index: u32,
    /// The XID number, e.g. 79 ("GPU has fallen off the bus").
    pub xid: u64,
}
