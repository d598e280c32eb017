//! The poller: reads the GPUs every `--collect-interval` on its own thread and publishes a
//! [`Snapshot`]. Scrapes only ever read the last published snapshot, so a slow or failing NVML
//! call delays the next sample, never a scrape.

use std::{
    sync::{Arc, atomic::Ordering, mpsc},
    thread::JoinHandle,
    time::{Duration, SystemTime},
};

use kiln_gpu::GpuInventory;

use crate::{
    process::ProcessMapper,
    snapshot::{GpuSnapshot, MigPodUsage, Snapshot},
    state::Shared,
};

/// Reads every GPU once, carrying XID history over from `prev`. Per-GPU failures leave that
/// GPU without a sample and count one collect error each; with a `mapper`, per-pod usage is read
/// too: one process list per GPU and, on a GPU with MIG devices, one read of its MIG devices'
/// process lists. Returns the snapshot and the number of errors.
pub fn collect(
    inv: &dyn GpuInventory,
    prev: &Snapshot,
    mapper: Option<&ProcessMapper>,
) -> (Snapshot, u64) {
    let mut errors = 0;
    let pod_dir = mapper.map(ProcessMapper::pod_directory).unwrap_or_default();
    let system = inv
        .system()
        .map_err(|e| tracing::warn!(error = %crate::error_chain(&e), "reading driver versions"))
        .ok();
    errors += u64::from(system.is_none());
    let devices = match inv.devices() {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "listing GPUs; keeping the previous GPU list without samples");
            errors += 1;
            prev.gpus.iter().map(|g| g.device.clone()).collect()
        }
    };
    let mut gpus: Vec<GpuSnapshot> = devices
        .into_iter()
        .map(|device| {
            let mut g = GpuSnapshot::new(device);
            if let Some(old) = prev.gpus.iter().find(|o| o.device.uuid == g.device.uuid) {
                g.last_xid = old.last_xid;
                g.xid_counts = old.xid_counts.clone();
            }
            match inv.sample(g.device.index) {
                Ok(s) => g.sample = Some(s),
                Err(e) => {
                    tracing::warn!(gpu = g.device.index, error = %crate::error_chain(&e), "reading GPU counters");
                    errors += 1;
                }
            }
            if !g.device.mig_devices.is_empty() {
                match inv.mig_samples(g.device.index) {
                    Ok(m) => g.mig = m,
                    Err(e) => {
                        tracing::warn!(gpu = g.device.index, error = %crate::error_chain(&e), "reading MIG device counters");
                        errors += 1;
                    }
                }
            }
            if let Some(m) = mapper {
                match inv.processes(g.device.index) {
                    Ok(procs) => g.pod_usage = m.usage(&procs, &pod_dir),
                    Err(e) => {
                        tracing::debug!(gpu = g.device.index, error = %crate::error_chain(&e), "reading GPU processes")
                    }
                }
                if !g.device.mig_devices.is_empty() {
                    match inv.mig_processes(g.device.index) {
                        Ok(migs) => {
                            g.mig_pod_usage = migs
                                .into_iter()
                                .map(|p| MigPodUsage {
                                    pods: m.usage(&p.processes, &pod_dir),
                                    uuid: p.uuid,
                                })
                                .collect();
                        }
                        Err(e) => {
                            tracing::debug!(gpu = g.device.index, error = %crate::error_chain(&e), "reading MIG device processes");
                            g.mig_processes_failed = true;
                        }
                    }
                }
            }
            g
        })
        .collect();
    for ev in inv.drain_xid_events() {
        if let Some(g) = gpus.iter_mut().find(|g| g.device.index == ev.index) {
            g.last_xid = ev.xid;
            *g.xid_counts.entry(ev.xid).or_default() += 1;
        }
    }
    let pod_uids = pod_dir
        .into_values()
        .map(|k| ((k.namespace, k.pod), k.uid))
        .collect();
    let snap = Snapshot {
        generation: prev.generation + 1,
        taken_at: Some(SystemTime::now()),
        system,
        gpus,
        pod_uids,
    };
    (snap, errors)
}

/// The names of catalogue fields no GPU in `snap` provided (reported once at start-up). The
/// GPM activity ratios (`DCGM_FI_PROF_*` but the PCIe bytes) need two polls, so the first
/// poll's snapshot never has them: they are not reported.
#[must_use]
pub fn missing_fields(shared: &Shared, snap: &Snapshot) -> Vec<&'static str> {
    use crate::fields::Source;
    let two_polls = |name: &str| name.starts_with("DCGM_FI_PROF_") && !name.contains("_PCIE_");
    shared
        .catalogue()
        .metrics
        .iter()
        .filter(|m| !two_polls(m.field.name))
        .filter(|m| match m.field.source {
            Source::Sample(get) => !snap.gpus.iter().any(|g| {
                g.sample.as_ref().and_then(get).is_some()
                    || g.mig.iter().any(|m| get(&m.sample).is_some())
            }),
            _ => false,
        })
        .map(|m| m.field.name)
        .collect()
}

/// A running poller; dropping it stops the thread after its current poll.
#[derive(Debug)]
pub struct Poller {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Poller {
    /// Polls once synchronously (so the first scrape has data), then every `interval` on a
    /// thread named `kiln-poller`.
    ///
    /// # Errors
    /// The OS error if the thread cannot be spawned.
    pub fn start(
        inv: Arc<dyn GpuInventory>,
        shared: Arc<Shared>,
        interval: Duration,
        mapper: Option<ProcessMapper>,
    ) -> std::io::Result<Self> {
        let poll = move |inv: &dyn GpuInventory, shared: &Shared| {
            let (snap, errors) = collect(inv, &shared.snapshot(), mapper.as_ref());
            shared
                .metrics
                .collect_errors
                .fetch_add(errors, Ordering::Relaxed);
            shared.set_snapshot(snap);
        };
        poll(inv.as_ref(), &shared);
        let missing = missing_fields(&shared, &shared.snapshot());
        if !missing.is_empty() {
            tracing::warn!(fields = ?missing, "these GPUs do not provide some configured fields; they are left out");
        }
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("kiln-poller".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(interval) {
                    poll(inv.as_ref(), &shared);
                }
            })?;
        Ok(Self {
            stop: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use kiln_gpu::{DeviceSample, GpuDevice};

    use super::*;
    use crate::{catalogue::Catalogue, render::RenderOptions, snapshot::GpuSnapshot};

    #[test]
    fn mig_devices_processes_are_summed_per_pod_per_device_in_device_order() {
        const UID: &str = "0f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f";
        let fixture = r#"
driver_version: "550.144.03"
cuda_version: "12.4"
gpus:
  - uuid: GPU-33333333-2222-3333-4444-555555555555
    name: NVIDIA A100-SXM4-40GB
    memory_total_mib: 40960
    compute_capability: "8.0"
    mig_enabled: true
    mig_devices: [{uuid: MIG-a}, {uuid: MIG-b}]
    mig_processes:
      MIG-b: [{pid: 7, used_memory_bytes: 1572864}, {pid: 8, used_memory_bytes: 1572864}]
"#;
        let inv = kiln_gpu::FakeBackend::new(kiln_input::yaml::from_str(fixture).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let mapper = ProcessMapper {
            proc_root: dir.path().join("proc"),
            pod_logs_dir: dir.path().join("pods"),
        };
        for pid in [7, 8] {
            let d = mapper.proc_root.join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cgroup"), format!("0::/kubepods/pod{UID}/c\n")).unwrap();
        }
        std::fs::create_dir_all(mapper.pod_logs_dir.join(format!("ml_p_{UID}"))).unwrap();
        let (snap, errors) = collect(&inv, &Snapshot::default(), Some(&mapper));
        assert_eq!(errors, 0);
        let g = &snap.gpus[0];
        assert!(!g.mig_processes_failed);
        let usage: Vec<_> = g
            .mig_pod_usage
            .iter()
            .map(|m| {
                let pods: Vec<_> = m
                    .pods
                    .iter()
                    .map(|u| (u.pod.pod.as_str(), u.memory_mib, u.sm_util_pct))
                    .collect();
                (m.uuid.as_str(), pods)
            })
            .collect();
        // 1.5 MiB twice: 1 + 1 MiB, each process rounded down first.
        assert_eq!(usage, [("MIG-a", vec![]), ("MIG-b", vec![("p", 2, None)])]);
        // Not read without a mapper.
        let (snap, _) = collect(&inv, &Snapshot::default(), None);
        assert!(snap.gpus[0].mig_pod_usage.is_empty());
    }

    #[test]
    fn fields_no_gpu_gave_are_reported_but_not_the_ratios_that_need_two_polls() {
        let csv = "DCGM_FI_DEV_MEMORY_TEMP, gauge, t\nDCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, g\n\
                   DCGM_FI_PROF_PCIE_TX_BYTES, gauge, p\nDCGM_FI_DEV_GPU_TEMP, gauge, t\n";
        let shared = Shared::new(
            Catalogue::parse(csv).unwrap(),
            RenderOptions::default(),
            Vec::new(),
        );
        let mut gpu = GpuSnapshot::new(GpuDevice::default());
        gpu.sample = Some(DeviceSample {
            gpu_temp_c: Some(40),
            ..DeviceSample::default()
        });
        let snap = Snapshot {
            gpus: vec![gpu],
            ..Snapshot::default()
        };
        assert_eq!(
            missing_fields(&shared, &snap),
            ["DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_PROF_PCIE_TX_BYTES"]
        );
    }
}
