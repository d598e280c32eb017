//! What a watch event wakes, decided in one place: per kind, one pure function of the object
//! before and after the event (`None`: absent). The watches apply the answer; nothing else
//! decides what a change wakes.
//!
//! | kind | decided by |
//! |------|------------|
//! | Node | [`node`] over [`NodeDigest`]s (the node watch keeps digests, not copies) |
//! | DaemonSet | [`daemonset`] (the upgrade loop), [`crate::cluster::live::LabelledEvents`] (the labelled ones) |
//! | labelled objects, ConfigMaps | [`crate::cluster::live::LabelledEvents`], [`crate::cluster::facts::ConfigMapCache`] |
//! | pods, ControllerRevisions | [`crate::cluster::readiness::PodWatches`] |

use k8s_openapi::api::apps::v1::DaemonSet;

/// The wake-ups of one event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wakes {
    /// Judge every ClusterPolicy again ([`crate::cluster::live::Wake::reconcile`]).
    pub reconcile: bool,
    /// Label the node with the active policy's rules first (then judge again).
    pub label: bool,
    /// A driver upgrade pass ([`crate::cluster::live::Wake::upgrade`]).
    pub upgrade: bool,
    /// The NVIDIADriver controller reads its node pools again.
    pub pools: bool,
    /// The readiness timeline hears the node's facts.
    pub timeline: bool,
}

impl Wakes {
    /// Everything: a (re-)list may hold any change.
    pub const ALL: Wakes = Wakes {
        reconcile: true,
        label: false,
        upgrade: true,
        pools: true,
        timeline: true,
    };
}

/// What the wake-ups compare of a node, as hashes (the node watch keeps these, not a copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeDigest {
    /// What kiln reads ([`crate::controllers::policy::nodes::relevant_hash`]: the labels
    /// [`crate::cluster::node::reads_label`] keeps and the container runtime).
    pub read: u64,
    /// What the driver upgrade reads (its labels and annotations, cordon, `Ready`).
    pub upgrade: u64,
    /// The readiness timeline's facts ([`crate::signals::timeline::NodeFacts`]).
    pub timeline: u64,
    /// Every label the node store keeps (the NVIDIADriver pools select by any of them).
    pub labels: u64,
}

/// What a node event wakes, from the node's digest before (`None`: new) and after (`None`:
/// deleted): a new or deleted node wakes everything; a change wakes each sink whose part of
/// the digest moved, and a change of what kiln reads labels that node and judges again (GFD's
/// timestamp, a heartbeat: nothing).
pub fn node(old: Option<&NodeDigest>, new: Option<&NodeDigest>) -> Wakes {
    let Some(new) = new else {
        return Wakes::ALL;
    };
    let moved = |part: fn(&NodeDigest) -> u64| old.is_none_or(|o| part(o) != part(new));
    let read = moved(|d| d.read);
    Wakes {
        reconcile: read,
        label: read,
        upgrade: moved(|d| d.upgrade),
        pools: moved(|d| d.labels),
        timeline: moved(|d| d.timeline),
    }
}

/// What a DaemonSet event wakes beyond the labelled-object wake-ups: the upgrade loop for a
/// driver DaemonSet, the ClusterPolicy's or an NVIDIADriver's ([`crate::cluster::live::owner_of`]).
pub fn daemonset(ds: &DaemonSet) -> Wakes {
    let policy_driver = ds.metadata.name.as_deref()
        == Some(crate::cluster::watch::DRIVER_DAEMONSET)
        && ds
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(kiln_core::plan::STATE_LABEL));
    Wakes {
        upgrade: policy_driver || crate::cluster::live::owner_of(ds).is_some(),
        ..Wakes::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(read: u64, upgrade: u64, timeline: u64, labels: u64) -> NodeDigest {
        NodeDigest {
            read,
            upgrade,
            timeline,
            labels,
        }
    }

    #[test]
    fn a_node_wakes_each_sink_whose_part_moved() {
        let d = digest(1, 2, 3, 4);
        assert_eq!(node(None, None), Wakes::ALL);
        assert_eq!(node(Some(&d), None), Wakes::ALL, "deleted");
        let new = node(None, Some(&d));
        assert!(new.reconcile && new.label && new.upgrade && new.pools && new.timeline);
        assert_eq!(node(Some(&d), Some(&d)), Wakes::default(), "GFD churn");
        assert_eq!(
            node(Some(&d), Some(&digest(1, 2, 3, 5))),
            Wakes {
                pools: true,
                ..Wakes::default()
            },
            "a pool label"
        );
        assert_eq!(
            node(Some(&d), Some(&digest(9, 2, 3, 4))),
            Wakes {
                reconcile: true,
                label: true,
                ..Wakes::default()
            }
        );
        assert_eq!(
            node(Some(&d), Some(&digest(1, 9, 9, 4))),
            Wakes {
                upgrade: true,
                timeline: true,
                ..Wakes::default()
            }
        );
    }
}
