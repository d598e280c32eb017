//! kiln's pure core: ClusterPolicy types, the closed list of states and which ones a policy
//! enables, and the cluster facts handed to transforms. No IO, no async, no Wasm runtime: this
//! crate also compiles into the `wasm32-wasip2` plugins (with `default-features = false`).
//!
//! ```text
//! ClusterPolicy ──► spec::ClusterPolicySpec ──► State::enabled ──► assets/state-<name> ──► plugins/<name>
//!                                            ▲
//!                     context::TransformContext (cluster facts)
//! ```

pub mod context;
pub mod drift;
pub mod driver_digest;
pub mod gpu_health;
pub mod intstr;
pub mod label_keys;
pub mod labels;
pub mod node_stuck;
pub mod oci_ref;
pub mod plan;
pub mod readiness;
pub mod singleton;
pub mod spec;
pub mod state;
pub mod status;
pub mod testcase;
pub mod upgrade;

pub use context::{ContainerRuntime, NodeOs, TransformContext};
pub use spec::{ClusterPolicySpec, SpecError};
pub use state::State;
