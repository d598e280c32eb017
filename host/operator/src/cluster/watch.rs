//! How kiln's API clients watch: long-lived watches, with dead connections found by a read
//! timeout instead of by renewing every watch every few minutes.
//!
//! kube-runtime's default asks the API server to end each watch after 290 s and reconnects
//! then, so an operator at rest still sends one request per watch every 290 s (about 2.8 a
//! minute for the operator's 14 watches), and kube-runtime's only dead-connection check is the
//! same 290 s (+5 s). client-go's reflectors (NVIDIA's operator) renew every 5–10 minutes.
//!
//! kiln splits the two jobs:
//! - **Renewal**: each watch asks for [`WATCH_TIMEOUT_S`] (one hour). The API server honours
//!   any `timeoutSeconds` a client gives (`--min-request-timeout` only sets the default for
//!   watches that give none), so at rest a watch is renewed once an hour.
//! - **Liveness**: the API server sends a watch that allows bookmarks (kube-runtime's default)
//!   a `BOOKMARK` event about every minute, even when nothing changed (the watch cache's
//!   periodic bookmarks, Kubernetes ≥ 1.27). The client's socket read timeout,
//!   [`READ_TIMEOUT`] (295 s, about five missed bookmarks), therefore fails a connection that
//!   went silent — a dead peer, a dropped NAT entry, a stuck API server — within the same
//!   295 s kube-runtime gave before, and the watcher re-watches from its last resource version.
//!   The read timeout restarts on every write ([`kube::Config::reset_reader_on_write`]), so a
//!   pooled connection's idle time never counts against a request.
//!
//! Where an API server serves a watch without bookmarks (watch cache off), a quiet watch is
//! instead renewed by the read timeout every 295 s, as before.

use std::time::Duration;

use kiln_core::spec::ClusterPolicy;
use kube::api::ApiResource;
use kube::runtime::watcher;

/// Server-side lifetime of each watch kiln opens, in seconds (`timeoutSeconds`): 3,600, so an
/// idle watch is renewed once an hour. Long enough that a quiet cluster sees no requests from
/// kiln in any window shorter than that; short enough that watches still move between API
/// server replicas after a rolling restart or scale-out.
pub const WATCH_TIMEOUT_S: u32 = 3600;

/// Socket read timeout of kiln's API clients: 295 s without a byte on a connection that
/// awaits a response (a watch gets a bookmark about every 60 s) fails the request, and the
/// watcher reconnects.
pub const READ_TIMEOUT: Duration = Duration::from_secs(295);

/// How long a reconcile waits for the caches of labelled objects to list once; past it, the
/// reconcile goes on with what they hold (deleting less, never more).
pub const LIVE_READY_LIMIT: Duration = Duration::from_secs(30);

/// The ClusterPolicy's driver DaemonSet (assets/state-driver): the one DaemonSet whose pod
/// template the shared DaemonSet watch keeps ([`crate::cluster::live`]) and the driver upgrade rolls.
pub const DRIVER_DAEMONSET: &str = "nvidia-driver-daemonset";

/// The ClusterPolicy API resource (`nvidia.com/v1`, `clusterpolicies`). The controller
/// watches policies as [`kube::api::DynamicObject`]s: their exact JSON is what [`kiln_render::Policy`]
/// parses and checks (a typed copy serializes defaults the CRD's schema refuses), and a policy
/// the typed spec cannot hold still gets a status naming its fault.
pub fn policy_resource() -> ApiResource {
    ApiResource::erase::<ClusterPolicy>(&())
}

/// The base watcher configuration of every watch kiln opens (label and field selectors are
/// added by the caller): kube-runtime's defaults (bookmarks on, pages of 500) with a
/// [`WATCH_TIMEOUT_S`] timeout.
pub fn config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_TIMEOUT_S)
}

/// `cfg` with the read timeout ([`READ_TIMEOUT`], restarted on every write) that finds dead
/// watch connections; apply it to the configuration of every client that opens
/// [`config`] watches, before building the client.
pub fn tune_client(mut cfg: kube::Config) -> kube::Config {
    cfg.read_timeout = Some(READ_TIMEOUT);
    cfg.reset_reader_on_write = true;
    cfg
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use axum::extract::State;
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Node;
    use kube::runtime::{WatchStreamExt, watcher};

    use super::*;

    /// A fake API server for `/api/v1/nodes`: an empty list at resourceVersion 1, and watches
    /// whose body is silent (`bookmark_every` `None`) or a BOOKMARK every so often. Records
    /// each request's query string.
    async fn fake_apiserver(bookmark_every: Option<Duration>) -> (String, Arc<Mutex<Vec<String>>>) {
        type Seen = Arc<Mutex<Vec<String>>>;
        async fn nodes(
            State((seen, every)): State<(Seen, Option<Duration>)>,
            uri: axum::http::Uri,
        ) -> axum::response::Response {
            let query = uri.query().unwrap_or_default().to_string();
            let watch = query.split('&').any(|kv| kv == "watch=true");
            seen.lock().unwrap().push(query);
            if !watch {
                let list = r#"{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}"#;
                return axum::response::Response::new(axum::body::Body::from(list));
            }
            let bookmark = r#"{"type":"BOOKMARK","object":{"kind":"Node","apiVersion":"v1","metadata":{"resourceVersion":"1"}}}
"#;
            let body = futures::stream::unfold((), move |()| async move {
                match every {
                    Some(d) => {
                        tokio::time::sleep(d).await;
                        Some((Ok::<_, std::io::Error>(bookmark), ()))
                    }
                    None => futures::future::pending().await,
                }
            });
            axum::response::Response::new(axum::body::Body::from_stream(body))
        }
        let seen: Seen = Arc::default();
        let app = axum::Router::new()
            .route("/api/v1/nodes", axum::routing::get(nodes))
            .with_state((seen.clone(), bookmark_every));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, seen)
    }

    /// Runs kiln's node watch for 3.5 s against a [`fake_apiserver`] (`bookmark_every`), with
    /// the client's read timeout cut to 0.7 s (the only change to [`tune_client`]'s
    /// configuration); returns the watch requests' query strings and how many requests the
    /// server saw in all.
    async fn watch_requests(bookmark_every: Option<Duration>) -> (Vec<String>, usize) {
        let (url, seen) = fake_apiserver(bookmark_every).await;
        let mut cfg = tune_client(kube::Config::new(url.parse().unwrap()));
        cfg.read_timeout = Some(Duration::from_millis(700));
        let client = kube::Client::try_from(cfg).unwrap();
        let stream = watcher(kube::Api::<Node>::all(client), config()).default_backoff();
        let run = Duration::from_millis(3500);
        let _ = tokio::time::timeout(run, stream.for_each(|_| async {})).await;
        let seen = seen.lock().unwrap();
        let watches = seen.iter().filter(|q| q.contains("watch=true")).cloned();
        (watches.collect(), seen.len())
    }

    #[test]
    fn clients_get_the_read_timeout_that_restarts_on_writes() {
        let cfg = tune_client(kube::Config::new("http://127.0.0.1:1".parse().unwrap()));
        assert_eq!(cfg.read_timeout, Some(Duration::from_secs(295)));
        assert!(cfg.reset_reader_on_write);
        assert_eq!(config().timeout, Some(3600));
    }

    /// A connection that stops sending (no bookmarks) fails on the read timeout and the
    /// watcher watches again, long before the hour-long watch would end; the watches ask the
    /// server for `timeoutSeconds=3600` and bookmarks.
    #[tokio::test]
    async fn a_silent_watch_connection_is_dropped_and_watched_again() {
        let (w, _) = watch_requests(None).await;
        assert!(
            w.len() >= 2,
            "one watch only, the dead connection was kept: {w:?}"
        );
        for q in &w {
            assert!(q.contains("timeoutSeconds=3600"), "{q}");
            assert!(q.contains("allowWatchBookmarks=true"), "{q}");
        }
    }

    /// A watch the server keeps alive with bookmarks (as the API server does about every
    /// minute) is never renewed by the read timeout: one watch request in 5 read timeouts.
    #[tokio::test]
    async fn a_watch_kept_alive_by_bookmarks_is_not_renewed() {
        let (w, all) = watch_requests(Some(Duration::from_millis(200))).await;
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(all, 2, "one list, one watch");
    }
}
