//! Tests of the files kiln ships: the CRDs against the Rust types and NVIDIA's, the Helm chart
//! (`helm template` with `testcluster/bin/helm`, skipped when it is not built), the RBAC,
//! NetworkPolicies and admission policies under `deploy/`. No API server.
//!
//! `cargo test -p kiln-operator --test chart [filter]`.

#[path = "../support/mod.rs"]
mod support;

mod chart_operability;
mod crd;
mod crd_fidelity;
mod deploy;
mod helm_values;
mod site_plugins;
