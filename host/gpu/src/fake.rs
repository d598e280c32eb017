//! [`FakeBackend`]: GPUs described by a fixture file, so agents run without a GPU.
//!
//! Fixture format (YAML, or JSON which is YAML too); units as the field names say
//! (`memory_total_mib` in MiB, `fb_*_bytes` and `used_memory_bytes` in bytes, the rest as in
//! [`DeviceSample`]'s field names); every field is documented on [`FixtureGpu`] and
//! [`DeviceSample`]:
//!
//! ```yaml
//! driver_version: "550.144.03"
//! cuda_version: "12.4"
//! nvml_version: "12.550.144.03"
//! driver_version_changes: ["560.35.03"]   # one applied per later `system()` call
//! gpus:
//!   - uuid: GPU-11111111-2222-3333-4444-555555555555
//!     name: NVIDIA H100 80GB HBM3
//!     pci_bus_id: "00000000:8D:00.0"
//!     memory_total_mib: 81559
//!     compute_capability: "9.0"
//!     numa_node: 0                          # omit: no NUMA information
//!     nvlinks: [{index: 1, links: 18}]       # NVLink neighbours (make it symmetric)
//!     info: {brand: NVIDIA, serial: "1650…", vbios_version: 96.00.89.00.01}
//!     clique: {cluster_uuid: 7c5e…, clique_id: 3}   # multi-node NVLink
//!     vgpu: {host_driver_version: 550.54.16, host_driver_branch: r550_00}  # a vGPU guest
//!     mig_enabled: true                     # omit: GPU without MIG support
//!     mig_devices: [{uuid: MIG-..., gpu_instance_id: 1, profile: 1g.10gb,
//!                    attributes: {multiprocessors: 16, copy_engines: 1}}]
//!     mig_samples: {MIG-...: {fb_used_bytes: 1048576}}  # what `mig_samples()` returns
//!     mig_processes: {MIG-...: [{pid: 4343, used_memory_bytes: 1048576}]}  # `mig_processes()`
//!     sample: {sm_clock_mhz: 1980, power_usage_mw: 72345, fb_used_bytes: 1048576}
//!     processes: [{pid: 4242, used_memory_bytes: 1048576, sm_util_pct: 30}]
//!     xid_events: [31, 79]                  # one released per `drain_xid_events()` call
//! ```

use std::{
    collections::{BTreeMap, VecDeque},
    path::Path,
    sync::Mutex,
};

use serde::Deserialize;

use crate::{
    Clique, DeviceInfo, DeviceSample, GpuDevice, GpuError, GpuInventory, GpuProcess, MigDevice,
    MigProcesses, MigSample, NvLinkPeer, SystemInfo, VgpuGuest, XidEvent,
};

/// The fixture file's top level (see the module docs for an example).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fixture {
    /// Initial driver version.
    pub driver_version: String,
    /// CUDA version, `major.minor`.
    pub cuda_version: String,
    /// NVML version; defaults to `12.<driver_version>`.
    #[serde(default)]
    pub nvml_version: Option<String>,
    /// Driver versions applied one per `system()` call after the first (a driver upgrade).
    #[serde(default)]
    pub driver_version_changes: Vec<String>,
    /// The GPUs, in index order.
    pub gpus: Vec<FixtureGpu>,
}

/// The largest `memory_total_mib` a fixture may give: the most MiB whose byte count fits in
/// 64 bits (2^44 − 1 MiB, 16 EiB).
pub const MAX_MEMORY_MIB: u64 = u64::MAX >> 20;

/// The most GPUs a fixture may describe (NVML has no node with more than a few dozen).
pub const MAX_FIXTURE_GPUS: usize = 1024;

impl Fixture {
    /// Range checks: at most [`MAX_FIXTURE_GPUS`] GPUs, `memory_total_mib` at most
    /// [`MAX_MEMORY_MIB`] (2^44 MiB is 2^64 bytes, which wrapped to 0 and lost the memory
    /// label), every `nvlinks` entry naming another GPU of the fixture, and every
    /// `mig_processes` key naming one of the GPU's MIG devices, with no `sm_util_pct` (NVML has
    /// no per-process utilisation on a MIG device).
    ///
    /// # Errors
    /// The field path and the bound.
    pub fn check(&self) -> Result<(), kiln_input::YamlError> {
        let n = self.gpus.len();
        if n > MAX_FIXTURE_GPUS {
            return Err(kiln_input::YamlError {
                path: "gpus".into(),
                message: format!("at most {MAX_FIXTURE_GPUS} GPUs"),
            });
        }
        for (i, g) in self.gpus.iter().enumerate() {
            if let Some((j, p)) = g
                .nvlinks
                .iter()
                .enumerate()
                .find(|(_, p)| p.index as usize >= n || p.index as usize == i)
            {
                return Err(kiln_input::YamlError {
                    path: format!("gpus[{i}].nvlinks[{j}].index"),
                    message: format!(
                        "{} is not another GPU of this fixture (0 to {}, not {i})",
                        p.index,
                        n.saturating_sub(1)
                    ),
                });
            }
            for (uuid, procs) in &g.mig_processes {
                if !g.mig_devices.iter().any(|m| m.uuid == *uuid) {
                    return Err(kiln_input::YamlError {
                        path: format!("gpus[{i}].mig_processes.{uuid}"),
                        message: "not one of this GPU's mig_devices".into(),
                    });
                }
                if let Some(j) = procs.iter().position(|p| p.sm_util_pct.is_some()) {
                    return Err(kiln_input::YamlError {
                        path: format!("gpus[{i}].mig_processes.{uuid}[{j}].sm_util_pct"),
                        message: "NVML has no per-process utilisation on a MIG device".into(),
                    });
                }
            }
            if g.memory_total_mib > MAX_MEMORY_MIB {
                return Err(kiln_input::YamlError {
                    path: format!("gpus[{i}].memory_total_mib"),
                    message: format!(
                        "{} MiB is more than the most, {MAX_MEMORY_MIB} MiB (2^64 bytes)",
                        g.memory_total_mib
                    ),
                });
            }
        }
        Ok(())
    }
}

/// One GPU of a [`Fixture`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixtureGpu {
    /// `GPU-<uuid>`.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// PCI bus id; defaults to `00000000:<index + 1 as 2 hex digits>:00.0`.
    #[serde(default)]
    pub pci_bus_id: Option<String>,
    /// Total memory, MiB.
    pub memory_total_mib: u64,
    /// Compute capability as `"major.minor"`.
    pub compute_capability: String,
    /// NUMA node; absent where the machine has no NUMA information.
    #[serde(default)]
    pub numa_node: Option<u32>,
    /// NVLink neighbours by index, with link counts (as [`GpuDevice::nvlinks`]).
    #[serde(default)]
    pub nvlinks: Vec<NvLinkPeer>,
    /// Board and firmware strings.
    #[serde(default)]
    pub info: DeviceInfo,
    /// Multi-node NVLink clique.
    #[serde(default)]
    pub clique: Option<Clique>,
    /// Present for a vGPU seen from inside a virtual machine.
    #[serde(default)]
    pub vgpu: Option<VgpuGuest>,
    /// MIG mode; absent for a GPU without MIG support.
    #[serde(default)]
    pub mig_enabled: Option<bool>,
    /// MIG devices.
    #[serde(default)]
    pub mig_devices: Vec<MigDevice>,
    /// What every `sample()` returns.
    #[serde(default)]
    pub sample: DeviceSample,
    /// MIG device UUID → what `mig_samples()` returns for it (an empty sample when absent).
    #[serde(default)]
    pub mig_samples: BTreeMap<String, DeviceSample>,
    /// What every `processes()` returns.
    #[serde(default)]
    pub processes: Vec<GpuProcess>,
    /// MIG device UUID → what `mig_processes()` returns for it (none when absent).
    #[serde(default)]
    pub mig_processes: BTreeMap<String, Vec<GpuProcess>>,
    /// XIDs released one per `drain_xid_events()` call.
    #[serde(default)]
    pub xid_events: Vec<u64>,
}

/// A [`GpuInventory`] that answers from a [`Fixture`]; queued events and driver changes are
/// consumed as they are read.
#[derive(Debug)]
pub struct FakeBackend {
    devices: Vec<GpuDevice>,
    samples: Vec<DeviceSample>,
    mig_samples: Vec<Vec<MigSample>>,
    processes: Vec<Vec<GpuProcess>>,
    mig_processes: Vec<Vec<MigProcesses>>,
    state: Mutex<FakeState>,
}

#[derive(Debug)]
struct FakeState {
    system: SystemInfo,
    system_reads: u64,
    driver_changes: VecDeque<String>,
    xids: Vec<VecDeque<u64>>,
    lost: Vec<bool>,
}

impl FakeBackend {
    /// Reads a fixture file: a regular file of at most [`kiln_input::MAX_FILE_BYTES`], parsed
    /// by kiln's one YAML loader, then [`Fixture::check`]ed.
    ///
    /// # Errors
    /// [`GpuError::FixtureRead`] or [`GpuError::FixtureParse`] (the message names the field).
    pub fn from_file(path: &Path) -> Result<Self, GpuError> {
        let text =
            kiln_input::read_bounded(path, kiln_input::MAX_FILE_BYTES).map_err(|source| {
                GpuError::FixtureRead {
                    path: path.to_owned(),
                    source: Box::new(source),
                }
            })?;
        let parse_err = |source| GpuError::FixtureParse {
            path: path.to_owned(),
            source: Box::new(source),
        };
        let fixture: Fixture = kiln_input::yaml::from_str(&text).map_err(parse_err)?;
        fixture.check().map_err(parse_err)?;
        Ok(Self::new(fixture))
    }

    /// Builds the fake from an in-memory fixture.
    #[must_use]
    pub fn new(fixture: Fixture) -> Self {
        let devices: Vec<GpuDevice> = fixture
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| to_device(i, g))
            .collect();
        let samples = fixture.gpus.iter().map(sample_with_total).collect();
        // One entry per MIG device of each GPU, in MIG-device order, made by `f`.
        fn per_mig<T>(
            gpus: &[FixtureGpu],
            devices: &[GpuDevice],
            f: impl Fn(&FixtureGpu, &str) -> T,
        ) -> Vec<Vec<T>> {
            gpus.iter()
                .zip(devices)
                .map(|(g, d)| d.mig_devices.iter().map(|m| f(g, &m.uuid)).collect())
                .collect()
        }
        let mig_samples = per_mig(&fixture.gpus, &devices, |g, uuid| MigSample {
            uuid: uuid.to_owned(),
            sample: g.mig_samples.get(uuid).cloned().unwrap_or_default(),
        });
        let mig_processes = per_mig(&fixture.gpus, &devices, |g, uuid| MigProcesses {
            uuid: uuid.to_owned(),
            processes: g.mig_processes.get(uuid).cloned().unwrap_or_default(),
        });
        let processes = fixture.gpus.iter().map(|g| g.processes.clone()).collect();
        let xids = fixture
            .gpus
            .iter()
            .map(|g| g.xid_events.iter().copied().collect())
            .collect();
        let nvml_version = fixture
            .nvml_version
            .unwrap_or_else(|| format!("12.{}", fixture.driver_version));
        let system = SystemInfo {
            driver_version: fixture.driver_version,
            cuda_version: fixture.cuda_version,
            nvml_version,
        };
        let state = FakeState {
            system,
            system_reads: 0,
            driver_changes: fixture.driver_version_changes.into(),
            lost: vec![false; fixture.gpus.len()],
            xids,
        };
        Self {
            devices,
            samples,
            mig_samples,
            processes,
            mig_processes,
            state: Mutex::new(state),
        }
    }

    /// Queues XID `xid` on GPU `index`, released by a later `drain_xid_events()` (tests inject
    /// faults at run time this way). An unknown index is ignored.
    pub fn inject_xid(&self, index: u32, xid: u64) {
        let mut st = self.lock();
        if let Some(q) = st.xids.get_mut(index as usize) {
            q.push_back(xid);
        }
    }

    /// Marks GPU `index` lost (`sample()` then fails with [`GpuError::GpuLost`], as NVML does
    /// after XID 79) or back.
    pub fn set_lost(&self, index: u32, lost: bool) {
        if let Some(l) = self.lock().lost.get_mut(index as usize) {
            *l = lost;
        }
    }

    /// Changes the driver version `system()` reports from now on (an in-place driver upgrade).
    pub fn set_driver_version(&self, version: &str) {
        self.lock().system.driver_version = version.to_owned();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn check(&self, index: u32) -> Result<usize, GpuError> {
        let i = index as usize;
        if i < self.devices.len() {
            Ok(i)
        } else {
            Err(GpuError::NoSuchDevice(index))
        }
    }
}

fn to_device(index: usize, g: &FixtureGpu) -> GpuDevice {
    let (major, minor) = g
        .compute_capability
        .split_once('.')
        .unwrap_or((&g.compute_capability, "0"));
    GpuDevice {
        index: index as u32,
        uuid: g.uuid.clone(),
        name: g.name.clone(),
        pci_bus_id: g
            .pci_bus_id
            .clone()
            .unwrap_or_else(|| format!("00000000:{:02X}:00.0", index + 1)),
        memory_total_bytes: mib_to_bytes(g.memory_total_mib),
        compute_capability: (major.parse().unwrap_or(0), minor.parse().unwrap_or(0)),
        mig_enabled: g.mig_enabled,
        mig_devices: if g.mig_enabled == Some(true) {
            g.mig_devices.clone()
        } else {
            Vec::new()
        },
        numa_node: g.numa_node,
        nvlinks: g.nvlinks.clone(),
        info: g.info.clone(),
        clique: g.clique.clone(),
        vgpu: g.vgpu.clone(),
    }
}

/// The fixture's sample, with `fb_total_bytes` filled from `memory_total_mib` when absent.
fn sample_with_total(g: &FixtureGpu) -> DeviceSample {
    let mut s = g.sample.clone();
    s.fb_total_bytes = s.fb_total_bytes.or(Some(mib_to_bytes(g.memory_total_mib)));
    s
}

/// MiB to bytes, saturating (never wrapping to 0) above [`MAX_MEMORY_MIB`].
fn mib_to_bytes(mib: u64) -> u64 {
    mib.saturating_mul(1 << 20)
}

impl GpuInventory for FakeBackend {
    fn system(&self) -> Result<SystemInfo, GpuError> {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if st.system_reads > 0
            && let Some(v) = st.driver_changes.pop_front()
        {
            st.system.driver_version = v;
        }
        st.system_reads += 1;
        Ok(st.system.clone())
    }

    fn devices(&self) -> Result<Vec<GpuDevice>, GpuError> {
        Ok(self.devices.clone())
    }

    fn sample(&self, index: u32) -> Result<DeviceSample, GpuError> {
        let i = self.check(index)?;
        if self.lock().lost[i] {
            return Err(GpuError::GpuLost { index });
        }
        Ok(self.samples[i].clone())
    }

    fn mig_samples(&self, index: u32) -> Result<Vec<MigSample>, GpuError> {
        Ok(self.mig_samples[self.check(index)?].clone())
    }

    fn processes(&self, index: u32) -> Result<Vec<GpuProcess>, GpuError> {
        Ok(self.processes[self.check(index)?].clone())
    }

    fn mig_processes(&self, index: u32) -> Result<Vec<MigProcesses>, GpuError> {
        Ok(self.mig_processes[self.check(index)?].clone())
    }

    fn drain_xid_events(&self) -> Vec<XidEvent> {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = Vec::new();
        for (index, queue) in st.xids.iter_mut().enumerate() {
            if let Some(xid) = queue.pop_front() {
                out.push(XidEvent {
                    index: index as u32,
                    xid,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = r#"
driver_version: "550.144.03"
cuda_version: "12.4"
driver_version_changes: ["560.35.03"]
gpus:
  - uuid: GPU-11111111-2222-3333-4444-555555555555
    name: NVIDIA H100 80GB HBM3
    pci_bus_id: "00000000:8D:00.0"
    memory_total_mib: 81559
    compute_capability: "9.0"
    mig_enabled: true
    mig_devices:
      - {uuid: MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee, gpu_instance_id: 7, profile: 1g.10gb}
      - {uuid: MIG-ffffffff-bbbb-cccc-dddd-eeeeeeeeeeee, gpu_instance_id: 8, profile: 1g.10gb}
    mig_samples:
      MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee: {fb_used_bytes: 2097152, fb_total_bytes: 10737418240}
    mig_processes:
      MIG-ffffffff-bbbb-cccc-dddd-eeeeeeeeeeee: [{pid: 4343, used_memory_bytes: 2097152}]
    sample: {sm_clock_mhz: 1980, power_usage_mw: 72345}
    processes: [{pid: 4242, used_memory_bytes: 1048576, sm_util_pct: 30}]
    xid_events: [31, 79]
  - uuid: GPU-22222222-2222-3333-4444-555555555555
    name: Tesla T4
    memory_total_mib: 15360
    compute_capability: "7.5"
"#;

    fn fake() -> FakeBackend {
        FakeBackend::new(serde_yaml_ng::from_str(FIXTURE).unwrap())
    }

    #[test]
    fn identity_comes_from_the_fixture_with_defaults_filled() {
        let devs = fake().devices().unwrap();
        assert_eq!(devs.len(), 2);
        assert_eq!(devs[0].pci_bus_id, "00000000:8D:00.0");
        assert_eq!(devs[0].compute_capability, (9, 0));
        assert_eq!(devs[0].memory_total_bytes, 81559 * 1024 * 1024);
        assert_eq!(devs[0].mig_devices[0].gpu_instance_id, Some(7));
        assert_eq!(devs[1].index, 1);
        assert_eq!(devs[1].pci_bus_id, "00000000:02:00.0");
        assert_eq!(devs[1].mig_enabled, None);
        assert_eq!(devs[1].compute_capability, (7, 5));
    }

    #[test]
    fn samples_and_processes_are_returned_and_bad_indexes_rejected() {
        let f = fake();
        let s = f.sample(0).unwrap();
        assert_eq!(s.sm_clock_mhz, Some(1980));
        assert_eq!(s.power_usage_mw, Some(72345));
        assert_eq!(s.gpu_temp_c, None);
        assert_eq!(s.fb_total_bytes, Some(81559 << 20));
        assert_eq!(f.processes(0).unwrap()[0].pid, 4242);
        let migs = f.mig_samples(0).unwrap();
        assert_eq!(migs.len(), 2);
        assert_eq!(migs[0].uuid, "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee");
        assert_eq!(migs[0].sample.fb_used_bytes, Some(2 << 20));
        assert_eq!(migs[0].sample.fb_total_bytes, Some(10 << 30));
        assert_eq!(migs[1].sample, DeviceSample::default());
        assert!(f.mig_samples(1).unwrap().is_empty());
        let mig_procs = f.mig_processes(0).unwrap();
        assert_eq!(
            mig_procs,
            [
                MigProcesses {
                    uuid: "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
                    processes: Vec::new(),
                },
                MigProcesses {
                    uuid: "MIG-ffffffff-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
                    processes: vec![GpuProcess {
                        pid: 4343,
                        used_memory_bytes: Some(2 << 20),
                        sm_util_pct: None,
                    }],
                },
            ]
        );
        assert!(f.mig_processes(1).unwrap().is_empty());
        assert!(matches!(f.mig_processes(2), Err(GpuError::NoSuchDevice(2))));
        assert!(matches!(f.sample(2), Err(GpuError::NoSuchDevice(2))));
    }

    #[test]
    fn xids_are_released_one_per_drain_and_driver_changes_one_per_read() {
        let f = fake();
        assert_eq!(f.drain_xid_events(), vec![XidEvent { index: 0, xid: 31 }]);
        assert_eq!(f.drain_xid_events(), vec![XidEvent { index: 0, xid: 79 }]);
        assert!(f.drain_xid_events().is_empty());
        f.inject_xid(1, 48);
        assert_eq!(f.drain_xid_events(), vec![XidEvent { index: 1, xid: 48 }]);
        f.set_lost(1, true);
        assert!(matches!(f.sample(1), Err(GpuError::GpuLost { index: 1 })));
        f.set_lost(1, false);
        assert!(f.sample(1).is_ok());
        assert_eq!(f.system().unwrap().driver_version, "550.144.03");
        assert_eq!(f.system().unwrap().nvml_version, "12.550.144.03");
        assert_eq!(f.system().unwrap().driver_version, "560.35.03");
        assert_eq!(f.system().unwrap().driver_version, "560.35.03");
        f.set_driver_version("570.86.15");
        assert_eq!(f.system().unwrap().driver_version, "570.86.15");
    }

    #[test]
    fn fixture_errors_name_the_file_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus.yaml");
        assert!(matches!(
            FakeBackend::from_file(&path),
            Err(GpuError::FixtureRead { .. })
        ));
        std::fs::write(
            &path,
            "driver_version: x\ncuda_version: y\ngpus: [{uuid: 1}]\n",
        )
        .unwrap();
        let err = FakeBackend::from_file(&path).unwrap_err();
        assert!(matches!(err, GpuError::FixtureParse { .. }));
        assert!(err.to_string().contains("gpus.yaml"), "{err}");
    }

    #[test]
    fn fixtures_are_bounded_files_with_bounded_values() {
        let err = FakeBackend::from_file(Path::new("/dev/urandom")).unwrap_err();
        let GpuError::FixtureRead { source, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(
            source.to_string(),
            "/dev/urandom: not a regular file (character device)"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus.yaml");
        let huge = FIXTURE.replace(
            "memory_total_mib: 15360",
            "memory_total_mib: 17592186044416",
        );
        std::fs::write(&path, huge).unwrap();
        let err = FakeBackend::from_file(&path).unwrap_err();
        let GpuError::FixtureParse { source, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(source.path, "gpus[1].memory_total_mib");
        assert!(source.message.contains("17592186044415 MiB"), "{source}");
        let dup = FIXTURE.replace(
            "cuda_version: \"12.4\"",
            "cuda_version: \"12.4\"\ncuda_version: \"12.5\"",
        );
        std::fs::write(&path, dup).unwrap();
        let err = FakeBackend::from_file(&path).unwrap_err();
        let GpuError::FixtureParse { source, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(source.path, "cuda_version");
        let self_link = FIXTURE.replace(
            "compute_capability: \"7.5\"",
            "compute_capability: \"7.5\"\n    nvlinks: [{index: 0, links: 2}, {index: 1, links: 2}]",
        );
        std::fs::write(&path, self_link).unwrap();
        let err = FakeBackend::from_file(&path).unwrap_err();
        let GpuError::FixtureParse { source, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(source.path, "gpus[1].nvlinks[1].index");
        assert!(source.message.contains("1 is not another GPU"), "{source}");
        let check = |text: String| {
            std::fs::write(&path, text).unwrap();
            match FakeBackend::from_file(&path).unwrap_err() {
                GpuError::FixtureParse { source, .. } => (source.path, source.message),
                other => panic!("{other:?}"),
            }
        };
        let (at, why) = check(FIXTURE.replace(
            "MIG-ffffffff-bbbb-cccc-dddd-eeeeeeeeeeee: [",
            "MIG-00000000-bbbb-cccc-dddd-eeeeeeeeeeee: [",
        ));
        assert_eq!(
            at,
            "gpus[0].mig_processes.MIG-00000000-bbbb-cccc-dddd-eeeeeeeeeeee"
        );
        assert_eq!(why, "not one of this GPU's mig_devices");
        let (at, why) = check(FIXTURE.replace(
            "used_memory_bytes: 2097152}]",
            "used_memory_bytes: 2097152, sm_util_pct: 5}]",
        ));
        assert_eq!(
            at,
            "gpus[0].mig_processes.MIG-ffffffff-bbbb-cccc-dddd-eeeeeeeeeeee[0].sm_util_pct"
        );
        assert!(why.contains("no per-process utilisation"), "{why}");
        // In memory the conversion saturates instead of wrapping to 0.
        assert_eq!(mib_to_bytes(1 << 44), u64::MAX);
    }
}
