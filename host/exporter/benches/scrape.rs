//! Scrape latency and memory with 8 fake GPUs × 64 pods (8 time-sliced pods per GPU).
//!
//! Run: `cargo bench -p kiln-exporter --bench scrape`. Prints p50/p99 of a full `/metrics`
//! request through the axum router (in-process, no socket) for three cases — the steady state
//! (body cached between polls), a fresh render on every scrape (a new sample each time, the
//! worst case), and `--kubernetes-virtual-gpus` fresh renders — then the whole exporter
//! (`serve`, poller, pod-resources refresher) over TCP, and the process's RSS after each stage.
//! Targets from the issue: p99 ≤ 2 ms, RSS ≤ 20 MiB.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{body::Body, http::Request};
use http_body_util::BodyExt;
use kiln_exporter::{
    attribution::Allocation, catalogue::Catalogue, poller::collect, render::RenderOptions,
    server::router, snapshot::Snapshot, state::Shared,
};
use kiln_gpu::{DeviceSample, FakeBackend, Fixture, FixtureGpu};
use tower::ServiceExt;

const GPUS: usize = 8;
const PODS: usize = 64;
/// Scrapes per case: `KILN_BENCH_SCRAPES` (default 5,000; fewer for paired rounds on a loaded
/// machine or in a dev build).
fn scrapes() -> usize {
    std::env::var("KILN_BENCH_SCRAPES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(5_000)
}

fn fixture() -> Fixture {
    let sample = DeviceSample {
        sm_clock_mhz: Some(1980),
        mem_clock_mhz: Some(2619),
        gpu_temp_c: Some(41),
        power_usage_mw: Some(72345),
        total_energy_mj: Some(123_456_789),
        pcie_replay_count: Some(0),
        gpu_util_pct: Some(87),
        mem_copy_util_pct: Some(35),
        enc_util_pct: Some(0),
        dec_util_pct: Some(0),
        fb_free_bytes: Some(42_949_672_960),
        fb_used_bytes: Some(40_802_189_312),
        fb_reserved_bytes: Some(570_425_344),
        pcie_tx_kib_per_s: Some(1200),
        pcie_rx_kib_per_s: Some(3400),
        ..DeviceSample::default()
    };
    // `KILN_BENCH_ALL_READINGS=1`: also the readings the default list gained with issue 36
    // (memory temperature, NVLink bandwidth, row remapping, GPM ratios): 24 families, not 16.
    let sample = if std::env::var_os("KILN_BENCH_ALL_READINGS").is_some() {
        DeviceSample {
            memory_temp_c: Some(48),
            nvlink_bandwidth_total: Some(9_876_543_210),
            remapped_rows_correctable: Some(1),
            remapped_rows_uncorrectable: Some(0),
            row_remap_failure: Some(0),
            gr_engine_active: Some(0.912),
            tensor_active: Some(0.652),
            dram_active: Some(0.389),
            ..sample
        }
    } else {
        sample
    };
    let gpus = (0..GPUS)
        .map(|i| FixtureGpu {
            uuid: format!("GPU-{i:08x}-2222-3333-4444-555555555555"),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: None,
            memory_total_mib: 81559,
            compute_capability: "9.0".into(),
            numa_node: None,
            nvlinks: Vec::new(),
            info: Default::default(),
            clique: None,
            vgpu: None,
            mig_enabled: None,
            mig_devices: Vec::new(),
            sample: sample.clone(),
            mig_samples: Default::default(),
            processes: Vec::new(),
            mig_processes: Default::default(),
            xid_events: Vec::new(),
        })
        .collect();
    Fixture {
        driver_version: "550.144.03".into(),
        cuda_version: "12.4".into(),
        nvml_version: None,
        driver_version_changes: Vec::new(),
        gpus,
    }
}

fn allocations() -> Vec<Allocation> {
    (0..PODS)
        .map(|p| Allocation {
            namespace: format!("team-{}", p % 5),
            pod: format!("job-{p:03}-7f9c8d6b5-x2x4z"),
            container: "main".into(),
            resource_name: "nvidia.com/gpu".into(),
            device_ids: vec![format!(
                "GPU-{:08x}-2222-3333-4444-555555555555::{}",
                p % GPUS,
                p / GPUS
            )],
        })
        .collect()
}

async fn scrape(shared: &Arc<Shared>) -> usize {
    let req = Request::get("/metrics").body(Body::empty()).unwrap();
    let resp = router(shared.clone()).oneshot(req).await.unwrap();
    resp.into_body().collect().await.unwrap().to_bytes().len()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn measure(name: &str, per_pod: bool, fresh: bool) {
    let inv = FakeBackend::new(fixture());
    let opts = RenderOptions {
        hostname: Some("node-a".into()),
        per_pod,
        ..Default::default()
    };
    let shared = Arc::new(Shared::new(Catalogue::default_list(), opts, Vec::new()));
    let (mut snap, _) = collect(&inv, &Snapshot::default(), None);
    shared.set_snapshot(snap.clone());
    shared.set_allocations(allocations());
    let bytes = scrape(&shared).await;
    let scrapes = scrapes();
    let mut times = Vec::with_capacity(scrapes);
    let cpu_before = thread_cpu_ns();
    for _ in 0..scrapes {
        if fresh {
            snap.generation += 1;
            shared.set_snapshot(snap.clone());
        }
        let t = Instant::now();
        std::hint::black_box(scrape(&shared).await);
        times.push(t.elapsed());
    }
    // CPU time this thread spent per scrape (scrapes run on it: `oneshot` spawns nothing), so
    // a figure that time-sharing with other processes does not inflate; it includes the
    // untimed snapshot swap of the fresh cases.
    let cpu_ms = (thread_cpu_ns() - cpu_before) as f64 / scrapes as f64 / 1e6;
    times.sort_unstable();
    println!(
        "{name:<34} body {:>6} B  p50 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms  cpu/scrape {:>6.3} ms",
        bytes,
        percentile(&times, 0.50).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3,
        times.last().unwrap().as_secs_f64() * 1e3,
        cpu_ms,
    );
}

/// Nanoseconds the calling thread has run on a CPU (`/proc/thread-self/schedstat`, field 1).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "kiln-exporter scrape bench: {GPUS} fake GPUs x {PODS} pods, {} scrapes per case",
        scrapes()
    );
    rt.block_on(async {
        measure("steady (cached between polls)", false, false).await;
        measure("fresh render every scrape", false, true).await;
        measure("fresh, --kubernetes-virtual-gpus", true, true).await;
    });
    println!(
        "RSS after the in-process cases: {:.1} MiB",
        rss_kib() as f64 / 1024.0
    );
    rt.block_on(tcp::measure());
    println!(
        "RSS after the TCP case: {:.1} MiB",
        rss_kib() as f64 / 1024.0
    );
}

/// The whole exporter as `kiln exporter` runs it — `serve` with `--kubernetes`, a 1 s poll and a
/// 1 s pod-resources refresh against a stand-in kubelet reporting the 64 pods — scraped over
/// TCP with HTTP/1.1 keep-alive.
mod tcp {
    use std::time::{Duration, Instant};

    use kiln_exporter::podresources::proto::{
        AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
        ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse,
        ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
        pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
    };
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tonic::{Request, Response, Status};

    use super::{GPUS, allocations, percentile, scrapes};

    struct Kubelet;

    #[tonic::async_trait]
    impl PodResourcesLister for Kubelet {
        async fn list(
            &self,
            _: Request<ListPodResourcesRequest>,
        ) -> Result<Response<ListPodResourcesResponse>, Status> {
            let pod_resources = allocations()
                .into_iter()
                .map(|a| PodResources {
                    name: a.pod,
                    namespace: a.namespace,
                    containers: vec![ContainerResources {
                        name: a.container,
                        devices: vec![ContainerDevices {
                            resource_name: a.resource_name,
                            device_ids: a.device_ids,
                            topology: None,
                        }],
                        ..Default::default()
                    }],
                })
                .collect();
            Ok(Response::new(ListPodResourcesResponse { pod_resources }))
        }
        async fn get_allocatable_resources(
            &self,
            _: Request<AllocatableResourcesRequest>,
        ) -> Result<Response<AllocatableResourcesResponse>, Status> {
            Err(Status::unimplemented(""))
        }
        async fn get(
            &self,
            _: Request<GetPodResourcesRequest>,
        ) -> Result<Response<GetPodResourcesResponse>, Status> {
            Err(Status::unimplemented(""))
        }
    }

    fn fixture_yaml() -> String {
        let sample = "{sm_clock_mhz: 1980, mem_clock_mhz: 2619, gpu_temp_c: 41, power_usage_mw: 72345, \
                      total_energy_mj: 123456789, pcie_replay_count: 0, gpu_util_pct: 87, mem_copy_util_pct: 35, \
                      enc_util_pct: 0, dec_util_pct: 0, fb_free_bytes: 42949672960, fb_used_bytes: 40802189312, \
                      fb_reserved_bytes: 570425344, pcie_tx_kib_per_s: 1200, pcie_rx_kib_per_s: 3400}";
        let mut y = String::from("driver_version: \"550.144.03\"\ncuda_version: \"12.4\"\ngpus:\n");
        for i in 0..GPUS {
            y.push_str(&format!(
                "  - {{uuid: GPU-{i:08x}-2222-3333-4444-555555555555, name: NVIDIA H100 80GB HBM3, \
                 memory_total_mib: 81559, compute_capability: \"9.0\", sample: {sample}}}\n"
            ));
        }
        y
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        cfg: kiln_exporter::Config,
    }

    pub async fn measure() {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let fixture = dir.path().join("gpus.yaml");
        std::fs::write(&fixture, fixture_yaml()).unwrap();
        let sock = dir.path().join("kubelet.sock");
        let uds = tokio::net::UnixListener::bind(&sock).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(Kubelet))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(uds)),
        );
        let backend = format!("fake:{}", fixture.display());
        let sock_arg = sock.display().to_string();
        let args = [
            "x",
            "--gpu-backend",
            &backend,
            "-k",
            "--pod-resources-kubelet-socket",
            &sock_arg,
        ];
        let mut cli = Cli::parse_from(args);
        cli.cfg.collect_interval = 1000;
        cli.cfg.pod_resources_interval = 1000;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(kiln_exporter::serve(
            cli.cfg,
            listener,
            std::future::pending(),
        ));

        let mut conn = BufReader::new(
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap(),
        );
        let mut body = Vec::new();
        // Wait for the pod labels (the first List after start-up).
        let start = Instant::now();
        while !String::from_utf8_lossy(&body).contains("pod=\"")
            && start.elapsed() < Duration::from_secs(10)
        {
            scrape(&mut conn, &mut body).await;
        }
        let scrapes = scrapes();
        let mut times = Vec::with_capacity(scrapes);
        for _ in 0..scrapes {
            let t = Instant::now();
            scrape(&mut conn, &mut body).await;
            times.push(t.elapsed());
        }
        times.sort_unstable();
        println!(
            "{:<34} body {:>6} B  p50 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms",
            "TCP: serve() + kubelet stand-in",
            body.len(),
            percentile(&times, 0.50).as_secs_f64() * 1e3,
            percentile(&times, 0.99).as_secs_f64() * 1e3,
            times.last().unwrap().as_secs_f64() * 1e3,
        );
    }

    async fn scrape(conn: &mut BufReader<tokio::net::TcpStream>, body: &mut Vec<u8>) {
        conn.get_mut()
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut len = 0;
        loop {
            let mut line = String::new();
            conn.read_line(&mut line).await.unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        body.resize(len, 0);
        conn.read_exact(body).await.unwrap();
    }
}
