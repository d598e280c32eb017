//! Removing additive drift from an object a controller applied, and the Event naming what went:
//! one rule for both controllers (the ClusterPolicy's states, [`crate::controllers::policy::reconcile`], and each
//! NVIDIADriver's objects, [`crate::controllers::driver`]).
//!
//! ```text
//! live object kiln holds (apply answer, or the DaemonSet cache's copy)
//!   ─► Applier::due (other managers' fields kiln does not own) ─► nothing: no request
//!   ─► Applier::correct (one JSON patch, guarded by resourceVersion)
//!   ─► DriftRemoved Warning Event on the object (what went, who set it)
//! ```
//!
//! The live object is never read for this ([`crate::apply`]'s module docs): [`held`] makes it
//! from an apply's answer, [`crate::cluster::live::foreign_of`] from a cached DaemonSet.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::api::DynamicObject;
use kube::runtime::events::{Event, EventType};
use serde_json::Value;

use crate::Result;
use crate::apply::{Applier, ObjKey};
use crate::signals::events::Events;
use crate::signals::metrics::Metrics;

/// The longest note of a `DriftRemoved` Event, in bytes (the API server refuses notes over
/// 1 KiB).
pub const DRIFT_NOTE_LIMIT: usize = 1000;

/// An applied object as [`remove_drift`] takes it: its managed fields and the object as JSON
/// (`None` when it does not serialize).
pub fn held(obj: &DynamicObject) -> Option<(Vec<ManagedFieldsEntry>, Value)> {
    let managed = obj.metadata.managed_fields.clone().unwrap_or_default();
    Some((managed, serde_json::to_value(obj).ok()?))
}

/// Remove the drift due on `live` (the object `key` as JSON, with its managed fields
/// `managed`; [`Applier::due`]) through `applier`, count the correction in `metrics` (writes of
/// kind `drift`) when given, and publish a `DriftRemoved` Warning through `recorder` on the
/// object naming each field removed and the manager that set it. Nothing due: no request. An
/// Event the server refuses is logged, not an error.
///
/// # Errors
/// [`crate::Error::Kube`] from [`Applier::correct`].
pub async fn remove_drift(
    applier: &Applier,
    recorder: &Events,
    metrics: Option<&Metrics>,
    key: &ObjKey,
    managed: &[ManagedFieldsEntry],
    live: &Value,
) -> Result<()> {
    let due = applier.due(key, managed, live);
    if due.is_empty() {
        return Ok(());
    }
    let meta = &live["metadata"];
    let rv = meta["resourceVersion"].as_str().unwrap_or_default();
    let Some(removed) = applier.correct(key, rv, &due).await? else {
        return Ok(());
    };
    if let Some(metrics) = metrics {
        metrics.writes("drift", 1);
    }
    if removed.is_empty() {
        return Ok(());
    }
    let note = format!(
        "removed what kiln does not render, {}",
        kiln_core::drift::describe(&removed)
    );
    tracing::warn!(object = %key, "{note}");
    let ev = Event {
        type_: EventType::Warning,
        reason: "DriftRemoved".into(),
        note: Some(kiln_plugin_host::text::bounded(&note, DRIFT_NOTE_LIMIT).into_owned()),
        action: "Reconcile".into(),
        secondary: None,
    };
    let reference = ObjectReference {
        api_version: Some(key.api_version.clone()),
        kind: Some(key.kind.clone()),
        name: Some(key.name.clone()),
        namespace: key.namespace.clone(),
        uid: meta["uid"].as_str().map(str::to_string),
        ..ObjectReference::default()
    };
    if let Err(e) = recorder.publish(&ev, &reference).await {
        tracing::warn!(object = %key, error = %e, "could not publish event");
    }
    Ok(())
}
