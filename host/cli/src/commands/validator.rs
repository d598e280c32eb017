//! `kiln validator`: the node readiness chain (driver → toolkit → cuda → plugin → hold), the
//! sandbox chain, and `wait --for <file>` for other operands' init containers. Status files go
//! to `<root>/run/nvidia/validations` (see `kiln_validator`).

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use kiln_gpu::BackendSpec;
use kiln_validator::{
    ExpectedResource, HostPaths, KubeNodes, Layout, RetryPolicy, StatusFile, Validator,
    clear_ready_files,
};

/// Flags shared by every `kiln validator` subcommand.
#[derive(Debug, clap::Args)]
pub struct ValidatorArgs {
    /// Container root under which every path is looked up (tests use a temporary tree).
    #[arg(long, global = true, env = "KILN_VALIDATOR_ROOT", default_value = "/")]
    root: PathBuf,
    /// Status-file directory; default `<root>/run/nvidia/validations`.
    #[arg(long, global = true, env = "KILN_VALIDATOR_VALIDATIONS_DIR")]
    validations_dir: Option<PathBuf>,
    /// Where the host's `/` is mounted; default `<root>/host`. `/` on a bare machine.
    #[arg(long, global = true, env = "KILN_VALIDATOR_HOST_ROOT")]
    host_root: Option<PathBuf>,
    /// The host root as the host sees it, written to driver-ready (upstream `HOST_ROOT`).
    #[arg(long, global = true, env = "HOST_ROOT", default_value = "/")]
    host_root_on_host: String,
    /// The driver container's install dir on the host (upstream `DRIVER_INSTALL_DIR`).
    #[arg(
        long,
        global = true,
        env = "DRIVER_INSTALL_DIR",
        default_value = "/run/nvidia/driver"
    )]
    driver_install_dir: String,
    #[arg(
        long,
        global = true,
        help = super::GPU_BACKEND_HELP,
        env = "KILN_VALIDATOR_GPU_BACKEND",
        default_value = "nvml"
    )]
    gpu_backend: BackendSpec,
    /// Attempts per step before giving up (the pod's restart policy retries after that);
    /// 1 to 1000000.
    #[arg(
        long,
        global = true,
        env = "KILN_VALIDATOR_RETRIES",
        default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..=1_000_000)
    )]
    retries: u64,
    /// Seconds between attempts (upstream `SLEEP_INTERVAL_SECONDS`); at most 31622400 (366
    /// days).
    #[arg(
        long,
        global = true,
        env = "SLEEP_INTERVAL_SECONDS",
        default_value_t = 5,
        value_parser = clap::value_parser!(u64).range(0..=kiln_input::MAX_DURATION_SECS)
    )]
    sleep_interval_seconds: u64,
    #[command(subcommand)]
    step: Step,
}

#[derive(Debug, clap::Subcommand)]
enum Step {
    /// NVML opens and its driver version equals the loaded kernel module's; writes driver-ready.
    Driver,
    /// The NVIDIA container runtime injected the driver into this container; writes toolkit-ready.
    Toolkit,
    /// CUDA prerequisites (CUDA version, compute capability, MIG devices), then a CUDA context
    /// on every device with 16 MiB allocated, written and read back; writes cuda-ready.
    Cuda {
        /// `false`: create no CUDA context, only check the prerequisites (upstream then runs
        /// no vectorAdd pod).
        #[arg(
            long,
            env = "WITH_WORKLOAD",
            default_value_t = true,
            action = clap::ArgAction::Set,
            value_parser = clap::builder::BoolishValueParser::new()
        )]
        with_workload: bool,
    },
    /// The node advertises allocatable GPUs; writes plugin-ready.
    Plugin {
        /// This node (downward API).
        #[arg(long, env = "NODE_NAME")]
        node_name: String,
        /// The device plugin's MIG strategy: `mixed` expects `nvidia.com/mig-*`.
        #[arg(long, env = "MIG_STRATEGY", default_value = "single")]
        mig_strategy: String,
        /// Also run a pod requesting one GPU on this node to success (upstream's workload
        /// check; its image etc. from VALIDATOR_IMAGE*, its namespace OPERATOR_NAMESPACE).
        #[arg(long, env = "WITH_WORKLOAD")]
        with_workload: bool,
    },
    /// The cc-manager has labelled the node nvidia.com/cc.ready.state; writes cc-manager-ready.
    CcManager {
        /// This node (downward API).
        #[arg(long, env = "NODE_NAME")]
        node_name: String,
    },
    /// Every NVIDIA GPU is bound to vfio-pci; writes vfio-pci-ready.
    VfioPci,
    /// The vGPU manager's kernel module is loaded; writes vgpu-manager-ready.
    VgpuManager,
    /// vGPU devices exist; writes vgpu-devices-ready.
    VgpuDevices,
    /// Wait for another step's status file, e.g. `--for toolkit-ready`.
    Wait {
        /// The status file name: one the validator writes (any other would never appear).
        #[arg(
            long = "for",
            value_parser = clap::builder::PossibleValuesParser::new(StatusFile::file_names())
        )]
        file: String,
    },
    /// Stay up until SIGTERM, then remove the `*-ready` files (upstream's preStop hook).
    Hold,
}

impl ValidatorArgs {
    /// Runs the chosen step; a step that gives up is an error (exit 1).
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let mut layout = Layout::new(&self.root);
        if let Some(d) = self.validations_dir {
            layout.validations_dir = d;
        }
        if let Some(h) = self.host_root {
            layout.host_root = h;
        }
        let spec = self.gpu_backend.clone();
        let v = Validator {
            layout,
            host: HostPaths {
                host_root: self.host_root_on_host,
                driver_install_dir: self.driver_install_dir,
            },
            retry: RetryPolicy::new(
                usize::try_from(self.retries).unwrap_or(usize::MAX),
                Duration::from_secs(self.sleep_interval_seconds),
            ),
            open_gpu: Box::new(move |root| open_gpu(&spec, root)),
            make_node: Box::new(kiln_validator::mknod_char),
            cuda: Box::new(kiln_validator::DynamicCuda),
        };
        match self.step {
            Step::Driver => {
                let r = v.driver()?;
                super::outln!(
                    "driver {} ok ({} driver, root {}), GPUs: {}",
                    r.version,
                    if r.root.is_host_driver {
                        "host"
                    } else {
                        "container"
                    },
                    r.root.path.display(),
                    r.gpus.join(", ")
                );
            }
            Step::Toolkit => {
                let r = v.toolkit()?;
                super::outln!(
                    "toolkit ok: {} GPU(s) visible in this container",
                    r.gpus.len()
                );
            }
            Step::Cuda { with_workload } => {
                let r = if with_workload {
                    v.cuda()?
                } else {
                    v.cuda_without_workload()?
                };
                super::outln!(
                    "cuda {} ok on {} GPU(s)",
                    r.gpu.cuda_version,
                    r.gpu.gpus.len()
                );
                for device in &r.devices {
                    super::outln!(
                        "{device}: context created, {} MiB allocated, written and read back",
                        kiln_validator::CHECK_BYTES >> 20
                    );
                }
            }
            Step::Plugin {
                node_name,
                mig_strategy,
                with_workload,
            } => {
                let nodes = KubeNodes::connect().context("connecting to the API server")?;
                let expected = ExpectedResource::from_mig_strategy(&mig_strategy);
                let units = if with_workload {
                    let spec = kiln_validator::workload::WorkloadSpec::from_env(&node_name, |k| {
                        std::env::var(k).ok()
                    })
                    .map_err(anyhow::Error::msg)?;
                    v.plugin_with_workload(&nodes, &node_name, expected, &spec)?
                } else {
                    v.plugin(&nodes, &node_name, expected)?
                };
                let ran = if with_workload {
                    " and ran a GPU workload pod"
                } else {
                    ""
                };
                super::outln!("plugin ok: node {node_name} advertises {units} GPU unit(s){ran}");
            }
            Step::CcManager { node_name } => {
                let nodes = KubeNodes::connect().context("connecting to the API server")?;
                let state = v.cc_manager(&nodes, &node_name)?;
                super::outln!(
                    "cc-manager ok: {} = {state}",
                    kiln_validator::CC_READY_LABEL
                );
            }
            Step::VfioPci => super::outln!("vfio-pci ok: {}", v.vfio_pci()?.join(", ")),
            Step::VgpuManager => super::outln!("vgpu-manager {} ok", v.vgpu_manager()?),
            Step::VgpuDevices => super::outln!("vgpu-devices ok: {}", v.vgpu_devices()?),
            Step::Wait { file } => {
                v.wait_for(&file)?;
                super::outln!("{file} present");
            }
            Step::Hold => {
                super::outln!("all validations are successful; holding until SIGTERM");
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("starting the async runtime")?
                    .block_on(super::termination());
                let removed = clear_ready_files(&v.layout)?;
                super::outln!("removed {}", removed.join(", "));
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Env var set on the re-executed process so it re-executes at most once.
const REEXEC_GUARD: &str = "KILN_VALIDATOR_DRIVER_LIBS";

/// Opens the GPU backend. In the driver step NVML usually is not in this container (the
/// toolkit is not set up yet) but in the driver root it found (`/host/usr/lib/…` or
/// `/run/nvidia/driver/usr/lib/…`); the dynamic loader reads `LD_LIBRARY_PATH` only at start,
/// so the process re-executes itself once with that library directory on it. Upstream
/// chroots into the driver root to run `nvidia-smi` instead.
fn open_gpu(
    spec: &BackendSpec,
    root: Option<&kiln_validator::DriverRoot>,
) -> Result<std::sync::Arc<dyn kiln_gpu::GpuInventory>, kiln_gpu::GpuError> {
    let err = match kiln_gpu::open(spec) {
        Err(e @ kiln_gpu::GpuError::NvmlInit(_)) => e,
        other => return other,
    };
    let lib_dir = root.and_then(|r| r.nvml_library.parent());
    if let (BackendSpec::Nvml, Some(dir), None) = (spec, lib_dir, std::env::var_os(REEXEC_GUARD)) {
        use std::os::unix::process::CommandExt as _;
        let mut path = std::ffi::OsString::from(dir);
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            path.push(":");
            path.push(old);
        }
        eprintln!(
            "NVML not loadable here; re-running with LD_LIBRARY_PATH={}",
            path.to_string_lossy()
        );
        let exe = std::env::current_exe().unwrap_or_else(|_| "kiln".into());
        let e = std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env("LD_LIBRARY_PATH", &path)
            .env(REEXEC_GUARD, dir)
            .exec();
        eprintln!("re-exec failed: {e}");
    }
    Err(err)
}
