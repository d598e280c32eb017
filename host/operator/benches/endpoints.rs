//! The operator's `/metrics` port under abuse, as issue 40's hostile review loaded it: prints
//! the server's RSS and `/healthz` latency before, during and after each load. Not a test (no
//! assertion); figures in deploy/operator/README.md and host/exporter/README.md.
//!
//! The server runs in a child process (this binary with `--child`), as the operator serves it
//! (`kiln_operator::runtime()`, jemalloc, `metrics::router` with `--metrics-auth kubernetes`)
//! under a 1,024 file limit, against a fake API server that answers every TokenReview
//! "unauthenticated" after 2 ms and counts them. `--server plain` serves with `axum::serve` (what
//! the operator did before kiln_httpd), `--server hardened` (the default) with
//! `kiln_httpd::serve` and `Limits::DEFAULT`.
//!
//! Loads, from this process over 127.0.0.1: 2,000 distinct random tokens (50 at a time); 400
//! requests with 300 KB tokens (200 at a time); 4,000 slowloris clients (half a head, then a
//! header line a second, for 8 s); 1,030 idle connections held for 3 s.
//!
//! `cargo bench -p kiln-operator --bench endpoints [-- --server plain]`

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kiln_operator::metrics::{Metrics, MetricsAuthorizer, router};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

kiln_operator::global_allocator!();

/// The file limit the child runs under (the hostile review's).
const FILE_LIMIT: u32 = 1024;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let server = args
        .iter()
        .position(|a| a == "--server")
        .and_then(|i| args.get(i + 1))
        .map_or("hardened", String::as_str)
        .to_string();
    if args.iter().any(|a| a == "--child") {
        child(&server);
    } else {
        parent(&server);
    }
}

/// A kube client whose API server answers every review "unauthenticated" after 2 ms.
fn fake_api(reviews: Arc<AtomicUsize>) -> kube::Client {
    use http_body_util::{BodyExt as _, Full};
    let service = tower::service_fn(move |req: axum::http::Request<kube::client::Body>| {
        let reviews = reviews.clone();
        async move {
            reviews.fetch_add(1, Ordering::SeqCst);
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let mut review: serde_json::Value = serde_json::from_slice(&body).unwrap();
            review["status"] = serde_json::json!({"authenticated": false});
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok::<_, std::convert::Infallible>(
                axum::http::Response::builder()
                    .header("content-type", "application/json")
                    .body(Full::new(axum::body::Bytes::from(review.to_string())))
                    .unwrap(),
            )
        }
    });
    kube::Client::new(service, "default")
}

fn child(server: &str) {
    let runtime = kiln_operator::runtime().unwrap();
    runtime.block_on(async {
        let reviews = Arc::new(AtomicUsize::new(0));
        let app = router(
            Arc::new(Metrics::new()),
            Some(MetricsAuthorizer::new(fake_api(reviews.clone()))),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap().port());
        // Each line on stdin asks for the TokenReviews so far.
        std::thread::spawn(move || {
            for _ in std::io::stdin().lines() {
                println!("{}", reviews.load(Ordering::SeqCst));
            }
            std::process::exit(0);
        });
        match server {
            "plain" => axum::serve(listener, app).await.unwrap(),
            _ => {
                kiln_httpd::serve(
                    listener,
                    app,
                    kiln_httpd::Limits::DEFAULT,
                    std::future::pending(),
                )
                .await;
            }
        }
    });
}

struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
    port: u16,
}

impl Server {
    fn start(server: &str) -> Self {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -n {FILE_LIMIT} && exec \"$0\" --child --server {server}"
            ))
            .arg(exe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let port = line.trim().parse().unwrap();
        Server {
            child,
            stdin,
            stdout,
            port,
        }
    }

    fn reviews(&mut self) -> usize {
        writeln!(self.stdin).unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().parse().unwrap()
    }

    /// (RSS, peak RSS) in MiB.
    fn rss(&self) -> (f64, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib = |key: &str| -> f64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request on a new connection; the status code (0: no answer within 2 s or an error).
async fn request(port: u16, head: &str) -> u16 {
    let exchange = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let _ = s.write_all(head.as_bytes()).await;
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = s.read(&mut buf).await {
            out.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&out).into_owned();
        text.get(9..12)?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or(0)
}

fn metrics_head(token: &str) -> String {
    format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
}

/// 20 sequential `/healthz` probes: "median / max ms (failed)".
async fn healthz(port: u16) -> String {
    let mut took = Vec::new();
    let mut failed = 0;
    for _ in 0..20 {
        let start = Instant::now();
        let code = request(
            port,
            "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        took.push(start.elapsed().as_secs_f64() * 1000.0);
        if code != 200 {
            failed += 1;
        }
    }
    took.sort_by(f64::total_cmp);
    format!(
        "{:.1} / {:.1} ms ({failed}/20 failed)",
        took[took.len() / 2],
        took[took.len() - 1]
    )
}

/// `n` requests, `at_once` at a time; the answers' status codes counted.
async fn flood(port: u16, n: usize, at_once: usize, head: impl Fn(usize) -> String) -> String {
    let heads: Vec<String> = (0..n).map(head).collect();
    let mut codes = std::collections::BTreeMap::<u16, usize>::new();
    for chunk in heads.chunks(at_once) {
        let answers = futures::future::join_all(chunk.iter().map(|h| request(port, h))).await;
        for code in answers {
            *codes.entry(code).or_default() += 1;
        }
    }
    codes
        .iter()
        .map(|(c, n)| {
            format!(
                "{n}× {}",
                if *c == 0 {
                    "none".into()
                } else {
                    c.to_string()
                }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A token no other request used (`i`, then 128 bits of splitmix64 of it and the clock).
fn random_token(i: usize) -> String {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let a = mix(seed ^ i as u64);
    format!("{i}-{a:016x}{:016x}", mix(a))
}

/// Connects `n` clients, `at_once` at a time (a connect not done in 2 s is dropped).
async fn connect_many(port: u16, n: usize) -> Vec<TcpStream> {
    let mut all = Vec::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        let made = futures::future::join_all(chunk.iter().map(|_| {
            tokio::time::timeout(
                Duration::from_secs(2),
                TcpStream::connect(("127.0.0.1", port)),
            )
        }))
        .await;
        all.extend(made.into_iter().filter_map(|r| r.ok()?.ok()));
    }
    all
}

/// How many of `clients` the server has closed (a read returns at once with EOF or an error).
async fn closed(clients: &mut [TcpStream]) -> usize {
    let mut n = 0;
    for s in clients {
        let mut buf = [0u8; 1024];
        let probe = tokio::time::timeout(Duration::from_millis(1), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return true,
                    Ok(_) => {}
                }
            }
        });
        if probe.await.unwrap_or(false) {
            n += 1;
        }
    }
    n
}

fn row(server: &Server, phase: &str, load: &str, health: &str) {
    let (rss, peak) = server.rss();
    println!("| {phase} | {load} | {rss:.1} | {peak:.1} | {health} |");
}

fn parent(mode: &str) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut server = Server::start(mode);
        let port = server.port;
        println!(
            "server: {mode}; child file limit {FILE_LIMIT}\n\n\
             | phase | load answered | RSS MiB | peak MiB | /healthz median / max |\n|---|---|---|---|---|"
        );
        row(&server, "start", "–", &healthz(port).await);

        let answers = flood(port, 2000, 50, |i| metrics_head(&random_token(i))).await;
        let reviews = server.reviews();
        row(
            &server,
            "2,000 random tokens",
            &format!("{answers}; {reviews} TokenReviews"),
            &healthz(port).await,
        );

        let big = "t".repeat(300 * 1000);
        let answers = flood(port, 400, 200, |_| metrics_head(&big)).await;
        let reviews = server.reviews() - reviews;
        row(
            &server,
            "400 × 300 KB tokens",
            &format!("{answers}; {reviews} TokenReviews"),
            &healthz(port).await,
        );

        let mut slow = connect_many(port, 4000).await;
        let connected = slow.len();
        for s in &mut slow {
            let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").await;
        }
        let during = {
            let trickle = async {
                for _ in 0..8 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    for s in &mut slow {
                        let _ = s.write_all(b"X-a: b\r\n").await;
                    }
                }
            };
            let probe = async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                healthz(port).await
            };
            tokio::join!(trickle, probe).1
        };
        let shut = closed(&mut slow).await;
        row(
            &server,
            "4,000 slowloris, 8 s",
            &format!("{connected} connected; {shut} closed by the server after 8 s"),
            &during,
        );
        drop(slow);
        tokio::time::sleep(Duration::from_secs(1)).await;

        let mut idle = connect_many(port, 1030).await;
        let connected = idle.len();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let during = healthz(port).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let shut = closed(&mut idle).await;
        row(
            &server,
            "1,030 idle, 3 s",
            &format!("{connected} connected; {shut} closed by the server"),
            &during,
        );
        drop(idle);
        tokio::time::sleep(Duration::from_secs(2)).await;
        row(&server, "after", "–", &healthz(port).await);
    });
}
