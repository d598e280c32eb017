//! Server-side apply of rendered objects, and deletion of objects that should be gone.
//!
//! Writes only when something changed: [`Applier`] remembers, per object, a hash of what it
//! last applied and the live object's marker (`metadata.generation` when the kind has one,
//! else `resourceVersion`). An object whose desired form and live marker are both unchanged is
//! not applied again, so a reconcile at steady state sends no PATCH. Objects seen absent are
//! remembered too, so deletions of disabled states do not GET every object on every pass.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use serde_json::Value;

use crate::{Error, Result, is_not_found};

/// Field manager of every kiln write.
pub const FIELD_MANAGER: &str = "kiln";

/// Identity of one object: `apiVersion`, `kind`, namespace (`None` for cluster-scoped) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjKey {
    /// `apiVersion`, e.g. `apps/v1`.
    pub api_version: String,
    /// `kind`, e.g. `DaemonSet`.
    pub kind: String,
    /// `metadata.namespace` as rendered.
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: String,
}

impl ObjKey {
    /// The key of a rendered object.
    ///
    /// # Errors
    /// [`Error::BadObject`] when `apiVersion`, `kind` or `metadata.name` is missing.
    pub fn of(obj: &Value) -> Result<Self> {
        let s = |p: &str| obj.pointer(p).and_then(Value::as_str).map(str::to_string);
        match (s("/apiVersion"), s("/kind"), s("/metadata/name")) {
            (Some(api_version), Some(kind), Some(name)) => Ok(ObjKey {
                api_version,
                kind,
                namespace: s("/metadata/namespace"),
                name,
            }),
            _ => Err(Error::BadObject(truncate(&obj.to_string(), 200))),
        }
    }

    fn gvk(&self) -> GroupVersionKind {
        let (group, version) = match self.api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", self.api_version.as_str()),
        };
        GroupVersionKind::gvk(group, version, &self.kind)
    }
}

impl std::fmt::Display for ObjKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
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
    absent: Mutex<HashSet<ObjKey>>,
}

fn marker(obj: &DynamicObject) -> String {
    match obj.metadata.generation {
        Some(g) => format!("g{g}"),
        None => format!(
            "rv{}",
            obj.metadata.resource_version.clone().unwrap_or_default()
        ),
    }
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
            absent: Mutex::default(),
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

    async fn resource(&self, key: &ObjKey) -> Result<Resolved> {
        let ck = (key.api_version.clone(), key.kind.clone());
        if let Some(hit) = self.kinds.lock().expect("kinds lock").get(&ck) {
            return Ok(hit.clone());
        }
        let found = match kube::discovery::pinned_kind(&self.client, &key.gvk()).await {
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

    /// Apply `obj` with server-side apply (field manager `kiln`, forced), adding `owner` as its
    /// controller owner reference. Returns the live object (`None` when the kind is not served)
    /// and what happened.
    ///
    /// # Errors
    /// [`Error::Kube`] naming the object when a request fails.
    pub async fn apply(
        &self,
        obj: &Value,
        owner: &OwnerReference,
    ) -> Result<(Outcome, Option<DynamicObject>)> {
        let key = ObjKey::of(obj)?;
        let Some(api) = self.api(&key).await? else {
            return Ok((Outcome::KindNotServed, None));
        };
        let mut desired = obj.clone();
        desired["metadata"]["ownerReferences"] = serde_json::json!([owner]);
        let hash = hash_of(&desired);
        let live = api
            .get_opt(&key.name)
            .await
            .map_err(|e| Error::kube(format!("get {key}"), e))?;
        if let Some(live) = &live {
            let cached = self.seen.lock().expect("seen lock").get(&key).cloned();
            if cached.is_some_and(|c| c.hash == hash && c.marker == marker(live)) {
                return Ok((Outcome::Unchanged, Some(live.clone())));
            }
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let applied = api
            .patch(&key.name, &params, &Patch::Apply(&desired))
            .await
            .map_err(|e| Error::kube(format!("apply {key}"), e))?;
        let m = marker(&applied);
        tracing::info!(object = %key, created = live.is_none(), "applied");
        self.seen
            .lock()
            .expect("seen lock")
            .insert(key.clone(), Seen { hash, marker: m });
        self.absent.lock().expect("absent lock").remove(&key);
        Ok((Outcome::Applied, Some(applied)))
    }

    /// Delete the object `key` if it exists and a ClusterPolicy owns it (background
    /// propagation). Returns whether a delete was sent. Objects known to be absent are skipped
    /// without a request.
    ///
    /// # Errors
    /// [`Error::Kube`] naming the object when a request fails (NotFound is not an error).
    pub async fn delete_owned(&self, key: &ObjKey) -> Result<bool> {
        if self.absent.lock().expect("absent lock").contains(key) {
            return Ok(false);
        }
        let Some(api) = self.api(key).await? else {
            self.absent.lock().expect("absent lock").insert(key.clone());
            return Ok(false);
        };
        let live = api
            .get_opt(&key.name)
            .await
            .map_err(|e| Error::kube(format!("get {key}"), e))?;
        let owned = live.as_ref().is_some_and(|o| {
            o.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.kind == "ClusterPolicy" && r.api_version == "nvidia.com/v1")
        });
        if !owned {
            if live.is_none() {
                self.absent.lock().expect("absent lock").insert(key.clone());
            }
            return Ok(false);
        }
        match api.delete(&key.name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(Error::kube(format!("delete {key}"), e)),
        }
        tracing::info!(object = %key, "deleted");
        self.seen.lock().expect("seen lock").remove(key);
        self.absent.lock().expect("absent lock").insert(key.clone());
        Ok(true)
    }

    /// Forget everything cached about `key` (e.g. after a watch saw it deleted).
    pub fn forget(&self, key: &ObjKey) {
        self.seen.lock().expect("seen lock").remove(key);
        self.absent.lock().expect("absent lock").remove(key);
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
        let k = ObjKey::of(&json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "nvidia-dcgm-exporter", "namespace": "gpu-operator"}}))
        .unwrap();
        assert_eq!(k.to_string(), "DaemonSet gpu-operator/nvidia-dcgm-exporter");
        assert_eq!(k.gvk(), GroupVersionKind::gvk("apps", "v1", "DaemonSet"));
        let rc = ObjKey::of(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "sa"}}))
        .unwrap();
        assert_eq!(rc.gvk(), GroupVersionKind::gvk("", "v1", "ServiceAccount"));
        assert!(matches!(
            ObjKey::of(&json!({"kind": "X"})),
            Err(Error::BadObject(_))
        ));
    }
}
