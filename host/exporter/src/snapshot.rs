//! What one poll of the GPUs produced; built by the poller, read by every scrape.

use std::{collections::BTreeMap, time::SystemTime};

use kiln_gpu::{DeviceSample, GpuDevice, MigSample, SystemInfo};

use crate::process::PodUsage;

/// Everything a scrape renders about the GPUs, as of one poll.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Bumped on every poll (0 = no poll yet); keys the rendered-body cache.
    pub generation: u64,
    /// When the poll finished.
    pub taken_at: Option<SystemTime>,
    /// Driver versions; `None` if NVML could not answer.
    pub system: Option<SystemInfo>,
    /// One entry per GPU in index order.
    pub gpus: Vec<GpuSnapshot>,
    /// `(namespace, pod)` → pod UID, from the kubelet's pod log directory, read once per poll
    /// when process values are on (empty otherwise); names the `pod_uid` of idle pods'
    /// per-process series.
    pub pod_uids: BTreeMap<(String, String), String>,
}

/// One GPU in a [`Snapshot`].
#[derive(Debug, Clone)]
pub struct GpuSnapshot {
    /// Identity.
    pub device: GpuDevice,
    /// Counters; `None` when reading them failed this poll (the GPU then has no samples).
    pub sample: Option<DeviceSample>,
    /// Counters of each MIG device (MIG on only), in `device.mig_devices` order.
    pub mig: Vec<MigSample>,
    /// The last XID seen since start-up, 0 before any (`DCGM_FI_DEV_XID_ERRORS`).
    pub last_xid: u64,
    /// XID number → occurrences since start-up (`kiln_gpu_xid_errors_total`).
    pub xid_counts: BTreeMap<u64, u64>,
    /// Per-pod usage from NVML's process list, when per-pod process metrics are on.
    pub pod_usage: Vec<PodUsage>,
    /// Per-pod usage of each MIG device's processes (MIG on, process lists read), in
    /// `device.mig_devices` order; virtual-GPU mode's per-process values of a GPU instance.
    pub mig_pod_usage: Vec<MigPodUsage>,
    /// Set when NVML could not list the MIG devices' processes this poll: their per-process
    /// fields are then copied per pod like any other field, as dcgm-exporter's
    /// `processMIGEnabledGPU` gives no per-process data for the GPU when that listing fails.
    pub mig_processes_failed: bool,
}

/// What the pods' processes use on one MIG device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigPodUsage {
    /// The MIG device, `MIG-xxxxxxxx-...`.
    pub uuid: String,
    /// Per pod, the memory of its processes on that device; `sm_util_pct` is `None` (NVML has
    /// no per-process utilisation on a MIG device).
    pub pods: Vec<PodUsage>,
}

impl GpuSnapshot {
    /// A GPU with identity only (no sample yet, no XIDs).
    #[must_use]
    pub fn new(device: GpuDevice) -> Self {
        Self {
            device,
            sample: None,
            mig: Vec::new(),
            last_xid: 0,
            xid_counts: BTreeMap::new(),
            pod_usage: Vec::new(),
            mig_pod_usage: Vec::new(),
            mig_processes_failed: false,
        }
    }
}
