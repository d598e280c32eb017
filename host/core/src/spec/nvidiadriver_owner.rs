//! `spec.default`: which NVIDIADriver manages each GPU node (NVIDIA v26.7.0's owner routing).
//!
//! Upstream labels every GPU node with the one NVIDIADriver that manages its driver
//! ([`OWNER_LABEL`]) and each CR's node pools select that label as well as the CR's
//! `nodeSelector`. The rule, restated:
//! - CRs being deleted take no part;
//! - a CR may not select on [`OWNER_LABEL`], and a `default: true` CR may not have a
//!   `nodeSelector` at all (the CRD says so too);
//! - at most one CR is the default;
//! - a GPU node (`nvidia.com/gpu.present=true`) matched by exactly one non-default CR belongs to
//!   it; matched by none, to the default CR (or to none: the label is removed); matched by more
//!   than one, the whole assignment fails and no node label changes.

use std::collections::BTreeMap;

use super::NvidiaDriverSpec;
use crate::label_keys::{GPU_PRESENT, LabelLookup};

/// Node label naming the NVIDIADriver that manages the node's driver
/// (`nvidia.com/gpu-operator.driver.owner=<cr>`); operator-managed, reserved in selectors.
pub const OWNER_LABEL: &str = "nvidia.com/gpu-operator.driver.owner";

/// Why no owner assignment could be made; nothing is to change then.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnerError {
    /// A CR's `nodeSelector` is not allowed.
    #[error("NVIDIADriver {name:?}: {message}")]
    Selector {
        /// The CR.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// More than one CR is the default.
    #[error("multiple default NVIDIADrivers found: {0:?}")]
    MultipleDefaults(Vec<String>),
    /// More than one non-default CR selects the node.
    #[error("multiple NVIDIADrivers match the same node {node}: {drivers:?}")]
    Conflict {
        /// The node.
        node: String,
        /// The CRs selecting it, in input order.
        drivers: Vec<String>,
    },
}

/// Whether the CR `name`'s `nodeSelector` is allowed (upstream `ValidateNodeSelector`): not on
/// [`OWNER_LABEL`], and none at all on a default CR.
///
/// # Errors
/// [`OwnerError::Selector`].
pub fn check_owner_selector(name: &str, spec: &NvidiaDriverSpec) -> Result<(), OwnerError> {
    let Some(sel) = &spec.node_selector else {
        return Ok(());
    };
    let fail = |message: String| {
        Err(OwnerError::Selector {
            name: name.to_string(),
            message,
        })
    };
    if spec.default && !sel.is_empty() {
        return fail("a default NVIDIADriver cannot use nodeSelector".into());
    }
    if sel.contains_key(OWNER_LABEL) {
        return fail(format!(
            "nodeSelector cannot use reserved label {OWNER_LABEL:?}"
        ));
    }
    Ok(())
}

/// The owner each GPU node among `nodes` (`(name, labels)`) should carry in [`OWNER_LABEL`]
/// (`None`: no label), for the live (not deleting) CRs `drivers` (`(name, spec)`), by the rule
/// of the module docs. Nodes that are not GPU nodes are not in the result.
///
/// # Errors
/// The first [`OwnerError`] found: a bad selector, several defaults, or a node several
/// non-default CRs select.
pub fn node_owners<N: AsRef<str>, L: LabelLookup>(
    drivers: &[(String, &NvidiaDriverSpec)],
    nodes: impl IntoIterator<Item = (N, L)>,
) -> Result<BTreeMap<String, Option<String>>, OwnerError> {
    for (name, spec) in drivers {
        check_owner_selector(name, spec)?;
    }
    let defaults: Vec<String> = drivers
        .iter()
        .filter(|(_, s)| s.default)
        .map(|(n, _)| n.clone())
        .collect();
    if defaults.len() > 1 {
        return Err(OwnerError::MultipleDefaults(defaults));
    }
    let mut out = BTreeMap::new();
    for (node, labels) in nodes {
        if labels.label(GPU_PRESENT) != Some("true") {
            continue;
        }
        let matching: Vec<String> = drivers
            .iter()
            .filter(|(_, s)| !s.default)
            .filter(|(_, s)| {
                s.node_selector
                    .iter()
                    .flatten()
                    .all(|(k, v)| labels.label(k) == Some(v.as_str()))
            })
            .map(|(n, _)| n.clone())
            .collect();
        let owner = match matching.len() {
            0 => defaults.first().cloned(),
            1 => matching.into_iter().next(),
            _ => {
                return Err(OwnerError::Conflict {
                    node: node.as_ref().to_string(),
                    drivers: matching,
                });
            }
        };
        out.insert(node.as_ref().to_string(), owner);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::label_keys::Labels;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> NvidiaDriverSpec {
        serde_json::from_value(v).unwrap()
    }

    fn node(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn specific_drivers_win_and_the_default_takes_the_rest() {
        let a100 = spec(json!({"nodeSelector": {"gpu": "a100"}}));
        let fallback = spec(json!({"default": true}));
        let drivers = [
            ("a100".to_string(), &a100),
            ("fallback".to_string(), &fallback),
        ];
        let nodes = [
            ("n1", node(&[(GPU_PRESENT, "true"), ("gpu", "a100")])),
            ("n2", node(&[(GPU_PRESENT, "true"), ("gpu", "h100")])),
            ("cpu", node(&[("gpu", "a100")])),
        ];
        let owners = node_owners(&drivers, nodes.clone()).unwrap();
        assert_eq!(
            owners,
            BTreeMap::from([
                ("n1".to_string(), Some("a100".to_string())),
                ("n2".to_string(), Some("fallback".to_string())),
            ])
        );
        // Without a default, unmatched GPU nodes have no owner.
        let owners = node_owners(&drivers[..1], nodes).unwrap();
        assert_eq!(owners["n2"], None);
    }

    #[test]
    fn conflicts_and_bad_selectors_fail_the_whole_assignment() {
        let all = spec(json!({}));
        let some = spec(json!({"nodeSelector": {"gpu": "a100"}}));
        let nodes = [("n1", node(&[(GPU_PRESENT, "true"), ("gpu", "a100")]))];
        let err = node_owners(
            &[("all".into(), &all), ("some".into(), &some)],
            nodes.clone(),
        );
        assert_eq!(
            err,
            Err(OwnerError::Conflict {
                node: "n1".into(),
                drivers: vec!["all".into(), "some".into()]
            })
        );
        let d1 = spec(json!({"default": true}));
        let d2 = spec(json!({"default": true, "nodeSelector": {}}));
        assert_eq!(
            node_owners(&[("d1".into(), &d1), ("d2".into(), &d2)], nodes.clone()),
            Err(OwnerError::MultipleDefaults(vec!["d1".into(), "d2".into()]))
        );
        let scoped = spec(json!({"default": true, "nodeSelector": {"gpu": "a100"}}));
        assert!(matches!(
            node_owners(&[("scoped".into(), &scoped)], nodes.clone()),
            Err(OwnerError::Selector { .. })
        ));
        let reserved = spec(json!({"nodeSelector": {OWNER_LABEL: "x"}}));
        let err = node_owners(&[("r".into(), &reserved)], nodes).unwrap_err();
        assert!(err.to_string().contains("reserved label"), "{err}");
    }
}
