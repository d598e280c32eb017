//! The one error type of the GPU seam.

use std::path::PathBuf;

/// Why a GPU backend could not be opened or answer a query. Messages name what failed; the
/// cause is the error's `source()` (print the chain, e.g. anyhow's `{:#}`).
///
/// NVML's own per-call "not supported on this device" answers never become an error: the
/// reading is `None` in [`crate::DeviceSample`] instead, as dcgm-exporter skips blank values.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// `libnvidia-ml.so.1` could not be loaded or initialised (no driver, no GPU, or a
    /// container without the NVIDIA runtime). Every agent reports this at start-up.
    #[error("NVML init failed")]
    NvmlInit(#[source] nvml_wrapper::error::NvmlError),
    /// An NVML call failed for a reason other than "not supported".
    #[error("NVML {call} failed on GPU {index}")]
    NvmlCall {
        /// The NVML function, by its C name (e.g. `nvmlDeviceGetUUID`).
        call: &'static str,
        /// The NVML device index; `u32::MAX` for system-wide calls.
        index: u32,
        /// What NVML said.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// The GPU fell off the bus or needs a reset (NVML `GPU_IS_LOST`, XID 79-style).
    #[error("GPU {index} is lost (fell off the bus or needs a reset)")]
    GpuLost {
        /// The NVML device index.
        index: u32,
    },
    /// A device index beyond the last GPU was asked for.
    #[error("no GPU with index {0}")]
    NoSuchDevice(u32),
    /// The fake backend's fixture file could not be read: missing, not a regular file, over
    /// [`kiln_input::MAX_FILE_BYTES`] (the source names the file).
    #[error("reading the GPU fixture")]
    FixtureRead {
        /// The fixture path.
        path: PathBuf,
        /// What went wrong, naming the file (boxed: keeps `GpuError` small).
        #[source]
        source: Box<kiln_input::InputError>,
    },
    /// The fake backend's fixture file is not valid YAML/JSON for the fixture format, or a
    /// value is out of range.
    #[error("parsing GPU fixture {}", path.display())]
    FixtureParse {
        /// The fixture path.
        path: PathBuf,
        /// The field path and what is wrong with it (boxed: keeps `GpuError` small).
        #[source]
        source: Box<kiln_input::YamlError>,
    },
    /// A backend spec was neither `nvml` nor `fake:<path>`.
    #[error("unknown GPU backend {0:?}: expected `nvml` or `fake:<fixture path>`")]
    BadBackendSpec(String),
}

/// `e` and its causes joined with `: `, each cause once: a cause whose text the layer above
/// already ends with is skipped. nvml-wrapper's `a libloading error occurred: libnvidia-ml.so.1:
/// cannot open …` both embeds its source in its message and returns it as `source()`, which
/// printed the same `cannot open` text twice. The one chain formatter of the agents and the
/// CLI.
#[must_use]
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut above = e.to_string();
    let mut out = above.clone();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !above.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        above = text;
        cur = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("nvml init failed")]
    struct Top(#[source] Mid);

    #[derive(Debug, thiserror::Error)]
    #[error("a libloading error occurred: {0}")]
    struct Mid(#[source] std::io::Error);

    #[test]
    fn each_cause_is_printed_once() {
        let e = Top(Mid(std::io::Error::other(
            "libnvidia-ml.so.1: cannot open shared object file",
        )));
        assert_eq!(
            super::error_chain(&e),
            "nvml init failed: a libloading error occurred: libnvidia-ml.so.1: cannot open shared object file"
        );
        let io = std::io::Error::other("in use");
        assert_eq!(super::error_chain(&io), "in use");
    }
}
