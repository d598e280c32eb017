//! `kiln-input`: every file, YAML document, duration and Kubernetes name the host binaries take
//! from outside goes through here, so each bound is defined once.
//!
//! ```text
//! path ──► read_bounded (regular file, ≤ MAX_FILE_BYTES) ──► yaml::from_str (≤ MAX_DEPTH,
//!          no duplicate keys, errors name the field path) ──► T
//! "1m30s" ──► duration::parse_go_duration (≤ MAX_DURATION)
//! "NVIDIA H100 …" ──► k8s::sanitize_label_value (Kubernetes label syntax) or skipped
//! ```
//!
//! The rules and why: a hostile-input review (issue 15) found `/dev/urandom` read whole as a
//! fixture, YAML nested 100,000 deep parsed in 39 s (libyaml is quadratic in flow depth),
//! duplicate keys silently taking the last value (kubectl refuses them), a duration
//! `99999999999999999999999h` panicking the agents, and label values the API server refuses.

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
