//! Additive drift: what another field manager added to an object kiln applied, that kiln does
//! not render, and the JSON patch that takes it out again.
//!
//! Server-side apply makes kiln the owner of exactly the fields it renders: a changed value of
//! one of those is a conflict that kiln's forced apply wins back, but a field kiln never set (a
//! sidecar container, an env var, a volume, a label, `privileged: true` in a container kiln
//! renders without a security context) belongs to whoever set it, and no apply of kiln's
//! removes it. The API server itself records who set what: every object's
//! `metadata.managedFields` holds, per field manager, the set of fields it owns (`fieldsV1`).
//! So the drift of an object is read off that record, not guessed by comparing the live object
//! with the render:
//!
//! ```text
//! drift = ⋃ fields of every other manager's entry on the main resource (not `status`)
//!         − fields of kiln's own entries
//!         − TOLERATED (the server's template-generation annotation, `kubectl rollout restart`)
//! ```
//!
//! Fields the API server fills in by defaulting (`terminationMessagePath`, `protocol: TCP`,
//! `imagePullPolicy`, `revisionHistoryLimit`, `updateStrategy`, …) are owned by nobody when kiln
//! created the object, so they are never drift. A manager that created or updated the object
//! with a full-object write (`kubectl create`/`edit`, a controller's Update, NVIDIA's operator
//! before a takeover) owns the defaulted fields it sent too: removing those makes the server
//! default them again to the same value, a write that changes nothing. The operator remembers
//! such a residue (what is still there after its correction) and does not try again until its
//! value changes ([`Removal::id`]).
//!
//! [`removals`] resolves the drift against the live object into JSON-patch `remove`
//! operations, each at the topmost field the drift owns (a foreign container goes whole, an
//! env var added to kiln's container goes alone), ordered so that removing one never moves
//! the index of another; [`json_patch`] guards them with a `test` of the `resourceVersion`
//! they were computed from, so a patch against a stale copy fails instead of removing the
//! wrong list item. A JSON patch is used rather than a replace (`PUT`) of the whole object:
//! it touches nothing but the drift, keeps every other manager's unrelated fields and status,
//! and when the drift lies outside the pod template the DaemonSet's template, and so its
//! pods, stay as they are.

use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use serde_json::{Map, Value, json};

/// Fields (as `fieldsV1` paths) that are never drift: the whole status; the
/// `deprecated.daemonset.template.generation` annotation the API server keeps on DaemonSets;
/// the pod template's `kubectl.kubernetes.io/restartedAt` annotation that `kubectl rollout
/// restart` sets (a restart, not configuration: removing it would roll the pods a second time).
pub const TOLERATED: &[&[&str]] = &[
    &["f:status"],
    &[
        "f:metadata",
        "f:annotations",
        "f:deprecated.daemonset.template.generation",
    ],
    &[
        "f:spec",
        "f:template",
        "f:metadata",
        "f:annotations",
        "f:kubectl.kubernetes.io/restartedAt",
    ],
];

/// Whether a `fieldsV1` node is itself a member of the set: a leaf (`{}`) or a node with `.`.
fn member(node: Option<&Map<String, Value>>) -> bool {
    node.is_some_and(|m| m.is_empty() || m.contains_key("."))
}

/// The members of the `fieldsV1` set `a` that are not members of `b`, where a node `b` owns
/// anything under counts as `b`'s too: a map or list item whose fields kiln sets exists
/// because kiln renders it, even when a manager that wrote the whole object (a create, an
/// Update) owns the node itself and kiln owns only what it holds.
fn minus(a: &Map<String, Value>, b: Option<&Map<String, Value>>) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, ca) in a {
        if k == "." {
            if b.is_none() {
                out.insert(".".into(), json!({}));
            }
            continue;
        }
        let cb = b.and_then(|b| b.get(k)).and_then(Value::as_object);
        match ca.as_object() {
            Some(m) if !m.is_empty() => {
                let d = minus(m, cb);
                if !d.is_empty() {
                    out.insert(k.clone(), Value::Object(d));
                }
            }
            _ => {
                if cb.is_none() {
                    out.insert(k.clone(), json!({}));
                }
            }
        }
    }
    out
}

/// Remove the field at `path` (and everything under it) from the `fieldsV1` set `set`, and
/// the membership of its parents (a foreign annotations map that holds a tolerated annotation
/// is not removed whole: its other annotations are, one by one); parents left empty go.
fn remove_path(set: &mut Map<String, Value>, path: &[&str]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    if rest.is_empty() {
        set.remove(*first);
        return;
    }
    let emptied = match set.get_mut(*first).and_then(Value::as_object_mut) {
        Some(child) => {
            // The field's parents stay: only their other members may be drift.
            child.remove(".");
            remove_path(child, rest);
            child.is_empty()
        }
        None => false,
    };
    if emptied {
        set.remove(*first);
    }
}

/// Whether `e` is about the object itself (not a subresource such as `status`).
fn main_resource(e: &ManagedFieldsEntry) -> bool {
    e.subresource.as_deref().unwrap_or_default().is_empty()
}

fn fields(e: &ManagedFieldsEntry) -> Option<&Map<String, Value>> {
    e.fields_v1.as_ref().and_then(|f| f.0.as_object())
}

/// The drift of an object whose `metadata.managedFields` are `entries`, kiln's manager being
/// `own`: one entry per other manager of the main resource that owns fields `own` does not
/// (minus [`TOLERATED`]), its `fieldsV1` reduced to those fields; its manager, operation and
/// apiVersion kept, its time dropped. Empty when nobody else added anything.
///
/// Applied to its own output (where `own` has no entry left) it returns the same entries, so a
/// cache may keep this reduction instead of the full record.
pub fn foreign(entries: &[ManagedFieldsEntry], own: &str) -> Vec<ManagedFieldsEntry> {
    let owned: Vec<&Map<String, Value>> = entries
        .iter()
        .filter(|e| e.manager.as_deref() == Some(own) && main_resource(e))
        .filter_map(fields)
        .collect();
    entries
        .iter()
        .filter(|e| e.manager.as_deref() != Some(own) && main_resource(e))
        .filter_map(|e| {
            let mut set = fields(e)?.clone();
            for o in &owned {
                set = minus(&set, Some(o));
            }
            for path in TOLERATED {
                remove_path(&mut set, path);
            }
            (!set.is_empty()).then(|| ManagedFieldsEntry {
                api_version: e.api_version.clone(),
                fields_type: e.fields_type.clone(),
                fields_v1: Some(FieldsV1(Value::Object(set))),
                manager: e.manager.clone(),
                operation: e.operation.clone(),
                subresource: None,
                time: None,
            })
        })
        .collect()
}

/// One step of a JSON pointer: an object's field or a list's index.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Seg {
    Key(String),
    Index(usize),
}

/// One field to take out of the live object.
#[derive(Debug, Clone, PartialEq)]
pub struct Removal {
    /// Where it is in the live object, as an RFC 6901 JSON pointer
    /// (`/spec/template/spec/containers/1`).
    pub pointer: String,
    /// Where it is, for people: list items named by their keys
    /// (`spec.template.spec.containers[name=sidecar]`, `metadata.labels.team`).
    pub path: String,
    /// The field manager that set it.
    pub manager: String,
    /// Its value in the live object.
    pub value: Value,
    segs: Vec<Seg>,
}

impl Removal {
    /// The field and its value as one word: the operator remembers the ids of a residue its
    /// correction could not remove (defaulted again by the server), and tries again only when
    /// the value there changes.
    pub fn id(&self) -> String {
        let mut h = DefaultHasher::new();
        self.value.to_string().hash(&mut h);
        format!("{}={:016x}", self.path, h.finish())
    }
}

/// A JSON value as a list key shows it: strings bare, everything else as JSON.
fn shown(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

/// The child of `value` that the `fieldsV1` key `key` names (`f:name`, `k:{"name":"x"}`,
/// `v:"value"`, `i:3`), with its pointer step and how a person reads that step.
fn step<'a>(value: &'a Value, key: &str) -> Option<(Seg, String, &'a Value)> {
    if let Some(name) = key.strip_prefix("f:") {
        let v = value.as_object()?.get(name)?;
        return Some((Seg::Key(name.to_string()), format!(".{name}"), v));
    }
    let items = value.as_array()?;
    let (i, label) = if let Some(k) = key.strip_prefix("k:") {
        let want: Map<String, Value> = serde_json::from_str(k).ok()?;
        let i = items
            .iter()
            .position(|it| want.iter().all(|(f, w)| it.get(f) == Some(w)))?;
        let label: Vec<String> = want
            .iter()
            .map(|(f, w)| format!("{f}={}", shown(w)))
            .collect();
        (i, label.join(","))
    } else if let Some(v) = key.strip_prefix("v:") {
        let want: Value = serde_json::from_str(v).ok()?;
        (items.iter().position(|it| *it == want)?, shown(&want))
    } else {
        let i: usize = key.strip_prefix("i:")?.parse().ok()?;
        (i, i.to_string())
    };
    Some((Seg::Index(i), format!("[{label}]"), items.get(i)?))
}

fn walk(
    value: &Value,
    node: &Map<String, Value>,
    at: (&mut Vec<Seg>, &str),
    manager: &str,
    out: &mut Vec<Removal>,
) {
    let (segs, path) = at;
    for (k, child) in node {
        if k == "." {
            continue;
        }
        let Some((seg, shown, v)) = step(value, k) else {
            continue;
        };
        let path = format!("{path}{shown}");
        segs.push(seg);
        match child.as_object() {
            Some(m) if !member(Some(m)) => walk(v, m, (segs, &path), manager, out),
            _ => out.push(Removal {
                pointer: pointer(segs),
                path: path.trim_start_matches('.').to_string(),
                manager: manager.to_string(),
                value: v.clone(),
                segs: segs.clone(),
            }),
        }
        segs.pop();
    }
}

fn pointer(segs: &[Seg]) -> String {
    segs.iter()
        .map(|s| match s {
            Seg::Key(k) => format!("/{}", k.replace('~', "~0").replace('/', "~1")),
            Seg::Index(i) => format!("/{i}"),
        })
        .collect()
}

/// The drift `foreign` (as [`foreign`] made it) resolved against the live `object` (JSON): one
/// removal per topmost field it owns that the object holds (fields it names that the object
/// no longer has are skipped), each once, in the order a JSON patch must apply them (a list's
/// later items before its earlier ones).
pub fn removals(object: &Value, foreign: &[ManagedFieldsEntry]) -> Vec<Removal> {
    let mut out = Vec::new();
    for e in foreign {
        if let Some(set) = fields(e) {
            let manager = e.manager.as_deref().unwrap_or_default();
            walk(object, set, (&mut Vec::new(), ""), manager, &mut out);
        }
    }
    out.sort_by(|a, b| b.segs.cmp(&a.segs));
    out.dedup_by(|a, b| a.segs == b.segs);
    out
}

/// The JSON patch (RFC 6902) that makes `removals` of the object at `resource_version`: a
/// `test` of `/metadata/resourceVersion` first, so a patch computed from a stale copy is
/// refused, then one `remove` each.
pub fn json_patch(resource_version: &str, removals: &[Removal]) -> Value {
    let test =
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version});
    Value::Array(
        std::iter::once(test)
            .chain(
                removals
                    .iter()
                    .map(|r| json!({"op": "remove", "path": r.pointer})),
            )
            .collect(),
    )
}

/// What an Event says about `removed`: each field's path, grouped by the manager that set it
/// (`set by kubectl-edit: spec.template.spec.containers[name=sidecar]; …`).
pub fn describe(removed: &[Removal]) -> String {
    let mut by: Vec<(&str, Vec<&str>)> = Vec::new();
    for r in removed {
        match by.iter_mut().find(|(m, _)| *m == r.manager) {
            Some((_, paths)) => paths.push(&r.path),
            None => by.push((&r.manager, vec![&r.path])),
        }
    }
    by.iter()
        .map(|(m, paths)| format!("set by {m}: {}", paths.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
#[path = "drift_tests.rs"]
mod tests;
