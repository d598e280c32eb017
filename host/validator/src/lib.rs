//! `kiln-validator`: the readiness chain that kiln's `nvidia-operator-validator` DaemonSet runs
//! on every GPU node (`kiln validator driver|toolkit|cuda|plugin|hold`), the sandbox chain
//! (`vfio-pci`, `vgpu-manager`, `vgpu-devices`), and `kiln validator wait --for <file>` for
//! the other operands' init containers.
//!
//! ```text
//!  driver ──► toolkit ──► cuda ──► plugin ──► hold
//!    │           │          │         │
//!    ▼           ▼          ▼         ▼        <root>/run/nvidia/validations/
//!  driver-ready toolkit-ready cuda-ready plugin-ready
//! ```
//!
//! Each step removes the status files it makes stale, retries its check a bounded number of
//! times ([`RetryPolicy`], logging what it waits for and why), then writes its file with the
//! content upstream writes: `driver-ready` holds `KEY=value` lines ([`DriverReady`]); the
//! others are empty. Every path is under a configurable root ([`Layout`]) so the chain tests
//! against a temporary tree; GPUs come through `kiln_gpu` (a fake in tests), the CUDA driver
//! API through [`CudaApi`] ([`DynamicCuda`]: `libcuda.so.1` loaded at run time; a fake in
//! tests) and the node through [`NodeSource`].

mod cuda;
mod driver;
mod error;
mod layout;
mod nodes;
mod retry;
mod sandbox;
mod status;
mod steps;
mod uvm;
pub mod workload;

use std::sync::Arc;

use kiln_gpu::{GpuError, GpuInventory};

pub use cuda::{
    CHECK_BYTES, CUDA_LIBRARY, CudaApi, CudaDevice, CudaDeviceApi, CudaError, DynamicCuda,
    Mismatch, check_cuda_memory, classify_panic, error_name, first_mismatch, format_uuid, pattern,
};
pub use driver::{
    DriverReport, DriverRoot, GpuOpener, LIBRARY_DIRS, NVML_LIBRARY, check_driver, driver_ready,
    find_driver_root, find_nvml_library, kernel_module_version, parse_proc_version,
};
pub use error::{NotReady, ValidatorError};
pub use layout::{DRIVER_INSTALL_DIR, HOST_ROOT_CTR_PATH, HostPaths, Layout, VALIDATIONS_DIR};
pub use nodes::{KubeNodes, NodeSource};
pub use retry::{RetryPolicy, chain};
pub use sandbox::{PciGpu, check_vfio_pci, check_vgpu_devices, nvidia_pci_gpus};
pub use status::{DriverReady, StatusFile, clear_ready_files, remove_stale, write_status};
pub use steps::{
    CC_READY_LABEL, CudaReport, ExpectedResource, GpuReport, check_cc_manager, check_cuda,
    check_plugin, check_toolkit,
};
pub use uvm::{MakeNode, UVM_NODES, char_major, ensure_uvm_nodes, mknod_char};

/// Opens the GPU backend for a step: given the driver root the driver step found (`None`: NVML
/// as injected into this container), the inventory, or why it could not be opened.
pub type OpenGpu = Box<dyn Fn(Option<&DriverRoot>) -> Result<Arc<dyn GpuInventory>, GpuError>>;

/// The steps with what they need: where to look, how to retry, how to open the GPUs.
pub struct Validator {
    /// Paths under the root.
    pub layout: Layout,
    /// Host paths reported in `driver-ready`.
    pub host: HostPaths,
    /// Attempts and interval.
    pub retry: RetryPolicy,
    /// Opens the GPU backend; the driver step passes the driver root it found, the others
    /// `None` (NVML as injected into this container).
    pub open_gpu: OpenGpu,
    /// Creates the CUDA unified-memory device nodes the driver step finds missing
    /// ([`mknod_char`] in production).
    pub make_node: MakeNode,
    /// The CUDA driver API of the cuda step ([`DynamicCuda`] in production).
    pub cuda: Box<dyn CudaApi>,
}

impl std::fmt::Debug for Validator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validator")
            .field("layout", &self.layout)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl Validator {
    /// The driver step ([`check_driver`]), then, as upstream's, the CUDA unified-memory device
    /// nodes on the host ([`ensure_uvm_nodes`] under the host root, with the `nvidia-uvm` major
    /// of `<root>/proc/devices`); writes `driver-ready`.
    ///
    /// # Errors
    /// [`ValidatorError::GaveUp`] with the last reason (e.g. the version mismatch), or a
    /// status-file error.
    pub fn driver(&self) -> Result<DriverReport, ValidatorError> {
        remove_stale(&self.layout, StatusFile::Driver)?;
        let open = |root: &DriverRoot| (self.open_gpu)(Some(root));
        let report = self.retry.run("driver", "a usable NVIDIA driver", || {
            let report = check_driver(&self.layout, &open)?;
            ensure_uvm_nodes(
                &self.layout.host_root,
                &layout::under(&self.layout.root, "proc/devices"),
                &self.make_node,
            )?;
            Ok(report)
        })?;
        let content = driver_ready(&self.layout, &report.root, &self.host).render();
        write_status(&self.layout, StatusFile::Driver, &content)?;
        Ok(report)
    }

    /// The toolkit step ([`check_toolkit`]); writes an empty `toolkit-ready`.
    ///
    /// # Errors
    /// As [`Validator::driver`].
    pub fn toolkit(&self) -> Result<GpuReport, ValidatorError> {
        remove_stale(&self.layout, StatusFile::Toolkit)?;
        let open = || (self.open_gpu)(None);
        let report = self.retry.run(
            "toolkit",
            "the NVIDIA container runtime to inject the driver",
            || check_toolkit(&self.layout, &open),
        )?;
        write_status(&self.layout, StatusFile::Toolkit, "")?;
        Ok(report)
    }

    /// The cuda step, as upstream's with its default `WITH_WORKLOAD=true`: the prerequisites
    /// NVML reports ([`check_cuda`]), then a CUDA context on every device with
    /// [`CHECK_BYTES`] allocated, written and read back ([`check_cuda_memory`] with the
    /// validator's [`CudaApi`]), both retried together; writes an empty `cuda-ready`.
    ///
    /// # Errors
    /// As [`Validator::driver`]; the last reason names the device and the CUDA call that
    /// failed, or that `libcuda.so.1` cannot be loaded.
    pub fn cuda(&self) -> Result<CudaReport, ValidatorError> {
        self.cuda_step(true)
    }

    /// The cuda step with `WITH_WORKLOAD=false`: upstream then runs no `vectorAdd` pod, so no
    /// CUDA context is created; the NVML prerequisites ([`check_cuda`]) are still checked.
    /// Writes an empty `cuda-ready`.
    ///
    /// # Errors
    /// As [`Validator::driver`].
    pub fn cuda_without_workload(&self) -> Result<CudaReport, ValidatorError> {
        self.cuda_step(false)
    }

    fn cuda_step(&self, with_workload: bool) -> Result<CudaReport, ValidatorError> {
        remove_stale(&self.layout, StatusFile::Cuda)?;
        let open = || (self.open_gpu)(None);
        let report = self.retry.run("cuda", "CUDA to be usable", || {
            let gpu = check_cuda(&open)?;
            let devices = if with_workload {
                check_cuda_memory(&*self.cuda, CHECK_BYTES)?
            } else {
                tracing::info!("WITH_WORKLOAD=false: no CUDA context created");
                Vec::new()
            };
            Ok(CudaReport { gpu, devices })
        })?;
        write_status(&self.layout, StatusFile::Cuda, "")?;
        Ok(report)
    }

    /// The plugin step ([`check_plugin`]); writes an empty `plugin-ready`. Returns the units
    /// advertised.
    ///
    /// # Errors
    /// As [`Validator::driver`].
    pub fn plugin(
        &self,
        nodes: &dyn NodeSource,
        node: &str,
        expected: ExpectedResource,
    ) -> Result<u64, ValidatorError> {
        self.plugin_step(nodes, node, expected, None)
    }

    /// The plugin step with upstream's `WITH_WORKLOAD=true`: once the node advertises the
    /// resource, a workload pod ([`workload`]) requesting one unit of it must run to success
    /// on the node ([`NodeSource::run_workload`]); both are retried together. Writes an empty
    /// `plugin-ready`. Returns the units advertised.
    ///
    /// # Errors
    /// As [`Validator::driver`]; the last reason names what is missing (the resource, or the
    /// workload pod's failing container and its reason).
    pub fn plugin_with_workload(
        &self,
        nodes: &dyn NodeSource,
        node: &str,
        expected: ExpectedResource,
        spec: &workload::WorkloadSpec,
    ) -> Result<u64, ValidatorError> {
        self.plugin_step(nodes, node, expected, Some(spec))
    }

    fn plugin_step(
        &self,
        nodes: &dyn NodeSource,
        node: &str,
        expected: ExpectedResource,
        spec: Option<&workload::WorkloadSpec>,
    ) -> Result<u64, ValidatorError> {
        remove_stale(&self.layout, StatusFile::Plugin)?;
        let what = match spec {
            None => format!("the device plugin to advertise GPUs on node {node}"),
            Some(_) => format!("a GPU workload pod to run on node {node}"),
        };
        let units = self.retry.run("plugin", &what, || {
            let units = check_plugin(nodes, node, expected)?;
            if let Some(spec) = spec {
                let alloc = nodes.allocatable(node).map_err(|message| NotReady::Kube {
                    node: node.to_owned(),
                    message,
                })?;
                let resource = workload::resource_name(&alloc, expected).ok_or_else(|| {
                    NotReady::Workload(format!("node {node} advertises no GPU resource to request"))
                })?;
                nodes
                    .run_workload(spec, &resource)
                    .map_err(NotReady::Workload)?;
            }
            Ok(units)
        })?;
        write_status(&self.layout, StatusFile::Plugin, "")?;
        Ok(units)
    }

    /// The vfio-pci step ([`check_vfio_pci`]); writes an empty `vfio-pci-ready`.
    ///
    /// # Errors
    /// As [`Validator::driver`].
    pub fn vfio_pci(&self) -> Result<Vec<String>, ValidatorError> {
        remove_stale(&self.layout, StatusFile::VfioPci)?;
        let found = self.retry.run("vfio-pci", "GPUs bound to vfio-pci", || {
            check_vfio_pci(&self.layout)
        })?;
        write_status(&self.layout, StatusFile::VfioPci, "")?;
        Ok(found)
    }

    /// The vgpu-manager step: the vGPU manager is a driver, so this is the kernel-module
    /// check of the driver step (loaded, version readable); writes an empty
    /// `vgpu-manager-ready`. Returns the version.
    ///
    /// # Errors
    /// As [`Validator::driver`].
    pub fn vgpu_manager(&self) -> Result<String, ValidatorError> {
        remove_stale(&self.layout, StatusFile::VgpuManager)?;
        let v = self
            .retry
            .run("vgpu-manager", "the vGPU manager kernel module", || {
                kernel_module_version(&self.layout)
            })?;
        write_status(&self.layout, StatusFile::VgpuManager, "")?;
        Ok(v)
    }

    /// The vgpu-devices step ([`check_vgpu_devices`]); writes an empty `vgpu-devices-ready`.
    ///
    /// # Errors
    /// As [`Validator::driver`].
    pub fn vgpu_devices(&self) -> Result<usize, ValidatorError> {
        remove_stale(&self.layout, StatusFile::VgpuDevices)?;
        let n = self.retry.run("vgpu-devices", "vGPU devices", || {
            check_vgpu_devices(&self.layout)
        })?;
        write_status(&self.layout, StatusFile::VgpuDevices, "")?;
        Ok(n)
    }

    /// The cc-manager step ([`check_cc_manager`]); writes an empty `cc-manager-ready`.
    ///
    /// # Errors
    /// As [`Validator::driver`].
    pub fn cc_manager(&self, nodes: &dyn NodeSource, node: &str) -> Result<String, ValidatorError> {
        remove_stale(&self.layout, StatusFile::CcManager)?;
        let what = format!("the cc-manager to apply the CC mode on node {node}");
        let v = self
            .retry
            .run("cc-manager", &what, || check_cc_manager(nodes, node))?;
        write_status(&self.layout, StatusFile::CcManager, "")?;
        Ok(v)
    }

    /// `wait --for <name>`: polls for `<validations_dir>/<name>` with the retry policy
    /// (replaces the `until [ -f … ]; do sleep 5; done` loops of upstream's init containers,
    /// which never give up).
    ///
    /// # Errors
    /// [`ValidatorError::BadStatusName`] for a name that is not one of
    /// [`StatusFile::file_names`] (it would never appear: waiting for it could only time
    /// out); [`ValidatorError::GaveUp`] with [`NotReady::FileAbsent`] when it never appears.
    pub fn wait_for(&self, name: &str) -> Result<(), ValidatorError> {
        if StatusFile::from_file_name(name).is_none() {
            return Err(ValidatorError::BadStatusName(name.to_owned()));
        }
        let path = self.layout.status_file(name);
        let what = format!("{name} (written when that part of the GPU stack is ready)");
        self.retry.run("wait", &what, || {
            if path.exists() {
                Ok(())
            } else {
                Err(NotReady::FileAbsent { path: path.clone() })
            }
        })
    }
}
