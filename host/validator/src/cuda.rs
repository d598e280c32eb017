//! The cuda step's CUDA check: the CUDA driver API (`libcuda.so.1`, loaded at run time) must
//! initialise (`cuInit`), and on every device it enumerates a context must be created, then
//! [`CHECK_BYTES`] of device memory allocated, written from the host, read back equal to what
//! was written, and freed. The first failure names the device and the driver API call, with
//! CUDA's error name (`CUDA_ERROR_OUT_OF_MEMORY`).
//!
//! Upstream's cuda step runs the CUDA sample `vectorAdd` in a pod
//! (`validator/manifests/cuda-workload-validation.yaml`): on the first device, three vectors of
//! 50,000 floats are allocated, copied to the device, added by a kernel and copied back. kiln's
//! image holds no CUDA kernel and no toolkit; it makes the same driver calls short of a kernel
//! launch (context, allocation, both copies, free) and does so on every device CUDA lists.
//!
//! The API comes through [`CudaApi`]: [`DynamicCuda`] in production (cudarc's driver bindings,
//! which `dlopen` the library on first use, so kiln needs no CUDA to build and holds no
//! `unsafe` of its own), a fake in tests. cudarc panics where the library or one of its
//! symbols is missing; [`DynamicCuda`] catches that panic and returns it as a [`CudaError`]
//! (so the workspace must keep `panic = "unwind"`, which a build with `abort` is refused for).

use std::{
    panic::AssertUnwindSafe,
    sync::{Arc, Once},
};

use cudarc::driver::{CudaContext, DriverError, result};

use crate::NotReady;

#[cfg(panic = "abort")]
compile_error!(
    "kiln-validator catches cudarc's panic for a missing libcuda.so.1; build with panic = \"unwind\""
);

/// The library the CUDA driver API is loaded from, as the dynamic loader is asked for it (the
/// name the NVIDIA container runtime injects and the driver installs).
pub const CUDA_LIBRARY: &str = "libcuda.so.1";

/// Bytes allocated, written and read back on each device: 16 MiB.
pub const CHECK_BYTES: usize = 16 << 20;

/// A CUDA device as the check names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CudaDevice {
    /// CUDA's ordinal (its enumeration order, which may differ from NVML's index).
    pub ordinal: usize,
    /// `cuDeviceGetName` (`NVIDIA H100 80GB HBM3`); empty when not known.
    pub name: String,
    /// `cuDeviceGetUuid` as NVML writes UUIDs (`GPU-…`, [`format_uuid`]); empty when not known.
    pub uuid: String,
}

impl std::fmt::Display for CudaDevice {
    /// `CUDA device 0 (NVIDIA H100 80GB HBM3, GPU-…)`; parts not known are left out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CUDA device {}", self.ordinal)?;
        let known: Vec<&str> = [self.name.as_str(), self.uuid.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
        if !known.is_empty() {
            write!(f, " ({})", known.join(", "))?;
        }
        Ok(())
    }
}

/// Why the CUDA driver API could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// The dynamic loader found no CUDA driver library.
    #[error(
        "{CUDA_LIBRARY} cannot be loaded{}: this step needs the driver step to have found the \
         NVIDIA driver and the toolkit step the NVIDIA container runtime, which injects it into \
         this container and puts {CUDA_LIBRARY} on the library path",
        if *tried > 1 { format!(" (nor any of the {} other names tried)", tried - 1) } else { String::new() }
    )]
    NoLibrary {
        /// How many library names the loader was asked for (`libcuda.so.1` among them; cudarc
        /// also tries `libcuda.so`, versioned and Windows-style names); 0 when not known.
        tried: usize,
    },
    /// The library has no symbol the check calls: a driver older than the API it uses.
    #[error("{CUDA_LIBRARY} has no {symbol}: the driver is older than the CUDA API it provides")]
    MissingSymbol {
        /// The symbol, e.g. `cuMemAllocAsync`.
        symbol: String,
    },
    /// A driver API call returned an error.
    #[error("{call} failed: {name}{}", if description.is_empty() { String::new() } else { format!(" ({description})") })]
    Call {
        /// The call, as the driver API names it (`cuMemAlloc_v2`).
        call: &'static str,
        /// The `CUresult` name (`CUDA_ERROR_OUT_OF_MEMORY`).
        name: String,
        /// `cuGetErrorString`'s text (`out of memory`); empty when not known.
        description: String,
    },
    /// The bindings panicked for another reason (their message).
    #[error("the CUDA bindings panicked: {0}")]
    Panicked(String),
}

/// Where the memory read back first differs from what was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// Bytes written.
    pub written: usize,
    /// Bytes read back.
    pub read: usize,
    /// The first differing offset (the shorter length when the lengths differ).
    pub offset: usize,
    /// The byte written there.
    pub expected: u8,
    /// The byte read there; `None` past the end of what was read.
    pub got: Option<u8>,
    /// How many offsets differ (within the shorter length, plus the length difference).
    pub differing: usize,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the {} bytes read back from device memory differ from the {} written: {} {}, the \
             first at offset {} (wrote {:#04x}, read ",
            self.read,
            self.written,
            self.differing,
            if self.differing == 1 {
                "byte differs"
            } else {
                "bytes differ"
            },
            self.offset,
            self.expected
        )?;
        match self.got {
            Some(b) => write!(f, "{b:#04x})"),
            None => f.write_str("nothing)"),
        }
    }
}

/// The bytes written to device `ordinal`: a multiplicative hash of each offset and the
/// ordinal's seed, so no two 4 KiB pages are equal (an aliased address shows), no byte value
/// dominates (a stuck bit shows), it is never all zero (the buffer starts zeroed, so a copy
/// that did nothing shows), and each device gets other bytes.
#[must_use]
pub fn pattern(len: usize, ordinal: usize) -> Vec<u8> {
    let seed = (ordinal as u64)
        .wrapping_add(1)
        .wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (0..len as u64)
        .map(|i| ((i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
        .collect()
}

/// Compares what was read back with what was written; `None` when equal.
#[must_use]
pub fn first_mismatch(written: &[u8], read: &[u8]) -> Option<Mismatch> {
    let common = written.len().min(read.len());
    let differing = written.iter().zip(read).filter(|(a, b)| a != b).count()
        + written.len().abs_diff(read.len());
    if differing == 0 {
        return None;
    }
    let offset = written
        .iter()
        .zip(read)
        .position(|(a, b)| a != b)
        .unwrap_or(common);
    Some(Mismatch {
        written: written.len(),
        read: read.len(),
        offset,
        expected: written.get(offset).copied().unwrap_or_default(),
        got: read.get(offset).copied(),
        differing,
    })
}

/// A CUDA UUID's 16 bytes as NVML writes a GPU's UUID:
/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lower-case hex.
#[must_use]
pub fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex = |r: std::ops::Range<usize>| -> String {
        bytes[r].iter().map(|b| format!("{b:02x}")).collect()
    };
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// The CUDA driver API as the check uses it.
pub trait CudaApi {
    /// Loads the library (on first use) and calls `cuInit(0)`.
    ///
    /// # Errors
    /// [`CudaError::NoLibrary`], or the failed call.
    fn init(&self) -> Result<(), CudaError>;

    /// `cuDeviceGetCount`: the devices CUDA lists in this container.
    ///
    /// # Errors
    /// The failed call.
    fn device_count(&self) -> Result<usize, CudaError>;

    /// Creates a context on device `ordinal` (its primary context, current on this thread).
    ///
    /// # Errors
    /// The failed call.
    fn open(&self, ordinal: usize) -> Result<Box<dyn CudaDeviceApi>, CudaError>;
}

/// A device with a context, from [`CudaApi::open`]; dropping it releases the context.
pub trait CudaDeviceApi {
    /// The device's ordinal, name and UUID (the parts that cannot be read are left empty).
    fn device(&self) -> CudaDevice;

    /// Allocates `written.len()` bytes of device memory (zeroed), copies `written` host to
    /// device, copies it back device to host, frees the memory, and returns what was read.
    ///
    /// # Errors
    /// The failed call.
    fn round_trip(&self, written: &[u8]) -> Result<Vec<u8>, CudaError>;
}

/// Runs the check with `bytes` per device (production: [`CHECK_BYTES`]); returns the devices
/// checked, in ordinal order.
///
/// # Errors
/// [`NotReady::CudaApi`] naming the device (after `cuInit`) and the failed call,
/// [`NotReady::Cuda`] when CUDA lists no device, [`NotReady::CudaMemory`] when what was read
/// back differs from what was written.
pub fn check_cuda_memory(api: &dyn CudaApi, bytes: usize) -> Result<Vec<CudaDevice>, NotReady> {
    let failed = |device: Option<CudaDevice>| {
        move |source| NotReady::CudaApi {
            device: device.map(Box::new),
            source,
        }
    };
    api.init().map_err(failed(None))?;
    let count = api.device_count().map_err(failed(None))?;
    if count == 0 {
        return Err(NotReady::Cuda(
            "CUDA lists no device in this container (cuDeviceGetCount returned 0)".into(),
        ));
    }
    let mut checked = Vec::with_capacity(count);
    for ordinal in 0..count {
        let unnamed = CudaDevice {
            ordinal,
            ..CudaDevice::default()
        };
        let handle = api.open(ordinal).map_err(failed(Some(unnamed)))?;
        let device = handle.device();
        let written = pattern(bytes, ordinal);
        let read = handle
            .round_trip(&written)
            .map_err(failed(Some(device.clone())))?;
        if let Some(mismatch) = first_mismatch(&written, &read) {
            return Err(NotReady::CudaMemory {
                device: Box::new(device),
                mismatch,
            });
        }
        checked.push(device);
    }
    Ok(checked)
}

/// The CUDA driver API through cudarc: `libcuda.so.1` is `dlopen`ed on first use, where the
/// dynamic loader looks (`LD_LIBRARY_PATH`, its cache, the system directories). A panic of the
/// bindings (no library, a missing symbol) is caught and returned as a [`CudaError`]; its
/// message is not printed.
#[derive(Debug, Clone, Copy, Default)]
pub struct DynamicCuda;

impl CudaApi for DynamicCuda {
    fn init(&self) -> Result<(), CudaError> {
        guarded(|| result::init().map_err(|e| call_error("cuInit", e)))
    }

    fn device_count(&self) -> Result<usize, CudaError> {
        guarded(|| {
            result::device::get_count()
                .map(|n| usize::try_from(n).unwrap_or(0))
                .map_err(|e| call_error("cuDeviceGetCount", e))
        })
    }

    fn open(&self, ordinal: usize) -> Result<Box<dyn CudaDeviceApi>, CudaError> {
        guarded(|| {
            let as_int = i32::try_from(ordinal).unwrap_or(i32::MAX);
            result::device::get(as_int).map_err(|e| call_error("cuDeviceGet", e))?;
            // Retains the primary context (what the CUDA runtime, and so `vectorAdd`, uses),
            // reads one attribute and makes the context current.
            let ctx =
                CudaContext::new(ordinal).map_err(|e| call_error("cuDevicePrimaryCtxRetain", e))?;
            Ok(Box::new(DynamicDevice { ctx, ordinal }) as Box<dyn CudaDeviceApi>)
        })
    }
}

/// A device's primary context, retained by cudarc (released on drop).
struct DynamicDevice {
    ctx: Arc<CudaContext>,
    ordinal: usize,
}

impl CudaDeviceApi for DynamicDevice {
    fn device(&self) -> CudaDevice {
        let name = guarded(|| {
            self.ctx
                .name()
                .map_err(|e| call_error("cuDeviceGetName", e))
        });
        let uuid = guarded(|| {
            result::device::get_uuid(self.ctx.cu_device())
                .map_err(|e| call_error("cuDeviceGetUuid", e))
        });
        CudaDevice {
            ordinal: self.ordinal,
            name: name.unwrap_or_default(),
            uuid: uuid
                .map(|u| format_uuid(&u.bytes.map(|b| b as u8)))
                .unwrap_or_default(),
        }
    }

    fn round_trip(&self, written: &[u8]) -> Result<Vec<u8>, CudaError> {
        guarded(|| {
            // cudarc allocates from the device's memory pool where it has one.
            let (alloc, free) = if self.ctx.has_async_alloc() {
                ("cuMemAllocAsync", "cuMemFreeAsync")
            } else {
                ("cuMemAlloc_v2", "cuMemFree_v2")
            };
            let stream = self.ctx.default_stream();
            let mut buffer = stream
                .alloc_zeros::<u8>(written.len())
                .map_err(|e| call_error(alloc, e))?;
            stream
                .memcpy_htod(written, &mut buffer)
                .map_err(|e| call_error("cuMemcpyHtoDAsync_v2", e))?;
            let read = stream
                .clone_dtoh(&buffer)
                .map_err(|e| call_error("cuMemcpyDtoHAsync_v2", e))?;
            stream
                .synchronize()
                .map_err(|e| call_error("cuStreamSynchronize", e))?;
            // The free is queued on drop; its error is kept in the context until checked.
            drop(buffer);
            stream
                .synchronize()
                .and_then(|()| self.ctx.check_err())
                .map_err(|e| call_error(free, e))?;
            Ok(read)
        })
    }
}

/// `call` failed with `e`: its `CUresult` name and the driver's description.
fn call_error(call: &'static str, e: DriverError) -> CudaError {
    CudaError::Call {
        call,
        name: error_name(&e),
        description: e
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
    }
}

/// The `CUresult` name of `e` (`CUDA_ERROR_OUT_OF_MEMORY`), from the bindings' enum, so it is
/// known without calling into the library.
#[must_use]
pub fn error_name(e: &DriverError) -> String {
    format!("{:?}", e.0)
}

/// Runs `f`, turning a panic of the bindings into a [`CudaError`] ([`classify_panic`]).
fn guarded<T>(f: impl FnOnce() -> Result<T, CudaError>) -> Result<T, CudaError> {
    quiet_binding_panics();
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            Err(classify_panic(&message))
        }
    }
}

/// Leaves panics raised inside cudarc unprinted (they are returned as errors by [`guarded`]);
/// every other panic goes to the hook that was installed before.
fn quiet_binding_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_bindings = info.location().is_some_and(|l| l.file().contains("cudarc"));
            if !in_bindings {
                previous(info);
            }
        }));
    });
}

/// A cudarc panic message as a [`CudaError`]: "Unable to dynamically load …" is
/// [`CudaError::NoLibrary`] with the number of names it searched for, "Missing symbol NAME: …"
/// is [`CudaError::MissingSymbol`], anything else [`CudaError::Panicked`].
#[must_use]
pub fn classify_panic(message: &str) -> CudaError {
    if message.starts_with("Unable to dynamically load") {
        let tried = message
            .split_once("searched for library names: [")
            .and_then(|(_, rest)| rest.split_once(']'))
            .map_or(0, |(names, _)| names.split(',').count());
        return CudaError::NoLibrary { tried };
    }
    if let Some(rest) = message.strip_prefix("Missing symbol ") {
        let symbol = rest.split(':').next().unwrap_or(rest).trim().to_owned();
        return CudaError::MissingSymbol { symbol };
    }
    CudaError::Panicked(message.to_owned())
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, collections::HashSet};

    use cudarc::driver::sys::CUresult;

    use super::*;

    #[test]
    fn the_pattern_has_no_equal_pages_no_zero_buffer_and_differs_per_device() {
        let p = pattern(CHECK_BYTES, 0);
        assert_eq!(p.len(), CHECK_BYTES);
        assert_eq!(p, pattern(CHECK_BYTES, 0), "deterministic");
        let pages: HashSet<&[u8]> = p.chunks(4096).collect();
        assert_eq!(pages.len(), CHECK_BYTES / 4096, "every 4 KiB page differs");
        let mut counts = [0usize; 256];
        for b in &p {
            counts[usize::from(*b)] += 1;
        }
        let (min, max) = (counts.iter().min(), counts.iter().max());
        assert!(
            min.unwrap() * 2 > *max.unwrap(),
            "every byte value about as frequent: {min:?}..{max:?}"
        );
        assert!(p.iter().any(|b| *b != 0));
        let other = pattern(CHECK_BYTES, 1);
        let same = p.iter().zip(&other).filter(|(a, b)| a == b).count();
        assert!(
            same < CHECK_BYTES / 128,
            "{same} equal bytes across devices"
        );
    }

    #[test]
    fn a_mismatch_names_the_first_offset_both_bytes_and_the_count() {
        let written = pattern(64, 0);
        assert_eq!(first_mismatch(&written, &written), None);
        let mut read = written.clone();
        read[10] ^= 0x01;
        read[40] ^= 0x80;
        let m = first_mismatch(&written, &read).unwrap();
        assert_eq!((m.offset, m.differing), (10, 2));
        assert_eq!(m.got, Some(written[10] ^ 0x01));
        assert_eq!(
            m.to_string(),
            format!(
                "the 64 bytes read back from device memory differ from the 64 written: 2 bytes \
                 differ, the first at offset 10 (wrote {:#04x}, read {:#04x})",
                written[10],
                written[10] ^ 0x01
            )
        );
        let short = first_mismatch(&written, &written[..60]).unwrap();
        assert_eq!((short.offset, short.got, short.differing), (60, None, 4));
        assert!(short.to_string().ends_with(", read nothing)"), "{short}");
        let zeroed = first_mismatch(&written, &[0; 64]).unwrap();
        assert_eq!(zeroed.offset, written.iter().position(|b| *b != 0).unwrap());
    }

    #[test]
    fn uuids_are_written_as_nvml_writes_them() {
        let bytes: [u8; 16] = [
            0x11, 0x11, 0x11, 0x11, 0x22, 0x22, 0x33, 0x33, 0x44, 0x44, 0x55, 0x55, 0x55, 0x55,
            0x55, 0xab,
        ];
        assert_eq!(
            format_uuid(&bytes),
            "GPU-11111111-2222-3333-4444-5555555555ab"
        );
    }

    #[test]
    fn errors_carry_the_cuda_error_name() {
        assert_eq!(
            error_name(&DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY)),
            "CUDA_ERROR_OUT_OF_MEMORY"
        );
        assert_eq!(
            error_name(&DriverError(CUresult::CUDA_ERROR_NO_DEVICE)),
            "CUDA_ERROR_NO_DEVICE"
        );
        let e = CudaError::Call {
            call: "cuMemAlloc_v2",
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            description: "out of memory".into(),
        };
        assert_eq!(
            e.to_string(),
            "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
        );
    }

    #[test]
    fn binding_panics_are_classified() {
        // cudarc 0.19's messages (`panic_no_lib_found`, `get_func`).
        let no_lib = classify_panic(
            "Unable to dynamically load the \"cuda\" shared library - searched for library \
             names: [\"libcuda.so\", \"libcuda.so.1\"]. Ensure that `LD_LIBRARY_PATH` has the \
             correct path to the installed library.",
        );
        assert_eq!(no_lib, CudaError::NoLibrary { tried: 2 });
        assert!(
            no_lib.to_string().starts_with(
                "libcuda.so.1 cannot be loaded (nor any of the 1 other names tried): this step \
                 needs the driver step"
            ),
            "{no_lib}"
        );
        let unknown = classify_panic("Unable to dynamically load the library");
        assert_eq!(unknown, CudaError::NoLibrary { tried: 0 });
        assert!(
            unknown
                .to_string()
                .starts_with("libcuda.so.1 cannot be loaded: this step needs the driver step"),
            "{unknown}"
        );
        assert_eq!(
            classify_panic("Missing symbol cuMemAllocAsync: undefined symbol"),
            CudaError::MissingSymbol {
                symbol: "cuMemAllocAsync".into()
            }
        );
        assert_eq!(classify_panic("boom"), CudaError::Panicked("boom".into()));
    }

    #[test]
    fn a_panic_inside_the_guard_is_an_error() {
        let r: Result<(), CudaError> = guarded(|| panic!("Missing symbol cuInit: gone"));
        assert_eq!(
            r,
            Err(CudaError::MissingSymbol {
                symbol: "cuInit".into()
            })
        );
    }

    /// Devices that fail at one call, or read back other bytes.
    #[derive(Default)]
    struct Fake {
        devices: usize,
        fail_open: Option<usize>,
        fail_alloc: Option<usize>,
        corrupt: Option<usize>,
        opened: RefCell<Vec<usize>>,
    }

    struct FakeDevice {
        ordinal: usize,
        fail_alloc: bool,
        corrupt: bool,
    }

    fn oom(call: &'static str) -> CudaError {
        CudaError::Call {
            call,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            description: "out of memory".into(),
        }
    }

    impl CudaApi for Fake {
        fn init(&self) -> Result<(), CudaError> {
            Ok(())
        }
        fn device_count(&self) -> Result<usize, CudaError> {
            Ok(self.devices)
        }
        fn open(&self, ordinal: usize) -> Result<Box<dyn CudaDeviceApi>, CudaError> {
            self.opened.borrow_mut().push(ordinal);
            if self.fail_open == Some(ordinal) {
                return Err(oom("cuDevicePrimaryCtxRetain"));
            }
            Ok(Box::new(FakeDevice {
                ordinal,
                fail_alloc: self.fail_alloc == Some(ordinal),
                corrupt: self.corrupt == Some(ordinal),
            }))
        }
    }

    impl CudaDeviceApi for FakeDevice {
        fn device(&self) -> CudaDevice {
            CudaDevice {
                ordinal: self.ordinal,
                name: "NVIDIA H100 80GB HBM3".into(),
                uuid: format!("GPU-{}", self.ordinal),
            }
        }
        fn round_trip(&self, written: &[u8]) -> Result<Vec<u8>, CudaError> {
            if self.fail_alloc {
                return Err(oom("cuMemAlloc_v2"));
            }
            let mut read = written.to_vec();
            if self.corrupt {
                read[4096] = !read[4096];
            }
            Ok(read)
        }
    }

    fn reason(e: &NotReady) -> String {
        crate::chain(e)
    }

    #[test]
    fn every_device_is_checked_and_the_first_failure_names_device_and_call() {
        let ok = Fake {
            devices: 2,
            ..Fake::default()
        };
        let devices = check_cuda_memory(&ok, 8192).unwrap();
        assert_eq!(
            devices.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "CUDA device 0 (NVIDIA H100 80GB HBM3, GPU-0)",
                "CUDA device 1 (NVIDIA H100 80GB HBM3, GPU-1)"
            ]
        );

        let alloc = Fake {
            devices: 3,
            fail_alloc: Some(1),
            ..Fake::default()
        };
        let e = check_cuda_memory(&alloc, 8192).unwrap_err();
        assert_eq!(
            reason(&e),
            "CUDA is not usable on CUDA device 1 (NVIDIA H100 80GB HBM3, GPU-1): cuMemAlloc_v2 \
             failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
        );
        assert_eq!(*alloc.opened.borrow(), [0, 1], "stops at the first failure");

        let open = Fake {
            devices: 2,
            fail_open: Some(0),
            ..Fake::default()
        };
        assert_eq!(
            reason(&check_cuda_memory(&open, 8192).unwrap_err()),
            "CUDA is not usable on CUDA device 0: cuDevicePrimaryCtxRetain failed: \
             CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
        );

        let corrupt = Fake {
            devices: 1,
            corrupt: Some(0),
            ..Fake::default()
        };
        let e = reason(&check_cuda_memory(&corrupt, 8192).unwrap_err());
        assert!(
            e.starts_with(
                "CUDA is not usable on CUDA device 0 (NVIDIA H100 80GB HBM3, GPU-0): the 8192 \
                 bytes read back from device memory differ from the 8192 written: 1 byte \
                 differs, the first at offset 4096"
            ),
            "{e}"
        );

        let none = Fake::default();
        assert_eq!(
            reason(&check_cuda_memory(&none, 8192).unwrap_err()),
            "CUDA is not usable: CUDA lists no device in this container (cuDeviceGetCount \
             returned 0)"
        );
    }
}
