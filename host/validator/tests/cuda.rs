//! The cuda step with the real CUDA driver API ([`DynamicCuda`]): where this machine has no
//! `libcuda.so.1` (CI, a developer's machine) the step fails with the error that names the
//! library, attempt after attempt, and never panics; where it has one, the step either passes
//! or names the device and the call.

use std::{sync::Arc, time::Duration};

use kiln_gpu::FakeBackend;
use kiln_validator::{
    CUDA_LIBRARY, CudaApi, CudaError, DynamicCuda, HostPaths, Layout, NotReady, RetryPolicy,
    Validator, ValidatorError,
};

/// Whether the dynamic loader can find `libcuda.so.1` here: in `LD_LIBRARY_PATH` or the
/// loader's cache (what `dlopen` reads besides the system directories the cache lists).
fn has_libcuda() -> bool {
    let in_path = std::env::var("LD_LIBRARY_PATH").is_ok_and(|p| {
        p.split(':')
            .any(|d| !d.is_empty() && std::path::Path::new(d).join(CUDA_LIBRARY).exists())
    });
    let cached = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|c| std::process::Command::new(c).arg("-p").output().ok())
        .is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains(CUDA_LIBRARY));
    in_path || cached
}

#[test]
fn without_libcuda_the_step_names_the_library_on_every_attempt_and_does_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let v = Validator {
        layout: Layout::new(dir.path()),
        host: HostPaths::default(),
        retry: RetryPolicy {
            attempts: 2,
            interval: Duration::ZERO,
            sleeper: Arc::new(|_| {}),
        },
        open_gpu: Box::new(|_| {
            Ok(Arc::new(FakeBackend::new(
                serde_yaml_ng::from_str(kiln_gpu::fixtures::ONE_H100).unwrap(),
            )))
        }),
        make_node: Box::new(|_, _, _| Ok(())),
        cuda: Box::new(DynamicCuda),
    };
    let result = v.cuda();
    let cuda_ready = dir.path().join("run/nvidia/validations/cuda-ready");
    if has_libcuda() {
        // A GPU machine: the step may pass; if not, the reason is a named CUDA failure.
        match result {
            Ok(report) => {
                assert!(!report.devices.is_empty());
                assert!(cuda_ready.exists());
            }
            Err(ValidatorError::GaveUp { last, .. }) => assert!(
                matches!(
                    *last,
                    NotReady::CudaApi { .. } | NotReady::CudaMemory { .. } | NotReady::Cuda(_)
                ),
                "{last:?}"
            ),
            Err(e) => panic!("{e:?}"),
        }
        return;
    }
    let err = result.unwrap_err();
    let text = kiln_validator::chain(&err);
    assert!(
        text.starts_with("cuda: not ready after 2 attempts over 0s: CUDA is not usable: libcuda.so.1 cannot be loaded (nor any of the ")
            && text.ends_with(
                " other names tried): this step needs the driver step to have found the NVIDIA \
                 driver and the toolkit step the NVIDIA container runtime, which injects it into \
                 this container and puts libcuda.so.1 on the library path"
            ),
        "{text}"
    );
    assert!(!cuda_ready.exists());
    // The loader is asked again on the next attempt (and by the next call).
    assert!(matches!(
        DynamicCuda.init(),
        Err(CudaError::NoLibrary { tried }) if tried > 1
    ));
}
