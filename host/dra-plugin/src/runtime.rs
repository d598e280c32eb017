//! The plugin's life: open the GPUs, read the checkpoint, serve the sockets, publish the
//! slice, and on every health interval poll XIDs (kiln's device-plugin tracker) and the driver
//! version. A GPU with a critical XID, or lost, leaves the slice (republished without its
//! devices: this works on every API server; device taints, a beta API that Kubernetes 1.36 and
//! testcluster do not serve without extra runtime config, are not used), its devices turn
//! `UNHEALTHY` on the dra-health stream, and both come back once it recovers.

use std::{
    collections::BTreeSet,
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use kiln_device_plugin::{health::XidFilter, settings::Settings};

use crate::{
    proto::health::{DeviceHealth, DeviceIdentifier, HealthStatus},
    slices::Allocatable,
};

/// The plugin's settings; flag names and defaults are NVIDIA's kubelet plugin's where it has
/// the same setting.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--node-name` / `NODE_NAME`: the node, and the pool name.
    pub node_name: String,
    /// `--kubelet-registrar-directory-path` (`/var/lib/kubelet/plugins_registry`).
    pub registrar_dir: PathBuf,
    /// `--kubelet-plugins-directory-path` (`/var/lib/kubelet/plugins`).
    pub plugins_dir: PathBuf,
    /// `--cdi-root` (NVIDIA's default `/etc/cdi`; its chart sets `/var/run/cdi`).
    pub cdi_root: PathBuf,
    /// `--gpu-backend`: `nvml` or `fake:FIXTURE`.
    pub backend: kiln_gpu::BackendSpec,
    /// The CDI generator's settings (`--nvidia-driver-root`, `--nvidia-cdi-hook-path`).
    pub settings: Settings,
    /// `--container-driver-root` (`/driver-root`).
    pub container_driver_root: PathBuf,
    /// `nvidia-smi` for time-slicing; `None` records instead (the fake backend).
    pub nvidia_smi: Option<PathBuf>,
    /// How often XIDs and the driver version are polled.
    pub health_interval: Duration,
    /// Quiet time before a responding GPU is healthy again.
    pub recovery_after: Duration,
    /// Which XIDs are critical (`--additional-xids-to-ignore` added to the ignored ones).
    pub xid_filter: XidFilter,
    /// `--http-endpoint`: where metrics are served; `None`: not served.
    pub http_endpoint: Option<std::net::SocketAddr>,
    /// `--metrics-path` (`/metrics`).
    pub metrics_path: String,
    /// How long prepare waits for a claim to reach the cache.
    pub claim_wait: Duration,
}

/// The dra-health list: every device of `all` with its health (`unhealthy` GPU indexes with
/// their last critical XID) at `now`.
#[must_use]
pub fn device_health(
    all: &[Allocatable],
    faults: &[(u32, u64)],
    node: &str,
    now: SystemTime,
) -> Vec<DeviceHealth> {
    let secs = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    all.iter()
        .map(|a| {
            let fault = faults.iter().find(|(i, _)| *i == a.gpu_index);
            DeviceHealth {
                device: Some(DeviceIdentifier {
                    pool_name: node.into(),
                    device_name: a.name.clone(),
                }),
                health: if fault.is_some() {
                    HealthStatus::Unhealthy
                } else {
                    HealthStatus::Healthy
                }
                .into(),
                last_updated_time: secs,
                health_check_timeout_seconds: 0,
                message: fault.map_or_else(String::new, |(i, xid)| {
                    format!("GPU {i}: critical XID {xid} (or lost)")
                }),
            }
        })
        .collect()
}

/// The unhealthy GPU indexes of `faults`.
#[must_use]
pub fn unhealthy(faults: &[(u32, u64)]) -> BTreeSet<u32> {
    faults.iter().map(|(i, _)| *i).collect()
}

#[cfg(feature = "kube")]
pub use run_impl::run;

#[cfg(feature = "kube")]
mod run_impl {
    use std::sync::{Arc, Mutex};

    use kiln_device_plugin::health::HealthTracker;
    use kiln_gpu::GpuInventory;

    use super::{Options, device_health, unhealthy};
    use crate::{
        checkpoint,
        config::{NvidiaSmi, Recorder, SharingApplier},
        metrics::Metrics,
        publish::{ClaimCache, Publisher},
        server::{self, DraService, HealthService, RegistrationService, Served},
        slices,
        state::{DeviceState, StateOptions},
    };

    fn inventory(
        inv: &dyn GpuInventory,
    ) -> anyhow_like::Result<(Vec<slices::Allocatable>, String)> {
        let sys = inv.system()?;
        let gpus = inv.devices()?;
        Ok((slices::allocatable(&gpus, &sys), sys.driver_version))
    }

    /// Errors of [`run`], as one boxed error with its causes.
    mod anyhow_like {
        pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;
    }

    /// Runs the plugin until `shutdown` completes: serves the sockets, publishes the slice and
    /// polls health (see the module docs). On shutdown the sockets are removed; the slice and
    /// the checkpoint stay for the next start.
    ///
    /// # Errors
    /// The GPU backend does not open, the checkpoint is corrupt, the API client cannot be
    /// built, or a socket cannot be bound.
    pub async fn run(
        opts: Options,
        client: kube::Client,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let inv = kiln_gpu::open(&opts.backend)?;
        let (mut all, mut driver_version) = inventory(inv.as_ref())?;
        let plugin_dir = server::plugin_dir(&opts.plugins_dir);
        let applier: Arc<dyn SharingApplier> = match &opts.nvidia_smi {
            Some(path) => Arc::new(NvidiaSmi { path: path.clone() }),
            None => Arc::new(Recorder::default()),
        };
        let state = DeviceState::new(
            StateOptions {
                node: opts.node_name.clone(),
                checkpoint: plugin_dir.join(checkpoint::FILE_NAME),
                cdi_root: opts.cdi_root.clone(),
                settings: opts.settings.clone(),
                container_driver_root: opts.container_driver_root.clone(),
                applier,
            },
            all.clone(),
            driver_version.clone(),
        )?;
        tracing::info!(
            node = %opts.node_name,
            devices = all.len(),
            prepared = state.prepared().len(),
            "kiln DRA plugin starting"
        );
        let metrics = Arc::new(Metrics::default());
        metrics.set_prepared_claims(state.prepared().len());
        let state = Arc::new(Mutex::new(state));
        let claims = Arc::new(ClaimCache::start(client.clone(), opts.claim_wait));
        let mut tracker = HealthTracker::new(opts.xid_filter.clone(), opts.recovery_after);
        let (health_tx, health_rx) = tokio::sync::watch::channel(Arc::new(device_health(
            &all,
            &[],
            &opts.node_name,
            std::time::SystemTime::now(),
        )));
        let dra_socket = plugin_dir.join(server::DRA_SOCKET);
        let (registration, _status) = RegistrationService::new(&dra_socket);
        let served = Served::start(
            server::registration_socket(&opts.registrar_dir),
            dra_socket,
            registration,
            DraService::new(state.clone(), claims, metrics.clone()),
            HealthService::new(health_rx),
        )?;
        let http = opts.http_endpoint.map(|addr| {
            let metrics = metrics.clone();
            let path = opts.metrics_path.clone();
            tokio::spawn(async move {
                let app = axum::Router::new().route(
                    &path,
                    axum::routing::get(move || {
                        let m = metrics.clone();
                        async move { m.render() }
                    }),
                );
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => {
                        kiln_httpd::serve(
                            l,
                            app,
                            kiln_httpd::Limits::DEFAULT,
                            std::future::pending(),
                        )
                        .await;
                    }
                    Err(e) => tracing::error!(%addr, "metrics endpoint: {e}"),
                }
            })
        });
        let mut publisher = Publisher::new(client, &opts.node_name).await;
        let mut pending_publish = true;
        let mut shutdown = std::pin::pin!(shutdown);
        let mut tick = tokio::time::interval(opts.health_interval);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = tick.tick() => {}
            }
            let mut changed = tracker.poll(inv.as_ref());
            if let Ok(sys) = inv.system()
                && sys.driver_version != driver_version
                && let Ok((fresh, version)) = inventory(inv.as_ref())
            {
                tracing::info!(from = %driver_version, to = %version, "driver version changed");
                all = fresh;
                driver_version = version;
                if let Ok(mut s) = state.lock() {
                    s.set_devices(all.clone(), driver_version.clone());
                }
                changed = true;
            }
            if changed {
                let faults = tracker.faults();
                health_tx.send_replace(Arc::new(device_health(
                    &all,
                    &faults,
                    &opts.node_name,
                    std::time::SystemTime::now(),
                )));
                pending_publish = true;
            }
            if pending_publish {
                let devices = slices::published(&all, &unhealthy(&tracker.faults()));
                let n = devices.len();
                match publisher.publish(devices).await {
                    Ok(wrote) => {
                        pending_publish = false;
                        metrics.set_devices_published(n);
                        if wrote {
                            metrics.slice_written();
                        }
                    }
                    Err(e) => tracing::warn!("publishing the ResourceSlice (retried): {e}"),
                }
            }
        }
        served.stop().await;
        if let Some(h) = http {
            h.abort();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use kiln_gpu::{FakeBackend, GpuInventory};

    use super::*;

    #[test]
    fn an_unhealthy_gpu_reports_all_its_devices_unhealthy() {
        let fake = FakeBackend::new(
            serde_yaml_ng::from_str(
                r#"
driver_version: "550.144.03"
cuda_version: "12.4"
gpus:
  - {uuid: GPU-0, name: H100, memory_total_mib: 1, compute_capability: "9.0"}
  - {uuid: GPU-1, name: H100, memory_total_mib: 1, compute_capability: "9.0"}
"#,
            )
            .unwrap(),
        );
        let all = crate::slices::allocatable(&fake.devices().unwrap(), &fake.system().unwrap());
        let h = device_health(&all, &[(1, 79)], "n", UNIX_EPOCH + Duration::from_secs(5));
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].health, i32::from(HealthStatus::Healthy));
        assert_eq!(h[1].health, i32::from(HealthStatus::Unhealthy));
        assert_eq!(h[1].message, "GPU 1: critical XID 79 (or lost)");
        assert_eq!(h[1].last_updated_time, 5);
        assert_eq!(h[1].device.as_ref().unwrap().device_name, "gpu-1");
        assert_eq!(unhealthy(&[(1, 79)]), [1].into());
    }
}
