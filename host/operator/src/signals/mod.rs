//! What the operator reports: Prometheus metrics ([`metrics`]), Kubernetes Events
//! ([`events`]) and the per-node readiness timeline ([`timeline`]), fed by the cluster view
//! ([`crate::cluster`]) and by the controllers' calls; a signal never reads a controller's
//! internals.

pub mod events;
pub mod metrics;
pub mod stuck;
pub mod timeline;
