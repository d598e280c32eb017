//! Events through kube's [`Recorder`], with its series cache dropped once it can no longer
//! matter.
//!
//! kube's `Recorder` keeps every Event it published for six minutes, so that the same Event
//! published again becomes a series (one object, a count) instead of a new object. It forgets
//! old entries only when something is published: after a rollout at 5,000 GPU nodes (one
//! `GPUNodeReady` Event a node) an operator at rest kept 5,000 Events in memory for good.
//! [`Events`] hands out the `Recorder` and replaces it with a fresh one (an empty cache) once
//! [`SERIES_WINDOW`] has passed since the last publish: every entry of the old cache has
//! expired by then, so no series is lost. [`Events::run_renewal`] checks every minute; it makes
//! no requests. Events that never repeat (`GPUNodeReady`) skip the cache altogether
//! ([`Events::publish_once`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Recorder, Reporter};
use tokio::time::Instant;

/// How long kube's `Recorder` keeps a published Event for series (its private `CACHE_TTL`, six
/// minutes in kube-runtime 5).
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// How often [`Events::run_renewal`] looks.
pub const RENEW_CHECK_EVERY: Duration = Duration::from_secs(60);

/// kube's Event [`Recorder`] for one reporter (`kiln`, this replica), renewed when idle (see
/// the module docs). Cheap to clone: clones share the recorder.
#[derive(Clone)]
pub struct Events {
    client: Client,
    reporter: Reporter,
    current: Arc<Mutex<Current>>,
}

struct Current {
    recorder: Recorder,
    /// When the last publish started; `None` while the recorder is fresh.
    last_publish: Option<Instant>,
}

impl Events {
    /// Events published by `reporter` through `client`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Events {
            current: Arc::new(Mutex::new(Current {
                recorder: Recorder::new(client.clone(), reporter.clone()),
                last_publish: None,
            })),
            client,
            reporter,
        }
    }

    /// Publish `ev` about `reference` (kube's [`Recorder::publish`]: a new Event, or a series
    /// patch of one published within [`SERIES_WINDOW`]).
    ///
    /// # Errors
    /// The API server's refusal, as kube reports it.
    pub async fn publish(
        &self,
        ev: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let recorder = {
            let mut c = self.current.lock().expect("events lock");
            c.last_publish = Some(Instant::now());
            c.recorder.clone()
        };
        recorder.publish(ev, reference).await
    }

    /// Publish `ev` about `reference` as a one-off: through a recorder of its own, so kube's
    /// series cache does not keep it. For an Event that does not repeat within
    /// [`SERIES_WINDOW`], such as a node's `GPUNodeReady` (one a node): through the shared
    /// recorder a 5,000-node rollout's 5,000 of them stayed in memory for six minutes (about
    /// 3 MB, and the heap they were scattered through stayed with the process after). A repeat
    /// is a new Event, not a series.
    ///
    /// # Errors
    /// The API server's refusal, as kube reports it.
    pub async fn publish_once(
        &self,
        ev: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        Recorder::new(self.client.clone(), self.reporter.clone())
            .publish(ev, reference)
            .await
    }

    /// Replace the recorder with a fresh one when nothing was published for
    /// [`SERIES_WINDOW`] before `now`; returns whether it did.
    pub fn renew_if_idle(&self, now: Instant) -> bool {
        let mut c = self.current.lock().expect("events lock");
        match c.last_publish {
            Some(t) if now.saturating_duration_since(t) >= SERIES_WINDOW => {
                c.recorder = Recorder::new(self.client.clone(), self.reporter.clone());
                c.last_publish = None;
                true
            }
            _ => false,
        }
    }

    /// [`Events::renew_if_idle`] every [`RENEW_CHECK_EVERY`], forever (run it as a task).
    pub async fn run_renewal(self) {
        let mut tick = tokio::time::interval(RENEW_CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.renew_if_idle(Instant::now()) {
                tracing::debug!("event series cache dropped (idle for {SERIES_WINDOW:?})");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use axum::http::Method;
    use kube::runtime::events::EventType;

    use super::*;

    /// A fake API server for Events: answers every create and patch with the body it got;
    /// counts creates (POST) and series patches (PATCH).
    async fn events_server() -> (Client, Arc<AtomicU64>, Arc<AtomicU64>) {
        let (creates, patches) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (c, p) = (creates.clone(), patches.clone());
        let app = axum::Router::new().fallback(move |method: Method, body: String| {
            let (c, p) = (c.clone(), p.clone());
            async move {
                match method {
                    Method::POST => c.fetch_add(1, Ordering::SeqCst),
                    _ => p.fetch_add(1, Ordering::SeqCst),
                };
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    body,
                )
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        (client, creates, patches)
    }

    /// [`Events`] of reporter `kiln` (instance `test`) over [`events_server`], and a reading
    /// of the server's (creates, series patches).
    async fn recorder() -> (Events, impl Fn() -> (u64, u64)) {
        let (client, creates, patches) = events_server().await;
        let events = Events::new(
            client,
            Reporter {
                controller: "kiln".into(),
                instance: Some("test".into()),
            },
        );
        let counts = move || {
            (
                creates.load(Ordering::SeqCst),
                patches.load(Ordering::SeqCst),
            )
        };
        (events, counts)
    }

    fn node_ready() -> (Event, ObjectReference) {
        let ev = Event {
            type_: EventType::Normal,
            reason: "GPUNodeReady".into(),
            note: Some("every operand is ready".into()),
            action: "Validate".into(),
            secondary: None,
        };
        let node = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some("gpu-node-1".into()),
            ..ObjectReference::default()
        };
        (ev, node)
    }

    /// Within the series window a repeat is a series patch; once the recorder was renewed after
    /// the window, the same Event is created anew (the old cache is gone), and a recorder that
    /// was published to recently, or never, is kept.
    #[tokio::test]
    async fn an_idle_recorder_is_renewed_and_its_series_cache_dropped() {
        let (events, counts) = recorder().await;
        assert!(
            !events.renew_if_idle(Instant::now()),
            "nothing published yet"
        );
        let (ev, node) = node_ready();
        events.publish(&ev, &node).await.unwrap();
        events.publish(&ev, &node).await.unwrap();
        assert_eq!(counts(), (1, 1));
        let now = Instant::now();
        assert!(!events.renew_if_idle(now + SERIES_WINDOW - Duration::from_secs(5)));
        assert!(events.renew_if_idle(now + SERIES_WINDOW));
        assert!(
            !events.renew_if_idle(now + SERIES_WINDOW * 2),
            "already fresh"
        );
        events.publish(&ev, &node).await.unwrap();
        assert_eq!(counts(), (2, 1));
    }

    /// A one-off Event is created each time, never patched into a series, and leaves the
    /// shared recorder (and when it is renewed) alone.
    #[tokio::test]
    async fn a_one_off_event_is_not_kept_for_series() {
        let (events, counts) = recorder().await;
        let (ev, node) = node_ready();
        events.publish_once(&ev, &node).await.unwrap();
        events.publish_once(&ev, &node).await.unwrap();
        assert_eq!(counts(), (2, 0));
        assert!(
            !events.renew_if_idle(Instant::now() + SERIES_WINDOW),
            "the shared recorder was not published to"
        );
    }
}
