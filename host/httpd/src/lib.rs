//! The HTTP/1.1 server behind kiln's `/metrics` and health endpoints: the operator's
//! (`kiln_operator::metrics::router`) and the exporter's (`kiln_exporter::server::router`).
//!
//! `axum::serve` sets no header-size cap, no header-read, request or idle timeout and no
//! connection cap, so a client without credentials could hold the process' file descriptors
//! and memory (idle connections up to the file limit, 300 KB headers, headers sent a byte at
//! a time). [`serve`] runs the same [`Router`] on hyper's HTTP/1.1 connection builder with
//! [`Limits`]:
//!
//! - a request head (request line and headers) larger than [`Limits::max_header_bytes`]
//!   (16 KiB) is answered `431 Request Header Fields Too Large` by hyper and the connection is
//!   closed, before any handler (or authorization check) sees the request;
//! - a head not complete within [`Limits::header_read_timeout`] of the connection opening, or
//!   of the previous response on a kept-alive connection, closes the connection (slowloris);
//!   the same timer bounds how long a kept-alive connection waits idle for its next request;
//! - a handler that has not answered within [`Limits::request_timeout`] is answered
//!   `408 Request Timeout` (tower-http's `TimeoutLayer`);
//! - a connection that moves no byte in either direction for [`Limits::idle_timeout`] while
//!   no handler runs for it (say a client that stops reading its response) is closed;
//! - at most [`Limits::max_connections`] connections are open: a new one beyond the cap closes
//!   the least recently active connection that has no request in a handler (idle, or still
//!   sending its head), so a kubelet probe or a scrape always gets in while the cap is held by
//!   idle clients; it is refused only while every open connection has a request in a handler,
//!   which [`Limits::request_timeout`] bounds. An `accept` failing for want of file descriptors
//!   closes such a connection too, then retries.
//!
//! HTTP/2 is not offered (Prometheus and the kubelet speak HTTP/1.1 to these ports).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::http::{Request, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt as _;
use tower_http::timeout::TimeoutLayer;

/// What one server allows a client ([`serve`]); [`Limits::DEFAULT`] is what the operator and
/// the exporter run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes of a request head (request line and headers); larger is answered 431.
    pub max_header_bytes: usize,
    /// Longest wait for a complete request head, from the connection's accept or the end of
    /// its previous response; then the connection is closed.
    pub header_read_timeout: Duration,
    /// Longest a handler may take; then the request is answered 408.
    pub request_timeout: Duration,
    /// Longest a connection may move no byte while no handler runs for it; then it is closed.
    pub idle_timeout: Duration,
    /// Most connections open at once (at least 1).
    pub max_connections: usize,
}

impl Limits {
    /// 16 KiB heads; 5 s to send a head (and to wait between requests on a kept-alive
    /// connection: Prometheus' Go client retries a GET whose reused connection the server
    /// closed, the kubelet's probes do not keep connections alive); 10 s per handler (the
    /// kubelet's and Prometheus' own timeouts are shorter); 30 s without progress; 128
    /// connections (an eighth of the common 1,024 file limit).
    pub const DEFAULT: Limits = Limits {
        max_header_bytes: 16 * 1024,
        header_read_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(30),
        max_connections: 128,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// Pause after an `accept` error that is not about one connection (out of file descriptors,
/// memory), so the loop does not spin while the cause lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// One server's open connections; [`Server::serve`] runs it.
pub struct Server {
    limits: Limits,
    registry: Arc<Registry>,
}

impl Server {
    /// A server holding to `limits` (a `max_connections` of 0 is taken as 1).
    pub fn new(limits: Limits) -> Self {
        Server {
            limits: Limits {
                max_connections: limits.max_connections.max(1),
                ..limits
            },
            registry: Arc::new(Registry::new()),
        }
    }

    /// Connections open now (accepted and not yet closed; at most
    /// [`Limits::max_connections`]).
    pub fn open_connections(&self) -> usize {
        self.registry.lock().len()
    }

    /// Serve `app` on `listener` until `shutdown` completes; then stop accepting, let
    /// requests in handlers finish (kept-alive connections are closed after their response),
    /// and return after at most [`Limits::request_timeout`] more, closing what is left.
    pub async fn serve(
        &self,
        listener: TcpListener,
        app: Router,
        shutdown: impl Future<Output = ()> + Send,
    ) {
        let app = app.layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            self.limits.request_timeout,
        ));
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_read_timeout)
            .max_header_size(self.limits.max_header_bytes)
            .keep_alive(true);
        let http = Arc::new(http);
        let (stop, stopped) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            while tasks.try_join_next().is_some() {}
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) if is_connection_error(&e) => continue,
                    Err(e) => {
                        // Most likely out of file descriptors: free one held by an idle client.
                        tracing::debug!(error = %e, "accept failed");
                        self.registry.evict_idlest();
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let Some(conn) = self.registry.admit(self.limits.max_connections) else {
                tracing::debug!("every connection has a request in a handler: refused one");
                continue;
            };
            let _ = stream.set_nodelay(true);
            tasks.spawn(connection(
                http.clone(),
                stream,
                conn,
                self.registry.clone(),
                app.clone(),
                self.limits.idle_timeout,
                stopped.clone(),
            ));
        }
        drop(listener);
        let _ = stop.send(true);
        let drained = async { while tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(self.limits.request_timeout, drained)
            .await
            .is_err()
        {
            tracing::debug!("closing connections still open after the shutdown grace");
        }
    }
}

/// Serve `app` on `listener` with `limits` until `shutdown` completes ([`Server::serve`]).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) {
    Server::new(limits).serve(listener, app, shutdown).await;
}

/// `accept` errors about the one connection being accepted (the peer went away first).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// One open connection as the cap and the idle timeout see it.
struct Conn {
    id: u64,
    /// Milliseconds from [`Registry::epoch`] to the last byte read or written, the accept, or
    /// the end of the last handler.
    last_active: AtomicU64,
    /// Requests of this connection in a handler now.
    busy: AtomicUsize,
    /// Closes the connection (it was shed for a newer one).
    evict: Notify,
}

struct Registry {
    epoch: Instant,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl Registry {
    fn new() -> Self {
        Registry {
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            conns: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self, conn: &Conn) {
        conn.last_active.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Registers a new connection, first closing the least recently active one with no request
    /// in a handler when `cap` are open; `None` (refuse it) when every open one has.
    fn admit(&self, cap: usize) -> Option<Arc<Conn>> {
        let mut conns = self.lock();
        if conns.len() >= cap && !Self::evict_from(&mut conns) {
            return None;
        }
        let conn = Arc::new(Conn {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            last_active: AtomicU64::new(self.now_ms()),
            busy: AtomicUsize::new(0),
            evict: Notify::new(),
        });
        conns.insert(conn.id, conn.clone());
        Some(conn)
    }

    /// Closes the least recently active connection with no request in a handler, if any.
    fn evict_idlest(&self) {
        Self::evict_from(&mut self.lock());
    }

    fn evict_from(conns: &mut HashMap<u64, Arc<Conn>>) -> bool {
        let victim = conns
            .values()
            .filter(|c| c.busy.load(Ordering::Relaxed) == 0)
            .min_by_key(|c| (c.last_active.load(Ordering::Relaxed), c.id))
            .map(|c| c.id);
        match victim.and_then(|id| conns.remove(&id)) {
            Some(conn) => {
                conn.evict.notify_one();
                true
            }
            None => false,
        }
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }
}

/// Marks a connection busy while one of its requests is in a handler.
struct Busy {
    conn: Arc<Conn>,
    registry: Arc<Registry>,
}

impl Busy {
    fn enter(conn: &Arc<Conn>, registry: &Arc<Registry>) -> Self {
        conn.busy.fetch_add(1, Ordering::Relaxed);
        Busy {
            conn: conn.clone(),
            registry: registry.clone(),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.registry.touch(&self.conn);
        self.conn.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A TCP stream that records when it last moved a byte.
struct Watched {
    stream: TcpStream,
    conn: Arc<Conn>,
    registry: Arc<Registry>,
}

impl Watched {
    fn progressed<T>(&self, result: &Poll<io::Result<T>>, moved: bool) {
        if moved && matches!(result, Poll::Ready(Ok(_))) {
            self.registry.touch(&self.conn);
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.stream).poll_read(cx, buf);
        self.progressed(&result, buf.filled().len() > before);
        result
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.progressed(&result, matches!(result, Poll::Ready(Ok(n)) if n > 0));
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.progressed(&result, matches!(result, Poll::Ready(Ok(n)) if n > 0));
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Serves one connection until it ends, is shed ([`Registry::admit`]), stays idle past
/// `idle`, or the server stops (then after its request in flight, if any).
async fn connection(
    http: Arc<http1::Builder>,
    stream: TcpStream,
    conn: Arc<Conn>,
    registry: Arc<Registry>,
    app: Router,
    idle: Duration,
    mut stopped: watch::Receiver<bool>,
) {
    let io = TokioIo::new(Watched {
        stream,
        conn: conn.clone(),
        registry: registry.clone(),
    });
    let (handler_conn, handler_registry) = (conn.clone(), registry.clone());
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let busy = Busy::enter(&handler_conn, &handler_registry);
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await;
            drop(busy);
            response
        }
    });
    let served = http.serve_connection(io, service);
    let mut served = std::pin::pin!(served);
    let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
    let mut draining = false;
    loop {
        let deadline = if conn.busy.load(Ordering::Relaxed) > 0 {
            // A handler runs: the request timeout bounds it; look again after `idle`.
            Instant::now() + idle
        } else {
            registry.epoch + Duration::from_millis(conn.last_active.load(Ordering::Relaxed)) + idle
        };
        tokio::select! {
            result = served.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended");
                }
                break;
            }
            () = conn.evict.notified() => {
                tracing::debug!("connection shed at the connection cap");
                break;
            }
            _ = stopped.changed(), if !draining => {
                draining = true;
                served.as_mut().graceful_shutdown();
            }
            () = tokio::time::sleep_until(deadline) => {
                let quiet = registry
                    .now_ms()
                    .saturating_sub(conn.last_active.load(Ordering::Relaxed));
                if conn.busy.load(Ordering::Relaxed) == 0 && quiet >= idle_ms {
                    tracing::debug!("connection idle past the idle timeout");
                    break;
                }
            }
        }
    }
    registry.remove(conn.id);
}
