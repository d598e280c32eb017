//! The validator chain against a temporary root with fake GPUs: status files and their
//! content, stale-file removal, the driver/library mismatch message, wait timeouts.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use kiln_gpu::{FakeBackend, GpuError, GpuInventory};
use kiln_validator::{
    CudaApi, CudaDevice, CudaDeviceApi, CudaError, ExpectedResource, HostPaths, Layout,
    RetryPolicy, StatusFile, Validator, ValidatorError, clear_ready_files,
};

/// One fake H100 (see `kiln_gpu::fixtures`).
const FIXTURE: &str = kiln_gpu::fixtures::ONE_H100;

const PROC_550: &str = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.144.03  Thu Nov 28 08:09:50 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";

struct Node {
    dir: tempfile::TempDir,
    slept: Arc<Mutex<Vec<Duration>>>,
    cuda: HostCuda,
}

/// CUDA over host memory: `devices` devices, of which device 1 fails its first
/// `alloc_failures` allocations; counts the `cuInit` calls.
#[derive(Clone, Default)]
struct HostCuda {
    devices: usize,
    alloc_failures: Arc<Mutex<usize>>,
    inits: Arc<Mutex<usize>>,
}

struct HostDevice {
    ordinal: usize,
    alloc_failures: Arc<Mutex<usize>>,
}

impl CudaApi for HostCuda {
    fn init(&self) -> Result<(), CudaError> {
        *self.inits.lock().unwrap() += 1;
        Ok(())
    }
    fn device_count(&self) -> Result<usize, CudaError> {
        Ok(self.devices)
    }
    fn open(&self, ordinal: usize) -> Result<Box<dyn CudaDeviceApi>, CudaError> {
        Ok(Box::new(HostDevice {
            ordinal,
            alloc_failures: self.alloc_failures.clone(),
        }))
    }
}

impl CudaDeviceApi for HostDevice {
    fn device(&self) -> CudaDevice {
        CudaDevice {
            ordinal: self.ordinal,
            name: "NVIDIA H100 80GB HBM3".into(),
            uuid: format!("GPU-{}", self.ordinal),
        }
    }
    fn round_trip(&self, written: &[u8]) -> Result<Vec<u8>, CudaError> {
        let mut left = self.alloc_failures.lock().unwrap();
        if self.ordinal == 1 && *left > 0 {
            *left -= 1;
            return Err(CudaError::Call {
                call: "cuMemAllocAsync",
                name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
                description: "out of memory".into(),
            });
        }
        Ok(written.to_vec())
    }
}

impl Node {
    /// A root with a loaded 550.144.03 module and the host driver's NVML library.
    fn new() -> Self {
        let n = Self {
            dir: tempfile::tempdir().unwrap(),
            slept: Arc::default(),
            cuda: HostCuda {
                devices: 1,
                ..HostCuda::default()
            },
        };
        n.write("proc/driver/nvidia/version", PROC_550);
        n.write(
            "proc/devices",
            "Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n",
        );
        n.library("host", "550.144.03");
        n.write("dev/nvidiactl", "");
        // What the container runtime passes in (toolkit check) ...
        n.write("dev/nvidia-uvm", "");
        n.write("dev/nvidia-uvm-tools", "");
        // ... and the host's, made by the driver step when missing.
        n.write("host/dev/nvidia-uvm", "");
        n.write("host/dev/nvidia-uvm-tools", "");
        n
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// `<driver root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 -> libnvidia-ml.so.<version>`.
    fn library(&self, driver_root: &str, version: &str) {
        let dir = self.path(driver_root).join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&dir).unwrap();
        let real = format!("libnvidia-ml.so.{version}");
        std::fs::write(dir.join(&real), "").unwrap();
        std::os::unix::fs::symlink(&real, dir.join("libnvidia-ml.so.1")).unwrap();
    }

    fn validator(&self, fixture: &str, attempts: usize) -> Validator {
        let fixture = fixture.to_owned();
        self.validator_with(attempts, move || {
            Ok(Arc::new(FakeBackend::new(
                serde_yaml_ng::from_str(&fixture).unwrap(),
            )))
        })
    }

    fn validator_with(
        &self,
        attempts: usize,
        open: impl Fn() -> Result<Arc<dyn GpuInventory>, GpuError> + 'static,
    ) -> Validator {
        let slept = self.slept.clone();
        Validator {
            layout: Layout::new(self.root()),
            host: HostPaths::default(),
            retry: RetryPolicy {
                attempts,
                interval: Duration::from_secs(5),
                sleeper: Arc::new(move |d| slept.lock().unwrap().push(d)),
            },
            open_gpu: Box::new(move |_| open()),
            // Records the request in a regular file: `<path>` holding `major:minor`.
            make_node: Box::new(|path, major, minor| {
                std::fs::write(path, format!("{major}:{minor}"))
            }),
            cuda: Box::new(self.cuda.clone()),
        }
    }

    fn status(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.path("run/nvidia/validations").join(name)).ok()
    }

    fn sleeps(&self) -> Vec<Duration> {
        self.slept.lock().unwrap().clone()
    }
}

#[test]
fn chain_writes_each_status_file_with_upstream_content() {
    let node = Node::new();
    // Left over from an earlier run: the driver step must remove it (and later ones).
    node.write("run/nvidia/validations/cuda-ready", "");
    let v = node.validator(FIXTURE, 3);

    let driver = v.driver().unwrap();
    assert_eq!(driver.version, "550.144.03");
    assert_eq!(driver.gpus, ["GPU-11111111-2222-3333-4444-555555555555"]);
    assert!(driver.root.is_host_driver);
    assert_eq!(
        node.status("driver-ready").unwrap(),
        "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/host\nNVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n"
    );
    assert_eq!(node.status("cuda-ready"), None, "stale cuda-ready removed");

    let tk = v.toolkit().unwrap();
    assert_eq!(tk.gpus[0].1, "NVIDIA H100 80GB HBM3");
    assert_eq!(node.status("toolkit-ready").unwrap(), "");

    let cuda = v.cuda().unwrap();
    assert_eq!(cuda.gpu.cuda_version, "12.4");
    assert_eq!(
        cuda.devices
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["CUDA device 0 (NVIDIA H100 80GB HBM3, GPU-0)"]
    );
    assert_eq!(node.status("cuda-ready").unwrap(), "");

    let alloc: BTreeMap<String, String> = [("nvidia.com/gpu".into(), "5".into())].into();
    assert_eq!(
        v.plugin(&alloc, "gpu-node-1", ExpectedResource::Gpu)
            .unwrap(),
        5
    );
    assert_eq!(node.status("plugin-ready").unwrap(), "");
    assert!(node.sleeps().is_empty(), "everything was ready at once");

    let cleared = clear_ready_files(&v.layout).unwrap();
    assert_eq!(
        cleared,
        [
            "cuda-ready",
            "driver-ready",
            "plugin-ready",
            "toolkit-ready"
        ]
    );
    assert_eq!(node.status("driver-ready"), None);
}

#[test]
fn driver_library_and_kernel_module_mismatch_names_both_versions() {
    let node = Node::new();
    node.write(
        "proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build\n",
    );
    node.write(
        "run/nvidia/validations/driver-ready",
        "IS_HOST_DRIVER=true\n",
    );
    let v = node.validator(FIXTURE, 3);
    let err = v.driver().unwrap_err();
    let proc = node.path("proc/driver/nvidia/version");
    assert_eq!(
        kiln_validator::chain(&err),
        format!(
            "driver: not ready after 3 attempts over 10s: driver library version 550.144.03 \
             (libnvidia-ml, nvmlSystemGetDriverVersion) does not match the loaded kernel module \
             version 560.35.03 ({})",
            proc.display()
        )
    );
    assert_eq!(node.sleeps(), [Duration::from_secs(5); 2]);
    assert_eq!(
        node.status("driver-ready"),
        None,
        "stale driver-ready removed"
    );
}

#[test]
fn nvml_failing_to_open_with_an_older_library_reports_the_mismatch_from_the_file() {
    let node = Node::new();
    node.write(
        "proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  560.35.03  Tue Aug 20 2024\n",
    );
    let v = node.validator_with(1, || Err(GpuError::NoSuchDevice(0)));
    let err = v.driver().unwrap_err();
    let lib = node.path("host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
    assert_eq!(
        kiln_validator::chain(&err),
        format!(
            "driver: not ready after 1 attempt over 0s: driver library version 550.144.03 ({}) \
             does not match the loaded kernel module version 560.35.03 ({})",
            lib.display(),
            node.path("proc/driver/nvidia/version").display()
        )
    );
}

#[test]
fn driver_container_root_is_reported_when_the_host_has_no_driver() {
    let node = Node::new();
    std::fs::remove_dir_all(node.path("host")).unwrap();
    node.library("run/nvidia/driver", "550.144.03");
    let v = node.validator(FIXTURE, 1);
    let report = v.driver().unwrap();
    assert!(!report.root.is_host_driver);
    assert_eq!(
        node.status("driver-ready").unwrap(),
        "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\nDRIVER_ROOT_CTR_PATH=/run/nvidia/driver\nNVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n"
    );
}

#[test]
fn driver_waits_for_the_kernel_module_and_then_for_driver_files() {
    let node = Node::new();
    std::fs::remove_file(node.path("proc/driver/nvidia/version")).unwrap();
    let err = node.validator(FIXTURE, 2).driver().unwrap_err();
    assert!(
        kiln_validator::chain(&err).ends_with(&format!(
            "the NVIDIA kernel module is not loaded ({} does not exist)",
            node.path("proc/driver/nvidia/version").display()
        )),
        "{err}"
    );
    node.write("proc/driver/nvidia/version", PROC_550);
    std::fs::remove_dir_all(node.path("host")).unwrap();
    let err = node.validator(FIXTURE, 1).driver().unwrap_err();
    assert!(
        kiln_validator::chain(&err).contains("no NVIDIA driver found: neither the host root"),
        "{err}"
    );
}

#[test]
fn wait_for_gives_up_with_a_clear_timeout_and_succeeds_once_the_file_exists() {
    let node = Node::new();
    let v = node.validator(FIXTURE, 4);
    let err = v.wait_for("toolkit-ready").unwrap_err();
    assert!(matches!(err, ValidatorError::GaveUp { attempts: 4, .. }));
    assert_eq!(
        kiln_validator::chain(&err),
        format!(
            "wait: not ready after 4 attempts over 15s: {} does not exist yet",
            node.path("run/nvidia/validations/toolkit-ready").display()
        )
    );
    assert_eq!(node.sleeps().len(), 3);

    node.write("run/nvidia/validations/toolkit-ready", "");
    v.wait_for("toolkit-ready").unwrap();
    assert!(matches!(
        v.wait_for("../etc/passwd"),
        Err(ValidatorError::BadStatusName(_))
    ));
    let sleeps = node.sleeps().len();
    let err = v.wait_for("toolkit").unwrap_err();
    assert_eq!(
        err.to_string(),
        "`toolkit` is not a status file the validator writes (valid: driver-ready, \
         toolkit-ready, cuda-ready, plugin-ready, vfio-pci-ready, vgpu-manager-ready, \
         vgpu-devices-ready, cc-manager-ready)"
    );
    assert!(matches!(
        v.wait_for("bogus-ready"),
        Err(ValidatorError::BadStatusName(_))
    ));
    assert_eq!(
        node.sleeps().len(),
        sleeps,
        "an unknown name is not waited for"
    );
}

#[test]
fn toolkit_needs_the_control_device_and_cuda_needs_mig_devices() {
    let node = Node::new();
    std::fs::remove_file(node.path("dev/nvidiactl")).unwrap();
    let err = node.validator(FIXTURE, 1).toolkit().unwrap_err();
    assert!(
        kiln_validator::chain(&err).ends_with(
            "dev/nvidiactl is missing: the NVIDIA container runtime did not set up this container"
        ),
        "{err}"
    );
    assert_eq!(node.status(StatusFile::Toolkit.file_name()), None);

    let mig_no_devices = FIXTURE.replace(
        "compute_capability: \"9.0\"",
        "compute_capability: \"9.0\"\n    mig_enabled: true",
    );
    let err = node.validator(&mig_no_devices, 1).cuda().unwrap_err();
    assert!(
        kiln_validator::chain(&err).ends_with(
            "CUDA is not usable: GPU 0 (GPU-11111111-2222-3333-4444-555555555555) is in MIG mode but has no MIG devices"
        ),
        "{err}"
    );
}

#[test]
fn the_cuda_step_retries_a_failed_cuda_call_naming_device_and_call() {
    let mut node = Node::new();
    node.cuda = HostCuda {
        devices: 2,
        alloc_failures: Arc::new(Mutex::new(5)),
        ..HostCuda::default()
    };
    node.write("run/nvidia/validations/cuda-ready", "");
    let err = node.validator(FIXTURE, 3).cuda().unwrap_err();
    assert_eq!(
        kiln_validator::chain(&err),
        "cuda: not ready after 3 attempts over 10s: CUDA is not usable on CUDA device 1 \
         (NVIDIA H100 80GB HBM3, GPU-1): cuMemAllocAsync failed: CUDA_ERROR_OUT_OF_MEMORY (out \
         of memory)"
    );
    assert_eq!(node.status("cuda-ready"), None, "stale cuda-ready removed");
    assert_eq!(*node.cuda.inits.lock().unwrap(), 3);

    // Two failures left: the third attempt passes.
    let report = node.validator(FIXTURE, 3).cuda().unwrap();
    assert_eq!(report.devices.len(), 2);
    assert_eq!(node.status("cuda-ready").unwrap(), "");

    // WITH_WORKLOAD=false: no CUDA call at all.
    *node.cuda.alloc_failures.lock().unwrap() = 1;
    let inits = *node.cuda.inits.lock().unwrap();
    let report = node.validator(FIXTURE, 1).cuda_without_workload().unwrap();
    assert!(report.devices.is_empty());
    assert_eq!(*node.cuda.inits.lock().unwrap(), inits);
    assert_eq!(node.status("cuda-ready").unwrap(), "");
}

#[test]
fn the_driver_step_creates_missing_uvm_nodes_and_the_toolkit_step_requires_them() {
    let node = Node::new();
    for n in ["nvidia-uvm", "nvidia-uvm-tools"] {
        std::fs::remove_file(node.path(&format!("host/dev/{n}"))).unwrap();
    }
    // The nvidia-uvm module is not loaded: the driver step waits, naming what is missing.
    node.write("proc/devices", "Character devices:\n195 nvidia-frontend\n");
    let err = node.validator(FIXTURE, 2).driver().unwrap_err();
    let msg = kiln_validator::chain(&err);
    assert!(
        msg.ends_with(
            "host/dev/nvidia-uvm is missing and cannot be created: the nvidia-uvm kernel module is not loaded"
        ) || msg.contains("lists no nvidia-uvm character device"),
        "{msg}"
    );
    assert_eq!(node.status("driver-ready"), None);
    // Loaded: both nodes are made with its major, minors 0 and 1, and the step is ready.
    node.write(
        "proc/devices",
        "Character devices:\n195 nvidia-frontend\n237 nvidia-uvm\n",
    );
    node.validator(FIXTURE, 1).driver().unwrap();
    assert_eq!(
        std::fs::read_to_string(node.path("host/dev/nvidia-uvm")).unwrap(),
        "237:0"
    );
    assert_eq!(
        std::fs::read_to_string(node.path("host/dev/nvidia-uvm-tools")).unwrap(),
        "237:1"
    );
    assert!(node.status("driver-ready").is_some());
    // The runtime did not pass nvidia-uvm-tools into the toolkit container: not ready.
    std::fs::remove_file(node.path("dev/nvidia-uvm-tools")).unwrap();
    let err = node.validator(FIXTURE, 1).toolkit().unwrap_err();
    assert!(
        kiln_validator::chain(&err).ends_with(
            "dev/nvidia-uvm-tools is missing: the NVIDIA container runtime did not set up this container"
        ),
        "{err}"
    );
}

#[test]
fn plugin_waits_for_allocatable_gpus_of_the_mig_strategy() {
    let node = Node::new();
    let v = node.validator(FIXTURE, 2);
    let zero: BTreeMap<String, String> = [
        ("cpu".into(), "8".into()),
        ("nvidia.com/gpu".into(), "0".into()),
    ]
    .into();
    let err = v.plugin(&zero, "n1", ExpectedResource::Gpu).unwrap_err();
    assert!(
        kiln_validator::chain(&err).ends_with(
            "node n1 advertises no allocatable nvidia.com/gpu (allocatable GPU resources: nvidia.com/gpu=0)"
        ),
        "{err}"
    );
    let mixed: BTreeMap<String, String> = [
        ("nvidia.com/mig-1g.10gb".into(), "4".into()),
        ("nvidia.com/mig-3g.40gb".into(), "1".into()),
    ]
    .into();
    assert_eq!(
        v.plugin(&mixed, "n1", ExpectedResource::MigMixed).unwrap(),
        5
    );
    assert!(v.plugin(&mixed, "n1", ExpectedResource::Gpu).is_err());
    let shared: BTreeMap<String, String> = [("nvidia.com/gpu.shared".into(), "4".into())].into();
    assert_eq!(v.plugin(&shared, "n1", ExpectedResource::Gpu).unwrap(), 4);
}

#[test]
fn vfio_pci_requires_every_nvidia_gpu_bound_to_vfio() {
    let node = Node::new();
    let dev = |addr: &str, vendor: &str, class: &str, driver: &str| {
        let d = format!("sys/bus/pci/devices/{addr}");
        node.write(&format!("{d}/vendor"), &format!("{vendor}\n"));
        node.write(&format!("{d}/class"), &format!("{class}\n"));
        let drv = node.path(&format!("sys/bus/pci/drivers/{driver}"));
        std::fs::create_dir_all(&drv).unwrap();
        std::os::unix::fs::symlink(&drv, node.path(&format!("{d}/driver"))).unwrap();
    };
    dev("0000:3b:00.0", "0x10de", "0x030200", "vfio-pci");
    dev("0000:5e:00.0", "0x8086", "0x020000", "ixgbe");
    dev("0000:86:00.0", "0x10de", "0x030200", "nvidia");
    let v = node.validator(FIXTURE, 1);
    let err = v.vfio_pci().unwrap_err();
    assert!(
        kiln_validator::chain(&err)
            .ends_with("GPU 0000:86:00.0 is bound to nvidia instead of vfio-pci"),
        "{err}"
    );
    std::fs::remove_file(node.path("sys/bus/pci/devices/0000:86:00.0/driver")).unwrap();
    std::os::unix::fs::symlink(
        node.path("sys/bus/pci/drivers/vfio-pci"),
        node.path("sys/bus/pci/devices/0000:86:00.0/driver"),
    )
    .unwrap();
    assert_eq!(v.vfio_pci().unwrap(), ["0000:3b:00.0", "0000:86:00.0"]);
    assert_eq!(node.status("vfio-pci-ready").unwrap(), "");
}

#[test]
fn cc_manager_waits_for_the_ready_label() {
    let node = Node::new();
    let v = node.validator(FIXTURE, 1);
    let none: BTreeMap<String, String> = BTreeMap::new();
    let err = v.cc_manager(&none, "n1").unwrap_err();
    assert!(
        kiln_validator::chain(&err).ends_with(
            "node n1 has no nvidia.com/cc.ready.state label yet (set by the cc-manager)"
        ),
        "{err}"
    );
    let on: BTreeMap<String, String> = [("nvidia.com/cc.ready.state".into(), "true".into())].into();
    assert_eq!(v.cc_manager(&on, "n1").unwrap(), "true");
    assert_eq!(node.status("cc-manager-ready").unwrap(), "");
}
