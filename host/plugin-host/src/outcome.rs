//! Applying a plugin's outcomes to its input objects, and the output policy every result is
//! held to before anything is applied (`wit/README.md`, "Output policy"):
//!
//! * Every plugin: a patched object keeps its identity, the same `apiVersion`, `kind`,
//!   `metadata.name` and `metadata.namespace` ([`PluginError::IdentityChanged`]); an `apps/v1`
//!   DaemonSet keeps its `spec.selector`, which the API server holds immutable
//!   ([`PluginError::InvalidResult`]); and it serializes to at most
//!   [`crate::HostConfig::object_limit_bytes`], the `copy` operations of its patch adding at most
//!   that much together, counted before each is applied ([`PluginError::ObjectTooLarge`]).
//! * Site plugins (all but the bundled standard ones) also return DaemonSets that still parse
//!   as typed `apps/v1` DaemonSets ([`PluginError::InvalidResult`]; a standard plugin's sections
//!   are serialized from the typed DaemonSet the SDK edited, so they parse by construction and
//!   are not parsed again); leave RBAC alone: the `rules` and
//!   `aggregationRule` of Roles/ClusterRoles, the `roleRef` and `subjects` of
//!   RoleBindings/ClusterRoleBindings ([`PluginError::RbacChanged`]); and, unless the host
//!   allows it ([`PodPrivileges::Allow`]), do not widen an operand pod's privileges beyond what
//!   its input had: `hostPID`/`hostNetwork`/`hostIPC`, a `privileged` container, an added
//!   capability, a `hostPath` volume ([`PluginError::PodPrivilegeWidened`]).
//!
//! Objects a plugin returns unpatched (an empty patch) are not checked again: they are what it
//! was given. The site checks read only the objects of the kinds they concern.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::DaemonSet;
use serde_json::Value;

use crate::bindings::v2::kiln::operand::types::Outcome;
use crate::config::PodPrivileges;
use crate::error::PluginError;

/// What one call's output is held to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutputPolicy {
    /// Cap on the total patch text of the call.
    pub(crate) output_limit_bytes: usize,
    /// Cap on one patched object, serialized.
    pub(crate) object_limit_bytes: usize,
    /// `Some` for a site plugin, with whether it may widen pod privileges.
    pub(crate) site: Option<PodPrivileges>,
}

impl OutputPolicy {
    /// The default limits for a plugin that is standard (`site` false) or not.
    #[cfg(test)]
    pub(crate) fn for_tests(output_limit_bytes: usize, site: bool) -> Self {
        OutputPolicy {
            output_limit_bytes,
            object_limit_bytes: crate::config::DEFAULT_OBJECT_LIMIT_BYTES,
            site: site.then_some(PodPrivileges::Deny),
        }
    }
}

/// What a plugin decided for one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Rendered {
    /// The object, patched (unchanged when the patch was empty).
    Keep(Value),
    /// The object is left out: not rendered, deleted if present.
    Omit,
}

/// `kind/name` of an object, for messages.
pub(crate) fn describe(object: &Value) -> String {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("?");
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("?");
    format!("{kind}/{name}")
}

/// A chain step's objects: the chain's input (borrowed, copied only as far as a patch needs)
/// or the previous step's results (owned, patched in place).
pub(crate) enum StepObjects<'a> {
    /// The chain's input objects.
    Input(&'a [Value]),
    /// Results of the previous step.
    Owned(Vec<Value>),
}

impl StepObjects<'_> {
    pub(crate) fn as_slice(&self) -> &[Value] {
        match self {
            StepObjects::Input(o) => o,
            StepObjects::Owned(o) => o,
        }
    }
}

/// Applies `outcomes` to `objects` and validates the results.
///
/// # Errors
/// As [`apply_outcomes_to`].
#[cfg(test)]
pub(crate) fn apply_outcomes(
    plugin: &str,
    objects: &[Value],
    outcomes: Vec<Outcome>,
    policy: &OutputPolicy,
) -> Result<Vec<Rendered>, PluginError> {
    let sizes: Vec<usize> = objects.iter().map(|o| o.to_string().len()).collect();
    let out = apply_outcomes_to(
        plugin,
        StepObjects::Input(objects),
        &sizes,
        outcomes,
        policy,
    )?;
    Ok(rendered(out))
}

/// `Keep`/`Omit` for each result of [`apply_outcomes_to`].
pub(crate) fn rendered(results: Vec<Option<Value>>) -> Vec<Rendered> {
    results
        .into_iter()
        .map(|o| o.map_or(Rendered::Omit, Rendered::Keep))
        .collect()
}

/// Applies `outcomes` to `objects` and validates the results: per object, the patched object,
/// or `None` when the plugin omitted it.
///
/// # Errors
/// [`PluginError::WrongOutcomeCount`], [`PluginError::OutputTooLarge`] (total patch bytes over
/// the policy's `output_limit_bytes`), [`PluginError::InvalidPatch`], and the output policy's
/// errors (see the module docs).
///
/// `sizes` are the objects' serialized sizes (the length of the compact JSON text the plugin
/// was given), one per object; they let the size check skip serializing a result that cannot be
/// over the limit (see [`result_size_bound`]).
pub(crate) fn apply_outcomes_to(
    plugin: &str,
    objects: StepObjects<'_>,
    sizes: &[usize],
    outcomes: Vec<Outcome>,
    policy: &OutputPolicy,
) -> Result<Vec<Option<Value>>, PluginError> {
    let output_limit_bytes = policy.output_limit_bytes;
    let expected = objects.as_slice().len();
    debug_assert_eq!(sizes.len(), expected);
    if outcomes.len() != expected {
        return Err(PluginError::WrongOutcomeCount {
            plugin: plugin.to_string(),
            expected,
            actual: outcomes.len(),
        });
    }
    let total: usize = outcomes
        .iter()
        .map(|o| match o {
            Outcome::Patch(p) => p.len(),
            Outcome::Omit => 0,
        })
        .sum();
    if total > output_limit_bytes {
        return Err(PluginError::OutputTooLarge {
            plugin: plugin.to_string(),
            limit_bytes: output_limit_bytes,
            actual_bytes: total,
        });
    }
    let patch_one = |index: usize, object: Target<'_>, outcome: Outcome| match outcome {
        Outcome::Omit => Ok(None),
        Outcome::Patch(text) => {
            let size = sizes.get(index).copied();
            apply_patch(plugin, index, object, size, &text, policy).map(Some)
        }
    };
    match objects {
        StepObjects::Input(objects) => objects
            .iter()
            .zip(outcomes)
            .enumerate()
            .map(|(i, (o, outcome))| patch_one(i, Target::Copy(o), outcome))
            .collect(),
        StepObjects::Owned(objects) => objects
            .into_iter()
            .zip(outcomes)
            .enumerate()
            .map(|(i, (o, outcome))| patch_one(i, Target::InPlace(o), outcome))
            .collect(),
    }
}

/// The object a patch applies to.
enum Target<'a> {
    /// Patch a copy; the original stays.
    Copy(&'a Value),
    /// Patch this object.
    InPlace(Value),
}

/// The copy of `original` that `patch` is applied to. When every operation is an `add`,
/// `replace` or `remove` of a top-level member (what the standard plugins answer), members that
/// an `add` or `replace` overwrites are not copied: they get a `null` placeholder, which those
/// operations replace without reading it, so the result equals patching a full copy. Any other
/// patch gets a full copy.
fn copy_for_patch(original: &Value, patch: &json_patch::Patch) -> Value {
    use json_patch::PatchOperation as Op;
    let Value::Object(members) = original else {
        return original.clone();
    };
    let mut overwritten = Vec::with_capacity(patch.len());
    for op in patch.iter() {
        let (path, overwrites) = match op {
            Op::Add(a) => (&a.path, true),
            Op::Replace(r) => (&r.path, true),
            Op::Remove(r) => (&r.path, false),
            _ => return original.clone(),
        };
        let mut tokens = path.tokens();
        let (Some(token), None) = (tokens.next(), tokens.next()) else {
            return original.clone();
        };
        if overwrites {
            overwritten.push(token.decoded().into_owned());
        }
    }
    Value::Object(
        members
            .iter()
            .map(|(k, v)| {
                let placeholder = overwritten.iter().any(|o| o == k);
                (k.clone(), if placeholder { Value::Null } else { v.clone() })
            })
            .collect(),
    )
}

/// The members of an object a patch must not change (see the module docs), copied before the
/// patch is applied.
struct Identity {
    members: [Option<Value>; 4],
    daemonset_selector: Option<Option<Value>>,
}

/// Pointers of the members every patched object keeps.
const IDENTITY: [&str; 4] = [
    "/apiVersion",
    "/kind",
    "/metadata/name",
    "/metadata/namespace",
];

impl Identity {
    fn of(object: &Value) -> Self {
        Identity {
            members: IDENTITY.map(|p| object.pointer(p).cloned()),
            daemonset_selector: is_daemonset(object)
                .then(|| object.pointer("/spec/selector").cloned()),
        }
    }

    /// `kind/name` of the object, as [`describe`] gives it.
    fn describe(&self) -> String {
        let text = |v: &Option<Value>| {
            v.as_ref()
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string()
        };
        format!("{}/{}", text(&self.members[1]), text(&self.members[2]))
    }

    /// Why `patched` is not an acceptable result for the object this identity was taken
    /// from, if it is not.
    fn check(&self, patched: &Value) -> Result<(), Refusal> {
        if !patched.is_object() {
            return Err(Refusal::Invalid("the result is not a JSON object".into()));
        }
        for (pointer, before) in IDENTITY.iter().zip(&self.members) {
            let after = patched.pointer(pointer);
            if before.as_ref() != after {
                return Err(Refusal::Identity {
                    field: pointer,
                    before: show(before.as_ref()),
                    after: crate::text::bounded_owned(show(after), crate::text::MAX_NAME_BYTES),
                });
            }
        }
        self.check_daemonset(patched).map_err(Refusal::Invalid)
    }

    /// The selector rule of the module docs (a site plugin's DaemonSet is also parsed as a
    /// typed one, [`SiteGuard`]).
    fn check_daemonset(&self, patched: &Value) -> Result<(), String> {
        if let Some(before) = &self.daemonset_selector {
            let after = patched.pointer("/spec/selector");
            if before.as_ref() != after {
                return Err(format!(
                    "/spec/selector changed from {} to {}",
                    show(before.as_ref()),
                    show(after)
                ));
            }
        }
        Ok(())
    }
}

/// Whether `object` is an `apps/v1` DaemonSet (the kind the DaemonSet rules concern).
fn is_daemonset(object: &Value) -> bool {
    object.get("apiVersion").and_then(Value::as_str) == Some("apps/v1")
        && object.get("kind").and_then(Value::as_str) == Some("DaemonSet")
}

/// Why a patched object is refused (turned into a [`PluginError`] naming plugin and object).
enum Refusal {
    /// [`PluginError::InvalidResult`].
    Invalid(String),
    /// [`PluginError::IdentityChanged`].
    Identity {
        field: &'static str,
        before: String,
        after: String,
    },
    /// [`PluginError::RbacChanged`].
    Rbac(&'static str),
    /// [`PluginError::PodPrivilegeWidened`].
    Privilege(String),
    /// [`PluginError::ObjectTooLarge`], with the bytes counted (at least the limit + 1).
    TooLarge(usize),
}

/// What the site checks need of an object before it is patched: whether it must still parse
/// as a typed DaemonSet, the RBAC members it must keep, and its pod's privileges.
///
/// Only a site plugin's DaemonSet is parsed as a typed `apps/v1` DaemonSet: a standard plugin
/// answers through the SDK's `export_operand!` path (in kiln's build, the standard bundle's
/// `export_standard_bundle!`, which runs it per plugin), which serializes every DaemonSet section
/// from the typed object it edited (`kiln_plugin_std::run_operand`), so its result parses by
/// construction and is not parsed again (what that parse cost: `docs/benchmarks.md`,
/// `cargo bench -p kiln-render`).
struct SiteGuard {
    typed_daemonset: bool,
    rbac: Vec<(&'static str, Option<Value>)>,
    /// Pointer of the pod spec, and its privileges before.
    pod: Option<(&'static str, BTreeSet<String>)>,
}

/// The RBAC members a site plugin must keep, by kind.
fn rbac_members(kind: &str) -> &'static [&'static str] {
    match kind {
        "Role" | "ClusterRole" => &["/rules", "/aggregationRule"],
        "RoleBinding" | "ClusterRoleBinding" => &["/roleRef", "/subjects"],
        _ => &[],
    }
}

/// Where a kind keeps its pod spec.
fn pod_spec_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some("/spec"),
        "DaemonSet"
        | "Deployment"
        | "StatefulSet"
        | "ReplicaSet"
        | "ReplicationController"
        | "Job" => Some("/spec/template/spec"),
        "CronJob" => Some("/spec/jobTemplate/spec/template/spec"),
        _ => None,
    }
}

/// The privileges a pod spec grants, each as a path below the pod spec: `hostPID` (and the
/// other host namespaces) when true, `containers[name=c]/securityContext/privileged` when
/// true, `…/capabilities/add/CAP` per added capability, `volumes[name=v]/hostPath/path=P` per
/// hostPath volume.
fn pod_privileges(spec: Option<&Value>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Some(spec) = spec else { return out };
    for ns in ["hostPID", "hostNetwork", "hostIPC"] {
        if spec.get(ns).and_then(Value::as_bool) == Some(true) {
            out.insert(ns.to_string());
        }
    }
    let name_of = |v: &Value| {
        v.get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for c in spec
            .get(list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(sc) = c.get("securityContext") else {
                continue;
            };
            let name = name_of(c);
            if sc.get("privileged").and_then(Value::as_bool) == Some(true) {
                out.insert(format!("{list}[name={name}]/securityContext/privileged"));
            }
            let added = sc.pointer("/capabilities/add").and_then(Value::as_array);
            for cap in added.into_iter().flatten() {
                let cap = cap.as_str().map_or_else(|| cap.to_string(), str::to_string);
                out.insert(format!(
                    "{list}[name={name}]/securityContext/capabilities/add/{cap}"
                ));
            }
        }
    }
    for v in spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(hp) = v.get("hostPath") {
            let path = hp
                .get("path")
                .map_or_else(|| "null".into(), Value::to_string);
            out.insert(format!("volumes[name={}]/hostPath/path={path}", name_of(v)));
        }
    }
    out
}

impl SiteGuard {
    /// The guard for `object`, for a site plugin with `privileges`; none when the object is
    /// of a kind the site checks do not concern.
    fn of(object: &Value, privileges: PodPrivileges) -> Option<Self> {
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
        let rbac: Vec<_> = rbac_members(kind)
            .iter()
            .map(|p| (*p, object.pointer(p).cloned()))
            .collect();
        let pod = match privileges {
            PodPrivileges::Allow => None,
            PodPrivileges::Deny => {
                pod_spec_pointer(kind).map(|p| (p, pod_privileges(object.pointer(p))))
            }
        };
        let typed_daemonset = is_daemonset(object);
        (typed_daemonset || !rbac.is_empty() || pod.is_some()).then_some(SiteGuard {
            typed_daemonset,
            rbac,
            pod,
        })
    }

    fn check(&self, patched: &Value) -> Result<(), Refusal> {
        if self.typed_daemonset {
            <DaemonSet as serde::Deserialize>::deserialize(patched)
                .map_err(|e| Refusal::Invalid(format!("not a valid apps/v1 DaemonSet: {e}")))?;
        }
        for (pointer, before) in &self.rbac {
            if patched.pointer(pointer) != before.as_ref() {
                return Err(Refusal::Rbac(pointer));
            }
        }
        if let Some((pointer, before)) = &self.pod {
            let after = pod_privileges(patched.pointer(pointer));
            if let Some(widened) = after.difference(before).next() {
                return Err(Refusal::Privilege(crate::text::bounded_owned(
                    format!("{pointer}/{widened}"),
                    crate::text::MAX_ENGINE_TEXT_BYTES,
                )));
            }
        }
        Ok(())
    }
}

/// Counts bytes written, failing once there are more than `limit`.
struct CountUpTo {
    count: usize,
    limit: usize,
}

impl std::io::Write for CountUpTo {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.count += buf.len();
        if self.count > self.limit {
            return Err(std::io::Error::other("over the limit"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How much longer than its source text a JSON value parsed by `serde_json` can serialize
/// (compact): strings, keys, literals and structure never grow (whitespace goes, an escape
/// stays an escape of at most the same length or becomes the character itself); only a number
/// can, a float being at least 3 characters of source (`1e5`, `0.5`) and at most 24 when
/// written back (`-2.2250738585072014e-308`), `-0` becoming `-0.0`, an integer past `u64`
/// (20+ digits) a float of at most 24. So 8 is a bound.
const VALUE_GROWTH: usize = 8;

/// An upper bound of the serialized (compact JSON) size of `original` after `patch`, where
/// `original_size` is the original's serialized size and `patch_bytes` the patch's text length;
/// `None` when the patch has a `copy` (which may duplicate anything) or the size is unknown.
///
/// `add`, `replace` and `test` insert at most their `value` plus, for a new member, its key and
/// separators, all of which the operation's own text spells out (the key in `path`); `remove`
/// and `move` add nothing new. So the result serializes to at most the original's size plus
/// [`VALUE_GROWTH`] times the patch text.
fn result_size_bound(
    original_size: Option<usize>,
    patch: &json_patch::Patch,
    patch_bytes: usize,
) -> Option<usize> {
    let copies = patch
        .iter()
        .any(|op| matches!(op, json_patch::PatchOperation::Copy(_)));
    if copies {
        return None;
    }
    original_size?.checked_add(patch_bytes.checked_mul(VALUE_GROWTH)?)
}

/// `Err(bytes counted)` when `object` serializes (compact JSON) to more than `limit` bytes;
/// stops counting at the first write past it. With a `bound` of its size (see
/// [`result_size_bound`]) at most `limit`, nothing is serialized.
fn check_size(object: &Value, bound: Option<usize>, limit: usize) -> Result<(), Refusal> {
    if bound.is_some_and(|b| b <= limit) {
        return Ok(());
    }
    let mut w = CountUpTo { count: 0, limit };
    match serde_json::to_writer(&mut w, object) {
        Ok(()) => Ok(()),
        Err(_) => Err(Refusal::TooLarge(w.count)),
    }
}

/// Why [`apply_bounded`] stopped.
enum Applied {
    /// An operation failed (json-patch's error, naming the operation by index).
    Failed(json_patch::PatchError),
    /// `copy` operations would add more than the limit: the bytes counted so far.
    TooLarge(usize),
}

/// Applies `patch` to `object`, refusing before memory is spent when its `copy` operations
/// together would add more than `limit` bytes (serialized): a `copy` duplicates any subtree,
/// the root included, so without this a 1 KiB patch of 40 copies of the root asks for 2^40
/// times the object. Each copied subtree is counted up to what is left of the budget, so the
/// counting costs at most `limit` bytes of serialization per patch. Patches without `copy`
/// are applied as they are.
fn apply_bounded(
    object: &mut Value,
    patch: json_patch::Patch,
    limit: usize,
) -> Result<(), Applied> {
    use json_patch::PatchOperation as Op;
    let patch = match apply_top_level(object, patch) {
        Ok(()) => return Ok(()),
        Err(patch) => patch,
    };
    if !patch.iter().any(|op| matches!(op, Op::Copy(_))) {
        return json_patch::patch(object, &patch).map_err(Applied::Failed);
    }
    let mut copied = 0usize;
    for (i, op) in patch.iter().enumerate() {
        if let Op::Copy(c) = op
            && let Some(source) = object.pointer(c.from.as_str())
        {
            let mut w = CountUpTo {
                count: 0,
                limit: limit - copied,
            };
            if serde_json::to_writer(&mut w, source).is_err() {
                return Err(Applied::TooLarge(copied + w.count));
            }
            copied += w.count;
        }
        json_patch::patch(object, std::slice::from_ref(op)).map_err(|mut e| {
            e.operation = i;
            Applied::Failed(e)
        })?;
    }
    Ok(())
}

/// Applies `patch` to the JSON object `object` by moving each operation's `value` into place,
/// when every operation is an `add`, `replace` or `remove` of a top-level member and each
/// would succeed (a `replace` or `remove` names a member present at that point): what the
/// standard plugins answer. `json_patch::patch` would clone each `value` (a DaemonSet's whole
/// `spec`) out of the borrowed patch. Any other patch is handed back untouched, for
/// `json_patch::patch` to apply (and to report the failing operation exactly as it does).
fn apply_top_level(object: &mut Value, patch: json_patch::Patch) -> Result<(), json_patch::Patch> {
    use json_patch::PatchOperation as Op;
    let Value::Object(members) = object else {
        return Err(patch);
    };
    // A dry run over the keys first, so that nothing is changed unless every operation
    // applies: `changed` holds each key an earlier operation added or removed, with whether it
    // is present after it.
    let mut changed: Vec<(String, bool)> = Vec::with_capacity(patch.len());
    let mut keys = Vec::with_capacity(patch.len());
    for op in patch.iter() {
        let path = match op {
            Op::Add(a) => &a.path,
            Op::Replace(r) => &r.path,
            Op::Remove(r) => &r.path,
            _ => return Err(patch),
        };
        let mut tokens = path.tokens();
        let (Some(token), None) = (tokens.next(), tokens.next()) else {
            return Err(patch);
        };
        let key = token.decoded().into_owned();
        let was = changed
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map_or_else(|| members.contains_key(&key), |(_, p)| *p);
        let now = match op {
            Op::Add(_) => true,
            Op::Replace(_) if was => true,
            Op::Remove(_) if was => false,
            _ => return Err(patch),
        };
        if now != was {
            changed.push((key.clone(), now));
        }
        keys.push(key);
    }
    for (op, key) in patch.0.into_iter().zip(keys) {
        match op {
            Op::Add(a) => {
                members.insert(key, a.value);
            }
            Op::Replace(r) => {
                members.insert(key, r.value);
            }
            Op::Remove(_) => {
                members.remove(&key);
            }
            _ => unreachable!("checked above"),
        }
    }
    Ok(())
}

/// Applies one patch `text` to `target` (whose serialized size is `size`, when known) and
/// holds the result to the output policy.
fn apply_patch(
    plugin: &str,
    index: usize,
    target: Target<'_>,
    size: Option<usize>,
    text: &str,
    policy: &OutputPolicy,
) -> Result<Value, PluginError> {
    let original = match &target {
        Target::Copy(o) => *o,
        Target::InPlace(o) => o,
    };
    let invalid_patch = |object: String, message: String| PluginError::InvalidPatch {
        plugin: plugin.to_string(),
        index,
        object,
        message,
    };
    let patch = crate::patch::parse_patch(text).map_err(|e| {
        invalid_patch(
            describe(original),
            format!("not an RFC 6902 JSON Patch: {e}"),
        )
    })?;
    if patch.is_empty() {
        // Most objects of a state: no identity to check, nothing to copy but the result.
        return Ok(match target {
            Target::Copy(o) => o.clone(),
            Target::InPlace(o) => o,
        });
    }
    let size_bound = result_size_bound(size, &patch, text.len());
    let identity = Identity::of(original);
    let site = policy.site.and_then(|p| SiteGuard::of(original, p));
    let mut object = match target {
        Target::Copy(o) => copy_for_patch(o, &patch),
        Target::InPlace(o) => o,
    };
    match apply_bounded(&mut object, patch, policy.object_limit_bytes) {
        Ok(()) => {}
        Err(Applied::Failed(e)) => return Err(invalid_patch(identity.describe(), e.to_string())),
        Err(Applied::TooLarge(actual_bytes)) => {
            return Err(PluginError::ObjectTooLarge {
                plugin: plugin.to_string(),
                index,
                object: identity.describe(),
                limit_bytes: policy.object_limit_bytes,
                actual_bytes,
            });
        }
    }
    let checked = identity
        .check(&object)
        .and_then(|()| site.as_ref().map_or(Ok(()), |g| g.check(&object)))
        .and_then(|()| check_size(&object, size_bound, policy.object_limit_bytes));
    let Err(refusal) = checked else {
        return Ok(object);
    };
    let (plugin, object) = (plugin.to_string(), identity.describe());
    Err(match refusal {
        Refusal::Invalid(message) => PluginError::InvalidResult {
            plugin,
            index,
            object,
            message,
        },
        Refusal::Identity {
            field,
            before,
            after,
        } => PluginError::IdentityChanged {
            plugin,
            index,
            object,
            field,
            before,
            after,
        },
        Refusal::Rbac(field) => PluginError::RbacChanged {
            plugin,
            index,
            object,
            field,
        },
        Refusal::Privilege(field) => PluginError::PodPrivilegeWidened {
            plugin,
            index,
            object,
            field,
        },
        Refusal::TooLarge(actual_bytes) => PluginError::ObjectTooLarge {
            plugin,
            index,
            object,
            limit_bytes: policy.object_limit_bytes,
            actual_bytes,
        },
    })
}

fn show(v: Option<&Value>) -> String {
    v.map_or_else(|| "nothing".to_string(), Value::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn daemonset() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "ds", "namespace": "ns"},
            "spec": {
                "selector": {"matchLabels": {"app": "ds"}},
                "template": {"metadata": {"labels": {"app": "ds"}}, "spec": {"containers": [{"name": "c"}]}}
            }
        })
    }

    fn run(outcomes: Vec<Outcome>) -> Result<Vec<Rendered>, PluginError> {
        apply_outcomes(
            "p",
            &[daemonset()],
            outcomes,
            &OutputPolicy::for_tests(1000, false),
        )
    }

    #[test]
    fn applies_patches_and_omits() {
        let out = run(vec![Outcome::Patch(
            r#"[{"op":"add","path":"/metadata/labels","value":{"a":"b"}}]"#.into(),
        )])
        .unwrap();
        let Rendered::Keep(obj) = &out[0] else {
            panic!("omitted")
        };
        assert_eq!(obj.pointer("/metadata/labels/a"), Some(&json!("b")));
        assert_eq!(run(vec![Outcome::Omit]).unwrap(), vec![Rendered::Omit]);
    }

    /// Patching the partial copy gives what patching a full copy gives, for patches the
    /// shortcut takes and for those it does not.
    #[test]
    fn partial_copy_patches_like_a_full_copy() {
        let original = daemonset();
        for text in [
            r#"[{"op":"add","path":"/spec","value":{"selector":{"matchLabels":{"app":"ds"}},"template":{}}},{"op":"add","path":"/metadata","value":{"name":"ds","namespace":"ns","labels":{"x":"y"}}}]"#,
            r#"[{"op":"replace","path":"/metadata","value":{"name":"ds"}},{"op":"remove","path":"/spec"},{"op":"add","path":"/spec","value":7}]"#,
            r#"[{"op":"add","path":"/spec/x","value":1}]"#,
            r#"[{"op":"copy","from":"/spec","path":"/status"},{"op":"add","path":"/spec","value":{}}]"#,
        ] {
            let patch = crate::patch::parse_patch(text).unwrap();
            let mut full = original.clone();
            json_patch::patch(&mut full, &patch).unwrap();
            let mut partial = copy_for_patch(&original, &patch);
            json_patch::patch(&mut partial, &patch).unwrap();
            assert_eq!(partial, full, "{text}");
        }
        let top = crate::patch::parse_patch(r#"[{"op":"add","path":"/spec","value":1}]"#).unwrap();
        assert_eq!(
            copy_for_patch(&original, &top)["spec"],
            Value::Null,
            "not copied"
        );
    }

    /// Moving top-level values into place gives what `json_patch::patch` gives; a patch it
    /// does not take, or one with a failing operation, comes back with the object untouched.
    #[test]
    fn top_level_moves_patch_like_json_patch() {
        let original = daemonset();
        let taken = [
            r#"[{"op":"add","path":"/spec","value":{"a":1}},{"op":"add","path":"/metadata","value":{"name":"ds"}}]"#,
            r#"[{"op":"replace","path":"/metadata","value":{"name":"ds"}},{"op":"remove","path":"/spec"},{"op":"add","path":"/spec","value":7}]"#,
            r#"[{"op":"add","path":"/status","value":{}},{"op":"replace","path":"/status","value":2},{"op":"remove","path":"/status"}]"#,
            r#"[{"op":"add","path":"/a~1b~0c","value":"x"}]"#,
            "[]",
        ];
        for text in taken {
            let patch = crate::patch::parse_patch(text).unwrap();
            let mut expected = original.clone();
            json_patch::patch(&mut expected, &patch).unwrap();
            let mut moved = original.clone();
            assert!(apply_top_level(&mut moved, patch).is_ok(), "{text}");
            assert_eq!(moved, expected, "{text}");
        }
        let refused = [
            r#"[{"op":"replace","path":"/status","value":1}]"#,
            r#"[{"op":"remove","path":"/spec"},{"op":"remove","path":"/spec"}]"#,
            r#"[{"op":"add","path":"/spec","value":1},{"op":"remove","path":"/status"}]"#,
            r#"[{"op":"add","path":"/spec/x","value":1}]"#,
            r#"[{"op":"add","path":"","value":{}}]"#,
            r#"[{"op":"test","path":"/kind","value":"DaemonSet"}]"#,
        ];
        for text in refused {
            let patch = crate::patch::parse_patch(text).unwrap();
            let mut object = original.clone();
            let back = apply_top_level(&mut object, patch.clone()).expect_err(text);
            assert_eq!(back, patch, "{text}");
            assert_eq!(object, original, "{text}");
        }
        let mut not_an_object = json!([1]);
        let patch = crate::patch::parse_patch(r#"[{"op":"add","path":"/0","value":2}]"#).unwrap();
        assert!(apply_top_level(&mut not_an_object, patch).is_err());
    }

    /// The bound holds where serializing a parsed value grows it most (short floats, `-0`,
    /// integers past `u64`) and where escapes shrink, and a `copy` gets no bound.
    #[test]
    fn size_bound_is_an_upper_bound() {
        let original = daemonset();
        let size = original.to_string().len();
        for text in [
            r#"[{"op":"add","path":"/n","value":[1e5,1e9,-0,0.5,9e15,1E-7,2e-308]}]"#,
            r#"[{"op":"add","path":"/big","value":123456789012345678901234567890}]"#,
            r#"[{"op":"replace","path":"/metadata","value":{"name":"ds","namespace":"ns","x":"\u00e9\/\n\u0001"}}]"#,
            r#"[{"op":"move","from":"/spec","path":"/a~1b"},{"op":"remove","path":"/a~1b"},{"op":"test","path":"/kind","value":"DaemonSet"}]"#,
        ] {
            let patch = crate::patch::parse_patch(text).unwrap();
            let bound = result_size_bound(Some(size), &patch, text.len()).unwrap();
            let mut doc = original.clone();
            json_patch::patch(&mut doc, &patch).unwrap();
            assert!(doc.to_string().len() <= bound, "{text}");
        }
        let copy =
            crate::patch::parse_patch(r#"[{"op":"copy","from":"/spec","path":"/s"}]"#).unwrap();
        assert_eq!(result_size_bound(Some(size), &copy, 40), None);
        // Within the bound nothing is serialized; past it the exact count decides.
        assert!(check_size(&original, Some(10), 10).is_ok());
        assert!(matches!(check_size(&original, Some(11), 10), Err(Refusal::TooLarge(n)) if n > 10));
        assert!(matches!(
            check_size(&original, None, 10),
            Err(Refusal::TooLarge(_))
        ));
        assert!(check_size(&original, None, size).is_ok());
    }

    /// Copies of the root double the object each time; the host refuses once the copies
    /// would add more than the object limit, before building anything that large.
    #[test]
    fn copies_cannot_blow_up_an_object() {
        let ops: Vec<String> = (0..40)
            .map(|i| format!(r#"{{"op":"copy","from":"","path":"/c{i}"}}"#))
            .collect();
        let text = format!("[{}]", ops.join(","));
        let err = apply_outcomes(
            "p",
            &[daemonset()],
            vec![Outcome::Patch(text)],
            &OutputPolicy::for_tests(1 << 20, true),
        )
        .unwrap_err();
        assert!(
            matches!(err, PluginError::ObjectTooLarge { limit_bytes, actual_bytes, .. }
                if limit_bytes == 1 << 20 && actual_bytes > 1 << 20),
            "{err:?}"
        );
        // A few copies within the budget apply as json-patch applies them, and a failing
        // operation is still named by its index.
        let ok = r#"[{"op":"copy","from":"/spec/selector/matchLabels","path":"/metadata/labels"},{"op":"copy","from":"/spec/template/metadata/labels","path":"/metadata/annotations"}]"#;
        let Rendered::Keep(obj) = &run(vec![Outcome::Patch(ok.into())]).unwrap()[0] else {
            panic!("omitted")
        };
        assert_eq!(obj["metadata"]["labels"], json!({"app": "ds"}));
        assert_eq!(obj["metadata"]["annotations"], json!({"app": "ds"}));
        let bad = r#"[{"op":"copy","from":"/kind","path":"/metadata/k"},{"op":"copy","from":"/nope","path":"/x"}]"#;
        let err = run(vec![Outcome::Patch(bad.into())]).unwrap_err();
        assert!(err.to_string().contains("operation '/1'"), "{err}");
    }

    /// A site plugin's patched DaemonSet must still parse as a typed `apps/v1` DaemonSet; a
    /// standard plugin's is not parsed again (the SDK answers serialized typed sections), while
    /// its identity and selector are still checked.
    #[test]
    fn only_site_daemonsets_are_parsed_again() {
        let untyped = r#"[{"op":"replace","path":"/spec/template/spec/containers","value":5}]"#;
        let apply = |site: bool, patch: &str| {
            apply_outcomes(
                "p",
                &[daemonset()],
                vec![Outcome::Patch(patch.into())],
                &OutputPolicy::for_tests(1 << 20, site),
            )
        };
        let err = apply(true, untyped).unwrap_err();
        match &err {
            PluginError::InvalidResult { message, .. } => assert!(
                message.starts_with("not a valid apps/v1 DaemonSet: "),
                "{message}"
            ),
            other => panic!("{other:?}"),
        }
        let Rendered::Keep(obj) = &apply(false, untyped).unwrap()[0] else {
            panic!("omitted")
        };
        assert_eq!(
            obj.pointer("/spec/template/spec/containers"),
            Some(&json!(5))
        );
        let unselect = r#"[{"op":"remove","path":"/spec/selector"}]"#;
        for site in [false, true] {
            let err = apply(site, unselect).unwrap_err();
            assert!(err.to_string().contains("/spec/selector changed"), "{err}");
        }
    }

    #[test]
    fn refuses_bad_output() {
        assert!(matches!(
            run(vec![]),
            Err(PluginError::WrongOutcomeCount {
                expected: 1,
                actual: 0,
                ..
            })
        ));
        assert!(matches!(
            run(vec![Outcome::Patch("nope".into())]),
            Err(PluginError::InvalidPatch { index: 0, .. })
        ));
        let big = format!("[{}]", " ".repeat(1000));
        assert!(matches!(
            run(vec![Outcome::Patch(big)]),
            Err(PluginError::OutputTooLarge {
                actual_bytes: 1002,
                ..
            })
        ));
        let rename = r#"[{"op":"replace","path":"/metadata/name","value":"x"}]"#;
        let err = run(vec![Outcome::Patch(rename.into())]).unwrap_err();
        assert!(
            matches!(
                &err,
                PluginError::IdentityChanged { field: "/metadata/name", before, after, .. }
                    if before == "\"ds\"" && after == "\"x\""
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("/metadata/name changed"), "{err}");
        let unselect = r#"[{"op":"remove","path":"/spec/selector"}]"#;
        let err = run(vec![Outcome::Patch(unselect.into())]).unwrap_err();
        assert!(matches!(err, PluginError::InvalidResult { .. }), "{err}");
        let reselect = r#"[{"op":"replace","path":"/spec/selector/matchLabels/app","value":"x"}]"#;
        let err = run(vec![Outcome::Patch(reselect.into())]).unwrap_err();
        assert!(err.to_string().contains("/spec/selector changed"), "{err}");
    }
}
