//! `kiln-operator`: the ClusterPolicy reconciler.
//!
//! ```text
//!   ClusterPolicy ─┐                      ┌─► node labels (merge patches, kiln_core::labels)
//!   Nodes (labels)─┼─► reconcile(policy) ─┼─► per state, in order: render (plugin chain)
//!   owned DS ──────┘    active? (singleton)│      ─► server-side apply (field manager `kiln`)
//!                                          │      ─► readiness (kiln_core::readiness)
//!                                          └─► status (kiln_core::status) + Events on change
//! ```
//!
//! Layers, each importing only those below it (no import circle between modules or folders):
//!
//! ```text
//!   run            starts each part once, in order
//!   controllers/   policy (ClusterPolicy), driver (NVIDIADriver), upgrade (rolling driver
//!                  upgrades), side by side over the one view; none imports another
//!   context        the ClusterPolicy reconciler's context (configuration, cluster handle)
//!   drift, status  removing other managers' additions; status writes (with their Events)
//!   signals/       metrics, Events, the per-node readiness timeline
//!   cluster/       watches, stores, decoders, wake-ups, and the one view of them (View)
//!   apply, memory, leader, lifecycle, crd, error
//! ```
//!
//! Pure decisions (labels, readiness, singleton, status) live in `kiln-core`; this crate does
//! the IO. Guarantees:
//! - a failing state (plugin fault) never blocks later states and keeps its last applied objects;
//! - every applied object carries `kiln.dev/state=<state>` ([`kiln_core::plan::STATE_LABEL`]);
//!   a disabled state's objects, and objects a render no longer produces, are found by that
//!   label in the cluster ([`live`]) and deleted (only when a ClusterPolicy owns them), also
//!   after a restart;
//! - an invalid policy gets `Error` naming the field and deletes nothing;
//! - at steady state a reconcile reads but writes nothing (applies are skipped when the desired
//!   object and the live generation/resourceVersion are unchanged; label and status writes are
//!   computed as minimal diffs).

pub mod apply;
pub mod cluster;
pub mod context;
pub mod controllers;
pub mod crd;
pub mod drift;
mod error;
pub mod leader;
pub mod lifecycle;
pub mod memory;
pub mod run;
pub mod signals;
pub mod status;

// The modules by the paths the CLI, the tests and the benches name them (one level up from
// where they live).
pub use cluster::{facts, live, node, readiness, store, watch};
pub use controllers::driver as nvidiadriver;
pub use controllers::policy::{nodes, psa, reconcile};
pub use controllers::upgrade;
pub use controllers::upgrade::eviction;
pub use signals::{events, metrics, timeline};

pub use context::{Config, Context};
pub(crate) use error::is_not_found;
pub use error::{Error, Result};
pub use memory::PLUGIN_KEEP_RESIDENT_BYTES;
pub use run::{run, run_until, runtime};
