//! Bounded retries of a step's attempt (backon's constant backoff), logging each wait.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use backon::{BlockingRetryable as _, ConstantBuilder};

use crate::{NotReady, ValidatorError};

/// How a step retries: `attempts` tries in all, `interval` apart (upstream's
/// `--sleep-interval-seconds`, default 5 s).
#[derive(Clone)]
pub struct RetryPolicy {
    /// Total attempts, at least 1.
    pub attempts: usize,
    /// Pause between attempts.
    pub interval: Duration,
    /// How to pause; [`std::thread::sleep`] by default, a recorder in tests.
    pub sleeper: Arc<dyn Fn(Duration) + Send + Sync>,
}

impl std::fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("attempts", &self.attempts)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl RetryPolicy {
    /// `attempts` tries `interval` apart, sleeping the thread.
    #[must_use]
    pub fn new(attempts: usize, interval: Duration) -> Self {
        Self {
            attempts: attempts.max(1),
            interval,
            sleeper: Arc::new(std::thread::sleep),
        }
    }

    /// Runs `attempt` until it succeeds or the attempts are used up. Every failure is logged
    /// at `warn` with what the step waits for (`waiting_for`) and why (the [`NotReady`]).
    ///
    /// # Errors
    /// [`ValidatorError::GaveUp`] with the last reason.
    pub fn run<T>(
        &self,
        step: &'static str,
        waiting_for: &str,
        mut attempt: impl FnMut() -> Result<T, NotReady>,
    ) -> Result<T, ValidatorError> {
        let tries = Arc::new(AtomicUsize::new(0));
        let slept_ms = Arc::new(AtomicU64::new(0));
        let sleeper = {
            let (inner, slept_ms) = (self.sleeper.clone(), slept_ms.clone());
            move |d: Duration| {
                slept_ms.fetch_add(d.as_millis() as u64, Ordering::Relaxed);
                inner(d);
            }
        };
        let backoff = ConstantBuilder::default()
            .with_delay(self.interval)
            .with_max_times(self.attempts - 1);
        let counted = || {
            tries.fetch_add(1, Ordering::Relaxed);
            attempt()
        };
        let total = self.attempts;
        counted
            .retry(backoff)
            .sleep(sleeper)
            .notify(|e: &NotReady, d| {
                tracing::warn!(
                    step,
                    attempt = tries.load(Ordering::Relaxed),
                    of = total,
                    "waiting for {waiting_for}: {}; retrying in {d:?}",
                    chain(e)
                );
            })
            .call()
            .map_err(|last| ValidatorError::GaveUp {
                step,
                attempts: tries.load(Ordering::Relaxed),
                waited: Duration::from_millis(slept_ms.load(Ordering::Relaxed)),
                last: Box::new(last),
            })
    }
}

/// `e` and its causes joined with `: `.
#[must_use]
pub fn chain(e: &dyn std::error::Error) -> String {
    kiln_gpu::error_chain(e)
}
