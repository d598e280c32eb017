//! The labelling loop: read the config, snapshot the GPUs, compute labels, write them; then
//! exit (oneshot), sleep the interval, or wait forever (`infinite`). SIGHUP starts a new pass
//! at once (the config-manager sidecar sends it after switching the config).

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use kiln_device_plugin::config::{Config, MigStrategy, SleepInterval};
use kiln_gpu::GpuInventory;

use crate::{GfdError, LabelInput, Labels, host, make_labels, output};

/// Default relabel interval (upstream `--sleep-interval`).
pub const DEFAULT_SLEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Run options; `None` fields fall back to the config file's `flags`, then to upstream's
/// defaults (flag/env > file > default, as upstream).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The device-plugin config file (`/config/config.yaml`). A file that does not exist is an
    /// error unless [`Options::config_file_optional`] is set.
    pub config_file: Option<PathBuf>,
    /// A missing [`Options::config_file`] means the default config: true only for the
    /// built-in default path (config-manager writes it only when the policy names a config);
    /// a file named by a flag or env var must exist.
    pub config_file_optional: bool,
    /// `--mig-strategy`.
    pub mig_strategy: Option<MigStrategy>,
    /// `--oneshot`.
    pub oneshot: Option<bool>,
    /// `--no-timestamp`.
    pub no_timestamp: Option<bool>,
    /// `--sleep-interval`.
    pub sleep_interval: Option<SleepInterval>,
    /// `--machine-type-file`, default `/sys/class/dmi/id/product_name`.
    pub machine_type_file: Option<PathBuf>,
    /// Where `/sys` is (PCI classes for `gpu.mode`), default `/sys`.
    pub sys_dir: PathBuf,
}

/// Where labels are written.
#[derive(Clone)]
pub enum Output {
    /// This node's NodeFeature object (NFD's Node Feature API; NVIDIA's default).
    NodeFeature(output::NodeFeatureTarget),
    /// An NFD features.d file.
    File(PathBuf),
    /// `key=value` lines on stdout.
    Stdout,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NodeFeature(t) => write!(
                f,
                "NodeFeature({}/{})",
                t.namespace,
                output::node_feature_name(&t.node)
            ),
            Self::File(p) => write!(f, "File({})", p.display()),
            Self::Stdout => f.write_str("Stdout"),
        }
    }
}

/// The effective settings of one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Effective {
    /// The parsed config.
    pub config: Config,
    /// MIG strategy in force.
    pub mig_strategy: MigStrategy,
    /// Exit after one pass.
    pub oneshot: bool,
    /// Omit `gfd.timestamp`.
    pub no_timestamp: bool,
    /// What to do after a pass.
    pub sleep_interval: SleepInterval,
    /// The machine-type file.
    pub machine_type_file: PathBuf,
}

impl Options {
    /// Reads the config file and merges. A missing file is the default config only with
    /// [`Options::config_file_optional`].
    ///
    /// # Errors
    /// [`GfdError::Config`] for a missing (when required), unreadable or invalid file.
    pub fn effective(&self) -> Result<Effective, GfdError> {
        let config = match &self.config_file {
            Some(p) if self.config_file_optional && !p.exists() => Config::default(),
            Some(p) => Config::from_file(p)?,
            None => Config::default(),
        };
        let f = &config.flags;
        Ok(Effective {
            mig_strategy: self.mig_strategy.or(f.mig_strategy).unwrap_or_default(),
            oneshot: self.oneshot.or(f.gfd.oneshot).unwrap_or(false),
            no_timestamp: self.no_timestamp.or(f.gfd.no_timestamp).unwrap_or(false),
            sleep_interval: self
                .sleep_interval
                .or(f.gfd.sleep_interval)
                .unwrap_or(SleepInterval::Every(DEFAULT_SLEEP_INTERVAL)),
            machine_type_file: self
                .machine_type_file
                .clone()
                .or_else(|| f.gfd.machine_type_file.as_ref().map(PathBuf::from))
                .unwrap_or_else(|| "/sys/class/dmi/id/product_name".into()),
            config,
        })
    }
}

/// One pass: the labels for the current GPUs. Without an inventory (NVML failed and
/// `failOnInitError` is off) only the timestamp is produced, as upstream.
///
/// # Errors
/// [`GfdError::Gpu`] when the inventory cannot be read, or a labeling error.
pub fn snapshot(
    gpu: Option<&dyn GpuInventory>,
    eff: &Effective,
    sys_dir: &std::path::Path,
) -> Result<Labels, GfdError> {
    let timestamp = (!eff.no_timestamp).then(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    let mut input = LabelInput {
        mig_strategy: eff.mig_strategy,
        sharing: eff.config.sharing(),
        timestamp,
        machine: host::read_machine(&eff.machine_type_file),
        ..LabelInput::default()
    };
    let Some(gpu) = gpu else {
        return make_labels(&empty_system(), &[], &input);
    };
    let system = gpu.system()?;
    let devices = gpu.devices()?;
    input.pci_modes = host::read_pci_modes(sys_dir, &devices);
    for d in devices.iter().filter(|d| d.mig_enabled == Some(true)) {
        for s in gpu.mig_samples(d.index).unwrap_or_default() {
            if let Some(total) = s.sample.fb_total_bytes {
                input.mig_memory_mib.insert(s.uuid, total >> 20);
            }
        }
    }
    make_labels(&system, &devices, &input)
}

fn empty_system() -> kiln_gpu::SystemInfo {
    kiln_gpu::SystemInfo {
        driver_version: String::new(),
        cuda_version: String::new(),
        nvml_version: String::new(),
    }
}

/// Writes one pass's labels.
///
/// # Errors
/// [`GfdError::OutputFile`] or [`GfdError::Kube`].
pub async fn write(out: &Output, labels: &Labels) -> Result<(), GfdError> {
    if labels.len() <= 1 {
        tracing::warn!("No labels generated from any source");
    }
    match out {
        Output::Stdout => {
            print!("{}", output::render_lines(labels));
            Ok(())
        }
        Output::File(p) => output::write_features_file(p, labels),
        Output::NodeFeature(target) => {
            let changed = output::write_node_feature(target, labels).await?;
            tracing::info!(
                node = target.node,
                changed,
                labels = labels.len(),
                "wrote NodeFeature"
            );
            Ok(())
        }
    }
}

/// The loop. Returns after one pass with `oneshot`, or when `shutdown` resolves. A failed
/// pass is an error (the pod restarts), as upstream; labels already written stay (upstream
/// deletes its features.d file on exit, issue #796).
///
/// # Errors
/// The first pass error.
pub async fn run(
    opts: &Options,
    gpu: Option<Arc<dyn GpuInventory>>,
    out: &Output,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), GfdError> {
    tokio::pin!(shutdown);
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        let eff = opts.effective()?;
        let labels = snapshot(gpu.as_deref(), &eff, &opts.sys_dir)?;
        write(out, &labels).await?;
        if eff.oneshot {
            return Ok(());
        }
        let sleep = async {
            match eff.sleep_interval {
                SleepInterval::Every(d) => tokio::time::sleep(d).await,
                SleepInterval::Infinite => std::future::pending().await,
            }
        };
        let hangup = async {
            match hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = sleep => {}
            () = hangup => tracing::info!("SIGHUP: reloading the config"),
        }
    }
}
