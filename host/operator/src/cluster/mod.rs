//! The operator's view of the cluster: the watches it opens ([`watch`]), the stores they fill
//! (name-keyed ones for nodes and pods, [`store`], [`node`], [`readiness`]; kube reflector
//! stores for the labelled objects, DaemonSets and ConfigMaps, [`live`], [`facts`]), the one
//! [`view::View`] of them every controller reads, and the wake-ups their events send
//! ([`wakes`] decides, [`live::Wake`] delivers). Everything here reads and decodes; nothing
//! here reconciles. It imports no controller and no signal.

pub mod facts;
pub mod live;
pub mod node;
pub mod readiness;
pub mod store;
pub mod view;
pub mod wakes;
pub mod watch;
