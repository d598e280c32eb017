//! Cluster tests: what only a real control plane shows (admission, RBAC with the operator's own
//! token, server-side apply ownership, the garbage collector, Helm against an API server), each
//! test on its own `kiln-testcluster`, one cluster at a time (`support/cluster.rs`).
//!
//! `testcluster/build.sh` once, then `cargo test -p kiln-operator --test cluster [filter]`
//! (e.g. `e2e::` for the end-to-end scenario).

#[path = "../support/mod.rs"]
mod support;

mod crd;
mod e2e;
mod gpucluster;
mod helm;
mod helm_lifecycle;
mod migration;
mod monitoring;
mod nvidiadriver_cluster;
mod stuck;
mod takeover;
mod upgrade;
