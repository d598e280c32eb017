//! Which ClusterPolicy is the active one (upstream GPU Operator v26.7, `gpu-operator.md` §2.2
//! step 2): the oldest `metadata.creationTimestamp` wins; on a tie the lexically smallest name.
//! Every other ClusterPolicy is `ignored`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The name of the active policy among `policies` (their metadata), or `None` when there is
/// none. A policy without a creation timestamp (never the case for stored objects) sorts after
/// every timestamped one.
pub fn active_policy<'a>(policies: impl IntoIterator<Item = &'a ObjectMeta>) -> Option<&'a str> {
    policies
        .into_iter()
        .filter_map(|m| Some((m.creation_timestamp.as_ref(), m.name.as_deref()?)))
        .min_by(|(ta, na), (tb, nb)| {
            let key = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
                (t.is_none(), t.map(|t| t.0))
            };
            key(*ta).cmp(&key(*tb)).then_with(|| na.cmp(nb))
        })
        .map(|(_, name)| name)
}

/// What of a ClusterPolicy a render reads besides its spec: the identity (UID, creation time,
/// which decide the active policy and the owner reference) and `metadata.generation`, which
/// the API server bumps on every spec change and never on a status write (the CRD serves
/// `status` as a subresource).
type Revision = (Option<String>, Option<String>, Option<i64>);

/// The revision of each ClusterPolicy seen on a watch, by name: tells a change a render reads
/// (a policy added, deleted or replaced, its spec edited) from one it does not (the operator's
/// own status writes, label or annotation edits), so the latter re-renders nothing.
#[derive(Debug, Default, Clone)]
pub struct PolicyRevisions {
    seen: BTreeMap<String, Revision>,
}

impl PolicyRevisions {
    /// Record the policy `meta` as the watch delivered it. Returns `true` when its name is new
    /// or its UID, creation time or generation differ from the last seen (a render input
    /// changed), `false` for the same revision again (a status or metadata-only write).
    pub fn applied(&mut self, meta: &ObjectMeta) -> bool {
        let name = meta.name.clone().unwrap_or_default();
        let revision = (
            meta.uid.clone(),
            meta.creation_timestamp.as_ref().map(|t| t.0.to_string()),
            meta.generation,
        );
        self.seen.insert(name, revision.clone()) != Some(revision)
    }

    /// Forget the policy `meta` names (it was deleted).
    pub fn deleted(&mut self, meta: &ObjectMeta) {
        self.seen.remove(meta.name.as_deref().unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn meta(name: &str, created: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            creation_timestamp: created.map(|t| Time(t.parse().unwrap())),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn n5_oldest_wins() {
        let metas = [
            meta("newer", Some("2026-01-02T00:00:00Z")),
            meta("older", Some("2026-01-01T00:00:00Z")),
        ];
        assert_eq!(active_policy(&metas), Some("older"));
    }

    #[test]
    fn name_breaks_ties_and_missing_timestamps_sort_last() {
        let metas = [
            meta("zeta", Some("2026-01-01T00:00:00Z")),
            meta("alpha", Some("2026-01-01T00:00:00Z")),
            meta("aaa", None),
        ];
        assert_eq!(active_policy(&metas), Some("alpha"));
        assert_eq!(active_policy(&metas[2..]), Some("aaa"));
        assert_eq!(active_policy(&[]), None);
    }

    #[test]
    fn only_a_new_identity_or_generation_is_a_policy_change() {
        let mut revisions = PolicyRevisions::default();
        let mut p = meta("cluster-policy", Some("2026-01-01T00:00:00Z"));
        p.uid = Some("u1".into());
        p.generation = Some(1);
        assert!(revisions.applied(&p), "first sight");
        // A status write: same UID, creation time and generation, newer resourceVersion.
        p.resource_version = Some("42".into());
        assert!(!revisions.applied(&p));
        p.annotations = Some([("a".to_string(), "b".to_string())].into());
        assert!(
            !revisions.applied(&p),
            "an annotation is not read by a render"
        );
        p.generation = Some(2);
        assert!(revisions.applied(&p), "a spec edit");
        assert!(!revisions.applied(&p));
        // Deleted and recreated under the same name: a new UID.
        revisions.deleted(&p);
        assert!(revisions.applied(&p), "seen again after its deletion");
        p.uid = Some("u2".into());
        assert!(revisions.applied(&p), "replaced");
        let mut other = meta("second", Some("2026-01-02T00:00:00Z"));
        other.generation = Some(1);
        assert!(revisions.applied(&other));
        assert!(
            !revisions.applied(&p),
            "another policy's revision does not disturb this one"
        );
    }
}
