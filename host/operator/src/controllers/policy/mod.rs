//! The ClusterPolicy reconciler (its context and memory: [`crate::context`]): the reconcile
//! ([`reconcile`]), node labelling and the node watch ([`nodes`]) and the pod security
//! admission hook ([`psa`]), and the hand-off of the driver to NVIDIADriver CRs
//! ([`handoff`]).

pub mod handoff;
pub mod nodes;
pub mod psa;
pub mod reconcile;
