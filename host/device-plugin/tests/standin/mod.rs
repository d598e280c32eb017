//! A kubelet stand-in built from the official device-plugin protos: it owns a device-plugins
//! directory with `kubelet.sock` serving `Registration`, records every `RegisterRequest`, dials
//! plugins on the endpoint they registered, and restarts like the kubelet does (delete every
//! socket in the directory, then recreate `kubelet.sock`).

#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use kiln_device_plugin::proto::{
    Empty, RegisterRequest,
    device_plugin_client::DevicePluginClient,
    registration_server::{Registration, RegistrationServer},
};
use tokio::{
    net::UnixListener,
    sync::{Mutex, mpsc, oneshot},
    task::JoinHandle,
};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status, transport::Channel};

/// Generous bound for anything the tests wait for (never asserted as a speed).
pub const WAIT: Duration = Duration::from_secs(60);

struct Reg {
    tx: mpsc::UnboundedSender<RegisterRequest>,
}

#[tonic::async_trait]
impl Registration for Reg {
    async fn register(&self, req: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = req.into_inner();
        if r.version != "v1beta1" {
            return Err(Status::invalid_argument("unsupported version"));
        }
        let _ = self.tx.send(r);
        Ok(Response::new(Empty {}))
    }
}

/// The stand-in.
pub struct Kubelet {
    /// The device-plugins directory.
    pub dir: PathBuf,
    rx: Arc<Mutex<mpsc::UnboundedReceiver<RegisterRequest>>>,
    tx: mpsc::UnboundedSender<RegisterRequest>,
    server: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl Kubelet {
    /// Starts serving `Registration` on `<dir>/kubelet.sock`.
    pub fn start(dir: &Path) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut k = Self {
            dir: dir.to_owned(),
            rx: Arc::new(Mutex::new(rx)),
            tx,
            server: None,
        };
        k.serve();
        k
    }

    /// `<dir>/kubelet.sock`.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("kubelet.sock")
    }

    fn serve(&mut self) {
        let _ = std::fs::remove_file(self.socket());
        let listener = UnixListener::bind(self.socket()).expect("bind kubelet.sock");
        let (stop, stopped) = oneshot::channel::<()>();
        let reg = Reg {
            tx: self.tx.clone(),
        };
        let join = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(reg))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .expect("stand-in server");
        });
        self.server = Some((stop, join));
    }

    /// Stops, deletes every socket in the directory (as the kubelet does when it starts), and
    /// serves again on a new `kubelet.sock`.
    pub async fn restart(&mut self) {
        if let Some((stop, join)) = self.server.take() {
            let _ = stop.send(());
            let _ = join.await;
        }
        for e in std::fs::read_dir(&self.dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "sock") {
                std::fs::remove_file(p).unwrap();
            }
        }
        self.serve();
    }

    /// The next `RegisterRequest`.
    pub async fn next_registration(&self) -> RegisterRequest {
        tokio::time::timeout(WAIT, self.rx.lock().await.recv())
            .await
            .expect("a registration within the wait bound")
            .expect("stand-in channel open")
    }

    /// A DevicePlugin client for a registered endpoint (a socket name in the directory).
    pub async fn client(&self, endpoint: &str) -> DevicePluginClient<Channel> {
        let uri = format!("unix://{}", self.dir.join(endpoint).display());
        let ch = tonic::transport::Endpoint::from_shared(uri)
            .unwrap()
            .connect()
            .await
            .expect("dial plugin socket");
        DevicePluginClient::new(ch)
    }
}
