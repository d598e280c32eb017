//! `DRIVER_CONFIG_DIGEST`: the digest of a driver pod's install-relevant configuration, computed
//! exactly as NVIDIA GPU Operator v26.7.0 computes it (`shared/reference/driver-config-digest.md`),
//! so that taking over a cluster from NVIDIA's operator leaves every driver pod template as it is.
//!
//! The driver manager and the driver container compare the value with what is installed on the
//! node to choose between a fast path and a full reinstall; a different value for the same
//! configuration would reinstall the driver on every node.
//!
//! Upstream's rule, restated:
//! 1. From the **final** driver pod spec (every transform applied, the digest env itself left
//!    out) an "install state" record is read. For a ClusterPolicy DaemonSet only these of its
//!    fields can be non-zero (the others — `CertConfig`, `DriverType`, `HTTPProxy`, `KernelVersion`,
//!    `UsePrecompiled`, … — are filled only for NVIDIADriver CRs and are always skipped):
//!    - init container `k8s-driver-manager`: `DriverManagerImage` (image), `ManagerEnv` (env);
//!    - container `nvidia-driver-ctr`: `DriverImage`, `DriverCommand`, `DriverArgs`,
//!      `DriverEnv` (env), `SecretEnvSource` (name of its last `envFrom.secretRef`),
//!      `AdditionalVolumeMounts` (all its mounts);
//!    - `nvidia-peermem-ctr`: `PeermemImage`, `GPUDirectRDMAEnabled`; `nvidia-fs-ctr`: `GDSImage`,
//!      `GDSEnabled`, `GDSEnv`; `nvidia-gdrcopy-ctr`: `GDRCopyImage`, `GDRCopyEnabled`,
//!      `GDRCopyEnv`; `openshift-driver-toolkit-ctr`: `DTKImage`, `DTKEnabled`;
//!    - `AdditionalVolumes` (all pod volumes), `HostRoot` (hostPath of the volume `host-root`).
//!
//!    Env lists keep entries without `valueFrom` as `{Name, Value}`, sorted by name; mounts are
//!    `{Name, MountPath, SubPath, ReadOnly}` sorted by name, then mount path; volumes are
//!    `{Name, ConfigMapName, SecretName, HostPath}` (empty where the source is another kind),
//!    sorted by name.
//! 2. The record is written field by field in byte order of the field names, skipping zero
//!    fields (empty string, `false`, empty list), each as `Name:` and a go-spew `%#v`-style
//!    rendering: `(string)v`, `(bool)true`, `([]string)[a b]`,
//!    `([]config.EnvVar)[{Name:(string)A Value:(string)1} …]`, … with no separators.
//! 3. The digest is FNV-1a 32-bit of those bytes, as an unsigned decimal integer
//!    (e.g. `3379408550` for NVIDIA's sample ClusterPolicy).
//!
//! An NVIDIADriver's pods carry the digest of the same record type, filled from the CR and the
//! cluster facts instead of the final pod spec (upstream `buildDriverInstallConfig`): see
//! [`crate::spec::nvidiadriver::install_state`]. Both build an [`InstallState`], which writes
//! and hashes itself by rules 2 and 3.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, Volume, VolumeMount};

/// The env var carrying the digest (on `k8s-driver-manager`, `nvidia-driver-ctr` and
/// `openshift-driver-toolkit-ctr`).
pub const ENV: &str = "DRIVER_CONFIG_DIGEST";

/// Init container whose image and env are hashed.
const DRIVER_MANAGER: &str = "k8s-driver-manager";
/// The driver container.
const DRIVER: &str = "nvidia-driver-ctr";
const PEERMEM: &str = "nvidia-peermem-ctr";
const GDS: &str = "nvidia-fs-ctr";
const GDRCOPY: &str = "nvidia-gdrcopy-ctr";
const DTK: &str = "openshift-driver-toolkit-ctr";

/// FNV-1a, 32 bit (offset basis `0x811c9dc5`, prime `0x01000193`).
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// One value of the install-state record, rendered as upstream's dump renders it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// A string (`(string)v`).
    Str(String),
    /// A flag (`(bool)true`).
    Bool(bool),
    /// A string list (`([]string)[a b]`).
    Strings(Vec<String>),
    /// `(name, value)`, sorted by name.
    Env(Vec<(String, String)>),
    /// `(name, mountPath, subPath, readOnly)`, sorted by name then mount path.
    Mounts(Vec<(String, String, String, bool)>),
    /// `(name, configMapName, secretName, hostPath)`, sorted by name.
    Volumes(Vec<(String, String, String, String)>),
}

impl Field {
    /// Whether upstream skips the field (empty string, `false`, empty list).
    pub fn is_zero(&self) -> bool {
        match self {
            Field::Str(s) => s.is_empty(),
            Field::Bool(b) => !b,
            Field::Strings(v) => v.is_empty(),
            Field::Env(v) => v.is_empty(),
            Field::Mounts(v) => v.is_empty(),
            Field::Volumes(v) => v.is_empty(),
        }
    }

    /// Append upstream's rendering of the value to `out`.
    pub fn write(&self, out: &mut String) {
        // `write!` into a String cannot fail.
        match self {
            Field::Str(s) => {
                let _ = write!(out, "(string){s}");
            }
            Field::Bool(b) => {
                let _ = write!(out, "(bool){b}");
            }
            Field::Strings(v) => {
                let _ = write!(out, "([]string)[{}]", v.join(" "));
            }
            Field::Env(v) => {
                let items: Vec<String> = v
                    .iter()
                    .map(|(n, val)| format!("{{Name:(string){n} Value:(string){val}}}"))
                    .collect();
                let _ = write!(out, "([]config.EnvVar)[{}]", items.join(" "));
            }
            Field::Mounts(v) => {
                let items: Vec<String> = v
                    .iter()
                    .map(|(n, p, sub, ro)| {
                        format!(
                            "{{Name:(string){n} MountPath:(string){p} SubPath:(string){sub} ReadOnly:(bool){ro}}}"
                        )
                    })
                    .collect();
                let _ = write!(out, "([]config.VolumeMountConfig)[{}]", items.join(" "));
            }
            Field::Volumes(v) => {
                let items: Vec<String> = v
                    .iter()
                    .map(|(n, cm, secret, host)| {
                        format!(
                            "{{Name:(string){n} ConfigMapName:(string){cm} SecretName:(string){secret} HostPath:(string){host}}}"
                        )
                    })
                    .collect();
                let _ = write!(out, "([]config.VolumeConfig)[{}]", items.join(" "));
            }
        }
    }
}

/// An install state record: upstream's `DriverInstallState` fields by name (`DriverImage`,
/// `KernelModuleType`, `AdditionalVolumes`, …). [`InstallState::text`] writes the non-zero ones
/// in byte order of their names (rule 2), [`InstallState::digest`] hashes that (rule 3).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstallState(std::collections::BTreeMap<&'static str, Field>);

impl InstallState {
    /// Set field `name` to `value` (a zero value is kept but not written).
    pub fn set(&mut self, name: &'static str, value: Field) -> &mut Self {
        self.0.insert(name, value);
        self
    }

    /// The bytes upstream hashes, as text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        // A BTreeMap of `&str` iterates in byte order of the names, as upstream sorts them.
        for (name, value) in &self.0 {
            if !value.is_zero() {
                out.push_str(name);
                out.push(':');
                value.write(&mut out);
            }
        }
        out
    }

    /// FNV-1a 32 of [`InstallState::text`], as an unsigned decimal integer.
    pub fn digest(&self) -> String {
        fnv1a32(self.text().as_bytes()).to_string()
    }
}

/// `(name, value)` pairs as an env field: sorted by name (a stable sort, as upstream's).
pub fn env_field(pairs: impl IntoIterator<Item = (String, String)>) -> Field {
    let mut v: Vec<(String, String)> = pairs.into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Field::Env(v)
}

/// Volume mounts as upstream records them: `(name, mountPath, subPath, readOnly)`, sorted by
/// name, then mount path.
pub fn mounts_field(mounts: &[VolumeMount]) -> Field {
    let mut v: Vec<(String, String, String, bool)> = mounts
        .iter()
        .map(|m| {
            (
                m.name.clone(),
                m.mount_path.clone(),
                m.sub_path.clone().unwrap_or_default(),
                m.read_only.unwrap_or(false),
            )
        })
        .collect();
    v.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    Field::Mounts(v)
}

/// Volumes as upstream records them: `(name, configMapName, secretName, hostPath)` (empty where
/// the source is another kind), sorted by name.
pub fn volumes_field(volumes: &[Volume]) -> Field {
    let mut v: Vec<(String, String, String, String)> = volumes
        .iter()
        .map(|v| {
            (
                v.name.clone(),
                v.config_map
                    .as_ref()
                    .map(|c| c.name.clone())
                    .unwrap_or_default(),
                v.secret
                    .as_ref()
                    .and_then(|s| s.secret_name.clone())
                    .unwrap_or_default(),
                v.host_path
                    .as_ref()
                    .map(|h| h.path.clone())
                    .unwrap_or_default(),
            )
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Field::Volumes(v)
}

/// Plain env entries (no `valueFrom`, not the digest itself), sorted by name.
fn env(c: Option<&Container>) -> Field {
    env_field(
        c.and_then(|c| c.env.as_ref())
            .into_iter()
            .flatten()
            .filter(|e: &&EnvVar| e.value_from.is_none() && e.name != ENV)
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default())),
    )
}

fn image(c: Option<&Container>) -> Field {
    Field::Str(c.and_then(|c| c.image.clone()).unwrap_or_default())
}

/// The bytes upstream hashes for `pod` (see the module docs), as text. `pod` is the final
/// driver pod spec; a `DRIVER_CONFIG_DIGEST` env already on it is ignored.
pub fn install_state_text(pod: &PodSpec) -> String {
    let init = |name: &str| {
        pod.init_containers
            .iter()
            .flatten()
            .find(|c| c.name == name)
    };
    let ctr = |name: &str| pod.containers.iter().find(|c| c.name == name);
    let driver = ctr(DRIVER);
    let mounts = mounts_field(
        driver
            .and_then(|c| c.volume_mounts.as_deref())
            .unwrap_or_default(),
    );
    let volumes = volumes_field(pod.volumes.as_deref().unwrap_or_default());
    let host_root = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "host-root")
        .and_then(|v| v.host_path.as_ref())
        .map(|h| h.path.clone())
        .unwrap_or_default();
    let secret_env = driver
        .and_then(|c| c.env_from.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|f| f.secret_ref.as_ref())
        .next_back()
        .map(|s| s.name.clone())
        .unwrap_or_default();
    let strings = |v: Option<&Vec<String>>| Field::Strings(v.cloned().unwrap_or_default());
    let fields: [(&'static str, Field); 20] = [
        ("AdditionalVolumeMounts", mounts),
        ("AdditionalVolumes", volumes),
        ("DTKEnabled", Field::Bool(ctr(DTK).is_some())),
        ("DTKImage", image(ctr(DTK))),
        ("DriverArgs", strings(driver.and_then(|c| c.args.as_ref()))),
        (
            "DriverCommand",
            strings(driver.and_then(|c| c.command.as_ref())),
        ),
        ("DriverEnv", env(driver)),
        ("DriverImage", image(driver)),
        ("DriverManagerImage", image(init(DRIVER_MANAGER))),
        ("GDRCopyEnabled", Field::Bool(ctr(GDRCOPY).is_some())),
        ("GDRCopyEnv", env(ctr(GDRCOPY))),
        ("GDRCopyImage", image(ctr(GDRCOPY))),
        ("GDSEnabled", Field::Bool(ctr(GDS).is_some())),
        ("GDSEnv", env(ctr(GDS))),
        ("GDSImage", image(ctr(GDS))),
        ("GPUDirectRDMAEnabled", Field::Bool(ctr(PEERMEM).is_some())),
        ("HostRoot", Field::Str(host_root)),
        ("ManagerEnv", env(init(DRIVER_MANAGER))),
        ("PeermemImage", image(ctr(PEERMEM))),
        ("SecretEnvSource", Field::Str(secret_env)),
    ];
    let mut state = InstallState::default();
    for (name, value) in fields {
        state.set(name, value);
    }
    state.text()
}

/// `DRIVER_CONFIG_DIGEST` of the final driver pod spec: FNV-1a 32 of
/// [`install_state_text`], as an unsigned decimal integer (e.g. `"3379408550"`).
pub fn driver_config_digest(pod: &PodSpec) -> String {
    fnv1a32(install_state_text(pod).as_bytes()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: &str) -> PodSpec {
        serde_json::from_str(json).expect("a pod spec")
    }

    /// NVIDIA's golden driver pod specs (with their digest env) and the exact bytes NVIDIA
    /// hashed for them, from `nvidia-v26.7.0-rendered/digest-inputs/`.
    const VECTORS: [(&str, &str, &str, &str); 3] = [
        (
            "sample",
            include_str!("../tests/data/driver-digest/sample-pod.json"),
            include_str!("../tests/data/driver-digest/sample.txt"),
            "3379408550",
        ),
        (
            "vi-gds-gdrcopy",
            include_str!("../tests/data/driver-digest/vi-gds-gdrcopy-pod.json"),
            include_str!("../tests/data/driver-digest/vi-gds-gdrcopy.txt"),
            "3628656129",
        ),
        (
            "vii-rdma",
            include_str!("../tests/data/driver-digest/vii-rdma-pod.json"),
            include_str!("../tests/data/driver-digest/vii-rdma.txt"),
            "465854012",
        ),
    ];

    #[test]
    fn fnv_reference_values() {
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn upstream_vectors_hash_to_upstream_digests() {
        for (name, _, bytes, want) in VECTORS {
            assert_eq!(fnv1a32(bytes.as_bytes()).to_string(), want, "{name}");
        }
    }

    #[test]
    fn golden_pods_give_upstream_bytes_and_digest() {
        for (name, json, bytes, want) in VECTORS {
            let p = pod(json);
            assert_eq!(install_state_text(&p), bytes, "{name}");
            assert_eq!(driver_config_digest(&p), want, "{name}");
            // The golden's own digest env agrees.
            let on_driver = p
                .containers
                .iter()
                .find(|c| c.name == DRIVER)
                .and_then(|c| c.env.as_ref())
                .and_then(|e| e.iter().find(|e| e.name == ENV))
                .and_then(|e| e.value.clone());
            assert_eq!(on_driver.as_deref(), Some(want), "{name}");
        }
    }

    #[test]
    fn sensitive_to_install_fields_only() {
        let base = pod(VECTORS[0].1);
        let d0 = driver_config_digest(&base);
        let mut p = base.clone();
        p.containers[0].image = Some("nvcr.io/nvidia/driver:1".into());
        assert_ne!(driver_config_digest(&p), d0, "driver image");
        let mut p = base.clone();
        p.containers[0].resources = Some(Default::default());
        p.priority_class_name = Some("other".into());
        p.host_network = Some(true);
        assert_eq!(
            driver_config_digest(&p),
            d0,
            "resources, priority, hostNetwork"
        );
        // Env order does not matter (sorted by name); valueFrom entries are not hashed.
        let mut p = base.clone();
        p.containers[0].env.as_mut().unwrap().reverse();
        assert_eq!(driver_config_digest(&p), d0, "env order");
    }

    #[test]
    fn sidecars_flag_and_image() {
        let mut p = pod(VECTORS[0].1);
        p.containers.push(Container {
            name: DTK.into(),
            image: Some("dtk:1".into()),
            ..Default::default()
        });
        let text = install_state_text(&p);
        assert!(text.contains("DTKEnabled:(bool)trueDTKImage:(string)dtk:1DriverArgs:"));
    }
}
