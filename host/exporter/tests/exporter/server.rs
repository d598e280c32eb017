//! The real server path: flags parsed like the CLI's, `serve` on a TCP socket, HTTP/1.1 by hand.

use std::time::Duration;

use clap::Parser;
use kiln_exporter::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{fixture, parse, standin::StandIn};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    cfg: Config,
}

async fn get(port: u16, path: &str, accept: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let req =
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// Sends `request` and reads until the server closes (or resets) the connection.
async fn exchange(port: u16, request: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    // The server may answer and close before it has read the whole request.
    let _ = s.write_all(request.as_bytes()).await;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = s.read(&mut buf).await {
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_metrics_and_health_over_tcp_with_flags_from_env_and_args() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = StandIn::start(&dir.path().join("kubelet.sock")).await;
    let backend = format!("fake:{}", fixture().display());
    let socket = kubelet.path.display().to_string();
    let cli = Cli::try_parse_from([
        "kiln-exporter",
        "--gpu-backend",
        &backend,
        "-k",
        "--pod-resources-kubelet-socket",
        &socket,
        "--pod-resources-interval",
        "100",
        "--node-name",
        "node-z",
        "-c",
        "200",
    ])
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(kiln_exporter::serve(cli.cfg, listener, async {
        let _ = rx.await;
    }));

    let health = get(port, "/health", "*/*").await;
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("OK"),
        "{health}"
    );
    // kiln_httpd's head cap: over 16 KiB is answered 431, before any handler.
    let oversized = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\nConnection: close\r\n\r\n",
        "p".repeat(17 * 1024)
    );
    let refused = exchange(port, &oversized).await;
    assert!(refused.starts_with("HTTP/1.1 431 "), "{refused}");
    let mut text = String::new();
    for _ in 0..100 {
        text = get(port, "/metrics", "text/plain").await;
        if text.contains("pod=\"trainer-a\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        text.contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
        "{text}"
    );
    let body = text.split_once("\r\n\r\n").unwrap().1;
    let scrape = parse(body);
    let temp = scrape
        .samples
        .iter()
        .find(|s| s.metric == "DCGM_FI_DEV_GPU_TEMP")
        .unwrap();
    assert_eq!(temp.labels.get("hostname"), Some("node-z"));
    assert_eq!(temp.labels.get("pod"), Some("trainer-a"));
    let om = get(
        port,
        "/metrics",
        "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;q=0.3",
    )
    .await;
    assert!(
        om.contains("content-type: application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(om.ends_with("# EOF\n"));

    tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[test]
fn every_flag_has_a_kiln_exporter_env_var_and_defaults_match_the_readme() {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let mut flags = 0;
    for arg in cmd
        .get_arguments()
        .filter(|a| a.get_long().is_some_and(|l| l != "help"))
    {
        let env = arg
            .get_env()
            .unwrap_or_else(|| panic!("--{} has no env var", arg.get_long().unwrap()));
        // dcgm-exporter's names where the ClusterPolicy's transform sets them as they are.
        let upstream = [
            "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS",
            "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID",
            "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX",
        ];
        let env = env.to_str().unwrap();
        assert!(
            env.starts_with("KILN_EXPORTER_") || upstream.contains(&env),
            "{env:?}"
        );
        flags += 1;
    }
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for arg in cmd
        .get_arguments()
        .filter(|a| a.get_long().is_some_and(|l| l != "help"))
    {
        let env = arg.get_env().unwrap().to_str().unwrap();
        assert!(readme.contains(&format!("`{env}`")), "README lacks {env}");
    }
    assert_eq!(flags, 19);
    let cli = Cli::try_parse_from(["kiln-exporter"]).unwrap();
    assert_eq!(cli.cfg.listen_addr().unwrap().port(), 9400);
    assert_eq!(cli.cfg.collect_interval, 30_000);
    assert_eq!(cli.cfg.pod_resources_interval, 10_000);
}
