//! Opaque per-claim device configuration for `gpu.nvidia.com`, as NVIDIA's DRA driver accepts
//! it: `apiVersion: resource.nvidia.com/v1beta1`, `kind: GpuConfig` (or `MigDeviceConfig` for
//! MIG devices) with `sharing: {strategy: TimeSlicing|MPS, timeSlicingConfig: {interval},
//! mpsConfig: {…}}`.
//!
//! Which config applies to a device follows the DRA API and NVIDIA's driver: configs from the
//! DeviceClass come first, then the claim's; a config naming `requests` applies to the devices
//! of those requests (a sub-request `req/sub` matches `req`), one without applies to all; the
//! last match wins. No config means time-slicing at the `Default` interval (NVIDIA's default
//! `GpuConfig`), which needs nothing applied.
//!
//! kiln applies time-slicing (the interval set on the GPU through [`SharingApplier`]) and
//! refuses MPS with a reason: MPS needs a per-claim MPS control daemon, which kiln's plugin
//! does not start.

use k8s_openapi::api::resource::v1::DeviceAllocationConfiguration;
use serde::{Deserialize, Serialize};

/// The opaque config's API version.
pub const API_VERSION: &str = "resource.nvidia.com/v1beta1";

/// A time-slice length, NVIDIA's names (`Default`, `Short`, `Medium`, `Long`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSlice {
    /// The driver's default.
    Default,
    /// Short.
    Short,
    /// Medium.
    Medium,
    /// Long.
    Long,
}

impl TimeSlice {
    /// The value `nvidia-smi compute-policy --set-timeslice` takes (0 to 3).
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            Self::Default => 0,
            Self::Short => 1,
            Self::Medium => 2,
            Self::Long => 3,
        }
    }
}

/// What a prepared device shares, recorded in the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Sharing {
    /// Time-slicing at this interval.
    TimeSlicing(TimeSlice),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    sharing: Option<RawSharing>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawSharing {
    strategy: String,
    #[serde(default)]
    time_slicing_config: Option<RawTimeSlicing>,
    #[serde(default)]
    mps_config: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeSlicing {
    #[serde(default)]
    interval: Option<String>,
}

/// Parses one opaque config's parameters (JSON) for a device of type `device_type` (`gpu` or
/// `mig`) into what to apply.
///
/// # Errors
/// The reason it is refused, in words for the claim's user: another API version, a kind other
/// than `GpuConfig` (full GPUs) or `MigDeviceConfig` (MIG devices), an unknown strategy or
/// interval, a config for the other strategy, and MPS (not run by kiln's plugin).
pub fn parse(parameters: &serde_json::Value, device_type: &str) -> Result<Sharing, String> {
    let raw: Raw = serde_json::from_value(parameters.clone())
        .map_err(|e| format!("invalid {API_VERSION} config: {e}"))?;
    if raw.api_version.as_deref() != Some(API_VERSION) {
        return Err(format!(
            "unsupported config apiVersion {:?}: expected {API_VERSION}",
            raw.api_version.unwrap_or_default()
        ));
    }
    let kind = raw.kind.unwrap_or_default();
    let expected = if device_type == crate::slices::MIG_TYPE {
        "MigDeviceConfig"
    } else {
        "GpuConfig"
    };
    if kind != expected {
        return Err(format!(
            "config kind {kind:?} does not apply to a {device_type} device (expected {expected})"
        ));
    }
    let Some(s) = raw.sharing else {
        return Ok(Sharing::TimeSlicing(TimeSlice::Default));
    };
    match s.strategy.as_str() {
        "TimeSlicing" => {
            if s.mps_config.is_some() {
                return Err("cannot use mpsConfig with the TimeSlicing strategy".into());
            }
            if device_type == crate::slices::MIG_TYPE {
                return Err("MIG devices cannot be time-sliced (strategy TimeSlicing)".into());
            }
            let interval = match s
                .time_slicing_config
                .and_then(|t| t.interval)
                .as_deref()
                .unwrap_or("Default")
            {
                "Default" => TimeSlice::Default,
                "Short" => TimeSlice::Short,
                "Medium" => TimeSlice::Medium,
                "Long" => TimeSlice::Long,
                other => {
                    return Err(format!(
                        "unknown time-slice interval {other:?} (Default, Short, Medium, Long)"
                    ));
                }
            };
            Ok(Sharing::TimeSlicing(interval))
        }
        "MPS" => {
            if s.time_slicing_config.is_some() {
                return Err("cannot use timeSlicingConfig with the MPS strategy".into());
            }
            Err(
                "MPS sharing is not supported by kiln's DRA plugin (it does not run an MPS \
                 control daemon per claim); use strategy TimeSlicing, or NVIDIA's kubelet plugin"
                    .into(),
            )
        }
        other => Err(format!(
            "unknown sharing strategy {other:?} (TimeSlicing, MPS)"
        )),
    }
}

/// The parameters of the config that applies to the device allocated for `request` (see the
/// module docs), from the allocation's configs in their order (class configs first, as the
/// scheduler writes them). `None`: no config for this driver and request.
#[must_use]
pub fn applicable<'a>(
    configs: &'a [DeviceAllocationConfiguration],
    request: &str,
) -> Option<&'a serde_json::Value> {
    let base = request.split('/').next().unwrap_or(request);
    let ordered = configs
        .iter()
        .filter(|c| c.source == "FromClass")
        .chain(configs.iter().filter(|c| c.source != "FromClass"));
    let mut found = None;
    for c in ordered {
        let Some(opaque) = c.opaque.as_ref() else {
            continue;
        };
        if opaque.driver != crate::DRIVER_NAME {
            continue;
        }
        let applies = match c.requests.as_deref() {
            None | Some([]) => true,
            Some(rs) => rs.iter().any(|r| r == request || r == base),
        };
        if applies {
            found = Some(&opaque.parameters.0);
        }
    }
    found
}

/// Applies a device's sharing on the node.
pub trait SharingApplier: Send + Sync {
    /// Sets the time-slice of GPU `uuid`.
    ///
    /// # Errors
    /// Why it could not be set.
    fn set_time_slice(&self, uuid: &str, slice: TimeSlice) -> Result<(), String>;
}

/// The real applier: `nvidia-smi compute-policy -i <uuid> --set-timeslice=<0..3>`, as NVIDIA's
/// driver does (the plugin sets `Default` back when a claim that changed it is unprepared).
#[derive(Debug, Clone)]
pub struct NvidiaSmi {
    /// The `nvidia-smi` executable.
    pub path: std::path::PathBuf,
}

impl SharingApplier for NvidiaSmi {
    fn set_time_slice(&self, uuid: &str, slice: TimeSlice) -> Result<(), String> {
        let out = std::process::Command::new(&self.path)
            .args([
                "compute-policy",
                "-i",
                uuid,
                &format!("--set-timeslice={}", slice.code()),
            ])
            .output()
            .map_err(|e| format!("running {}: {e}", self.path.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} compute-policy failed ({}): {}",
                self.path.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

/// An applier that records what it was asked (the fake GPU backend's, and tests').
#[derive(Debug, Default)]
pub struct Recorder {
    /// `(uuid, slice)` in call order.
    pub calls: std::sync::Mutex<Vec<(String, TimeSlice)>>,
}

impl SharingApplier for Recorder {
    fn set_time_slice(&self, uuid: &str, slice: TimeSlice) -> Result<(), String> {
        self.calls
            .lock()
            .map_err(|e| e.to_string())?
            .push((uuid.to_owned(), slice));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::resource::v1::OpaqueDeviceConfiguration, apimachinery::pkg::runtime::RawExtension,
    };
    use serde_json::json;

    use super::*;

    fn cfg(
        source: &str,
        requests: Option<&[&str]>,
        params: serde_json::Value,
    ) -> DeviceAllocationConfiguration {
        DeviceAllocationConfiguration {
            source: source.into(),
            requests: requests.map(|r| r.iter().map(|s| (*s).to_owned()).collect()),
            opaque: Some(OpaqueDeviceConfiguration {
                driver: crate::DRIVER_NAME.into(),
                parameters: RawExtension(params),
            }),
        }
    }

    #[test]
    fn time_slicing_is_accepted_and_mps_refused_with_a_reason() {
        let ts = json!({"apiVersion": API_VERSION, "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}});
        assert_eq!(parse(&ts, "gpu"), Ok(Sharing::TimeSlicing(TimeSlice::Long)));
        let none = json!({"apiVersion": API_VERSION, "kind": "GpuConfig"});
        assert_eq!(
            parse(&none, "gpu"),
            Ok(Sharing::TimeSlicing(TimeSlice::Default))
        );
        let mps = json!({"apiVersion": API_VERSION, "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}});
        assert!(
            parse(&mps, "gpu")
                .unwrap_err()
                .contains("MPS sharing is not supported")
        );
        let bad = json!({"apiVersion": API_VERSION, "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}});
        assert!(parse(&bad, "gpu").unwrap_err().contains("Forever"));
        let other = json!({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"});
        assert!(parse(&other, "gpu").unwrap_err().contains("apiVersion"));
        assert!(parse(&none, "mig").unwrap_err().contains("MigDeviceConfig"));
        let mixed = json!({"apiVersion": API_VERSION, "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "mpsConfig": {}}});
        assert!(parse(&mixed, "gpu").is_err());
    }

    #[test]
    fn claim_configs_override_class_configs_per_request() {
        let class = cfg("FromClass", None, json!({"n": "class"}));
        let claim_all = cfg("FromClaim", None, json!({"n": "claim"}));
        let claim_b = cfg("FromClaim", Some(&["b"]), json!({"n": "b"}));
        // The claim's configs win over the class's even when listed first.
        let configs = [claim_all.clone(), class.clone(), claim_b];
        assert_eq!(applicable(&configs, "a"), Some(&json!({"n": "claim"})));
        assert_eq!(applicable(&configs, "b/sub"), Some(&json!({"n": "b"})));
        assert_eq!(applicable(&[class], "a"), Some(&json!({"n": "class"})));
        assert_eq!(applicable(&[], "a"), None);
    }
}
