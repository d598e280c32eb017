//! Which ClusterPolicy is the active one (upstream GPU Operator v26.7, `gpu-operator.md` §2.2
//! step 2): the oldest `metadata.creationTimestamp` wins; on a tie the lexically smallest name.
//! Every other ClusterPolicy is `ignored`.

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
}
