//! Server-side apply of rendered objects, and deletion of objects that should be gone.
//!
//! Writes only when something changed: [`Applier`] remembers, per object, a hash of what it
//! last applied and the live object's marker (`metadata.generation` when the kind has one,
//! else `resourceVersion`). An object whose desired form and live marker are both unchanged is
//! not applied again, so a reconcile at steady state sends no PATCH. What to delete is decided
//! from the cluster ([`crate::cluster::live`], [`kiln_core::plan::plan`]); [`Applier::delete`] only sends
//! the request.
//!
//! Server-side apply never removes a field another manager added (a sidecar, an env var, a
//! label): [`Applier::due`] reads that additive drift off the live object's managed fields
//! ([`kiln_core::drift`]: what other managers own and kiln does not) and
//! [`Applier::correct`] removes it with one JSON patch guarded by the `resourceVersion` it was
//! computed from. The live object is one the operator holds already, never read for this: the
//! answer of the apply that just ran, or the DaemonSet cache's copy (whose managed fields are
//! reduced to the drift, [`crate::cluster::live`]) when nothing needed applying. What a correction
//! could not remove (fields the server defaults again, or an admission webhook puts back) is
//! remembered per object and value, so the operator does not fight over it.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kiln_core::drift::{self, Removal};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use serde_json::Value;

use crate::{Error, Result, is_not_found};

/// Field manager of every kiln write.
pub const FIELD_MANAGER: &str = "kiln";

/// Identity of one object (kiln-core's [`kiln_core::plan::ObjectKey`]).
pub type ObjKey = kiln_core::plan::ObjectKey;

/// The key of a rendered object.
///
/// # Errors
/// [`Error::BadObject`] when `apiVersion`, `kind` or `metadata.name` is missing.
pub fn key_of(obj: &Value) -> Result<ObjKey> {
    ObjKey::of(obj).ok_or_else(|| Error::BadObject(truncate(&obj.to_string(), 200)))
}

fn gvk(key: &ObjKey) -> GroupVersionKind {
    let (group, version) = match key.api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", key.api_version.as_str()),
    };
    GroupVersionKind::gvk(group, version, &key.kind)
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// What happened to one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Applied (created or changed).
    Applied,
    /// Already as desired; nothing sent.
    Unchanged,
    /// Its kind is not served by this cluster (say, no ServiceMonitor CRD); skipped.
    KindNotServed,
}

/// A resolved kind: its API resource and whether it is namespaced; `None` when not served.
type Resolved = Option<(ApiResource, bool)>;

#[derive(Debug, Clone)]
struct Seen {
    hash: u64,
    marker: String,
}

/// Server-side apply with caches (see the module docs). One per operator process.
pub struct Applier {
    client: Client,
    kinds: Mutex<HashMap<(String, String), Resolved>>,
    seen: Mutex<HashMap<ObjKey, Seen>>,
    /// Per object, the [`Removal::id`]s of the drift its last correction left in place.
    settled: Mutex<HashMap<ObjKey, HashSet<String>>>,
}

fn marker(obj: &DynamicObject) -> String {
    marker_of(&obj.metadata)
}

/// An object's change marker: `g<metadata.generation>` when the kind has one, else
/// `rv<resourceVersion>` (what [`Applier::is_current`] compares).
pub fn marker_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    match meta.generation {
        Some(g) => format!("g{g}"),
        None => format!("rv{}", meta.resource_version.clone().unwrap_or_default()),
    }
}

/// Whether change marker `a` ([`marker_of`]) is later than `b`: both generations or both
/// resourceVersions, and `a`'s number larger (etcd's resourceVersions are decimal and grow).
/// Anything else (an older or equal marker, unparseable ones) is not later.
pub fn marker_later(a: &str, b: &str) -> bool {
    let num = |m: &str, p: &str| m.strip_prefix(p).and_then(|n| n.parse::<u64>().ok());
    ["g", "rv"]
        .into_iter()
        .any(|p| match (num(a, p), num(b, p)) {
            (Some(x), Some(y)) => x > y,
            _ => false,
        })
}

fn hash_of(v: &Value) -> u64 {
    let mut h = DefaultHasher::new();
    v.to_string().hash(&mut h);
    h.finish()
}

impl Applier {
    /// A new applier with empty caches.
    pub fn new(client: Client) -> Self {
        Applier {
            client,
            kinds: Mutex::default(),
            seen: Mutex::default(),
            settled: Mutex::default(),
        }
    }

    /// Whether the cluster serves `apiVersion`/`kind` (cached after the first lookup).
    ///
    /// # Errors
    /// [`Error::Kube`] on discovery failures other than "not served".
    pub async fn serves(&self, api_version: &str, kind: &str) -> Result<bool> {
        let key = ObjKey {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: None,
            name: String::new(),
        };
        Ok(self.resource(&key).await?.is_some())
    }

    /// The API resource of `apiVersion`/`kind` and whether it is namespaced; `None` when the
    /// cluster does not serve it (cached after the first lookup).
    ///
    /// # Errors
    /// [`Error::Kube`] on discovery failures other than "not served".
    pub async fn resolve(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<Option<(ApiResource, bool)>> {
        self.resource(&ObjKey {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: None,
            name: String::new(),
        })
        .await
    }

    async fn resource(&self, key: &ObjKey) -> Result<Resolved> {
        let ck = (key.api_version.clone(), key.kind.clone());
        if let Some(hit) = self.kinds.lock().expect("kinds lock").get(&ck) {
            return Ok(hit.clone());
        }
        let found = match kube::discovery::pinned_kind(&self.client, &gvk(key)).await {
            Ok((ar, caps)) => Some((ar, namespaced(&caps))),
            Err(kube::Error::Discovery(_)) => None,
            Err(e) if is_not_found(&e) => None,
            Err(e) => return Err(Error::kube(format!("discover {}", key.kind), e)),
        };
        self.kinds
            .lock()
            .expect("kinds lock")
            .insert(ck, found.clone());
        Ok(found)
    }

    async fn api(&self, key: &ObjKey) -> Result<Option<Api<DynamicObject>>> {
        Ok(self
            .resource(key)
            .await?
            .map(|(ar, ns)| match (&key.namespace, ns) {
                (Some(n), true) => Api::namespaced_with(self.client.clone(), n, &ar),
                _ => Api::all_with(self.client.clone(), &ar),
            }))
    }

    /// Whether `desired` is what this process last applied and the live object, whose marker
    /// ([`marker_of`]) the cache of labelled objects reports as `live_marker`, has not changed
    /// since: then applying again would change nothing and no request (not even a GET) is needed.
    pub fn is_current(&self, desired: &Value, live_marker: &str) -> bool {
        let Ok(key) = key_of(desired) else {
            return false;
        };
        let hash = hash_of(desired);
        self.seen
            .lock()
            .expect("seen lock")
            .get(&key)
            .is_some_and(|c| c.hash == hash && c.marker == live_marker)
    }

    /// Apply `desired` (as [`kiln_core::plan::desired_object`] made it: labelled and owned) with
    /// server-side apply (field manager `kiln`, forced), with no GET before it: the caller
    /// skips objects [`Applier::is_current`] says are unchanged. Returns the live object as
    /// the apply left it (`None` when the kind is not served) and what happened.
    ///
    /// # Errors
    /// [`Error::Kube`] naming the object when a request fails.
    pub async fn apply(&self, desired: &Value) -> Result<(Outcome, Option<DynamicObject>)> {
        let key = key_of(desired)?;
        let Some(api) = self.api(&key).await? else {
            return Ok((Outcome::KindNotServed, None));
        };
        let hash = hash_of(desired);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let applied = api
            .patch(&key.name, &params, &Patch::Apply(desired))
            .await
            .map_err(|e| Error::kube(format!("apply {key}"), e))?;
        let m = marker(&applied);
        tracing::info!(object = %key, marker = %m, "applied");
        self.seen
            .lock()
            .expect("seen lock")
            .insert(key.clone(), Seen { hash, marker: m });
        Ok((Outcome::Applied, Some(applied)))
    }

    /// Every object this process applied, with the change marker its apply returned.
    pub fn applied(&self) -> Vec<(ObjKey, String)> {
        self.seen
            .lock()
            .expect("seen lock")
            .iter()
            .map(|(k, s)| (k.clone(), s.marker.clone()))
            .collect()
    }

    /// The `metadata.generation` the last apply of `key` returned (0 when unknown or the kind
    /// has none).
    pub fn generation(&self, key: &ObjKey) -> i64 {
        self.seen
            .lock()
            .expect("seen lock")
            .get(key)
            .and_then(|s| s.marker.strip_prefix('g')?.parse().ok())
            .unwrap_or(0)
    }

    /// Delete the object `key` (background propagation): the caller has seen it, labelled and
    /// owned by a ClusterPolicy, in the cluster's cache, so no GET precedes the request.
    /// Returns whether it was deleted by this request (`false`: already gone, or its kind is
    /// no longer served).
    ///
    /// # Errors
    /// [`Error::Kube`] naming the object when the request fails (NotFound is not an error).
    pub async fn delete(&self, key: &ObjKey) -> Result<bool> {
        self.seen.lock().expect("seen lock").remove(key);
        self.settled.lock().expect("settled lock").remove(key);
        let Some(api) = self.api(key).await? else {
            return Ok(false);
        };
        match api.delete(&key.name, &DeleteParams::background()).await {
            Ok(_) => {
                tracing::info!(object = %key, "deleted");
                Ok(true)
            }
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(Error::kube(format!("delete {key}"), e)),
        }
    }

    /// The additive drift of the live object `key` that is due for removal: the removals
    /// ([`drift::removals`]) of what managers other than [`FIELD_MANAGER`] own in `managed`
    /// (its `metadata.managedFields`, or a reduction of them by [`drift::foreign`]) and kiln
    /// does not, resolved against `object` (the live object as JSON), less what the last
    /// correction of `key` left in place with the same value. Empty at rest; pure (no request).
    pub fn due(
        &self,
        key: &ObjKey,
        managed: &[ManagedFieldsEntry],
        object: &Value,
    ) -> Vec<Removal> {
        let foreign = drift::foreign(managed, FIELD_MANAGER);
        if foreign.is_empty() {
            return Vec::new();
        }
        let mut removals = drift::removals(object, &foreign);
        if let Some(settled) = self.settled.lock().expect("settled lock").get(key) {
            removals.retain(|r| !settled.contains(&r.id()));
        }
        removals
    }

    /// Remove `removals` (from [`Applier::due`]) from the object `key` at `resource_version`
    /// with one JSON patch (field manager `kiln`), and remember what the server's answer still
    /// holds (defaulted again, or put back by admission) as settled. When the object changed
    /// since `resource_version` (a 409, or the patch not applying: [`unappliable`]), it is read
    /// once and what is then due tried again, at most [`CORRECT_RETRIES`] times. Returns what
    /// is gone, or `None`: gone, nothing due any more, still changing after the retries (the
    /// watch event of that change brings a fresh copy), or refused, when validation refuses
    /// the removal or the patch does not apply to the object as it is now; refused removals
    /// count as settled too.
    ///
    /// # Errors
    /// [`Error::Kube`] naming the object when the request fails otherwise.
    pub async fn correct(
        &self,
        key: &ObjKey,
        resource_version: &str,
        removals: &[Removal],
    ) -> Result<Option<Vec<Removal>>> {
        let Some(api) = self.api(key).await? else {
            return Ok(None);
        };
        let (mut resource_version, mut removals) =
            (resource_version.to_string(), removals.to_vec());
        // The copy the removals came from may trail the server (a status write moves the
        // resourceVersion of a DaemonSet often): on a changed object, read it once and retry
        // with what is then due, a bounded number of times (reads only while drift races).
        for _ in 0..CORRECT_RETRIES {
            let outcome = self
                .correct_once(&api, key, &resource_version, &removals)
                .await?;
            if let Corrected::Done(removed) = outcome {
                return Ok(removed);
            }
            let Some(fresh) = api
                .get_opt(&key.name)
                .await
                .map_err(|e| Error::kube(format!("read {key} to remove drift"), e))?
            else {
                return Ok(None);
            };
            if matches!(outcome, Corrected::NotApplied)
                && fresh.metadata.resource_version.as_deref() == Some(resource_version.as_str())
            {
                // The object had not changed: the patch itself does not apply to it.
                tracing::warn!(object = %key, "drift not removed: the removal does not apply to the object as it is");
                self.settle(key, &removals);
                return Ok(None);
            }
            let managed = fresh.metadata.managed_fields.clone().unwrap_or_default();
            let value = serde_json::to_value(&fresh).map_err(|e| Error::Json {
                action: format!("serialize {key}"),
                source: e,
            })?;
            removals = self.due(key, &managed, &value);
            if removals.is_empty() {
                return Ok(None);
            }
            resource_version = fresh.metadata.resource_version.clone().unwrap_or_default();
        }
        Ok(None)
    }

    /// One JSON patch of [`Applier::correct`]; [`Corrected::Changed`] when the object changed
    /// since `resource_version`.
    async fn correct_once(
        &self,
        api: &Api<DynamicObject>,
        key: &ObjKey,
        resource_version: &str,
        removals: &[Removal],
    ) -> Result<Corrected> {
        let patch: json_patch::Patch =
            serde_json::from_value(drift::json_patch(resource_version, removals)).map_err(|e| {
                Error::Json {
                    action: format!("JSON patch for {key}"),
                    source: e,
                }
            })?;
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        let patched = match api
            .patch(&key.name, &params, &Patch::Json::<()>(patch))
            .await
        {
            Ok(p) => p,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Corrected::Done(None)),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::info!(object = %key, reason = %s.message, "drift not removed: the object changed");
                return Ok(Corrected::Changed);
            }
            // The `test` failed (the copy is stale) or a removed path is missing.
            Err(kube::Error::Api(s)) if unappliable(&s) => {
                tracing::info!(object = %key, "drift not removed: the patch did not apply (the object changed?)");
                return Ok(Corrected::NotApplied);
            }
            // Refused by validation (or admission): not tried again while the values stay.
            Err(kube::Error::Api(s)) if s.code == 422 => {
                tracing::warn!(object = %key, error = %s.message, "drift not removed: refused");
                self.settle(key, removals);
                return Ok(Corrected::Done(None));
            }
            Err(e) => return Err(Error::kube(format!("remove drift from {key}"), e)),
        };
        let live = serde_json::to_value(&patched).map_err(|e| Error::Json {
            action: format!("serialize {key}"),
            source: e,
        })?;
        let left: HashSet<String> = drift::removals(
            &live,
            &drift::foreign(
                patched
                    .metadata
                    .managed_fields
                    .as_deref()
                    .unwrap_or_default(),
                FIELD_MANAGER,
            ),
        )
        .iter()
        .map(Removal::id)
        .collect();
        let removed: Vec<Removal> = removals
            .iter()
            .filter(|r| !left.contains(&r.id()))
            .cloned()
            .collect();
        tracing::info!(object = %key, removed = removed.len(), left = left.len(), "drift removed");
        if let Some(seen) = self.seen.lock().expect("seen lock").get_mut(key) {
            seen.marker = marker(&patched);
        }
        self.settled
            .lock()
            .expect("settled lock")
            .insert(key.clone(), left);
        Ok(Corrected::Done(Some(removed)))
    }

    /// Count `removals` of `key` as settled: not tried again while their values stay.
    fn settle(&self, key: &ObjKey, removals: &[Removal]) {
        self.settled
            .lock()
            .expect("settled lock")
            .entry(key.clone())
            .or_default()
            .extend(removals.iter().map(Removal::id));
    }
}

/// How many times [`Applier::correct`] patches an object that keeps changing under it.
const CORRECT_RETRIES: usize = 3;

/// Whether the API server's refusal `s` of a drift correction ([`drift::json_patch`]) says
/// the patch did not apply: its `test` of `/metadata/resourceVersion` failed (the copy it was
/// computed from is stale) or a path it removes is missing. The server answers both with a 422
/// `Invalid` whose message is generic ("the server rejected our request due to an error in our
/// request") and whose details are empty (the patch library's text is not passed on; older
/// servers put it in the message, naming the tested path), where a validation error names the
/// object and its fields. Which of the two it was takes a read ([`Applier::correct`]).
fn unappliable(s: &kube::core::Status) -> bool {
    s.code == 422
        && (s.message.contains("/metadata/resourceVersion")
            || s.details
                .as_ref()
                .is_none_or(|d| d.causes.is_empty() && d.name.is_empty() && d.kind.is_empty()))
}

/// One removal attempt's outcome: done (what is gone, or `None`: refused or gone), the
/// object changed since the resourceVersion the patch tested (409), or the patch did not
/// apply ([`unappliable`]: changed, or a removed path missing).
enum Corrected {
    Done(Option<Vec<Removal>>),
    Changed,
    NotApplied,
}

fn namespaced(caps: &ApiCapabilities) -> bool {
    matches!(caps.scope, Scope::Namespaced)
}

/// Delete the handed-off DaemonSets `keys` with `propagationPolicy: Orphan`: the DaemonSet
/// goes, its driver pods stay (upstream: they keep the driver loaded until the NVIDIADriver's
/// DaemonSet replaces them). Returns how many were deleted by this call.
///
/// # Errors
/// [`Error::Kube`] naming the DaemonSet when a request fails (NotFound is not an error).
pub async fn orphan(client: &Client, keys: &[ObjKey]) -> Result<u64> {
    let mut deleted = 0;
    for key in keys.iter().filter(|k| k.kind == "DaemonSet") {
        let ns = key.namespace.as_deref().unwrap_or_default();
        let api: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(client.clone(), ns);
        match api.delete(&key.name, &DeleteParams::orphan()).await {
            Ok(_) => {
                tracing::info!(object = %key, "deleted, pods orphaned (driver handed to NVIDIADriver)");
                deleted += 1;
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(Error::kube(format!("delete (orphan) {key}"), e)),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_of_rendered_objects() {
        let k = key_of(&json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "nvidia-dcgm-exporter", "namespace": "gpu-operator"}}))
        .unwrap();
        assert_eq!(k.to_string(), "DaemonSet gpu-operator/nvidia-dcgm-exporter");
        assert_eq!(gvk(&k), GroupVersionKind::gvk("apps", "v1", "DaemonSet"));
        let rc = key_of(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "sa"}}))
        .unwrap();
        assert_eq!(gvk(&rc), GroupVersionKind::gvk("", "v1", "ServiceAccount"));
        assert!(matches!(
            key_of(&json!({"kind": "X"})),
            Err(Error::BadObject(_))
        ));
    }

    /// The API server's answer to a JSON patch that does not apply (its `test` failed, or a
    /// removed path is missing), as a v1.36 server sends it, is told from a validation error.
    #[test]
    fn a_patch_that_did_not_apply_is_told_from_a_validation_error() {
        let status = |v: Value| -> kube::core::Status { serde_json::from_value(v).unwrap() };
        let generic = "the server rejected our request due to an error in our request";
        assert!(unappliable(&status(
            json!({"kind": "Status", "apiVersion": "v1",
            "metadata": {}, "status": "Failure", "message": generic, "reason": "Invalid",
            "details": {}, "code": 422})
        )));
        assert!(unappliable(&status(
            json!({"status": "Failure", "code": 422,
            "message": "testing value /metadata/resourceVersion failed: test failed"})
        )));
        let invalid = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "code": 422, "reason": "Invalid",
            "message": "DaemonSet.apps \"x\" is invalid: spec.template.spec.containers: Required value",
            "details": {"name": "x", "group": "apps", "kind": "DaemonSet", "causes": [
                {"reason": "FieldValueRequired", "message": "Required value",
                 "field": "spec.template.spec.containers"}]}});
        assert!(!unappliable(&status(invalid.clone())));
        let mut conflict = invalid;
        conflict["code"] = json!(409);
        assert!(!unappliable(&status(conflict)));
    }

    #[test]
    fn later_markers_compare_numerically_within_one_kind_of_marker() {
        assert!(marker_later("g10", "g9"));
        assert!(!marker_later("g9", "g9"));
        assert!(!marker_later("g8", "g9"));
        assert!(marker_later("rv1000", "rv999"));
        assert!(!marker_later("rv5", "g4"));
        assert!(!marker_later("rvx", "rv1"));
    }
}
