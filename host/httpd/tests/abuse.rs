//! The server under abuse, over TCP on 127.0.0.1: oversized heads, slowloris, idle clients at
//! the connection cap, a stuck handler, a client that stops reading. Counts are bounded and no
//! assertion is about elapsed time: short limits make each case happen, and a generous outer
//! bound only turns a hang into a failure.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use kiln_httpd::{Limits, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long any one step may take before the test fails as hung.
const HUNG: Duration = Duration::from_secs(30);

/// A body far larger than loopback socket buffers hold.
const LARGE: usize = 64 << 20;

fn app() -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/hang", get(std::future::pending::<&'static str>))
        .route("/large", get(|| async { vec![b'x'; LARGE] }))
}

/// Serves [`app`] with `limits` on a free loopback port.
async fn start(limits: Limits) -> (Arc<Server>, u16) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = Arc::new(Server::new(limits));
    let serving = server.clone();
    tokio::spawn(async move {
        serving.serve(listener, app(), std::future::pending()).await;
    });
    (server, port)
}

async fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port)).await.unwrap()
}

/// Sends `request` on a new connection and reads until the server closes it.
async fn exchange(port: u16, request: &[u8]) -> String {
    let mut s = connect(port).await;
    s.write_all(request).await.unwrap();
    read_to_close(&mut s).await
}

/// Everything the server sends until it closes the connection (a reset ends it too).
async fn read_to_close(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(HUNG, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    });
    read.await.expect("the server closes the connection");
    String::from_utf8_lossy(&out).into_owned()
}

fn get_with_header(path: &str, header_bytes: usize) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        "t".repeat(header_bytes)
    )
    .into_bytes()
}

#[tokio::test]
async fn a_head_over_16_kib_is_answered_431_and_one_under_is_served() {
    let (_server, port) = start(Limits::DEFAULT).await;
    let big = exchange(port, &get_with_header("/healthz", 17 * 1024)).await;
    assert!(
        big.starts_with("HTTP/1.1 431 Request Header Fields Too Large"),
        "{big}"
    );
    let huge = exchange(port, &get_with_header("/healthz", 300 * 1024)).await;
    assert!(huge.starts_with("HTTP/1.1 431 "), "{huge}");
    let fits = exchange(port, &get_with_header("/healthz", 15 * 1024)).await;
    assert!(fits.starts_with("HTTP/1.1 200 OK"), "{fits}");
    assert!(fits.ends_with("ok"), "{fits}");
}

#[tokio::test]
async fn slowloris_connections_are_closed_after_the_header_timeout() {
    let limits = Limits {
        header_read_timeout: Duration::from_millis(200),
        ..Limits::DEFAULT
    };
    let (server, port) = start(limits).await;
    let mut clients = Vec::new();
    for i in 0..20 {
        let mut s = connect(port).await;
        if i % 2 == 0 {
            // Half a head, never finished; the other half sends nothing at all.
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: a")
                .await
                .unwrap();
        }
        clients.push(s);
    }
    for s in &mut clients {
        let answer = read_to_close(s).await;
        assert!(!answer.contains("200 OK"), "{answer}");
    }
    tokio::time::timeout(HUNG, async {
        while server.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("closed connections leave the registry");
    // A kept-alive connection waiting for its next request closes the same way.
    let mut s = connect(port).await;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let kept = read_to_close(&mut s).await;
    assert!(kept.starts_with("HTTP/1.1 200 OK"), "{kept}");
}

#[tokio::test]
async fn idle_clients_at_the_connection_cap_do_not_keep_healthz_out() {
    let limits = Limits {
        max_connections: 8,
        header_read_timeout: Duration::from_secs(600),
        idle_timeout: Duration::from_secs(600),
        ..Limits::DEFAULT
    };
    let (server, port) = start(limits).await;
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(connect(port).await);
    }
    for _ in 0..3 {
        let health = exchange(
            port,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(health.starts_with("HTTP/1.1 200 OK"), "{health}");
        // Accepts are in connection order: every idle client was accepted before the probe.
        assert!(
            server.open_connections() <= 8,
            "{}",
            server.open_connections()
        );
    }
    // The server shed the least recently active: the first 32 clients (accept order) at least.
    for s in &mut idle[..32] {
        assert_eq!(read_to_close(s).await, "");
    }
}

#[tokio::test]
async fn a_handler_past_the_request_timeout_is_answered_408() {
    let limits = Limits {
        request_timeout: Duration::from_millis(100),
        ..Limits::DEFAULT
    };
    let (server, port) = start(limits).await;
    let answer = exchange(
        port,
        b"GET /hang HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 408 Request Timeout"),
        "{answer}"
    );
    assert!(server.open_connections() <= 1);
}

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_after_the_idle_timeout() {
    let limits = Limits {
        idle_timeout: Duration::from_millis(200),
        ..Limits::DEFAULT
    };
    let (server, port) = start(limits).await;
    let mut s = connect(port).await;
    s.write_all(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // Read nothing until the server has given up on the connection.
    tokio::time::timeout(HUNG, async {
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if server.open_connections() == 0 {
                break;
            }
        }
    })
    .await
    .expect("the stalled connection is closed");
    let got = read_to_close(&mut s).await;
    assert!(
        got.starts_with("HTTP/1.1 200 OK"),
        "{}",
        &got[..got.len().min(200)]
    );
    assert!(got.len() < LARGE, "the whole body was sent: {}", got.len());
}
