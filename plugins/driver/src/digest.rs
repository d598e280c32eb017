//! `DRIVER_CONFIG_DIGEST` (gpu-operator.md §3.1 step 8; sensitivity rules of transform-cases.md
//! C20).
//!
//! This is **kiln's own digest**, not byte-compatible with upstream's (which hashes a Go
//! structure dump): a stable FNV-1a-32 over a line-oriented canonical text of the
//! install-relevant fields of the final pod spec, written as 8 lowercase hex digits. Taking over
//! from the upstream operator therefore changes the value once (one driver-upgrade cycle).
//!
//! Hashed, in this order, skipping zero/empty fields:
//! - for each recognized container (init container `k8s-driver-manager`; containers
//!   `nvidia-driver-ctr`, `nvidia-peermem*`, `nvidia-fs*`, `nvidia-gdrcopy*`,
//!   `openshift-driver-toolkit-ctr`), in pod order: name, image, command, args, plain env
//!   sorted by name (`valueFrom` entries and `DRIVER_CONFIG_DIGEST` itself skipped), `envFrom`
//!   Secret/ConfigMap references, volume mounts (name, mountPath, subPath);
//! - every pod volume: name and its source (hostPath path and type, ConfigMap/Secret name and
//!   items, …, as canonical JSON).
//!
//! Not hashed: resources, probes, security contexts, pull policies, tolerations, node
//! selectors, priority class, service account, hostPID, labels, annotations and containers with
//! other names.

use kiln_plugin_sdk::k8s_openapi::api::core::v1::{Container, PodSpec};

/// The env var carrying the digest.
pub const ENV: &str = "DRIVER_CONFIG_DIGEST";

/// FNV-1a, 32 bit.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

fn recognized(name: &str, init: bool) -> bool {
    if init {
        return name == "k8s-driver-manager";
    }
    name == "nvidia-driver-ctr"
        || name == "openshift-driver-toolkit-ctr"
        || ["nvidia-peermem", "nvidia-fs", "nvidia-gdrcopy"]
            .iter()
            .any(|p| name.starts_with(p))
}

fn line(out: &mut String, key: &str, value: &str) {
    if !value.is_empty() {
        out.push_str(key);
        out.push('=');
        out.push_str(value);
        out.push('\n');
    }
}

fn container(out: &mut String, kind: &str, c: &Container) {
    line(out, kind, &c.name);
    line(out, "image", c.image.as_deref().unwrap_or_default());
    for a in c.command.iter().flatten() {
        line(out, "command", a);
    }
    for a in c.args.iter().flatten() {
        line(out, "arg", a);
    }
    let mut env: Vec<(&str, &str)> = c
        .env
        .iter()
        .flatten()
        .filter(|e| e.value_from.is_none() && e.name != ENV)
        .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default()))
        .collect();
    env.sort();
    for (k, v) in env {
        line(out, "env", &format!("{k}={v}"));
    }
    for f in c.env_from.iter().flatten() {
        if let Some(s) = &f.secret_ref {
            line(out, "envFromSecret", &s.name);
        }
        if let Some(m) = &f.config_map_ref {
            line(out, "envFromConfigMap", &m.name);
        }
    }
    for m in c.volume_mounts.iter().flatten() {
        let sub = m.sub_path.as_deref().unwrap_or_default();
        line(out, "mount", &format!("{}:{}:{sub}", m.name, m.mount_path));
    }
}

/// The canonical text the digest is computed from (exposed for tests and debugging).
pub fn canonical(pod: &PodSpec) -> String {
    let mut out = String::new();
    for c in pod.init_containers.iter().flatten() {
        if recognized(&c.name, true) {
            container(&mut out, "init", c);
        }
    }
    for c in &pod.containers {
        if recognized(&c.name, false) {
            container(&mut out, "container", c);
        }
    }
    for v in pod.volumes.iter().flatten() {
        let mut src = kiln_plugin_sdk::serde_json::to_value(v).unwrap_or_default();
        if let Some(o) = src.as_object_mut() {
            o.remove("name");
        }
        line(&mut out, "volume", &format!("{}:{src}", v.name));
    }
    out
}

/// The digest of `pod` as 8 lowercase hex digits.
pub fn digest(pod: &PodSpec) -> String {
    format!("{:08x}", fnv1a32(canonical(pod).as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_reference_values() {
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }
}
