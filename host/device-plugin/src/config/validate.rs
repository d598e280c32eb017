//! Checks upstream makes after decoding (§2.4, with its exact messages), then upstream's
//! `DisableResourceNamingInConfig` (§2.5).

use serde_yaml_ng::Value;

use super::{Config, ConfigError, SharingSpec, qualify_resource_name};

/// The most replicas one shared resource may advertise per physical device: 1024. Upstream
/// has no bound; each replica is a kubelet device entry (and ~100 bytes of every
/// ListAndWatch message), so `100000000` replicas exhausted memory without a log line. A
/// larger value is refused with `number of replicas must be <= 1024`.
pub const MAX_REPLICAS: i64 = 1024;

/// Validates `cfg` in place and applies the §2.5 resets.
pub(super) fn validate(cfg: &mut Config) -> Result<(), ConfigError> {
    match cfg.version.as_deref() {
        None | Some("" | "v1") => cfg.version = Some("v1".into()),
        Some(v) => {
            return Err(ConfigError::invalid(
                "version",
                format!("unknown version: {v}"),
            ));
        }
    }
    if let Some(res) = cfg.resources.take() {
        for (kind, list) in [("gpus", &res.gpus), ("mig", &res.mig)] {
            for (i, r) in list.iter().enumerate() {
                let path = format!("resources.{kind}[{i}]");
                if r.pattern.as_deref().is_none_or(str::is_empty) {
                    return Err(ConfigError::invalid(
                        path,
                        "resources must have a 'pattern' field set",
                    ));
                }
                if r.name.as_deref().is_none_or(str::is_empty) {
                    return Err(ConfigError::invalid(
                        path,
                        "resources must have a 'name' field set",
                    ));
                }
            }
        }
        tracing::warn!(
            "Customizing the 'resources' field is not yet supported in the config. Ignoring..."
        );
    }
    if cfg.sharing.time_slicing.is_some() && cfg.sharing.mps.is_some() {
        return Err(ConfigError::invalid(
            "sharing",
            "sharing.timeSlicing and sharing.mps are mutually exclusive; set only one",
        ));
    }
    if let Some(ts) = cfg.sharing.time_slicing.as_mut() {
        validate_sharing(ts, "sharing.timeSlicing")?;
    }
    if let Some(mps) = cfg.sharing.mps.as_mut() {
        validate_sharing(mps, "sharing.mps")?;
        // Upstream forces this for MPS (v0.17–v0.19).
        mps.fail_requests_greater_than_one = true;
    }
    let ids = &cfg.imex.channel_ids;
    if !(ids.is_empty() || ids == &[0]) {
        let found: Vec<String> = ids.iter().map(u32::to_string).collect();
        return Err(ConfigError::invalid(
            "imex.channelIDs",
            format!(
                "invalid IMEX config: channelIDs must be [] or [0]; found [{}]",
                found.join(" ")
            ),
        ));
    }
    Ok(())
}

fn validate_sharing(spec: &mut SharingSpec, path: &str) -> Result<(), ConfigError> {
    let resources = match spec.resources.as_mut() {
        Some(r) if !r.is_empty() => r,
        _ => {
            return Err(ConfigError::invalid(
                format!("{path}.resources"),
                "no resources specified",
            ));
        }
    };
    for (i, r) in resources.iter_mut().enumerate() {
        let at = format!("{path}.resources[{i}]");
        let name = match r.name.as_deref() {
            Some(n) if !n.is_empty() => qualify_resource_name(n),
            _ => {
                return Err(ConfigError::invalid(
                    format!("{at}.name"),
                    "no resource name specified",
                ));
            }
        };
        check_resource_name(&name).map_err(|m| ConfigError::invalid(format!("{at}.name"), m))?;
        match r.replicas {
            None => {
                return Err(ConfigError::invalid(
                    format!("{at}.replicas"),
                    "no replicas specified",
                ));
            }
            Some(n) if n < 2 => {
                return Err(ConfigError::invalid(
                    format!("{at}.replicas"),
                    "number of replicas must be >= 2",
                ));
            }
            Some(n) if n > MAX_REPLICAS => {
                return Err(ConfigError::invalid(
                    format!("{at}.replicas"),
                    format!("number of replicas must be <= {MAX_REPLICAS} (got {n})"),
                ));
            }
            Some(_) => {}
        }
        if let Some(d) = &r.devices {
            check_devices(d).map_err(|m| ConfigError::invalid(format!("{at}.devices"), m))?;
            if !matches!(d, Value::String(s) if s == "all") {
                tracing::warn!(
                    "Customizing the 'devices' field in {path}.resources is not yet supported in the config. Ignoring..."
                );
            }
        }
        let derived = spec.rename_by_default.then(|| format!("{name}.shared"));
        if let Some(d) = &derived {
            check_resource_name(d).map_err(|m| ConfigError::invalid(format!("{at}.name"), m))?;
        }
        if r.rename.is_some() && r.rename != derived {
            tracing::warn!(
                "Setting the 'rename' field in {path}.resources is not yet supported in the config. Ignoring..."
            );
        }
        r.name = Some(name);
        r.rename = derived;
        r.devices = None;
    }
    Ok(())
}

/// Upstream's resource-name rules: ≤ 63 characters in all, and the part after the first `/`
/// a lowercase RFC 1123 subdomain.
pub(crate) fn check_resource_name(name: &str) -> Result<(), String> {
    if name.len() > 63 {
        return Err(format!(
            "fully-qualified resource name must be 63 characters or less: {name}"
        ));
    }
    let suffix = name.split_once('/').map_or(name, |(_, s)| s);
    if !kiln_input::k8s::is_dns1123_subdomain(suffix) {
        return Err(format!(
            "incorrect format for resource name '{name}': [a lowercase RFC 1123 subdomain must \
             consist of lower case alphanumeric characters, '-' or '.', and must start and end \
             with an alphanumeric character (e.g. 'example.com', regex used for validation is \
             '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')]"
        ));
    }
    Ok(())
}

fn check_devices(d: &Value) -> Result<(), String> {
    match d {
        Value::String(s) if s == "all" => Ok(()),
        Value::String(s) => Err(format!(
            "devices set as '{s}' but the only valid string input is 'all'"
        )),
        Value::Number(n) if n.as_i64().is_some_and(|c| c > 0) => Ok(()),
        Value::Number(n) => Err(format!(
            "devices set as '{n}' but a count of devices must be > 0"
        )),
        Value::Sequence(items) => {
            for item in items {
                let ok = match item {
                    Value::Number(n) => n.as_u64().is_some(),
                    Value::String(_) => true,
                    _ => false,
                };
                if !ok {
                    return Err(format!(
                        "unsupported type for device in devices list: {item:?}"
                    ));
                }
            }
            Ok(())
        }
        other => Err(format!("unrecognized type for devices spec: {other:?}")),
    }
}
