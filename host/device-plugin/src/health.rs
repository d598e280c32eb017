//! Device health from XID events (reference §1.7) with kiln's fixes (§9.1–9.2): an XID on a
//! GPU marks **every** unit on it unhealthy (replicas and MIG devices), and a GPU is healthy
//! again once `recovery_after` has passed without a new critical XID **and** it answers a
//! sample (NVML has the handle back).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use kiln_gpu::{GpuInventory, XidEvent};

/// XIDs upstream treats as application errors and skips (v0.17.1+): 13, 31, 43, 45, 68, 109.
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Which XIDs mark a device unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidFilter {
    /// `DP_DISABLE_HEALTHCHECKS=all|xids`: no XID is critical.
    pub disabled: bool,
    /// Skipped XIDs (defaults plus `DP_DISABLE_HEALTHCHECKS`).
    pub ignored: BTreeSet<u64>,
    /// `DP_ENABLE_HEALTHCHECKS=all`: every XID is critical (unless `disabled`).
    pub all_enabled: bool,
    /// `DP_ENABLE_HEALTHCHECKS` ids, which override `ignored`.
    pub enabled: BTreeSet<u64>,
}

impl Default for XidFilter {
    fn default() -> Self {
        Self::from_env_values(None, None)
    }
}

impl XidFilter {
    /// Builds the filter from `DP_DISABLE_HEALTHCHECKS` and `DP_ENABLE_HEALTHCHECKS` values
    /// (comma-separated, case-insensitive, whitespace trimmed; bad numbers are logged and
    /// dropped; `all`/`xids` in the disable list disables XID checks entirely, as upstream).
    #[must_use]
    pub fn from_env_values(disable: Option<&str>, enable: Option<&str>) -> Self {
        let tokens = |v: Option<&str>| -> Vec<String> {
            v.unwrap_or_default()
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .filter(|t| !t.is_empty())
                .collect()
        };
        let numbers = |ts: &[String], var: &str| -> BTreeSet<u64> {
            ts.iter()
                .filter(|t| *t != "all" && *t != "xids")
                .filter_map(|t| match t.parse() {
                    Ok(n) => Some(n),
                    Err(_) => {
                        tracing::warn!("{var}: ignoring invalid XID {t:?}");
                        None
                    }
                })
                .collect()
        };
        let dis = tokens(disable);
        let en = tokens(enable);
        let disabled = dis.iter().any(|t| t == "all" || t == "xids");
        let mut ignored: BTreeSet<u64> = DEFAULT_IGNORED_XIDS.into_iter().collect();
        ignored.extend(numbers(&dis, "DP_DISABLE_HEALTHCHECKS"));
        Self {
            disabled,
            ignored,
            all_enabled: en.iter().any(|t| t == "all"),
            enabled: numbers(&en, "DP_ENABLE_HEALTHCHECKS"),
        }
    }

    /// Reads the two env vars of this process.
    #[must_use]
    pub fn from_env() -> Self {
        let disable = std::env::var("DP_DISABLE_HEALTHCHECKS").ok();
        let enable = std::env::var("DP_ENABLE_HEALTHCHECKS").ok();
        Self::from_env_values(disable.as_deref(), enable.as_deref())
    }

    /// True when `xid` makes the GPU unhealthy.
    #[must_use]
    pub fn is_critical(&self, xid: u64) -> bool {
        !self.disabled
            && (self.all_enabled || self.enabled.contains(&xid) || !self.ignored.contains(&xid))
    }
}

/// Per-GPU health, keyed by NVML index.
#[derive(Debug)]
pub struct HealthTracker {
    filter: XidFilter,
    recovery_after: Duration,
    /// GPU index → time and number of its last critical XID.
    unhealthy: BTreeMap<u32, (Instant, u64)>,
}

impl HealthTracker {
    /// A tracker with every GPU healthy.
    #[must_use]
    pub fn new(filter: XidFilter, recovery_after: Duration) -> Self {
        Self {
            filter,
            recovery_after,
            unhealthy: BTreeMap::new(),
        }
    }

    /// Applies `events` at `now`, then recovers GPUs whose quiet period has passed and that
    /// answer `probe` (`true` = the GPU responds). Returns true when the set of unhealthy GPUs
    /// changed. Each transition is logged once.
    pub fn update(
        &mut self,
        events: &[XidEvent],
        now: Instant,
        probe: &dyn Fn(u32) -> bool,
    ) -> bool {
        let mut changed = false;
        for e in events {
            if !self.filter.is_critical(e.xid) {
                tracing::info!(
                    gpu = e.index,
                    xid = e.xid,
                    "Skipping non-critical XID event"
                );
                continue;
            }
            if self.unhealthy.insert(e.index, (now, e.xid)).is_none() {
                tracing::warn!(
                    gpu = e.index,
                    xid = e.xid,
                    "XidCriticalError: Xid={} on GPU {}; marking every unit of it unhealthy",
                    e.xid,
                    e.index
                );
                changed = true;
            }
        }
        let recovered: Vec<u32> = self
            .unhealthy
            .iter()
            .filter(|(_, (since, _))| now.saturating_duration_since(*since) >= self.recovery_after)
            .map(|(i, _)| *i)
            .filter(|i| probe(*i))
            .collect();
        for i in recovered {
            self.unhealthy.remove(&i);
            tracing::info!(gpu = i, "GPU healthy again; re-advertising its units");
            changed = true;
        }
        changed
    }

    /// The unhealthy GPUs with their last critical XID, by index (what the node agent reports on
    /// the Node, [`crate::node_health`]).
    #[must_use]
    pub fn faults(&self) -> Vec<(u32, u64)> {
        self.unhealthy.iter().map(|(i, (_, x))| (*i, *x)).collect()
    }

    /// True when GPU `index` is healthy.
    #[must_use]
    pub fn is_healthy(&self, index: u32) -> bool {
        !self.unhealthy.contains_key(&index)
    }

    /// One poll of `inv`: drain its XIDs and probe with `sample`.
    pub fn poll(&mut self, inv: &dyn GpuInventory) -> bool {
        let events = inv.drain_xid_events();
        self.update(&events, Instant::now(), &|i| inv.sample(i).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_and_env_filters_follow_upstream() {
        let f = XidFilter::default();
        assert!(f.is_critical(79) && f.is_critical(48));
        assert!(!f.is_critical(13) && !f.is_critical(109));
        let f = XidFilter::from_env_values(Some(" 79 ,bad"), Some("13"));
        assert!(!f.is_critical(79) && f.is_critical(13) && !f.is_critical(31));
        let f = XidFilter::from_env_values(Some("XIDS"), Some("79"));
        assert!(!f.is_critical(79));
        let f = XidFilter::from_env_values(None, Some("all"));
        assert!(f.is_critical(13));
    }

    #[test]
    fn recovery_needs_quiet_time_and_a_responding_gpu() {
        let mut h = HealthTracker::new(XidFilter::default(), Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(!h.update(&[XidEvent { index: 1, xid: 31 }], t0, &|_| true));
        assert!(h.update(&[XidEvent { index: 1, xid: 79 }], t0, &|_| true));
        assert!(!h.is_healthy(1) && h.is_healthy(0));
        let later = t0 + Duration::from_secs(61);
        assert!(!h.update(&[], t0 + Duration::from_secs(30), &|_| true));
        assert!(!h.update(&[], later, &|_| false));
        assert!(!h.is_healthy(1));
        assert!(h.update(&[], later, &|_| true));
        assert!(h.is_healthy(1));
    }
}
