//! The controllers, side by side over the one view of the cluster
//! ([`crate::cluster::view::View`], handed to each by `run`): the ClusterPolicy reconciler
//! ([`policy`]), the NVIDIADriver reconciler ([`driver`]) and the rolling driver upgrade
//! ([`upgrade`]) of the DaemonSets both of them apply, which it finds in the view. None imports
//! another; each reports through [`crate::signals`].

pub mod driver;
pub mod gpucluster;
pub mod policy;
pub mod upgrade;
