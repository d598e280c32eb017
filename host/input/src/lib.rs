//! `kiln-input`: every file, YAML document, duration and Kubernetes name the host binaries take
//! from outside goes through here, so each bound is defined once.
//!
//! ```text
//! path ──► read_bounded (regular file, ≤ MAX_FILE_BYTES) ──► yaml::from_str (serde-saphyr:
//!          ≤ MAX_DEPTH, no duplicate keys, YAML 1.1 scalars as the API server; errors name
//!          the field path) ──► T
//! "1m30s" ──► duration::parse_go_duration (≤ MAX_DURATION)
//! "NVIDIA H100 …" ──► k8s::sanitize_label_value (Kubernetes label syntax) or skipped
//! ```
//!
//! The rules and why: each refuses an input that would otherwise hang, exhaust or silently
//! mislead an agent: a device file (`/dev/urandom`) read whole as a fixture, YAML nested
//! thousands deep (libyaml's flow parsing was quadratic in depth; serde-saphyr's depth budget
//! stops at the limit), duplicate keys silently taking
//! the last value (kubectl refuses them), a duration too large for `Duration`, and label values
//! the API server refuses. (The review that found them, with timings: `docs/benchmarks.md`.)

pub mod duration;
mod file;
pub mod k8s;
mod strict;
pub mod yaml;

pub use duration::{
    DurationError, MAX_DURATION, MAX_DURATION_MS, MAX_DURATION_SECS, parse_go_duration,
};
pub use file::{InputError, MAX_FILE_BYTES, file_kind, load_file, read_bounded};
pub use yaml::{MAX_DEPTH, YamlError};
