//! Effective settings: a CLI flag or its env var > the config file > the default (upstream
//! precedence, §2.1), then upstream's flag validation (§2.4).

use crate::config::{
    AllocationPolicy, Config, DeviceIdStrategy, DeviceListStrategy, MigStrategy, Sharing,
    SharingStrategy,
};

/// Flags that override the config file; each reads upstream's env var. `None` = not given.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Overrides {
    /// `none`, `single` or `mixed`.
    #[arg(long, env = "MIG_STRATEGY")]
    pub mig_strategy: Option<MigStrategy>,
    /// Exit when NVML cannot start or finds no GPU (default true).
    #[arg(long, env = "FAIL_ON_INIT_ERROR", num_args = 0..=1, default_missing_value = "true")]
    pub fail_on_init_error: Option<bool>,
    /// Host path of the driver installation (default `/`).
    #[arg(long, visible_alias = "nvidia-driver-root", env = "NVIDIA_DRIVER_ROOT")]
    pub driver_root: Option<String>,
    /// Host path above `/dev` (default: the driver root).
    #[arg(long, visible_alias = "nvidia-dev-root", env = "NVIDIA_DEV_ROOT")]
    pub dev_root: Option<String>,
    /// Add `DeviceSpec`s for the device nodes to Allocate responses.
    #[arg(long, env = "PASS_DEVICE_SPECS", num_args = 0..=1, default_missing_value = "true")]
    pub pass_device_specs: Option<bool>,
    /// `envvar`, `volume-mounts`, `cdi-annotations`, `cdi-cri`; comma-separated for several.
    #[arg(long, env = "DEVICE_LIST_STRATEGY")]
    pub device_list_strategy: Option<String>,
    /// `uuid` or `index`: which ids reach the container runtime.
    #[arg(long, env = "DEVICE_ID_STRATEGY")]
    pub device_id_strategy: Option<DeviceIdStrategy>,
    /// Prefix of the CDI annotation key (default `cdi.k8s.io/`).
    #[arg(long, env = "CDI_ANNOTATION_PREFIX")]
    pub cdi_annotation_prefix: Option<String>,
    /// `nvidia-cdi-hook` path written into the CDI spec (default `/usr/bin/nvidia-ctk`).
    #[arg(long, visible_alias = "nvidia-ctk-path", env = "NVIDIA_CDI_HOOK_PATH")]
    pub nvidia_cdi_hook_path: Option<String>,
    /// Where the driver root is mounted in this container (default `/driver-root`).
    #[arg(
        long,
        visible_alias = "container-driver-root",
        env = "DRIVER_ROOT_CTR_PATH"
    )]
    pub driver_root_ctr_path: Option<String>,
    /// Host directory of the MPS daemon (pipes, shm).
    #[arg(long, env = "MPS_ROOT")]
    pub mps_root: Option<String>,
    /// Set `NVIDIA_GDRCOPY=enabled` in Allocate responses.
    #[arg(long, env = "GDRCOPY_ENABLED", num_args = 0..=1, default_missing_value = "true")]
    pub gdrcopy_enabled: Option<bool>,
    /// Set `NVIDIA_GDS=enabled`.
    #[arg(long, env = "GDS_ENABLED", num_args = 0..=1, default_missing_value = "true")]
    pub gds_enabled: Option<bool>,
    /// Set `NVIDIA_MOFED=enabled`.
    #[arg(long, env = "MOFED_ENABLED", num_args = 0..=1, default_missing_value = "true")]
    pub mofed_enabled: Option<bool>,
    /// `distributed` or `packed`: how replicas of shared GPUs and MIG devices are preferred.
    #[arg(long, env = "SHARED_DEVICES_ALLOCATION_POLICY")]
    pub shared_devices_allocation_policy: Option<AllocationPolicy>,
}

impl Overrides {
    /// Fills the driver and dev roots that no flag or env var set from the validator's
    /// `driver-ready` file (`KEY=value` lines: `NVIDIA_DRIVER_ROOT`, `DRIVER_ROOT_CTR_PATH`,
    /// `NVIDIA_DEV_ROOT`). This is what upstream's device-plugin entrypoint does in the
    /// operator before `exec`ing the plugin: a host driver is `/` on the host and `/host` in the
    /// pod, a driver container's is `/run/nvidia/driver` in both. Unknown keys, blank and
    /// malformed lines are ignored; empty values leave the field unset. Returns the names of
    /// the fields filled.
    pub fn fill_from_driver_ready(&mut self, text: &str) -> Vec<&'static str> {
        let mut filled = Vec::new();
        for line in text.lines() {
            let Some((key, value)) = line.trim().split_once('=') else {
                continue;
            };
            let value = value.trim();
            let (slot, name) = match key.trim() {
                "NVIDIA_DRIVER_ROOT" => (&mut self.driver_root, "driver_root"),
                "DRIVER_ROOT_CTR_PATH" => (&mut self.driver_root_ctr_path, "driver_root_ctr_path"),
                "NVIDIA_DEV_ROOT" => (&mut self.dev_root, "dev_root"),
                _ => continue,
            };
            if slot.is_none() && !value.is_empty() {
                *slot = Some(value.to_owned());
                filled.push(name);
            }
        }
        filled
    }
}

/// The settings the plugin runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// MIG strategy.
    pub mig_strategy: MigStrategy,
    /// Exit on NVML init failure or when no GPU is found (§9.9).
    pub fail_on_init_error: bool,
    /// Device specs in Allocate.
    pub pass_device_specs: bool,
    /// Sorted, deduplicated list strategies (at least one).
    pub device_list_strategies: Vec<DeviceListStrategy>,
    /// Runtime id strategy.
    pub device_id_strategy: DeviceIdStrategy,
    /// CDI annotation key prefix.
    pub cdi_annotation_prefix: String,
    /// `nvidia-cdi-hook` path for the CDI spec.
    pub nvidia_cdi_hook_path: String,
    /// Host driver root.
    pub driver_root: String,
    /// Host dev root.
    pub dev_root: String,
    /// The driver root as mounted in this container (CDI library search).
    pub container_driver_root: String,
    /// MPS root, when MPS is used.
    pub mps_root: Option<String>,
    /// `NVIDIA_GDRCOPY`.
    pub gdrcopy_enabled: bool,
    /// `NVIDIA_GDS`.
    pub gds_enabled: bool,
    /// `NVIDIA_MOFED`.
    pub mofed_enabled: bool,
    /// Active sharing.
    pub sharing: Sharing,
    /// How GetPreferredAllocation picks replicas and MIG devices.
    pub shared_devices_allocation_policy: AllocationPolicy,
    /// IMEX channel ids (`[]` or `[0]`).
    pub imex_channels: Vec<u32>,
}

/// A setting combination upstream refuses ("unable to validate flags: …").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unable to validate flags: {0}")]
pub struct SettingsError(pub String);

impl Settings {
    /// Combines flags over the file over the defaults, then validates.
    ///
    /// # Errors
    /// [`SettingsError`] with upstream's message (MPS with `mixed`, MPS without `--mps-root`).
    pub fn resolve(o: &Overrides, cfg: &Config) -> Result<Self, SettingsError> {
        let f = &cfg.flags;
        let p = &f.plugin;
        let driver_root = pick(&o.driver_root, &f.nvidia_driver_root, || "/".into());
        let dev_root = pick(&o.dev_root, &f.nvidia_dev_root, || driver_root.clone());
        let flag_strategies = o
            .device_list_strategy
            .as_deref()
            .map(DeviceListStrategy::parse_list)
            .transpose()
            .map_err(SettingsError)?;
        let s = Self {
            mig_strategy: pick(&o.mig_strategy, &f.mig_strategy, MigStrategy::default),
            fail_on_init_error: pick(&o.fail_on_init_error, &f.fail_on_init_error, || true),
            pass_device_specs: pick(&o.pass_device_specs, &p.pass_device_specs, || false),
            device_list_strategies: pick(&flag_strategies, &p.device_list_strategy, || {
                vec![DeviceListStrategy::Envvar]
            }),
            device_id_strategy: pick(
                &o.device_id_strategy,
                &p.device_id_strategy,
                DeviceIdStrategy::default,
            ),
            cdi_annotation_prefix: pick(&o.cdi_annotation_prefix, &p.cdi_annotation_prefix, || {
                "cdi.k8s.io/".into()
            }),
            nvidia_cdi_hook_path: pick(&o.nvidia_cdi_hook_path, &p.nvidia_ctk_path, || {
                "/usr/bin/nvidia-ctk".into()
            }),
            container_driver_root: pick(&o.driver_root_ctr_path, &p.container_driver_root, || {
                "/driver-root".into()
            }),
            mps_root: o
                .mps_root
                .clone()
                .or_else(|| f.mps_root.clone())
                .filter(|r| !r.is_empty()),
            gdrcopy_enabled: pick(&o.gdrcopy_enabled, &f.gdrcopy_enabled, || false),
            gds_enabled: pick(&o.gds_enabled, &f.gds_enabled, || false),
            mofed_enabled: pick(&o.mofed_enabled, &f.mofed_enabled, || false),
            sharing: cfg.sharing(),
            shared_devices_allocation_policy: pick(
                &o.shared_devices_allocation_policy,
                &p.shared_devices_allocation_policy,
                AllocationPolicy::default,
            ),
            imex_channels: cfg.imex.channel_ids.clone(),
            driver_root,
            dev_root,
        };
        if s.device_list_strategies.is_empty() {
            return Err(SettingsError(
                "invalid --device-list-strategy option: invalid strategy: ".into(),
            ));
        }
        if s.sharing.strategy == SharingStrategy::Mps {
            if s.mig_strategy == MigStrategy::Mixed {
                return Err(SettingsError(
                    "using --mig-strategy=mixed is not supported with MPS".into(),
                ));
            }
            if s.mps_root.is_none() {
                return Err(SettingsError(
                    "using MPS requires --mps-root to be specified".into(),
                ));
            }
        }
        Ok(s)
    }

    /// True when a CDI strategy is enabled (then the CDI spec is written).
    #[must_use]
    pub fn uses_cdi(&self) -> bool {
        self.device_list_strategies.iter().any(|s| s.is_cdi())
    }
}

fn pick<T: Clone>(flag: &Option<T>, file: &Option<T>, default: impl FnOnce() -> T) -> T {
    flag.clone()
        .or_else(|| file.clone())
        .unwrap_or_else(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_beat_the_file_which_beats_defaults() {
        let cfg = Config::from_yaml(
            "flags: {migStrategy: mixed, nvidiaDriverRoot: /run/nvidia/driver, \
             plugin: {deviceIDStrategy: index}}",
        )
        .unwrap();
        let s = Settings::resolve(&Overrides::default(), &cfg).unwrap();
        assert_eq!(s.mig_strategy, MigStrategy::Mixed);
        assert_eq!(s.dev_root, "/run/nvidia/driver");
        assert_eq!(s.device_id_strategy, DeviceIdStrategy::Index);
        assert_eq!(s.device_list_strategies, [DeviceListStrategy::Envvar]);
        assert!(s.fail_on_init_error);
        let o = Overrides {
            mig_strategy: Some(MigStrategy::None),
            dev_root: Some("/".into()),
            ..Overrides::default()
        };
        let s = Settings::resolve(&o, &cfg).unwrap();
        assert_eq!(s.mig_strategy, MigStrategy::None);
        assert_eq!(s.dev_root, "/");
        assert_eq!(s.driver_root, "/run/nvidia/driver");
    }

    #[test]
    fn driver_ready_fills_only_unset_roots() {
        let host = "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/host\n\
                    NVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n";
        let mut o = Overrides::default();
        assert_eq!(
            o.fill_from_driver_ready(host),
            ["driver_root", "driver_root_ctr_path", "dev_root"]
        );
        let s = Settings::resolve(&o, &Config::default()).unwrap();
        assert_eq!(
            (s.driver_root.as_str(), s.container_driver_root.as_str()),
            ("/", "/host")
        );
        assert_eq!(s.dev_root, "/");

        let ctr = "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\n\
                   DRIVER_ROOT_CTR_PATH=/run/nvidia/driver\nNVIDIA_DEV_ROOT=/\n";
        let mut o = Overrides {
            driver_root_ctr_path: Some("/driver-root".into()),
            ..Overrides::default()
        };
        assert_eq!(o.fill_from_driver_ready(ctr), ["driver_root", "dev_root"]);
        let s = Settings::resolve(&o, &Config::default()).unwrap();
        assert_eq!(s.driver_root, "/run/nvidia/driver");
        assert_eq!(s.container_driver_root, "/driver-root");
        assert_eq!(s.dev_root, "/");

        let mut o = Overrides::default();
        assert!(
            o.fill_from_driver_ready("garbage\nNVIDIA_DRIVER_ROOT=\n")
                .is_empty()
        );
        assert_eq!(o.driver_root, None);
    }

    #[test]
    fn mps_needs_a_root_and_no_mixed() {
        let cfg =
            Config::from_yaml("sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}").unwrap();
        let e = Settings::resolve(&Overrides::default(), &cfg).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unable to validate flags: using MPS requires --mps-root to be specified"
        );
        let o = Overrides {
            mps_root: Some("/run/nvidia/mps".into()),
            mig_strategy: Some(MigStrategy::Mixed),
            ..Overrides::default()
        };
        assert_eq!(
            Settings::resolve(&o, &cfg).unwrap_err().0,
            "using --mig-strategy=mixed is not supported with MPS"
        );
    }
}
