//! Status and Events with IO: merge a [`Verdict`] into the stored status, write it through the
//! status subresource only when it changed, and publish an Event when the state or reason
//! changed. Depends on nothing of the reconciler ([`StatusWriter`] holds its own client).

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_core::spec::ClusterPolicyStatus;
use kiln_core::status::{Verdict, make_status, needs_write, transition};
use kube::api::DynamicObject;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Client, Resource};

pub use crate::cluster::watch::policy_resource;
use crate::{Error, Result};

/// Kubernetes caps an Event note at 1 KiB.
const NOTE_LIMIT: usize = 1000;
/// Cap on a status condition message (the API allows 32 KiB; 16 KiB keeps the whole status
/// write far below the request size limit, whatever a plugin's errors say).
const CONDITION_MESSAGE_LIMIT: usize = 16 << 10;

/// Writes ClusterPolicy status and Events, with no read: the status it compares against is
/// the policy as the caller has it (the controller's cache) or, when that is not provably newer,
/// the status this writer wrote last (the cache may not have seen that write yet).
pub struct StatusWriter {
    client: Client,
    recorder: crate::signals::events::Events,
    namespace: String,
    /// Per policy name: `resourceVersion` after our last write, and what was written.
    written: Mutex<HashMap<String, (String, ClusterPolicyStatus)>>,
    /// Per policy name: when its status was last written.
    last_write: Mutex<HashMap<String, std::time::Instant>>,
}

/// Least time between two status writes that change only a condition's message (same state
/// and reason): a rollout's progress counts would otherwise cost one write per DaemonSet
/// status event. State or reason changes are written at once.
pub const MESSAGE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `a` is a later `resourceVersion` than `b` (both decimal, as etcd's are; an
/// unparseable one is never later).
fn later(a: Option<&str>, b: &str) -> bool {
    match (a.and_then(|a| a.parse::<u64>().ok()), b.parse::<u64>()) {
        (Some(a), Ok(b)) => a > b,
        _ => false,
    }
}

/// The status a policy object carries (`None` when absent or not a ClusterPolicy status).
pub fn status_of(policy: &DynamicObject) -> Option<ClusterPolicyStatus> {
    policy
        .data
        .get("status")
        .and_then(|s| serde_json::from_value(s.clone()).ok())
}

impl StatusWriter {
    /// A writer over `client`, publishing Events through `recorder`; `namespace` is the
    /// operator namespace (written into the status).
    pub fn new(client: Client, recorder: crate::signals::events::Events, namespace: &str) -> Self {
        StatusWriter {
            client,
            recorder,
            namespace: namespace.to_string(),
            written: Mutex::default(),
            last_write: Mutex::default(),
        }
    }

    /// The stored status of `policy` as far as this process knows it.
    fn current(&self, policy: &DynamicObject) -> Option<ClusterPolicyStatus> {
        let name = policy.metadata.name.as_deref().unwrap_or_default();
        let written = self.written.lock().expect("written lock");
        match written.get(name) {
            Some((rv, status)) if !later(policy.metadata.resource_version.as_deref(), rv) => {
                Some(status.clone())
            }
            _ => status_of(policy),
        }
    }

    /// Write `verdict` as `policy`'s status (when it differs from the stored one) and publish
    /// an Event on transitions. Returns whether a status write was sent. No GET: `policy`
    /// should be the freshest copy the caller has.
    ///
    /// # Errors
    /// [`Error::Kube`] when the status patch fails. Event failures are logged, not returned.
    pub async fn write(&self, policy: &DynamicObject, verdict: &Verdict) -> Result<bool> {
        let name = policy.metadata.name.clone().unwrap_or_default();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let current = self.current(policy);
        let current = current.as_ref();
        // Messages quote plugin errors: bounded and escaped by the plugin host's one rule.
        let mut bounded = verdict.clone();
        for c in &mut bounded.conditions {
            c.message =
                kiln_plugin_host::text::bounded(&c.message, CONDITION_MESSAGE_LIMIT).into_owned();
        }
        let verdict = &bounded;
        let new = make_status(
            current,
            verdict,
            &self.namespace,
            &now,
            policy.metadata.generation,
        );
        if !needs_write(current, &new) {
            return Ok(false);
        }
        let change = transition(current, verdict);
        // Only the message moved (a rollout's counts): at most one write per MESSAGE_EVERY; the
        // caller requeues within it, so the last message is written too.
        if change.is_none()
            && self
                .last_write
                .lock()
                .expect("last_write lock")
                .get(&name)
                .is_some_and(|t| t.elapsed() < MESSAGE_EVERY)
        {
            return Ok(false);
        }
        if let Some(t) = change {
            let note = kiln_plugin_host::text::bounded(&t.note, NOTE_LIMIT).into_owned();
            let ev = Event {
                type_: if t.type_ == "Warning" {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: t.reason.to_string(),
                note: Some(note),
                action: "Reconcile".into(),
                secondary: None,
            };
            if let Err(e) = self
                .recorder
                .publish(&ev, &policy.object_ref(&policy_resource()))
                .await
            {
                tracing::warn!(policy = %name, error = %e, "could not publish event");
            }
        }
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &policy_resource());
        let body = serde_json::json!({"status": new});
        let res = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await;
        let written = match res {
            Ok(p) => p,
            Err(e) if crate::is_not_found(&e) => return Ok(false),
            Err(e) => {
                return Err(Error::kube(
                    format!("write status of ClusterPolicy {name}"),
                    e,
                ));
            }
        };
        self.last_write
            .lock()
            .expect("last_write lock")
            .insert(name.clone(), std::time::Instant::now());
        self.written.lock().expect("written lock").insert(
            name.clone(),
            (written.metadata.resource_version.unwrap_or_default(), new),
        );
        tracing::info!(policy = %name, state = ?verdict.state, reason = verdict.reason(), "status written");
        Ok(true)
    }

    /// Forget what was written for `policy` (it was deleted).
    pub fn forget(&self, policy: &str) {
        self.written.lock().expect("written lock").remove(policy);
    }
}
