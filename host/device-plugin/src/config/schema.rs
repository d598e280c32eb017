//! The v1 document as Rust types. Every key is optional (upstream fills defaults later, and a
//! CLI flag or env var overrides a file value), unknown keys are rejected.

use std::{fmt, str::FromStr, time::Duration};

use serde::{Deserialize, Deserializer};

/// The whole config file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// `v1` (empty means `v1`); anything else is `unknown version: <v>`.
    pub version: Option<String>,
    /// Flags that CLI flags and env vars override.
    pub flags: Flags,
    /// Custom resource naming; upstream parses then drops it (§2.5), so do we. Always `None`
    /// after [`Config::from_yaml`](crate::config::Config::from_yaml).
    pub resources: Option<Resources>,
    /// GPU sharing (time-slicing or MPS).
    pub sharing: SharingSpecs,
    /// IMEX channels.
    pub imex: Imex,
}

/// `flags:`; `None` means "not set in the file".
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Flags {
    /// `migStrategy`, default `none`.
    pub mig_strategy: Option<MigStrategy>,
    /// `failOnInitError`, default `true`.
    pub fail_on_init_error: Option<bool>,
    /// `mpsRoot`, the host directory of the MPS daemon's pipes and shm.
    pub mps_root: Option<String>,
    /// `nvidiaDriverRoot`, default `/`: host path of the driver installation.
    pub nvidia_driver_root: Option<String>,
    /// `nvidiaDevRoot`, defaults to the driver root: host path above `/dev`.
    pub nvidia_dev_root: Option<String>,
    /// `gdrcopyEnabled`.
    pub gdrcopy_enabled: Option<bool>,
    /// `gdsEnabled`.
    pub gds_enabled: Option<bool>,
    /// `mofedEnabled`.
    pub mofed_enabled: Option<bool>,
    /// `useNodeFeatureAPI` (GFD only).
    #[serde(rename = "useNodeFeatureAPI")]
    pub use_node_feature_api: Option<bool>,
    /// `deviceDiscoveryStrategy`: `auto`, `nvml`, `tegra` (GFD also `vfio`).
    pub device_discovery_strategy: Option<String>,
    /// `plugin:` flags.
    pub plugin: PluginFlags,
    /// `gfd:` flags.
    pub gfd: GfdFlags,
}

/// `flags.plugin:`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct PluginFlags {
    /// `passDeviceSpecs`, default `false`.
    pub pass_device_specs: Option<bool>,
    /// `deviceListStrategy`: a string or a list of strings, default `[envvar]`.
    #[serde(deserialize_with = "list_strategies")]
    pub device_list_strategy: Option<Vec<DeviceListStrategy>>,
    /// `deviceIDStrategy`, default `uuid`.
    #[serde(rename = "deviceIDStrategy")]
    pub device_id_strategy: Option<DeviceIdStrategy>,
    /// `cdiAnnotationPrefix`, default `cdi.k8s.io/`.
    pub cdi_annotation_prefix: Option<String>,
    /// `nvidiaCTKPath`, default `/usr/bin/nvidia-ctk`.
    #[serde(rename = "nvidiaCTKPath")]
    pub nvidia_ctk_path: Option<String>,
    /// `containerDriverRoot`, default `/driver-root`.
    pub container_driver_root: Option<String>,
    /// `sharedDevicesAllocationPolicy` (v0.20): how GetPreferredAllocation spreads replicas and
    /// MIG devices, default `distributed`.
    pub shared_devices_allocation_policy: Option<AllocationPolicy>,
}

/// `flags.gfd:` (read by GFD; kept here so the file has one schema).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct GfdFlags {
    /// `oneshot`.
    pub oneshot: Option<bool>,
    /// `noTimestamp`.
    pub no_timestamp: Option<bool>,
    /// `sleepInterval`: a Go duration string (`60s`, `1m30s`), a number of nanoseconds, or
    /// `infinite`; at most [`kiln_input::MAX_DURATION`] (366 days).
    pub sleep_interval: Option<SleepInterval>,
    /// `outputFile`.
    pub output_file: Option<String>,
    /// `machineTypeFile`.
    pub machine_type_file: Option<String>,
}

/// `resources:` (dropped after parsing, as upstream does).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Resources {
    /// Full-GPU patterns.
    pub gpus: Vec<ResourcePattern>,
    /// MIG profile patterns.
    pub mig: Vec<ResourcePattern>,
}

/// One `resources.gpus[]` / `resources.mig[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourcePattern {
    /// Glob over product names or MIG profiles.
    pub pattern: Option<String>,
    /// Resource name.
    pub name: Option<String>,
}

/// `sharing:`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct SharingSpecs {
    /// `timeSlicing:`.
    pub time_slicing: Option<SharingSpec>,
    /// `mps:`.
    pub mps: Option<SharingSpec>,
}

/// `sharing.timeSlicing:` or `sharing.mps:`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct SharingSpec {
    /// Advertise shared resources as `<name>.shared`.
    pub rename_by_default: bool,
    /// Refuse Allocate requests for more than one replica (always on for MPS).
    pub fail_requests_greater_than_one: bool,
    /// The shared resources; required and non-empty.
    pub resources: Option<Vec<SharedResourceSpec>>,
}

/// One `sharing.*.resources[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SharedResourceSpec {
    /// Resource name; `gpu` is qualified to `nvidia.com/gpu`.
    pub name: Option<String>,
    /// Replicas per physical device, ≥ 2.
    pub replicas: Option<i64>,
    /// Ignored like upstream (derived from `renameByDefault`); a warning is logged.
    pub rename: Option<String>,
    /// `all`, a count > 0, or a list of indexes/UUIDs; checked, then reset to `all`.
    pub devices: Option<serde_yaml_ng::Value>,
}

/// `imex:`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Imex {
    /// `channelIDs`: `[]` or `[0]`.
    #[serde(rename = "channelIDs")]
    pub channel_ids: Vec<u32>,
    /// Fail when the channels are missing.
    pub required: bool,
}

/// How MIG devices are advertised (`--mig-strategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum MigStrategy {
    /// Every GPU is `nvidia.com/gpu`, MIG or not.
    #[default]
    None,
    /// All MIG devices are `nvidia.com/gpu` (one profile per node).
    Single,
    /// One resource per profile, `nvidia.com/mig-<profile>`.
    Mixed,
}

/// What Allocate hands to the runtime (`--device-list-strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub enum DeviceListStrategy {
    /// `NVIDIA_VISIBLE_DEVICES=<ids>`.
    Envvar,
    /// `/dev/null` mounts under `/var/run/nvidia-container-devices/<id>`.
    VolumeMounts,
    /// A `cdi.k8s.io/…` annotation naming the CDI devices.
    CdiAnnotations,
    /// The CRI `cdi_devices` field.
    CdiCri,
}

/// Which ids reach the runtime (`--device-id-strategy`); the kubelet always sees UUIDs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum DeviceIdStrategy {
    /// `GPU-…` / `MIG-…`.
    #[default]
    Uuid,
    /// `0`, `1:0`, ….
    Index,
}

/// How GetPreferredAllocation picks replicas of shared GPUs and MIG devices
/// (`--shared-devices-allocation-policy`, v0.20).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum AllocationPolicy {
    /// The GPU with the fewest replicas already allocated first: spreads pods over GPUs.
    #[default]
    Distributed,
    /// The GPU with the most replicas already allocated first: fills one GPU before the next.
    Packed,
}

/// GFD's `sleepInterval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SleepInterval {
    /// Relabel every this long.
    Every(Duration),
    /// Label once and keep running (`infinite`).
    Infinite,
}

macro_rules! string_enum {
    ($ty:ty, $err:expr, { $($s:literal => $v:path),+ $(,)? }) => {
        impl FromStr for $ty {
            type Err = String;
            /// Parses the upstream spelling; the error is upstream's message.
            fn from_str(s: &str) -> Result<Self, String> {
                match s { $($s => Ok($v),)+ other => Err(format!($err, other)) }
            }
        }
        impl TryFrom<String> for $ty {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> { s.parse() }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self { $($v => $s,)+ })
            }
        }
    };
}

string_enum!(MigStrategy, "unknown MIG strategy: {}", {
    "none" => MigStrategy::None, "single" => MigStrategy::Single, "mixed" => MigStrategy::Mixed,
});
string_enum!(DeviceListStrategy, "invalid --device-list-strategy option: invalid strategy: {}", {
    "envvar" => DeviceListStrategy::Envvar,
    "volume-mounts" => DeviceListStrategy::VolumeMounts,
    "cdi-annotations" => DeviceListStrategy::CdiAnnotations,
    "cdi-cri" => DeviceListStrategy::CdiCri,
});
string_enum!(AllocationPolicy, "invalid --shared-devices-allocation-policy option: {}", {
    "distributed" => AllocationPolicy::Distributed, "packed" => AllocationPolicy::Packed,
});
string_enum!(DeviceIdStrategy, "invalid --device-id-strategy option: {}", {
    "uuid" => DeviceIdStrategy::Uuid, "index" => DeviceIdStrategy::Index,
});

impl DeviceListStrategy {
    /// True for the two CDI strategies.
    #[must_use]
    pub fn is_cdi(self) -> bool {
        matches!(self, Self::CdiAnnotations | Self::CdiCri)
    }

    /// Parses a comma-separated list (the env var form, `envvar,cdi-cri`), sorted and without
    /// duplicates.
    ///
    /// # Errors
    /// Upstream's `invalid --device-list-strategy option: invalid strategy: <s>`.
    pub fn parse_list(s: &str) -> Result<Vec<Self>, String> {
        let mut out = s
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::parse)
            .collect::<Result<Vec<Self>, _>>()?;
        out.sort();
        out.dedup();
        Ok(out)
    }
}

fn list_strategies<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<DeviceListStrategy>>, D::Error> {
    use serde::de::Error;
    let v = serde_yaml_ng::Value::deserialize(d)?;
    let names: Vec<String> = match v {
        serde_yaml_ng::Value::Null => return Ok(None),
        serde_yaml_ng::Value::String(s) => vec![s],
        serde_yaml_ng::Value::Sequence(items) => items
            .into_iter()
            .map(|i| match i {
                serde_yaml_ng::Value::String(s) => Ok(s),
                other => Err(D::Error::custom(format!(
                    "invalid deviceListStrategy: {other:?} is not a string"
                ))),
            })
            .collect::<Result<_, _>>()?,
        other => {
            return Err(D::Error::custom(format!(
                "invalid deviceListStrategy: {other:?} is neither a string nor a list of strings"
            )));
        }
    };
    if names.is_empty() {
        // Refused here, where the error gets the file and the field path, not later in the
        // settings (which named neither).
        return Err(D::Error::custom(
            "invalid deviceListStrategy: an empty list (give at least one strategy, or leave \
             the field out for the default envvar)",
        ));
    }
    let mut out = names
        .iter()
        .map(|n| n.parse().map_err(D::Error::custom))
        .collect::<Result<Vec<DeviceListStrategy>, _>>()?;
    out.sort();
    out.dedup();
    Ok(Some(out))
}

impl<'de> Deserialize<'de> for SleepInterval {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match serde_yaml_ng::Value::deserialize(d)? {
            serde_yaml_ng::Value::Number(n) => n
                .as_u64()
                .ok_or_else(|| format!("invalid sleepInterval: {n}"))
                .and_then(|ns| {
                    kiln_input::duration::check_max(
                        Duration::from_nanos(ns),
                        kiln_input::MAX_DURATION,
                        &format!("{ns}ns"),
                    )
                    .map_err(|e| format!("invalid sleepInterval: {e}"))
                })
                .and_then(Self::every)
                .map_err(D::Error::custom),
            serde_yaml_ng::Value::String(s) => s.parse().map_err(D::Error::custom),
            other => Err(D::Error::custom(format!(
                "invalid sleepInterval: {other:?}"
            ))),
        }
    }
}

impl FromStr for SleepInterval {
    type Err = String;

    /// `infinite`, or a Go duration of at most [`kiln_input::MAX_DURATION`]
    /// ([`kiln_input::parse_go_duration`]: `1h30m`, `1.5s`). The error starts with
    /// `invalid sleepInterval: `, then Go's message or the bound.
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "infinite" {
            return Ok(Self::Infinite);
        }
        kiln_input::parse_go_duration(s, kiln_input::MAX_DURATION)
            .map_err(|e| format!("invalid sleepInterval: {e}"))
            .and_then(Self::every)
    }
}

impl SleepInterval {
    /// The shortest interval between two label passes: 1 s (a shorter one, `0s` say, would
    /// rewrite the labels in a busy loop).
    pub const MIN: Duration = Duration::from_secs(1);

    /// `Every(d)` when `d` is at least [`SleepInterval::MIN`].
    fn every(d: Duration) -> Result<Self, String> {
        if d < Self::MIN {
            return Err(format!(
                "invalid sleepInterval: {d:?} is shorter than the minimum 1s"
            ));
        }
        Ok(Self::Every(d))
    }
}
