//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas are safe.
//!
//! Why not a crate: of the Lease crates on crates.io, `kube-leader-election` (kube 4) and
//! `kube-coordinate` (kube 2) do not build with kube 5; `kube-lease-manager` 0.13 does, but
//! decides expiry as the holder's `renewTime + leaseDurationSeconds` against this machine's
//! wall clock, so a skewed clock on either replica lets two lead at once (or none). This is the
//! client-go `leaderelection` algorithm instead:
//!
//! 1. GET the Lease; create it holding it ourselves when absent.
//! 2. Take it when we already hold it, nobody does (`holderIdentity` empty: a holder released
//!    it on shutdown), or **its record has not changed for `leaseDurationSeconds` as measured
//!    on our own monotonic clock since we first saw that record** ([`Observer`]). The remote
//!    `renewTime` is never compared with a local clock; only whether it changed matters.
//!    Taking is a replace carrying the `resourceVersion` read, so of two racing replicas only
//!    one wins (the other gets 409).
//! 3. While leading, renew every [`LeaseConfig::renew_every`]; when no renewal succeeded within
//!    [`LeaseConfig::renew_deadline`] (measured from the start of the last successful request,
//!    shorter than the lease duration, so we stop before anyone may take over) [`hold`]
//!    returns and the process exits.
//! 4. On shutdown, after the controller stopped, [`release`] empties `holderIdentity` (and sets
//!    `leaseDurationSeconds` 1), so a standby polling every [`LeaseConfig::retry_every`] takes
//!    over within that period instead of waiting out the lease.
//!
//! Caveat: each renewal is a write (one per `renew_every`); each standby poll is a GET.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use crate::{Error, Result};

/// `$POD_NAME`, else `$HOSTNAME`, else `kiln-<pid>`.
pub fn default_identity() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| format!("kiln-{}", std::process::id()))
}

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Lease name (`kiln-operator`).
    pub name: String,
    /// Lease namespace (the operator namespace).
    pub namespace: String,
    /// This replica's identity (the pod name).
    pub identity: String,
    /// `leaseDurationSeconds` written (15 s): how long a standby waits on a record that stopped
    /// changing before it takes over from a holder that died without releasing.
    pub duration: Duration,
    /// The leader gives up when no renewal succeeded for this long (10 s, < `duration`).
    pub renew_deadline: Duration,
    /// The leader renews this often (2 s).
    pub renew_every: Duration,
    /// A standby polls the Lease this often (1 s): the failover time after a release.
    pub retry_every: Duration,
}

impl LeaseConfig {
    /// The default timings (client-go's 15 s / 10 s, renewing every 2 s, polling every 1 s)
    /// for `identity` in `namespace`.
    pub fn new(namespace: &str, identity: &str) -> Self {
        LeaseConfig {
            name: "kiln-operator".into(),
            namespace: namespace.into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            renew_every: Duration::from_secs(2),
            retry_every: Duration::from_secs(1),
        }
    }
}

/// Who may hold the Lease, as one replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// We hold it (renew).
    Ours,
    /// Nobody holds it (never held, or released).
    Free,
    /// Another holder's record has not changed for its `leaseDurationSeconds` of our time.
    Expired(String),
    /// Another holder renewed it within its lease duration (of our time).
    Held(String),
}

impl Verdict {
    /// Whether this replica may write itself in as holder.
    pub fn may_take(&self) -> bool {
        !matches!(self, Verdict::Held(_))
    }
}

/// The last Lease record this replica saw and when it first saw it (own monotonic clock):
/// the only time base of the expiry decision, so skew between the replicas' clocks, or between
/// a replica and the API server, does not matter.
#[derive(Debug, Default)]
pub struct Observer {
    seen: Option<(LeaseSpec, Instant)>,
}

impl Observer {
    /// Record `spec` as read at `now` (a changed record restarts the expiry timer) and judge it
    /// for `me`. A holder's lease runs `leaseDurationSeconds` (`default` when unset) from when
    /// we first saw its current record.
    pub fn observe(
        &mut self,
        spec: &LeaseSpec,
        me: &str,
        default: Duration,
        now: Instant,
    ) -> Verdict {
        let since = match &self.seen {
            Some((prev, at)) if prev == spec => *at,
            _ => {
                self.seen = Some((spec.clone(), now));
                now
            }
        };
        let holder = match spec.holder_identity.as_deref() {
            None | Some("") => return Verdict::Free,
            Some(h) if h == me => return Verdict::Ours,
            Some(h) => h.to_string(),
        };
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(default, Duration::from_secs);
        if now.duration_since(since) >= duration {
            Verdict::Expired(holder)
        } else {
            Verdict::Held(holder)
        }
    }

    /// Remember a record we wrote ourselves at `now`.
    pub fn wrote(&mut self, spec: LeaseSpec, now: Instant) {
        self.seen = Some((spec, now));
    }
}

/// The spec `cfg.identity` writes to take or renew `current` (`now`: the `renewTime`, only
/// informational for the other replicas).
pub fn desired_spec(cfg: &LeaseConfig, current: Option<&LeaseSpec>, now: Timestamp) -> LeaseSpec {
    let prev = current.cloned().unwrap_or_default();
    let ours = prev.holder_identity.as_deref() == Some(cfg.identity.as_str());
    LeaseSpec {
        holder_identity: Some(cfg.identity.clone()),
        lease_duration_seconds: Some(secs(cfg.duration)),
        acquire_time: if ours {
            prev.acquire_time.clone()
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(prev.lease_transitions.unwrap_or(0) + i32::from(!ours)),
        ..LeaseSpec::default()
    }
}

/// The spec a holder leaves on shutdown: no holder, a 1 s duration (client-go's release).
pub fn released_spec(current: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: current.lease_transitions,
        ..LeaseSpec::default()
    }
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

fn lease(cfg: &LeaseConfig, resource_version: Option<String>, spec: LeaseSpec) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(cfg.name.clone()),
            namespace: Some(cfg.namespace.clone()),
            resource_version,
            ..ObjectMeta::default()
        },
        spec: Some(spec),
    }
}

/// One replica's view of the election: its settings and what it observed.
#[derive(Debug)]
pub struct Elector {
    /// Settings.
    pub cfg: LeaseConfig,
    observer: Observer,
}

impl Elector {
    /// A replica that has seen nothing yet.
    pub fn new(cfg: LeaseConfig) -> Self {
        Elector {
            cfg,
            observer: Observer::default(),
        }
    }

    /// One attempt to take or renew the Lease. `Ok(true)` when we hold it afterwards.
    ///
    /// # Errors
    /// [`Error::Kube`] on request failures other than a lost race (409).
    pub async fn try_acquire(&mut self, client: &Client) -> Result<bool> {
        let cfg = &self.cfg;
        let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
        let current = api
            .get_opt(&cfg.name)
            .await
            .map_err(|e| Error::kube(format!("get lease {}", cfg.name), e))?;
        let now = Instant::now();
        let spec = current.as_ref().map(|l| l.spec.clone().unwrap_or_default());
        if let Some(s) = &spec {
            let verdict = self.observer.observe(s, &cfg.identity, cfg.duration, now);
            if !verdict.may_take() {
                return Ok(false);
            }
            if let Verdict::Expired(holder) = &verdict {
                tracing::info!(%holder, "lease record unchanged for its duration: taking over");
            }
        }
        let want = desired_spec(cfg, spec.as_ref(), Timestamp::now());
        let rv = current
            .as_ref()
            .and_then(|l| l.metadata.resource_version.clone());
        let obj = lease(cfg, rv, want.clone());
        let res = match current {
            None => api.create(&PostParams::default(), &obj).await,
            Some(_) => api.replace(&cfg.name, &PostParams::default(), &obj).await,
        };
        match res {
            Ok(_) => {
                self.observer.wrote(want, now);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(Error::kube(format!("take lease {}", cfg.name), e)),
        }
    }

    /// Wait until this replica holds the Lease, polling every
    /// [`LeaseConfig::retry_every`]; request failures are logged and retried.
    pub async fn acquire(&mut self, client: &Client) {
        loop {
            match self.try_acquire(client).await {
                Ok(true) => {
                    tracing::info!(identity = %self.cfg.identity, lease = %self.cfg.name, "became leader");
                    return;
                }
                Ok(false) => tracing::debug!("lease held by another replica"),
                Err(e) => tracing::warn!(error = %e, "lease acquisition failed"),
            }
            tokio::time::sleep(self.cfg.retry_every).await;
        }
    }

    /// Renew the Lease until leadership is lost (no successful renewal within
    /// [`LeaseConfig::renew_deadline`], or another holder took it); then return.
    pub async fn hold(&mut self, client: &Client) {
        let mut last_ok = Instant::now();
        loop {
            tokio::time::sleep(self.cfg.renew_every).await;
            let started = Instant::now();
            match self.try_acquire(client).await {
                Ok(true) => last_ok = started,
                Ok(false) => {
                    tracing::error!("lease taken by another replica");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "lease renewal failed"),
            }
            if last_ok.elapsed() > self.cfg.renew_deadline {
                tracing::error!("lease not renewed within the renew deadline");
                return;
            }
        }
    }
}

/// Give the Lease up if this replica still holds it (on shutdown, after the controller
/// stopped): a standby takes over at its next poll. A lost race (409) or a Lease that is
/// gone is fine; other failures are returned (the lease then expires on its own).
///
/// # Errors
/// [`Error::Kube`] when the Lease cannot be read or written.
pub async fn release(client: &Client, cfg: &LeaseConfig) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let Some(current) = api
        .get_opt(&cfg.name)
        .await
        .map_err(|e| Error::kube(format!("get lease {}", cfg.name), e))?
    else {
        return Ok(());
    };
    let spec = current.spec.clone().unwrap_or_default();
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return Ok(());
    }
    let obj = lease(
        cfg,
        current.metadata.resource_version.clone(),
        released_spec(&spec, Timestamp::now()),
    );
    match api.replace(&cfg.name, &PostParams::default(), &obj).await {
        Ok(_) => {
            tracing::info!(lease = %cfg.name, "lease released");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("release lease {}", cfg.name), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn spec(holder: Option<&str>, renewed: &str) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(renewed.parse().unwrap())),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn own_and_free_leases_are_taken_at_once() {
        let t0 = Instant::now();
        let mut o = Observer::default();
        let mine = spec(Some("me"), "2026-01-01T00:00:19Z");
        assert_eq!(o.observe(&mine, "me", D, t0), Verdict::Ours);
        let free = spec(None, "2026-01-01T00:00:19Z");
        assert_eq!(o.observe(&free, "me", D, t0), Verdict::Free);
        let empty = spec(Some(""), "2026-01-01T00:00:19Z");
        assert_eq!(o.observe(&empty, "me", D, t0), Verdict::Free);
        let released = released_spec(
            &spec(Some("other"), "2020-01-01T00:00:00Z"),
            "2030-01-01T00:00:00Z".parse().unwrap(),
        );
        assert_eq!(released.holder_identity, None);
        assert_eq!(released.lease_duration_seconds, Some(1));
        assert_eq!(o.observe(&released, "me", D, t0), Verdict::Free);
    }

    /// The holder's clock is an hour behind ours: its `renewTime` looks long expired, but it
    /// keeps changing, so it is held. Before the fix (renewTime + duration < local now) this
    /// was taken over at once: two leaders.
    #[test]
    fn a_renewing_holder_with_a_slow_clock_keeps_the_lease() {
        let t0 = Instant::now();
        let mut o = Observer::default();
        for (i, renewed) in [
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:02Z",
            "2026-01-01T00:00:04Z",
            "2026-01-01T00:00:06Z",
            "2026-01-01T00:00:08Z",
            "2026-01-01T00:00:10Z",
            "2026-01-01T00:00:12Z",
            "2026-01-01T00:00:14Z",
            "2026-01-01T00:00:16Z",
            "2026-01-01T00:00:18Z",
        ]
        .into_iter()
        .enumerate()
        {
            // We read every 2 s of our time, for 18 s: past one lease duration in total.
            let now = t0 + Duration::from_secs(2 * i as u64);
            let v = o.observe(&spec(Some("other"), renewed), "me", D, now);
            assert_eq!(v, Verdict::Held("other".into()), "read {i}");
        }
    }

    /// The holder's clock is an hour ahead (its `renewTime` is in our future) and it died: the
    /// record stops changing and is taken exactly one lease duration after we first saw it.
    /// Before the fix this lease was never taken over for an hour.
    #[test]
    fn a_dead_holder_with_a_fast_clock_expires_on_our_time() {
        let t0 = Instant::now();
        let mut o = Observer::default();
        let frozen = spec(Some("other"), "2026-01-01T01:00:00Z");
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(
            o.observe(&frozen, "me", D, at(0)),
            Verdict::Held("other".into())
        );
        assert_eq!(
            o.observe(&frozen, "me", D, at(14)),
            Verdict::Held("other".into())
        );
        assert_eq!(
            o.observe(&frozen, "me", D, at(15)),
            Verdict::Expired("other".into())
        );
    }

    /// Whatever the remote timestamps say (far past, far future, absent), the decision depends
    /// only on when the record changed on our clock.
    #[test]
    fn remote_timestamps_do_not_matter() {
        let t0 = Instant::now();
        for renewed in ["1970-01-01T00:00:00Z", "2099-01-01T00:00:00Z"] {
            let mut o = Observer::default();
            let s = spec(Some("other"), renewed);
            assert!(!o.observe(&s, "me", D, t0).may_take(), "{renewed}");
            assert!(o.observe(&s, "me", D, t0 + D).may_take(), "{renewed}");
        }
        let mut o = Observer::default();
        let s = LeaseSpec {
            holder_identity: Some("other".into()),
            ..LeaseSpec::default()
        };
        assert!(!o.observe(&s, "me", D, t0).may_take());
        assert!(o.observe(&s, "me", D, t0 + D).may_take());
    }

    /// A record that changes restarts the timer; the holder's own `leaseDurationSeconds` is
    /// used, not ours.
    #[test]
    fn a_change_restarts_the_timer_and_the_holders_duration_counts() {
        let t0 = Instant::now();
        let mut o = Observer::default();
        let a = spec(Some("other"), "2026-01-01T00:00:00Z");
        let b = spec(Some("other"), "2026-01-01T00:00:10Z");
        assert!(!o.observe(&a, "me", D, t0).may_take());
        assert!(
            !o.observe(&b, "me", D, t0 + Duration::from_secs(10))
                .may_take()
        );
        assert!(
            !o.observe(&b, "me", D, t0 + Duration::from_secs(24))
                .may_take()
        );
        assert!(
            o.observe(&b, "me", D, t0 + Duration::from_secs(25))
                .may_take()
        );
        let short = LeaseSpec {
            lease_duration_seconds: Some(3),
            ..b
        };
        let t1 = t0 + Duration::from_secs(30);
        assert!(!o.observe(&short, "me", D, t1).may_take());
        assert!(
            o.observe(&short, "me", D, t1 + Duration::from_secs(3))
                .may_take()
        );
    }

    /// What we wrote counts as seen when we wrote it.
    #[test]
    fn our_write_is_an_observation() {
        let t0 = Instant::now();
        let mut o = Observer::default();
        let s = spec(Some("other"), "2026-01-01T00:00:00Z");
        o.wrote(s.clone(), t0);
        assert!(
            !o.observe(&s, "me", D, t0 + Duration::from_secs(14))
                .may_take()
        );
        assert!(o.observe(&s, "me", D, t0 + D).may_take());
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let cfg = LeaseConfig::new("gpu-operator", "me");
        let now: Timestamp = "2026-01-01T00:00:20Z".parse().unwrap();
        let taken = desired_spec(
            &cfg,
            Some(&spec(Some("other"), "2026-01-01T00:00:00Z")),
            now,
        );
        assert_eq!(taken.holder_identity.as_deref(), Some("me"));
        assert_eq!(taken.lease_duration_seconds, Some(15));
        assert_eq!(taken.lease_transitions, Some(1));
        assert_eq!(taken.acquire_time, Some(MicroTime(now)));
        let later: Timestamp = "2026-01-01T00:00:22Z".parse().unwrap();
        let renewed = desired_spec(&cfg, Some(&taken), later);
        assert_eq!(renewed.lease_transitions, Some(1));
        assert_eq!(renewed.acquire_time, Some(MicroTime(now)));
        assert_eq!(renewed.renew_time, Some(MicroTime(later)));
        let released = released_spec(&renewed, later);
        assert_eq!(released.lease_transitions, Some(1));
    }

    #[test]
    fn the_leader_gives_up_before_a_standby_may_take_over() {
        let cfg = LeaseConfig::new("gpu-operator", "me");
        assert!(cfg.renew_deadline < cfg.duration);
        assert!(cfg.renew_every < cfg.renew_deadline);
        assert!(cfg.retry_every <= Duration::from_secs(1));
    }
}
