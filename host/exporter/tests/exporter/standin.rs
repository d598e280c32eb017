//! A kubelet pod-resources stand-in over a Unix socket, built from the official proto: three
//! pods share GPU 0 (time-slicing replicas), one pod holds GPU 1; every `List` answers them in a
//! new pseudo-random order, like a real kubelet.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use kiln_exporter::podresources::proto::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
    pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
};
use tokio::{net::UnixListener, sync::oneshot, task::JoinHandle};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// (namespace, pod, container, device id) of every allocation the stand-in reports.
pub const PODS: [(&str, &str, &str, &str); 4] = [
    (
        "ml",
        "trainer-b",
        "main",
        "GPU-11111111-2222-3333-4444-555555555555::1",
    ),
    (
        "ml",
        "trainer-a",
        "main",
        "GPU-11111111-2222-3333-4444-555555555555::0",
    ),
    (
        "research",
        "notebook",
        "jupyter",
        "GPU-11111111-2222-3333-4444-555555555555::2",
    ),
    ("batch", "render", "worker", "nvidia1"),
];

struct Lister {
    calls: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let mut pods: Vec<PodResources> = PODS
            .iter()
            .map(|(ns, pod, ctr, id)| PodResources {
                name: (*pod).into(),
                namespace: (*ns).into(),
                containers: vec![ContainerResources {
                    name: (*ctr).into(),
                    devices: vec![ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: vec![(*id).into()],
                        topology: None,
                    }],
                    ..Default::default()
                }],
            })
            .collect();
        shuffle(&mut pods, n);
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: pods,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not used by the exporter"))
    }

    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not used by the exporter"))
    }
}

/// Fisher–Yates with a splitmix64 stream seeded by the call number and the clock.
fn shuffle<T>(v: &mut [T], call: u64) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let mut state = call.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(nanos);
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    for i in (1..v.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

/// A running stand-in; `stop` it to simulate a kubelet restart, `start` again on the same path.
pub struct StandIn {
    pub path: PathBuf,
    pub calls: Arc<AtomicU64>,
    stop: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl StandIn {
    pub async fn start(path: &Path) -> Self {
        let mut s = Self {
            path: path.to_owned(),
            calls: Arc::default(),
            stop: None,
        };
        s.restart().await;
        s
    }

    pub async fn restart(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let listener = UnixListener::bind(&self.path).expect("bind stand-in socket");
        let (tx, rx) = oneshot::channel();
        let svc = PodResourcesListerServer::new(Lister {
            calls: self.calls.clone(),
        });
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = rx.await;
                })
                .await
                .expect("stand-in serves");
        });
        self.stop = Some((tx, task));
    }

    /// Stops serving and removes the socket, as a restarting kubelet does.
    pub async fn stop(&mut self) {
        if let Some((tx, task)) = self.stop.take() {
            let _ = tx.send(());
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), task).await;
        }
        let _ = std::fs::remove_file(&self.path);
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}
