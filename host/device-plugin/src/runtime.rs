//! The running plugin: one task that owns the servers and reacts to config changes, health
//! polls, driver-version changes and kubelet restarts.
//!
//! - Config reloads keep registrations: a resource that stays gets its new snapshot through
//!   its watch channel (the kubelet sees a new ListAndWatch list); only added or removed
//!   resources start or stop servers.
//! - A missing config key or a bad config is reported in [`Status::last_error`]; the running
//!   config stays.
//! - `kubelet.sock` is checked every `kubelet_poll` (its inode changes when the kubelet
//!   restarts); on a change every socket is recreated and registered again.

use std::{
    collections::BTreeMap, os::unix::fs::MetadataExt as _, path::PathBuf, sync::Arc, time::Duration,
};

use kiln_gpu::GpuInventory;
use tokio::sync::{mpsc, watch};

use crate::{
    cdi,
    config::{Config, ConfigError},
    devices::{DeviceError, Resource, build_resources},
    health::{HealthTracker, XidFilter},
    selection::ConfigDir,
    server::{PluginService, Served, Snapshot, register},
    settings::{Overrides, Settings, SettingsError},
};

/// Where the plugin takes its config from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// No file: defaults and flags only.
    None,
    /// One file (`CONFIG_FILE`), re-read on [`Control::Reload`] and when its content changes.
    File(PathBuf),
    /// The ConfigMap directory, keyed by the node label ([`Control::Label`]).
    Dir(ConfigDir),
}

/// Everything `run` needs besides the GPUs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Flags over the config file.
    pub overrides: Overrides,
    /// Config source.
    pub source: ConfigSource,
    /// The kubelet's device-plugin directory, where plugin sockets go.
    pub plugin_dir: PathBuf,
    /// The kubelet's registration socket; `None` skips registration (upstream: empty value).
    pub kubelet_socket: Option<PathBuf>,
    /// CDI spec directory.
    pub cdi_root: PathBuf,
    /// How often XIDs, the driver version and the config file are polled.
    pub health_interval: Duration,
    /// Quiet time after the last critical XID before a responding GPU is healthy again.
    pub recovery_after: Duration,
    /// XID filter.
    pub xid_filter: XidFilter,
    /// How often `kubelet.sock` is checked for a kubelet restart.
    pub kubelet_poll: Duration,
}

/// Requests to the running plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Re-read the config (SIGHUP): the file, or the directory with the last label.
    Reload,
    /// The node label's new value (`None`: unset).
    Label(Option<String>),
}

/// What the plugin reports about itself (for logs, tests and benchmarks).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// Configs applied so far (1 after start).
    pub generation: u64,
    /// The config key in use (directory source).
    pub config_name: Option<String>,
    /// The last reload error; cleared by the next successful reload.
    pub last_error: Option<String>,
    /// Advertised resource names, sorted.
    pub resources: Vec<String>,
    /// Successful `Register` calls so far.
    pub registrations: u64,
    /// Driver version of the CDI spec on disk.
    pub cdi_driver_version: Option<String>,
    /// GPUs held unhealthy, `(index, last critical XID)` by index
    /// ([`HealthTracker::faults`]); the node agent reports them on the Node.
    pub unhealthy: Vec<(u32, u64)>,
}

/// Why the plugin could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad config.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Config selection failed.
    #[error(transparent)]
    Select(#[from] crate::selection::SelectError),
    /// Invalid flag combination.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// Invalid MIG layout.
    #[error(transparent)]
    Devices(#[from] DeviceError),
    /// NVML failed.
    #[error("nvml init failed")]
    Gpu(#[from] kiln_gpu::GpuError),
    /// `failOnInitError` with no GPU (upstream idles forever, issue #1080).
    #[error("no devices found and failOnInitError is set")]
    NoDevices,
    /// A socket could not be bound.
    #[error("serving on {path}")]
    Serve {
        /// Socket.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The CDI spec could not be written.
    #[error(transparent)]
    Cdi(#[from] cdi::CdiError),
}

/// A started plugin.
#[derive(Debug)]
pub struct Handle {
    /// Send [`Control`] requests here.
    pub control: mpsc::Sender<Control>,
    /// Latest [`Status`].
    pub status: watch::Receiver<Status>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: tokio::task::JoinHandle<()>,
}

impl Handle {
    /// Stops all servers (sockets removed) and waits for the task.
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.join).await;
    }
}

struct Running {
    served: Served,
    snapshot: watch::Sender<Arc<Snapshot>>,
    registered: bool,
}

struct Plugin {
    opts: Options,
    inv: Arc<dyn GpuInventory>,
    settings: Arc<Settings>,
    resources: Vec<Resource>,
    servers: BTreeMap<String, Running>,
    health: HealthTracker,
    label: Option<String>,
    file_text: Option<String>,
    kubelet_id: Option<(u64, u64, i64, i64)>,
    status: watch::Sender<Status>,
}

/// Loads the config, builds devices, writes the CDI spec, serves and registers every
/// resource, then runs until [`Handle::shutdown`]. `initial_label` is the node label value
/// known at start (directory source).
///
/// # Errors
/// [`RunError`] for anything that prevents the first start (bad config, NVML, no devices with
/// `failOnInitError`, bind or CDI write failures).
pub async fn start(
    opts: Options,
    inv: Arc<dyn GpuInventory>,
    initial_label: Option<String>,
) -> Result<Handle, RunError> {
    let (cfg, name, file_text) = load(&opts.source, initial_label.as_deref())?;
    let settings = Arc::new(Settings::resolve(&opts.overrides, &cfg)?);
    let (status, status_rx) = watch::channel(Status::default());
    let mut p = Plugin {
        health: HealthTracker::new(opts.xid_filter.clone(), opts.recovery_after),
        opts,
        inv,
        settings: settings.clone(),
        resources: Vec::new(),
        servers: BTreeMap::new(),
        label: initial_label,
        file_text,
        kubelet_id: None,
        status,
    };
    p.kubelet_id = p.kubelet_socket_id();
    p.apply(settings, name).await?;
    let (control, mut control_rx) = mpsc::channel(16);
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let join = tokio::spawn(async move {
        let mut health_tick = tokio::time::interval(p.opts.health_interval);
        let mut kubelet_tick = tokio::time::interval(p.opts.kubelet_poll);
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                Some(c) = control_rx.recv() => p.control(c).await,
                _ = health_tick.tick() => p.poll_health_and_driver().await,
                _ = kubelet_tick.tick() => p.poll_kubelet().await,
            }
        }
        for (_, r) in std::mem::take(&mut p.servers) {
            r.served.stop().await;
        }
    });
    Ok(Handle {
        control,
        status: status_rx,
        stop: Some(stop),
        join,
    })
}

/// The config for `source` and `label`, its key, and the file text (file source).
fn load(
    source: &ConfigSource,
    label: Option<&str>,
) -> Result<(Config, Option<String>, Option<String>), RunError> {
    Ok(match source {
        ConfigSource::None => (Config::default(), None, None),
        ConfigSource::File(path) => {
            let text = crate::config::read_file(path)?;
            let cfg = Config::from_yaml(&text).map_err(|e| ConfigError::InFile {
                file: path.clone(),
                source: Box::new(e),
            })?;
            (cfg, None, Some(text))
        }
        ConfigSource::Dir(dir) => {
            let sel = dir.select(label)?;
            let cfg = Config::from_yaml(&sel.text).map_err(|e| ConfigError::InFile {
                file: dir.dir.join(sel.name.as_deref().unwrap_or("<empty>")),
                source: Box::new(e),
            })?;
            (cfg, sel.name, None)
        }
    })
}

impl Plugin {
    async fn control(&mut self, c: Control) {
        if let Control::Label(l) = &c {
            if *l == self.label {
                return;
            }
            self.label.clone_from(l);
        }
        self.reload().await;
    }

    async fn reload(&mut self) {
        let result = async {
            let (cfg, name, text) = load(&self.opts.source, self.label.as_deref())?;
            let settings = Arc::new(Settings::resolve(&self.opts.overrides, &cfg)?);
            self.file_text = text;
            self.apply(settings, name).await
        }
        .await;
        if let Err(e) = result {
            let msg = error_chain(&e);
            tracing::error!("config not applied, keeping the running config: {msg}");
            self.status.send_modify(|s| s.last_error = Some(msg));
        }
    }

    /// Builds devices for `settings` and reconciles servers; bumps the generation.
    async fn apply(
        &mut self,
        settings: Arc<Settings>,
        name: Option<String>,
    ) -> Result<(), RunError> {
        let gpus = self.inv.devices()?;
        let resources = build_resources(&gpus, settings.mig_strategy, &settings.sharing)?;
        if resources.is_empty() {
            if settings.fail_on_init_error {
                return Err(RunError::NoDevices);
            }
            tracing::warn!("No devices found. Waiting indefinitely.");
        }
        self.settings = settings;
        self.resources = resources;
        let mut cdi_version = self.status.borrow().cdi_driver_version.clone();
        if self.settings.uses_cdi() {
            cdi_version = Some(self.write_cdi()?);
        }
        let wanted: BTreeMap<String, Resource> = self
            .resources
            .iter()
            .map(|r| (r.name.clone(), r.clone()))
            .collect();
        let gone: Vec<String> = self
            .servers
            .keys()
            .filter(|k| !wanted.contains_key(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(r) = self.servers.remove(&k) {
                tracing::info!(resource = %k, "resource no longer advertised; stopping its server");
                r.served.stop().await;
            }
        }
        for (name_r, res) in wanted {
            let snap = Arc::new(self.snapshot(res));
            if let Some(r) = self.servers.get(&name_r) {
                r.snapshot.send_replace(snap);
            } else {
                self.serve(snap)?;
            }
        }
        self.register_pending().await;
        let resources = self.servers.keys().cloned().collect();
        self.status.send_modify(|s| {
            s.generation += 1;
            s.config_name = name;
            s.last_error = None;
            s.resources = resources;
            s.cdi_driver_version = cdi_version;
        });
        Ok(())
    }

    fn snapshot(&self, resource: Resource) -> Snapshot {
        let unhealthy_gpus = resource
            .units
            .iter()
            .map(|u| u.physical.gpu_index)
            .filter(|i| !self.health.is_healthy(*i))
            .collect();
        Snapshot {
            resource,
            settings: self.settings.clone(),
            unhealthy_gpus,
        }
    }

    fn serve(&mut self, snap: Arc<Snapshot>) -> Result<(), RunError> {
        let name = snap.resource.name.clone();
        let socket = self.opts.plugin_dir.join(snap.resource.socket_name());
        let devices = snap.resource.units.len();
        let (tx, rx) = watch::channel(snap);
        let served = Served::start(socket.clone(), PluginService::new(rx)).map_err(|source| {
            RunError::Serve {
                path: socket.clone(),
                source,
            }
        })?;
        tracing::info!(resource = %name, socket = %socket.display(), devices, "serving the device plugin");
        self.servers.insert(
            name,
            Running {
                served,
                snapshot: tx,
                registered: false,
            },
        );
        Ok(())
    }

    async fn register_pending(&mut self) {
        let Some(kubelet) = self.opts.kubelet_socket.clone() else {
            return;
        };
        let mut count = 0;
        for (name, r) in self.servers.iter_mut().filter(|(_, r)| !r.registered) {
            let endpoint = r
                .served
                .socket
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            match register(&kubelet, &endpoint, name).await {
                Ok(()) => {
                    let devices = r.snapshot.borrow().resource.units.len();
                    tracing::info!(
                        resource = %name,
                        endpoint,
                        devices,
                        kubelet = %kubelet.display(),
                        "registered with the kubelet"
                    );
                    r.registered = true;
                    count += 1;
                }
                Err(e) => tracing::warn!(resource = %name, "{}; retrying", error_chain(&e)),
            }
        }
        if count > 0 {
            self.status.send_modify(|s| s.registrations += count);
        }
    }

    fn write_cdi(&self) -> Result<String, RunError> {
        let version = self.inv.system()?.driver_version;
        let spec = cdi::build_spec(
            &self.resources,
            &self.settings,
            &version,
            std::path::Path::new(&self.settings.container_driver_root),
        );
        let path = cdi::write_spec(&self.opts.cdi_root, &spec)?;
        tracing::info!(path = %path.display(), driver = %version, "wrote CDI spec");
        Ok(version)
    }

    async fn poll_health_and_driver(&mut self) {
        if self.health.poll(self.inv.as_ref()) {
            for r in self.servers.values() {
                let res = r.snapshot.borrow().resource.clone();
                r.snapshot.send_replace(Arc::new(self.snapshot(res)));
            }
            let faults = self.health.faults();
            self.status.send_modify(|s| s.unhealthy = faults);
        }
        if self.settings.uses_cdi() {
            let current = self.inv.system().map(|s| s.driver_version);
            let written = self.status.borrow().cdi_driver_version.clone();
            if let Ok(v) = current
                && Some(&v) != written.as_ref()
            {
                tracing::info!(from = ?written, to = %v, "driver version changed; rewriting the CDI spec");
                match self.write_cdi() {
                    Ok(v) => self.status.send_modify(|s| s.cdi_driver_version = Some(v)),
                    Err(e) => tracing::error!("{}", error_chain(&e)),
                }
            }
        }
        if let ConfigSource::File(path) = &self.opts.source {
            let now = crate::config::read_file(path).ok();
            if now.is_some() && now != self.file_text {
                tracing::info!(file = %path.display(), "config file changed; reloading");
                self.reload().await;
            }
        }
    }

    /// Identity of `kubelet.sock`: inode plus change time, since a recreated socket can reuse
    /// the inode number.
    fn kubelet_socket_id(&self) -> Option<(u64, u64, i64, i64)> {
        let m = std::fs::metadata(self.opts.kubelet_socket.as_ref()?).ok()?;
        Some((m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
    }

    async fn poll_kubelet(&mut self) {
        let id = self.kubelet_socket_id();
        // A starting kubelet deletes every socket in the directory; a missing socket of ours
        // means the same as a new kubelet.sock.
        let lost_socket = self.servers.values().any(|r| !r.served.socket.exists());
        if id != self.kubelet_id || (id.is_some() && lost_socket) {
            self.kubelet_id = id;
            if id.is_some() {
                tracing::info!(
                    "kubelet.sock was recreated; restarting servers and registering again"
                );
                let old = std::mem::take(&mut self.servers);
                for (_, r) in old {
                    r.served.stop().await;
                }
                let snaps: Vec<_> = self
                    .resources
                    .iter()
                    .map(|r| Arc::new(self.snapshot(r.clone())))
                    .collect();
                for s in snaps {
                    if let Err(e) = self.serve(s) {
                        tracing::error!("{}", error_chain(&e));
                    }
                }
            }
        }
        if id.is_some() && self.servers.values().any(|r| !r.registered) {
            self.register_pending().await;
        }
    }
}

/// `e: cause: cause…` on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    kiln_gpu::error_chain(e)
}
