//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas are safe.
//!
//! No maintained crate matched kube 5 when this was written, so this is the small standard
//! loop (the client-go `leaderelection` rules):
//! 1. GET the Lease; if absent, create it holding it ourselves.
//! 2. Take it when we already hold it, nobody does, or its `renewTime + leaseDurationSeconds`
//!    is in the past: replace it with our identity, carrying its `resourceVersion` so that of two
//!    racing replicas only one wins (the other gets 409 and retries).
//! 3. While leading, renew every `renew_every`; a failed renewal past the lease duration means
//!    leadership is lost and [`hold`] returns, and the process exits (the other replica takes
//!    over).
//!
//! Caveat: each renewal is a write; leader election is off by default out of cluster.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};

use crate::{Error, Result};

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Lease name (`kiln-operator`).
    pub name: String,
    /// Lease namespace (the operator namespace).
    pub namespace: String,
    /// This replica's identity.
    pub identity: String,
    /// `leaseDurationSeconds` (15 s).
    pub duration: Duration,
    /// Renewal / retry period (5 s).
    pub renew_every: Duration,
}

impl LeaseConfig {
    /// The default timings for `identity` in `namespace`.
    pub fn new(namespace: &str, identity: &str) -> Self {
        LeaseConfig {
            name: "kiln-operator".into(),
            namespace: namespace.into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
        }
    }
}

/// Whether `me` may take `lease` at `now`: we hold it, nobody holds it, or it expired.
pub fn can_take(lease: &Lease, me: &str, now: Timestamp) -> bool {
    let Some(spec) = &lease.spec else { return true };
    match spec.holder_identity.as_deref() {
        None | Some("") => return true,
        Some(h) if h == me => return true,
        Some(_) => {}
    }
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    match &spec.renew_time {
        Some(MicroTime(t)) => *t + SignedDuration::from_secs(secs) < now,
        None => true,
    }
}

fn desired(cfg: &LeaseConfig, current: Option<&Lease>, now: Timestamp) -> Lease {
    let prev = current.and_then(|l| l.spec.clone()).unwrap_or_default();
    let ours = prev.holder_identity.as_deref() == Some(cfg.identity.as_str());
    Lease {
        metadata: ObjectMeta {
            name: Some(cfg.name.clone()),
            namespace: Some(cfg.namespace.clone()),
            resource_version: current.and_then(|l| l.metadata.resource_version.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(cfg.identity.clone()),
            lease_duration_seconds: Some(cfg.duration.as_secs() as i32),
            acquire_time: if ours {
                prev.acquire_time.clone()
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(prev.lease_transitions.unwrap_or(0) + i32::from(!ours)),
            ..LeaseSpec::default()
        }),
    }
}

/// One attempt to take or renew the Lease. `Ok(true)` when we hold it afterwards.
///
/// # Errors
/// [`Error::Kube`] on request failures other than a lost race (409).
pub async fn try_acquire(client: &Client, cfg: &LeaseConfig) -> Result<bool> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let now = Timestamp::now();
    let current = api
        .get_opt(&cfg.name)
        .await
        .map_err(|e| Error::kube(format!("get lease {}", cfg.name), e))?;
    if current
        .as_ref()
        .is_some_and(|l| !can_take(l, &cfg.identity, now))
    {
        return Ok(false);
    }
    let lease = desired(cfg, current.as_ref(), now);
    let res = match current {
        None => api.create(&PostParams::default(), &lease).await,
        Some(_) => api.replace(&cfg.name, &PostParams::default(), &lease).await,
    };
    match res {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(Error::kube(format!("take lease {}", cfg.name), e)),
    }
}

/// Wait until this replica holds the Lease.
///
/// # Errors
/// Never returns an error by itself; request failures are logged and retried.
pub async fn acquire(client: &Client, cfg: &LeaseConfig) -> Result<()> {
    loop {
        match try_acquire(client, cfg).await {
            Ok(true) => {
                tracing::info!(identity = %cfg.identity, lease = %cfg.name, "became leader");
                return Ok(());
            }
            Ok(false) => tracing::debug!("lease held by another replica"),
            Err(e) => tracing::warn!(error = %e, "lease acquisition failed"),
        }
        tokio::time::sleep(cfg.renew_every).await;
    }
}

/// Renew the Lease until leadership is lost (no successful renewal within the lease
/// duration, or another holder took it); then return.
pub async fn hold(client: &Client, cfg: &LeaseConfig) {
    let mut last_ok = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(cfg.renew_every).await;
        match try_acquire(client, cfg).await {
            Ok(true) => last_ok = tokio::time::Instant::now(),
            Ok(false) => {
                tracing::error!("lease taken by another replica");
                return;
            }
            Err(e) => tracing::warn!(error = %e, "lease renewal failed"),
        }
        if last_ok.elapsed() > cfg.duration {
            tracing::error!("lease not renewed within its duration");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed: &str) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(renewed.parse().unwrap())),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn take_rules() {
        let now: Timestamp = "2026-01-01T00:00:20Z".parse().unwrap();
        assert!(can_take(
            &lease(Some("me"), "2026-01-01T00:00:19Z"),
            "me",
            now
        ));
        assert!(can_take(&lease(None, "2026-01-01T00:00:19Z"), "me", now));
        assert!(!can_take(
            &lease(Some("other"), "2026-01-01T00:00:10Z"),
            "me",
            now
        ));
        assert!(can_take(
            &lease(Some("other"), "2026-01-01T00:00:04Z"),
            "me",
            now
        ));
    }

    #[test]
    fn taking_over_counts_a_transition() {
        let cfg = LeaseConfig::new("gpu-operator", "me");
        let now: Timestamp = "2026-01-01T00:00:20Z".parse().unwrap();
        let l = desired(
            &cfg,
            Some(&lease(Some("other"), "2026-01-01T00:00:00Z")),
            now,
        );
        let spec = l.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.lease_transitions, Some(1));
        assert_eq!(spec.acquire_time, Some(MicroTime(now)));
    }
}
