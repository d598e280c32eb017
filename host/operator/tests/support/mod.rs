//! What the operator's test binaries share (`tests/scenarios`, `tests/chart`, `tests/cluster`;
//! each declares `mod support;` once and uses a part of it).

#![allow(dead_code)] // each test binary uses a part

pub mod cluster;
pub mod fixtures;
pub mod helm;
pub mod mock_api;
pub mod nvidia;
pub mod policy_corpus;
pub mod rbac;
pub mod view;

/// The repository root.
pub fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}
