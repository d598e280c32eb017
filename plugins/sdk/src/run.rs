//! Running edits over a state's objects and answering with one patch per object: free-form
//! [`Value`] edits ([`transform_each`]) or typed DaemonSet edits ([`transform_typed`]).

use std::borrow::Cow;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Context, TransformError};

/// What a plugin decides for one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Keep the (possibly edited) object.
    Keep,
    /// Leave the object out of the state (the operator deletes it if it exists).
    Omit,
}

/// The answer for one object, as sent to the host (WIT `outcome`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An RFC 6902 JSON Patch, serialized.
    Patch(String),
    /// Omit the object.
    Omit,
}

/// Parse the spec and objects, call `edit` on each object, and answer with one patch (or omit)
/// per object, computed with `json_patch::diff`. The spec is the ClusterPolicy's `spec` as the
/// host sends it (pruned to the CRD and validated), as JSON.
///
/// # Errors
/// A spec that is not JSON (`InvalidField` at `spec`), an object that is not JSON
/// (`InvalidObject` naming its index), or whatever `edit` returns.
pub fn transform_each<F>(
    objects: &[String],
    spec_json: &str,
    ctx: &Context,
    mut edit: F,
) -> Result<Vec<Outcome>, TransformError>
where
    F: FnMut(&mut Value, &Value, &Context) -> Result<Decision, TransformError>,
{
    let spec = parse_spec(spec_json)?;
    objects
        .iter()
        .enumerate()
        .map(|(i, text)| edit_value(i, text, |obj| edit(obj, &spec, ctx)))
        .collect()
}

/// Run typed edits over a state's objects: `daemonset` edits each `DaemonSet` (parsed straight
/// into the `apps/v1` type, no [`Value`]), `object` edits or omits each object whose `kind` is
/// in `object_kinds`, and every other object is kept unchanged without being parsed.
///
/// A DaemonSet is answered with one RFC 6902 `add` per top-level section the edit changed
/// (`/metadata`, `/spec`, `/status`; `remove` for one that became absent), carrying the section
/// as the typed object serializes it (`add` on an existing member replaces it, RFC 6902 §4.1);
/// sections the edit did not touch keep their input JSON. This costs a third of a generic JSON
/// diff of the whole object, which matters because every call runs in a fresh instance. Other
/// objects are answered with a `json_patch::diff`.
///
/// `object` must leave kinds outside `object_kinds` alone (they never reach it); native debug
/// builds call it on them too and panic when it changes one.
///
/// # Errors
/// An object that is not a JSON object or a DaemonSet that does not parse (`InvalidObject`
/// naming its index), or whatever the edits return.
pub fn transform_typed<D, O>(
    objects: &[String],
    object_kinds: &[&str],
    mut daemonset: D,
    mut object: O,
) -> Result<Vec<Outcome>, TransformError>
where
    D: FnMut(&mut DaemonSet) -> Result<(), TransformError>,
    O: FnMut(&mut Value) -> Result<Decision, TransformError>,
{
    objects
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let kind = match compact_kind(text) {
                Some(kind) => Some(Cow::Borrowed(kind)),
                None => peek_kind(i, text)?,
            };
            match kind.as_deref() {
                Some("DaemonSet") => edit_daemonset(i, text, &mut daemonset),
                Some(k) if object_kinds.contains(&k) => edit_value(i, text, &mut object),
                _other => {
                    #[cfg(debug_assertions)]
                    check_unlisted_kind_untouched(text, _other, &mut object);
                    Ok(Outcome::Patch(EMPTY_PATCH.to_string()))
                }
            }
        })
        .collect()
}

/// How an `apps/v1` DaemonSet's JSON text starts when its members are in sorted order, as the
/// kiln host serializes objects: recognizing it saves scanning the whole object for its `kind`
/// before parsing it (any other text falls back to that scan).
const DAEMONSET_PREFIX: &str = r#"{"apiVersion":"apps/v1","kind":"DaemonSet","#;

/// The RFC 6902 patch that changes nothing.
const EMPTY_PATCH: &str = "[]";

/// The spec as JSON.
fn parse_spec(spec_json: &str) -> Result<Value, TransformError> {
    serde_json::from_str(spec_json)
        .map_err(|e| TransformError::field("spec", format!("not JSON: {e}")))
}

/// The `kind` of an object whose text starts `{"apiVersion":"…","kind":"…",` (members sorted,
/// compact, as the kiln host writes objects; no escapes in either string), read off that
/// prefix; `None` for any other text, which [`peek_kind`] then reads.
fn compact_kind(text: &str) -> Option<&str> {
    if text.starts_with(DAEMONSET_PREFIX) {
        return Some("DaemonSet");
    }
    let rest = text.strip_prefix(r#"{"apiVersion":""#)?;
    let rest = &rest[rest.find('"')?..];
    let rest = rest.strip_prefix(r#"","kind":""#)?;
    let kind = &rest[..rest.find('"')?];
    let after = rest.as_bytes().get(kind.len() + 1);
    let plain = |s: &str| !s.contains('\\');
    (plain(&text[..text.len() - rest.len()]) && plain(kind) && matches!(after, Some(b',' | b'}')))
        .then_some(kind)
}

/// The object's `kind`, read without building the object (other members are skipped).
fn peek_kind<'a>(index: usize, text: &'a str) -> Result<Option<Cow<'a, str>>, TransformError> {
    #[derive(Deserialize)]
    struct Head<'a> {
        #[serde(borrow, default)]
        kind: Option<Cow<'a, str>>,
    }
    serde_json::from_str::<Head>(text)
        .map(|h| h.kind)
        .map_err(|e| {
            TransformError::InvalidObject(format!("object #{index} is not a JSON object: {e}"))
        })
}

/// Parses object `index` into a `Value`, lets `edit` change it, and answers with the diff.
fn edit_value(
    index: usize,
    text: &str,
    edit: impl FnOnce(&mut Value) -> Result<Decision, TransformError>,
) -> Result<Outcome, TransformError> {
    let original: Value = serde_json::from_str(text)
        .map_err(|e| TransformError::InvalidObject(format!("object #{index} is not JSON: {e}")))?;
    let mut edited = original.clone();
    match edit(&mut edited)? {
        Decision::Omit => Ok(Outcome::Omit),
        Decision::Keep => serde_json::to_string(&json_patch::diff(&original, &edited))
            .map(Outcome::Patch)
            .map_err(|e| TransformError::Failed(format!("cannot serialize patch: {e}"))),
    }
}

/// Runs `edit` on DaemonSet `index` and answers with [`section_patch`].
fn edit_daemonset(
    index: usize,
    text: &str,
    edit: &mut impl FnMut(&mut DaemonSet) -> Result<(), TransformError>,
) -> Result<Outcome, TransformError> {
    let mut ds: DaemonSet = serde_json::from_str(text).map_err(|e| {
        TransformError::InvalidObject(format!("object #{index} is not a DaemonSet: {e}"))
    })?;
    // Text as the kiln host writes it (compact, members sorted) is compared section by section
    // with what the edited object serializes to, so the object need not be copied first; any
    // other text is compared as typed objects, against a copy.
    let sections = text
        .starts_with(DAEMONSET_PREFIX)
        .then(|| top_level_members(text))
        .flatten();
    let before = match sections {
        Some(_) => None,
        None => Some(ds.clone()),
    };
    edit(&mut ds)?;
    match (&before, &sections) {
        (Some(before), _) => section_patch(before, &ds, text.len()),
        (None, Some(sections)) => text_section_patch(sections, &ds, text.len()),
        (None, None) => unreachable!("one of the two is set"),
    }
}

/// The top-level members of the JSON object `text` as (key, value text) slices, in order; `None`
/// when `text` is not a compact JSON object (no whitespace between tokens, keys without escapes),
/// so that a caller falls back to comparing parsed values. Only the structure is checked here:
/// the caller has parsed `text` already.
fn top_level_members(text: &str) -> Option<Vec<(&str, &str)>> {
    let bytes = text.as_bytes();
    if bytes.first() != Some(&b'{') || bytes.last() != Some(&b'}') {
        return None;
    }
    let mut members = Vec::with_capacity(5);
    let mut i = 1;
    while i < bytes.len() - 1 {
        // A key: `"name":`, without escapes.
        if bytes[i] != b'"' {
            return None;
        }
        let key_end = i + 1 + text[i + 1..].find('"')?;
        let key = &text[i + 1..key_end];
        if key.contains('\\') || bytes.get(key_end + 1) != Some(&b':') {
            return None;
        }
        // Its value: up to the `,` or `}` that ends it at depth 0.
        let start = key_end + 2;
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        let mut end = None;
        for (j, &b) in bytes.iter().enumerate().skip(start) {
            if in_string {
                match b {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' if depth > 0 => depth -= 1,
                b',' | b'}' if depth == 0 => {
                    end = Some(j);
                    break;
                }
                b' ' | b'\n' | b'\r' | b'\t' => return None,
                _ => {}
            }
        }
        let end = end?;
        members.push((key, &text[start..end]));
        i = end + 1;
    }
    Some(members)
}

/// [`section_patch`] for an object whose input text's top-level members are `sections` (see
/// [`top_level_members`]): a section is answered when what `after` serializes it to differs
/// from its input text (`add`), or when it became absent (`remove`).
fn text_section_patch(
    sections: &[(&str, &str)],
    after: &DaemonSet,
    capacity: usize,
) -> Result<Outcome, TransformError> {
    let failed =
        |e: serde_json::Error| TransformError::Failed(format!("cannot serialize patch: {e}"));
    let mut out = Vec::with_capacity(capacity + 64);
    out.push(b'[');
    let mut section = |key: &str, path: &str, value: Option<&dyn erased::Section>| {
        let input = sections.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let mark = out.len();
        if mark > 1 {
            out.push(b',');
        }
        match value {
            Some(value) => {
                out.extend_from_slice(br#"{"op":"add","path":""#);
                out.extend_from_slice(path.as_bytes());
                out.extend_from_slice(br#"","value":"#);
                let at = out.len();
                value.write(&mut out)?;
                if input.is_some_and(|t| t.as_bytes() == &out[at..]) {
                    out.truncate(mark);
                } else {
                    out.push(b'}');
                }
            }
            None if input.is_some() => {
                out.extend_from_slice(br#"{"op":"remove","path":""#);
                out.extend_from_slice(path.as_bytes());
                out.extend_from_slice(br#""}"#);
            }
            None => out.truncate(mark),
        }
        Ok::<(), serde_json::Error>(())
    };
    section("metadata", "/metadata", Some(&after.metadata)).map_err(failed)?;
    section("spec", "/spec", after.spec.as_ref().map(|s| s as _)).map_err(failed)?;
    section("status", "/status", after.status.as_ref().map(|s| s as _)).map_err(failed)?;
    out.push(b']');
    // serde_json writes UTF-8 only, and the rest is ASCII.
    String::from_utf8(out)
        .map(Outcome::Patch)
        .map_err(|e| TransformError::Failed(format!("cannot serialize patch: {e}")))
}

/// Serializing a DaemonSet section without knowing its type.
mod erased {
    /// A section that writes itself as compact JSON.
    pub(super) trait Section {
        /// Appends the section's JSON to `out`.
        fn write(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error>;
    }

    impl<T: serde::Serialize> Section for T {
        fn write(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
            serde_json::to_writer(out, self)
        }
    }
}

/// One operation of a [`section_patch`].
#[derive(Serialize)]
struct SectionOp<'a> {
    op: &'static str,
    path: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<Section<'a>>,
}

/// A top-level DaemonSet member, serialized as the typed object does.
#[derive(Serialize)]
#[serde(untagged)]
enum Section<'a> {
    Metadata(&'a ObjectMeta),
    Spec(&'a DaemonSetSpec),
    Status(&'a DaemonSetStatus),
}

/// The patch from `before` to `after`: per top-level member (`/metadata`, `/spec`,
/// `/status`) that differs, `add` with the new value or `remove` when it became absent.
/// `capacity` sizes the output buffer (the input's length fits a whole-object patch).
fn section_patch(
    before: &DaemonSet,
    after: &DaemonSet,
    capacity: usize,
) -> Result<Outcome, TransformError> {
    fn op<'a, T: PartialEq>(
        path: &'static str,
        before: Option<&T>,
        after: Option<&'a T>,
        section: fn(&'a T) -> Section<'a>,
    ) -> Option<SectionOp<'a>> {
        if before == after {
            return None;
        }
        Some(match after {
            Some(v) => SectionOp {
                op: "add",
                path,
                value: Some(section(v)),
            },
            None => SectionOp {
                op: "remove",
                path,
                value: None,
            },
        })
    }
    let ops: Vec<SectionOp> = [
        op(
            "/metadata",
            Some(&before.metadata),
            Some(&after.metadata),
            Section::Metadata,
        ),
        op(
            "/spec",
            before.spec.as_ref(),
            after.spec.as_ref(),
            Section::Spec,
        ),
        op(
            "/status",
            before.status.as_ref(),
            after.status.as_ref(),
            Section::Status,
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut out = Vec::with_capacity(capacity + 64);
    serde_json::to_writer(&mut out, &ops)
        .map_err(|e| TransformError::Failed(format!("cannot serialize patch: {e}")))?;
    // serde_json writes UTF-8 only.
    String::from_utf8(out)
        .map(Outcome::Patch)
        .map_err(|e| TransformError::Failed(format!("cannot serialize patch: {e}")))
}

/// Debug builds: `object` must leave kinds that [`transform_typed`] was not told to show it
/// alone, since release builds never show them to it.
#[cfg(debug_assertions)]
fn check_unlisted_kind_untouched(
    text: &str,
    kind: Option<&str>,
    object: &mut impl FnMut(&mut Value) -> Result<Decision, TransformError>,
) {
    let Ok(original) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let mut obj = original.clone();
    let decision = object(&mut obj);
    assert!(
        matches!(decision, Ok(Decision::Keep)) && obj == original,
        "the object edit changes kind {kind:?}, which its object kinds (an Operand's \
         OBJECT_KINDS) do not list"
    );
}

/// Applies outcomes to their objects natively, as the host would (`None`: omitted): for
/// native tests of a plugin.
///
/// # Errors
/// Never for outcomes the SDK produced; the `Result` lets callers chain it.
///
/// # Panics
/// On a patch that does not parse or apply (the SDK never produces one).
pub fn apply_outcomes(
    objects: &[Value],
    outcomes: Vec<Outcome>,
) -> Result<Vec<Option<Value>>, TransformError> {
    Ok(outcomes
        .into_iter()
        .zip(objects)
        .map(|(o, obj)| match o {
            Outcome::Omit => None,
            Outcome::Patch(p) => {
                let patch: json_patch::Patch = serde_json::from_str(&p).expect("SDK patches parse");
                let mut doc = obj.clone();
                json_patch::patch(&mut doc, &patch).expect("SDK patches apply");
                Some(doc)
            }
        })
        .collect())
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
