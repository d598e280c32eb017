//! Errors: [`NotReady`] is why one attempt of a step failed (retried); [`ValidatorError`] is
//! why a step gave up or could not record its result.

use std::{path::PathBuf, time::Duration};

/// Why one attempt of a step found the node not ready. Each is retried; the last one is
/// reported in [`ValidatorError::GaveUp`].
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    /// `/proc/driver/nvidia/version` is absent: no NVIDIA kernel module is loaded.
    #[error("the NVIDIA kernel module is not loaded ({} does not exist)", path.display())]
    NoKernelModule {
        /// The proc file looked at.
        path: PathBuf,
    },
    /// The proc file exists but has no `NVRM version` line with a version in it.
    #[error("cannot read the kernel module version from {}: {reason}", path.display())]
    BadProcVersion {
        /// The proc file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// Neither the host root nor the driver container's install dir holds the NVML library.
    #[error(
        "no NVIDIA driver found: neither the host root {} nor the driver container's install dir {} holds libnvidia-ml.so.1 (waiting for the driver container to install it)",
        host_root.display(), driver_install_dir.display()
    )]
    NoDriverFiles {
        /// The host root looked at.
        host_root: PathBuf,
        /// The driver install dir looked at.
        driver_install_dir: PathBuf,
    },
    /// The user-space driver library and the loaded kernel module are different versions.
    #[error(
        "driver library version {library} ({library_source}) does not match the loaded kernel module version {kernel} ({})",
        proc_path.display()
    )]
    VersionMismatch {
        /// The library's version.
        library: String,
        /// Where the library version came from (NVML, or the library file name).
        library_source: String,
        /// The kernel module's version.
        kernel: String,
        /// The proc file the kernel version came from.
        proc_path: PathBuf,
    },
    /// NVML could not be opened or answered with an error.
    #[error("NVML is not usable")]
    Nvml(#[source] kiln_gpu::GpuError),
    /// NVML answered but lists no GPU.
    #[error("NVML lists no GPU")]
    NoGpus,
    /// A device node the NVIDIA container runtime creates is missing.
    #[error("{} is missing: the NVIDIA container runtime did not set up this container", path.display())]
    MissingDeviceNode {
        /// The device node.
        path: PathBuf,
    },
    /// A CUDA unified-memory device node is missing and could not be created.
    #[error("{} is missing and cannot be created: {reason}", path.display())]
    UvmNodes {
        /// The device node.
        path: PathBuf,
        /// What is missing (the kernel module, or the permission).
        reason: String,
    },
    /// A CUDA prerequisite is missing.
    #[error("CUDA is not usable: {0}")]
    Cuda(String),
    /// The CUDA driver API failed ([`crate::cuda`]): loading `libcuda.so.1`, `cuInit`, or a
    /// call on a device.
    #[error(
        "CUDA is not usable{}",
        device.as_ref().map(|d| format!(" on {d}")).unwrap_or_default()
    )]
    CudaApi {
        /// The device the call was made on; `None` before any device (loading, `cuInit`,
        /// `cuDeviceGetCount`).
        device: Option<Box<crate::CudaDevice>>,
        /// What failed: the library, a symbol, or the call with its CUDA error name.
        #[source]
        source: crate::CudaError,
    },
    /// A device's memory read back differs from what was written to it.
    #[error("CUDA is not usable on {device}: {mismatch}")]
    CudaMemory {
        /// The device.
        device: Box<crate::CudaDevice>,
        /// Where and how much.
        mismatch: crate::Mismatch,
    },
    /// The node does not (yet) advertise the GPU resource.
    #[error("node {node} advertises no allocatable {wanted} (allocatable GPU resources: {have})")]
    NoAllocatable {
        /// The node.
        node: String,
        /// What was looked for, e.g. `nvidia.com/gpu` or `nvidia.com/mig-*`.
        wanted: String,
        /// The `nvidia.com/*` allocatable entries seen, or `none`.
        have: String,
    },
    /// The API server could not be asked.
    #[error("reading node {node} from the API server: {message}")]
    Kube {
        /// The node.
        node: String,
        /// The client's error, with its causes.
        message: String,
    },
    /// A status file another step writes is not there yet.
    #[error("{} does not exist yet", path.display())]
    FileAbsent {
        /// The file waited for.
        path: PathBuf,
    },
    /// The plugin step's workload pod did not run to success ([`crate::workload`]).
    #[error("GPU workload pod: {0}")]
    Workload(String),
    /// A sysfs check found the node not in the wanted state.
    #[error("{0}")]
    Sysfs(String),
}

/// Why a validator command failed.
#[derive(Debug, thiserror::Error)]
pub enum ValidatorError {
    /// Every attempt found the node not ready; `last` is the last reason.
    #[error(
        "{step}: not ready after {attempts} attempt{} over {}",
        if *attempts == 1 { "" } else { "s" },
        human_duration(*waited)
    )]
    GaveUp {
        /// The step, e.g. `driver`.
        step: &'static str,
        /// Attempts made.
        attempts: usize,
        /// Time spent sleeping between attempts.
        waited: Duration,
        /// The last attempt's reason (boxed: it carries paths and texts, and every step
        /// returns this error).
        #[source]
        last: Box<NotReady>,
    },
    /// A status file could not be written.
    #[error("writing status file {}", path.display())]
    StatusWrite {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// A stale status file could not be removed.
    #[error("removing status file {}", path.display())]
    StatusRemove {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// `wait --for` was given a name that is not one of the status files the validator
    /// writes ([`crate::StatusFile::file_names`]).
    #[error(
        "`{0}` is not a status file the validator writes (valid: {valid})",
        valid = crate::StatusFile::file_names().join(", ")
    )]
    BadStatusName(String),
}

/// `d` for people: `0s`, `750ms`, `15s`, `5m`, `1m 30s`, `2h 5m` (whole milliseconds below a
/// second, whole seconds above; zero parts are left out).
#[must_use]
pub fn human_duration(d: Duration) -> String {
    let total = d.as_secs();
    if total == 0 {
        let ms = d.as_millis();
        return if ms == 0 {
            "0s".to_owned()
        } else {
            format!("{ms}ms")
        };
    }
    let (h, m, s) = (total / 3600, total / 60 % 60, total % 60);
    [(h, "h"), (m, "m"), (s, "s")]
        .iter()
        .filter(|(v, _)| *v > 0)
        .map(|(v, unit)| format!("{v}{unit}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_duration_drops_zero_parts_and_keeps_milliseconds_below_a_second() {
        let f = |ms| human_duration(Duration::from_millis(ms));
        assert_eq!(f(0), "0s");
        assert_eq!(f(750), "750ms");
        assert_eq!(f(15_000), "15s");
        assert_eq!(f(15_400), "15s");
        assert_eq!(f(300_000), "5m");
        assert_eq!(f(90_000), "1m 30s");
        assert_eq!(f(7_500_000), "2h 5m");
        assert_eq!(f(3_601_000), "1h 1s");
    }

    #[test]
    fn gave_up_says_attempt_in_the_singular_for_one() {
        let e = |attempts| ValidatorError::GaveUp {
            step: "wait",
            attempts,
            waited: Duration::from_secs(300),
            last: Box::new(NotReady::Sysfs("x".into())),
        };
        assert_eq!(e(1).to_string(), "wait: not ready after 1 attempt over 5m");
        assert_eq!(
            e(60).to_string(),
            "wait: not ready after 60 attempts over 5m"
        );
    }
}
