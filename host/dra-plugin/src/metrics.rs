//! The plugin's Prometheus metrics (served on `--http-endpoint` at `--metrics-path`, NVIDIA's
//! flags; text exposition format 0.0.4):
//!
//! - `kiln_dra_prepare_duration_seconds` (histogram): NodePrepareResources per claim, from the
//!   request to the answer, including the wait for the claim cache;
//! - `kiln_dra_claims_prepared_total` / `kiln_dra_prepare_errors_total` (counters): claims
//!   newly prepared (a repeated prepare answered from the checkpoint is not counted) and claims
//!   refused;
//! - `kiln_dra_prepared_claims` (gauge): claims prepared now;
//! - `kiln_dra_devices_published` (gauge): devices in the node's ResourceSlice;
//! - `kiln_dra_slice_writes_total` (counter): ResourceSlice writes (changes only).

use std::{
    fmt::Write as _,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

/// Upper bounds of the prepare histogram's buckets, seconds.
pub const PREPARE_BUCKETS: [f64; 10] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

/// The counters, updated lock-free from the gRPC handlers and the publisher.
#[derive(Debug, Default)]
pub struct Metrics {
    buckets: [AtomicU64; PREPARE_BUCKETS.len()],
    prepare_count: AtomicU64,
    prepare_sum_ns: AtomicU64,
    claims_prepared: AtomicU64,
    prepare_errors: AtomicU64,
    prepared_claims: AtomicU64,
    devices_published: AtomicU64,
    slice_writes: AtomicU64,
}

impl Metrics {
    /// Records one claim's prepare: its duration, whether it was newly prepared, refused, or
    /// answered from the checkpoint (`new == false`, `ok == true`).
    pub fn prepare(&self, took: Duration, ok: bool, new: bool) {
        let secs = took.as_secs_f64();
        for (b, le) in self.buckets.iter().zip(PREPARE_BUCKETS) {
            if secs <= le {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.prepare_count.fetch_add(1, Ordering::Relaxed);
        self.prepare_sum_ns.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if !ok {
            self.prepare_errors.fetch_add(1, Ordering::Relaxed);
        } else if new {
            self.claims_prepared.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sets the number of claims prepared now.
    pub fn set_prepared_claims(&self, n: usize) {
        self.prepared_claims.store(n as u64, Ordering::Relaxed);
    }

    /// Sets the number of devices published.
    pub fn set_devices_published(&self, n: usize) {
        self.devices_published.store(n as u64, Ordering::Relaxed);
    }

    /// Counts one ResourceSlice write.
    pub fn slice_written(&self) {
        self.slice_writes.fetch_add(1, Ordering::Relaxed);
    }

    /// The exposition text.
    #[must_use]
    pub fn render(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = String::new();
        let h = "kiln_dra_prepare_duration_seconds";
        let _ = writeln!(s, "# HELP {h} NodePrepareResources duration per claim.");
        let _ = writeln!(s, "# TYPE {h} histogram");
        for (b, le) in self.buckets.iter().zip(PREPARE_BUCKETS) {
            let _ = writeln!(s, "{h}_bucket{{le=\"{le}\"}} {}", get(b));
        }
        let count = get(&self.prepare_count);
        let _ = writeln!(s, "{h}_bucket{{le=\"+Inf\"}} {count}");
        #[allow(clippy::cast_precision_loss)]
        let sum = get(&self.prepare_sum_ns) as f64 / 1e9;
        let _ = writeln!(s, "{h}_sum {sum}");
        let _ = writeln!(s, "{h}_count {count}");
        for (name, kind, help, v) in [
            (
                "kiln_dra_claims_prepared_total",
                "counter",
                "Claims newly prepared.",
                &self.claims_prepared,
            ),
            (
                "kiln_dra_prepare_errors_total",
                "counter",
                "Claims whose prepare was refused.",
                &self.prepare_errors,
            ),
            (
                "kiln_dra_prepared_claims",
                "gauge",
                "Claims prepared now.",
                &self.prepared_claims,
            ),
            (
                "kiln_dra_devices_published",
                "gauge",
                "Devices in the node's ResourceSlice.",
                &self.devices_published,
            ),
            (
                "kiln_dra_slice_writes_total",
                "counter",
                "ResourceSlice writes.",
                &self.slice_writes,
            ),
        ] {
            let _ = writeln!(
                s,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}",
                get(v)
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_counts_prepares_by_outcome() {
        let m = Metrics::default();
        m.prepare(Duration::from_millis(3), true, true);
        m.prepare(Duration::from_millis(30), true, false);
        m.prepare(Duration::from_secs(9), false, true);
        m.set_devices_published(8);
        let text = m.render();
        for line in [
            "kiln_dra_prepare_duration_seconds_bucket{le=\"0.0025\"} 0",
            "kiln_dra_prepare_duration_seconds_bucket{le=\"0.005\"} 1",
            "kiln_dra_prepare_duration_seconds_bucket{le=\"0.05\"} 2",
            "kiln_dra_prepare_duration_seconds_bucket{le=\"+Inf\"} 3",
            "kiln_dra_prepare_duration_seconds_count 3",
            "kiln_dra_claims_prepared_total 1",
            "kiln_dra_prepare_errors_total 1",
            "kiln_dra_devices_published 8",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
    }
}
