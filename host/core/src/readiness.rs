//! DaemonSet readiness, exactly as upstream `isDaemonSetReady` (GPU Operator v26.7; see
//! `gpu-operator.md` §2.5). Pure: the caller fetches the DaemonSet and, for `OnDelete`
//! DaemonSets, the pods and ControllerRevisions of its namespace, and hands them in.
//!
//! ```text
//! missing ─► notReady      desired 0 ─► ready (once observed)      numberUnavailable ≠ 0 ─► notReady
//! RollingUpdate: observedGeneration ≥ generation ∧ updated = desired ∧ available = desired
//! OnDelete: every owned pod on the current ControllerRevision (current_revision), Running,
//!           all containers ready
//! ```

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::Pod;

/// The label the DaemonSet controller puts on each pod: the hash of its ControllerRevision.
pub const REVISION_HASH_LABEL: &str = "controller-revision-hash";

/// Whether a DaemonSet is ready, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Ready.
    Ready,
    /// Not ready, with the reason.
    NotReady(NotReady),
}

/// Why a DaemonSet is not ready. `Display` gives the human text used in status messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// The DaemonSet does not exist (yet).
    Missing,
    /// The DaemonSet controller has not observed the current generation yet and reports no pods
    /// (kiln's guard before upstream's "desired 0 is ready").
    NotObserved,
    /// `status.numberUnavailable` pods are unavailable.
    Unavailable(i32),
    /// RollingUpdate still in progress.
    Rollout {
        /// `metadata.generation`.
        generation: i64,
        /// `status.observedGeneration` (0 when absent).
        observed: i64,
        /// `status.desiredNumberScheduled`.
        desired: i32,
        /// `status.updatedNumberScheduled`.
        updated: i32,
        /// `status.numberAvailable`.
        available: i32,
    },
    /// OnDelete: no pod owned by the DaemonSet matches its selector.
    NoPods,
    /// OnDelete: no ControllerRevision of the DaemonSet was found.
    NoRevision,
    /// OnDelete: the pod runs an older revision than the current one.
    StaleRevision {
        /// Pod name.
        pod: String,
        /// The current revision hash.
        want: String,
    },
    /// OnDelete: the pod is not `Running` (phase given, empty when unknown).
    NotRunning {
        /// Pod name.
        pod: String,
        /// Pod phase.
        phase: String,
    },
    /// OnDelete: a container of the pod is not ready.
    ContainerNotReady {
        /// Pod name.
        pod: String,
    },
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::Missing => write!(f, "DaemonSet not found"),
            NotReady::NotObserved => write!(f, "not yet observed by the DaemonSet controller"),
            NotReady::Unavailable(n) => write!(f, "{n} pod(s) unavailable"),
            NotReady::Rollout {
                generation,
                observed,
                desired,
                updated,
                available,
            } => write!(
                f,
                "rollout in progress (generation {generation}, observed {observed}; \
                 {updated}/{desired} updated, {available}/{desired} available)"
            ),
            NotReady::NoPods => write!(f, "no pods found"),
            NotReady::NoRevision => write!(f, "no ControllerRevision found"),
            NotReady::StaleRevision { pod, want } => {
                write!(f, "pod {pod} is not on revision {want}")
            }
            NotReady::NotRunning { pod, phase } => write!(f, "pod {pod} is {phase:?}, not Running"),
            NotReady::ContainerNotReady { pod } => write!(f, "pod {pod} has unready containers"),
        }
    }
}

/// Whether the DaemonSet uses the `OnDelete` update strategy (only then are pods and
/// ControllerRevisions needed by [`daemonset_readiness`]).
pub fn is_on_delete(ds: &DaemonSet) -> bool {
    ds.spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.type_.as_deref())
        == Some("OnDelete")
}

/// What the `OnDelete` readiness rule reads of a pod: its name, namespace, labels and first
/// ownerReference's uid, its phase, and whether every container is ready. Implemented for
/// k8s-openapi's [`Pod`] (and references and `Arc`s of an implementor), so a caller holding
/// slimmer copies of pods (the operator's watch stores, labels interned) judges them without
/// converting any.
pub trait PodFacts {
    /// `metadata.name` (empty when unset).
    fn name(&self) -> &str;
    /// `metadata.namespace`.
    fn namespace(&self) -> Option<&str>;
    /// The value of label `key`, when the pod has it.
    fn label(&self, key: &str) -> Option<&str>;
    /// The uid of the first `ownerReference` (a DaemonSet's pod has exactly one: the
    /// DaemonSet).
    fn first_owner_uid(&self) -> Option<&str>;
    /// `status.phase` (`Running`, `Pending`, …); `None` when unset.
    fn phase(&self) -> Option<&str>;
    /// Whether every entry of `status.containerStatuses` is `ready` (true when there are none,
    /// as upstream's loop over them).
    fn containers_ready(&self) -> bool;
}

impl PodFacts for Pod {
    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    fn namespace(&self) -> Option<&str> {
        self.metadata.namespace.as_deref()
    }
    fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }
    fn first_owner_uid(&self) -> Option<&str> {
        Some(
            self.metadata
                .owner_references
                .as_ref()?
                .first()?
                .uid
                .as_str(),
        )
    }
    fn phase(&self) -> Option<&str> {
        self.status.as_ref()?.phase.as_deref()
    }
    fn containers_ready(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_none_or(|cs| cs.iter().all(|c| c.ready))
    }
}

/// Forwards every fact to the pointee (`&P`, `Arc<P>`).
macro_rules! forward_pod_facts {
    ($($ty:ty),*) => {$(
        impl<T: PodFacts + ?Sized> PodFacts for $ty {
            fn name(&self) -> &str {
                (**self).name()
            }
            fn namespace(&self) -> Option<&str> {
                (**self).namespace()
            }
            fn label(&self, key: &str) -> Option<&str> {
                (**self).label(key)
            }
            fn first_owner_uid(&self) -> Option<&str> {
                (**self).first_owner_uid()
            }
            fn phase(&self) -> Option<&str> {
                (**self).phase()
            }
            fn containers_ready(&self) -> bool {
                (**self).containers_ready()
            }
        }
    )*};
}
forward_pod_facts!(&T, std::sync::Arc<T>);

/// Judge a DaemonSet (`None` = not found) by upstream's rules. `pods` and `revisions` may hold
/// more than the DaemonSet's own (say, every pod of the namespace): they are filtered by the
/// DaemonSet's `spec.selector.matchLabels` (not its template labels), pods further by their
/// first ownerReference UID, revisions as [`current_revision`] says. `pods` are any
/// [`PodFacts`]; `revisions` ControllerRevisions or `Arc`s of them.
pub fn daemonset_readiness<P: PodFacts, R: Borrow<ControllerRevision>>(
    ds: Option<&DaemonSet>,
    pods: &[P],
    revisions: &[R],
) -> Readiness {
    let Some(ds) = ds else {
        return Readiness::NotReady(NotReady::Missing);
    };
    let Some(status) = ds.status.clone() else {
        return Readiness::NotReady(NotReady::NotObserved);
    };
    let desired = status.desired_number_scheduled;
    if desired == 0 {
        // Deliberate guard before upstream's rule: a DaemonSet the controller has not observed
        // yet (fresh, status empty) says nothing about its nodes.
        if status.observed_generation.unwrap_or(0) < ds.metadata.generation.unwrap_or(0) {
            return Readiness::NotReady(NotReady::NotObserved);
        }
        return Readiness::Ready;
    }
    let unavailable = status.number_unavailable.unwrap_or(0);
    if unavailable != 0 {
        return Readiness::NotReady(NotReady::Unavailable(unavailable));
    }
    if !is_on_delete(ds) {
        let generation = ds.metadata.generation.unwrap_or(0);
        let observed = status.observed_generation.unwrap_or(0);
        let updated = status.updated_number_scheduled.unwrap_or(0);
        let available = status.number_available.unwrap_or(0);
        if observed >= generation && updated == desired && available == desired {
            return Readiness::Ready;
        }
        return Readiness::NotReady(NotReady::Rollout {
            generation,
            observed,
            desired,
            updated,
            available,
        });
    }
    on_delete_readiness(ds, pods, revisions)
}

fn selector(ds: &DaemonSet) -> BTreeMap<String, String> {
    ds.spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default()
}

fn matches(selector: &BTreeMap<String, String>, labels: Option<&BTreeMap<String, String>>) -> bool {
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Which ControllerRevision of `ds` is current, as its template hash: the one rule for both
/// the `OnDelete` readiness check and the driver upgrade's "is this pod on the current
/// revision". Pure; `revisions` may hold more than the DaemonSet's own (every revision of the
/// namespace, or `Arc`s from a watch store).
///
/// Follows upstream's rule (GPU Operator `isDaemonSetReady`, the upgrade library's revision
/// hash lookup): among the DaemonSet's revisions, the highest `.revision` is current, and its
/// hash is its name minus `<ds-name>-`. A revision counts as the DaemonSet's when
/// - one of its ownerReferences carries the DaemonSet's UID (what the DaemonSet controller
///   writes), or
/// - it has no ownerReferences, sits in the DaemonSet's namespace, its labels match
///   `spec.selector.matchLabels` and its name starts with `<ds-name>-` (upstream's test; an
///   orphan the controller would adopt).
///
/// Deliberately narrower than upstream: a revision owned by another UID (a deleted DaemonSet
/// of the same name, awaiting garbage collection) is never current, however new. The hash is
/// read from the revision's `controller-revision-hash` label when present (the value the
/// controller also stamps on pods; equal to the name suffix unless the name was truncated),
/// else from the name. A revision with neither is skipped.
///
/// ```text
/// ds  nvidia-driver-daemonset  uid U  selector app=nvidia-driver-daemonset
/// revisions  nvidia-driver-daemonset-aaa  revision 1  owner U
///            nvidia-driver-daemonset-bbb  revision 2  owner U          ─► Some("bbb")
///            nvidia-driver-daemonset-zzz  revision 3  owner V (other)  (ignored)
/// no revision of the DaemonSet ─► None
/// ```
pub fn current_revision<R: Borrow<ControllerRevision>>(
    ds: &DaemonSet,
    revisions: &[R],
) -> Option<String> {
    let name = ds.metadata.name.as_deref().unwrap_or_default();
    let prefix = format!("{name}-");
    let uid = ds.metadata.uid.as_deref();
    let sel = selector(ds);
    let ours = |r: &ControllerRevision| match r.metadata.owner_references.as_deref() {
        Some(owners) if !owners.is_empty() => owners.iter().any(|o| Some(o.uid.as_str()) == uid),
        _ => {
            !name.is_empty()
                && r.metadata.namespace == ds.metadata.namespace
                && matches(&sel, r.metadata.labels.as_ref())
                && r.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&prefix))
        }
    };
    revisions
        .iter()
        .map(Borrow::borrow)
        .filter(|r| ours(r))
        .filter_map(|r| {
            let label = r
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(REVISION_HASH_LABEL));
            let hash = match label {
                Some(h) => h.clone(),
                None => r
                    .metadata
                    .name
                    .as_deref()?
                    .strip_prefix(&prefix)?
                    .to_string(),
            };
            Some((r.revision, hash))
        })
        .max_by_key(|(rev, _)| *rev)
        .map(|(_, hash)| hash)
}

fn on_delete_readiness<P: PodFacts, R: Borrow<ControllerRevision>>(
    ds: &DaemonSet,
    pods: &[P],
    revisions: &[R],
) -> Readiness {
    let sel = selector(ds);
    let uid = ds.metadata.uid.as_deref();
    let mut owned = pods
        .iter()
        .filter(|p| p.namespace() == ds.metadata.namespace.as_deref())
        .filter(|p| sel.iter().all(|(k, v)| p.label(k) == Some(v.as_str())))
        .filter(|p| p.first_owner_uid() == uid)
        .peekable();
    if owned.peek().is_none() {
        return Readiness::NotReady(NotReady::NoPods);
    }
    let Some(want) = current_revision(ds, revisions) else {
        return Readiness::NotReady(NotReady::NoRevision);
    };
    for pod in owned {
        let name = || pod.name().to_string();
        if pod.label(REVISION_HASH_LABEL) != Some(want.as_str()) {
            return Readiness::NotReady(NotReady::StaleRevision { pod: name(), want });
        }
        let phase = pod.phase().unwrap_or_default();
        if phase != "Running" {
            return Readiness::NotReady(NotReady::NotRunning {
                pod: name(),
                phase: phase.to_string(),
            });
        }
        if !pod.containers_ready() {
            return Readiness::NotReady(NotReady::ContainerNotReady { pod: name() });
        }
    }
    Readiness::Ready
}

#[cfg(test)]
#[path = "readiness_tests.rs"]
mod tests;
