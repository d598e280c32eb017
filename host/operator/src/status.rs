//! Status and Events with IO: merge a [`Verdict`] into the stored status, write it through the
//! status subresource only when it changed, and publish an Event when the state or reason
//! changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_core::spec::ClusterPolicy;
use kiln_core::status::{Verdict, make_status, needs_write, transition};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};

use crate::context::Context;
use crate::{Error, Result};

/// Kubernetes caps an Event note at 1 KiB.
const NOTE_LIMIT: usize = 1000;
/// Cap on a status condition message (the API allows 32 KiB; 16 KiB keeps the whole status
/// write far below the request size limit, whatever a plugin's errors say).
const CONDITION_MESSAGE_LIMIT: usize = 16 << 10;

/// Write `verdict` as `policy`'s status (when it differs from the stored one) and publish an
/// Event on transitions. Returns whether a status write was sent.
///
/// # Errors
/// [`Error::Kube`] when the status patch fails. Event failures are logged, not returned.
pub async fn write_status(
    ctx: &Context,
    policy: &ClusterPolicy,
    verdict: &Verdict,
) -> Result<bool> {
    let name = policy.metadata.name.clone().unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    // The reconciled object may come from a cache older than our last status write: read the
    // stored status so transition times are kept and an unchanged status is not written again.
    let api: Api<ClusterPolicy> = Api::all(ctx.client.clone());
    let fresh = api
        .get_opt(&name)
        .await
        .map_err(|e| Error::kube(format!("get ClusterPolicy {name}"), e))?;
    let Some(fresh) = fresh else { return Ok(false) };
    let current = fresh.status.as_ref();
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
        &ctx.config.namespace,
        &now,
        policy.metadata.generation,
    );
    if let Some(t) = transition(current, verdict) {
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
        if let Err(e) = ctx.recorder.publish(&ev, &policy.object_ref(&())).await {
            tracing::warn!(policy = %name, error = %e, "could not publish event");
        }
    }
    if !needs_write(current, &new) {
        return Ok(false);
    }
    let body = serde_json::json!({"status": new});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(|e| Error::kube(format!("write status of ClusterPolicy {name}"), e))?;
    tracing::info!(policy = %name, state = ?verdict.state, reason = verdict.reason(), "status written");
    Ok(true)
}
