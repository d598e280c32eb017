//! Server-side apply of rendered objects, and deletion of objects that should be gone.
//!
//! Writes only when something changed: [`Applier`] remembers, per object, a hash of what it
//! last applied and the live object's marker (`metadata.generation` when the kind has one,
//! else `resourceVersion`). An object whose desired form and live marker are both unchanged is
//! not applied again, so a reconcile at steady state sends no PATCH. What to delete is decided
//! from the cluster ([`crate::live`], [`kiln_core::plan::plan`]); [`Applier::delete`] only sends
//! the request.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

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
}

fn namespaced(caps: &ApiCapabilities) -> bool {
    matches!(caps.scope, Scope::Namespaced)
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
