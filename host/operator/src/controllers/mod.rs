//! The controllers, side by side over the cluster view ([`crate::cluster`]): the
//! ClusterPolicy reconciler ([`policy`]), the NVIDIADriver reconciler ([`driver`]) and the
//! rolling driver upgrade ([`upgrade`]) both of them drive. Each reports through
//! [`crate::signals`].

pub mod driver;
pub mod gpucluster;
pub mod policy;
pub mod upgrade;
