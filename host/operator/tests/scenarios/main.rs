//! Scenario tests: the operator's controllers against the in-memory API server
//! (`support/mock_api.rs`), asserting on the requests they send. No control plane, no timing.
//!
//! `cargo test -p kiln-operator --test scenarios [filter]`.

#[path = "../support/mod.rs"]
mod support;

mod gpucluster;
mod nvidiadriver;
mod policy;
mod stuck;
