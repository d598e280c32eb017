//! `ClusterPolicy` (`nvidia.com/v1`, cluster-scoped) spec and status types.
//!
//! Field names, shapes and "nil means default" rules follow the upstream CRD
//! (`clusterpolicies.nvidia.com`, GPU Operator v26.7; see `shared/upstream/clusterpolicies-crd.yaml`).
//! Every field any transform reads is typed here. The host always hands plugins the policy's
//! *original* `spec` JSON, so fields this crate does not model are preserved for site plugins.
//!
//! Optional leaves are `Option<_>`: `None` is upstream's nil pointer, whose meaning is given by
//! the `is_*`/`*_or_default` methods (e.g. [`ComponentSpec::enabled_or`]).

mod components;
pub mod gpucluster;
pub mod nvidiadriver;
#[cfg(feature = "kube")]
pub mod schema;
mod status;

pub use components::*;
pub use status::*;

use serde::{Deserialize, Serialize};

#[cfg(feature = "kube")]
use kube::CustomResource;
#[cfg(feature = "kube")]
use schemars::JsonSchema;

/// The ClusterPolicy spec. One ClusterPolicy (the oldest) drives the whole cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(CustomResource, JsonSchema))]
#[cfg_attr(
    feature = "kube",
    kube(
        group = "nvidia.com",
        version = "v1",
        kind = "ClusterPolicy",
        plural = "clusterpolicies",
        status = "ClusterPolicyStatus",
        doc = "The GPU stack of the cluster's GPU nodes: which components run (driver, container toolkit, device plugin, validator, monitoring, MIG, sandbox workloads) and how. The oldest ClusterPolicy is the active one.",
        printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.state"}"#,
        printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPolicySpec {
    /// Operator-wide settings (`runtimeClass`, …).
    #[serde(default)]
    pub operator: OperatorSpec,
    /// Settings common to every operand DaemonSet.
    #[serde(default)]
    pub daemonsets: DaemonsetsSpec,
    /// The NVIDIA driver.
    #[serde(default)]
    pub driver: DriverSpec,
    /// The container toolkit.
    #[serde(default)]
    pub toolkit: ToolkitSpec,
    /// The device plugin (also the image of config-manager and MPS).
    #[serde(default)]
    pub device_plugin: DevicePluginSpec,
    /// The metrics exporter.
    #[serde(default)]
    pub dcgm_exporter: DcgmExporterSpec,
    /// Standalone DCGM host engine.
    #[serde(default)]
    pub dcgm: DcgmSpec,
    /// Node status exporter.
    #[serde(default)]
    pub node_status_exporter: ComponentSpec,
    /// GPU Feature Discovery.
    #[serde(default)]
    pub gfd: ComponentSpec,
    /// MIG strategy.
    #[serde(default)]
    pub mig: MigSpec,
    /// MIG manager.
    #[serde(default)]
    pub mig_manager: MigManagerSpec,
    /// Deprecated, unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psp: Option<EnabledSpec>,
    /// Pod Security Admission labels on the operator namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psa: Option<EnabledSpec>,
    /// The validator (readiness chain).
    #[serde(default)]
    pub validator: ValidatorSpec,
    /// GPUDirect Storage (nvidia-fs).
    #[serde(default)]
    pub gds: ComponentSpec,
    /// GDRCopy.
    #[serde(default)]
    pub gdrcopy: ComponentSpec,
    /// Sandbox (VM) workloads.
    #[serde(default)]
    pub sandbox_workloads: SandboxWorkloadsSpec,
    /// VFIO manager.
    #[serde(default)]
    pub vfio_manager: DriverManagedSpec,
    /// vGPU manager.
    #[serde(default)]
    pub vgpu_manager: DriverManagedSpec,
    /// KubeVirt sandbox device plugin.
    #[serde(default)]
    pub sandbox_device_plugin: ComponentSpec,
    /// Kata sandbox device plugin.
    #[serde(default)]
    pub kata_sandbox_device_plugin: ComponentSpec,
    /// vGPU device manager.
    #[serde(default)]
    pub vgpu_device_manager: VgpuDeviceManagerSpec,
    /// Container Device Interface.
    #[serde(default)]
    pub cdi: CdiSpec,
    /// Deprecated kata manager (never enabled).
    #[serde(default)]
    pub kata_manager: KataManagerSpec,
    /// Confidential-computing manager.
    #[serde(default)]
    pub cc_manager: CcManagerSpec,
    /// Host paths.
    #[serde(default)]
    pub host_paths: HostPathsSpec,
    /// Not a ClusterPolicy field: a GPUCluster's `draDriver`. A GPUCluster's other fields have
    /// the ClusterPolicy's shapes, so its states' plugins read its spec as a ClusterPolicySpec
    /// and find the DRA driver here. Absent from the ClusterPolicy CRD (the API server prunes it
    /// from a ClusterPolicy), so always `None` for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(skip))]
    pub dra_driver: Option<gpucluster::DraDriverSpec>,
}

/// Why a ClusterPolicy spec is rejected before anything is rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SpecError {
    /// Field path, e.g. `spec.cdi.nriPluginEnabled`.
    pub path: String,
    /// Why.
    pub message: String,
}

impl ClusterPolicySpec {
    /// Parse a spec from JSON, naming the offending field on error
    /// (e.g. `spec.mig.strategy: unknown variant "double", expected one of none, single, mixed`).
    ///
    /// With the `kube` feature, the value is first validated against the CRD's schema
    /// ([`schema::check_spec`]: types, enums, patterns, required fields, minimums), as the API
    /// server validates it, so a list never decodes positionally into a struct
    /// (`gfd: [false]` is `spec.gfd: must be of type object, got array`). Pass the spec as
    /// stored, after [`schema::default_spec`].
    pub fn from_json(value: &serde_json::Value) -> Result<Self, SpecError> {
        #[cfg(feature = "kube")]
        schema::check_spec(value)?;
        Self::parse_json(value)
    }

    fn parse_json(value: &serde_json::Value) -> Result<Self, SpecError> {
        // The plain deserializer is several times faster than the path-tracking one; the
        // latter runs only to explain a failure.
        Self::deserialize(value).or_else(|_| {
            serde_path_to_error::deserialize(value).map_err(|e| {
                let path = e.path().to_string();
                let message = plain_message(&e.into_inner());
                let (path, message) = inside_component(value, path, message);
                SpecError {
                    path: join_path("spec", &path),
                    message,
                }
            })
        })
    }

    /// Parse a spec from JSON text; errors as [`ClusterPolicySpec::from_json`], or
    /// `spec: not JSON: …` for text that is not JSON. This is what plugins call on every
    /// transform, so the common (valid) case skips building a `serde_json::Value`.
    pub fn from_json_str(text: &str) -> Result<Self, SpecError> {
        // A plain pass straight over the text first (no `Value`): in a Wasm plugin the
        // path-tracking deserializer costs about twice as much, and it runs on every call. It
        // runs only to explain a failure. (Each deserializer instance adds ~100 KiB to a plugin;
        // speed wins here.)
        if let Ok(spec) = serde_json::from_str::<Self>(text) {
            return Ok(spec);
        }
        let not_json = |e: serde_json::Error| SpecError {
            path: "spec".into(),
            message: format!("not JSON: {e}"),
        };
        let mut de = serde_json::Deserializer::from_str(text);
        let spec = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if inner.is_syntax() || inner.is_eof() {
                not_json(inner)
            } else {
                SpecError {
                    path: join_path("spec", &path),
                    message: plain_message(&inner),
                }
            }
        })?;
        de.end().map_err(not_json)?;
        Ok(spec)
    }

    /// Rules beyond the CRD schema, each an `Error` condition in the operator and a refusal in
    /// `kiln render`:
    /// - cross-field rules upstream enforces at start (fatal there): `cdi.nriPluginEnabled`
    ///   requires `cdi.enabled` and `toolkit.enabled`;
    /// - every int-or-percent (`driver.upgradePolicy.maxUnavailable`,
    ///   `daemonsets.rollingUpdate.maxUnavailable`) parses by the one rule of
    ///   [`crate::intstr::IntOrPercent`] (upstream's upgrade controller stops on such a value;
    ///   the API server refuses it in the DaemonSet).
    pub fn validate(&self) -> Result<(), SpecError> {
        use crate::intstr::IntOrPercent;
        if let Some(up) = &self.driver.upgrade_policy
            && let Err(message) = IntOrPercent::parse(&up.max_unavailable)
        {
            return Err(SpecError {
                path: "spec.driver.upgradePolicy.maxUnavailable".into(),
                message,
            });
        }
        let rolling = &self.daemonsets.rolling_update.max_unavailable;
        if !rolling.is_empty()
            && let Err(message) = IntOrPercent::parse_str(rolling)
        {
            return Err(SpecError {
                path: "spec.daemonsets.rollingUpdate.maxUnavailable".into(),
                message,
            });
        }
        if self.cdi.nri_plugin_enabled() {
            if !self.cdi.enabled() {
                return Err(SpecError {
                    path: "spec.cdi.nriPluginEnabled".into(),
                    message: "the NRI plugin requires cdi.enabled=true".into(),
                });
            }
            if !self.toolkit.common.enabled_or(true) {
                return Err(SpecError {
                    path: "spec.cdi.nriPluginEnabled".into(),
                    message: "the NRI plugin requires toolkit.enabled=true".into(),
                });
            }
        }
        Ok(())
    }

    /// Whether sandbox workloads are enabled (`sandboxWorkloads.enabled`, unset = false).
    pub fn sandbox_enabled(&self) -> bool {
        self.sandbox_workloads.enabled.unwrap_or(false)
    }

    /// The runtime class operands use (`operator.runtimeClass`, default `nvidia`).
    pub fn runtime_class(&self) -> &str {
        match self.operator.runtime_class.as_deref() {
            Some(rc) if !rc.is_empty() => rc,
            _ => "nvidia",
        }
    }
}

/// The image pull policies Kubernetes knows (`Always`, `Never`, `IfNotPresent`); an empty
/// policy means the default.
pub const PULL_POLICIES: [&str; 3] = ["Always", "Never", "IfNotPresent"];

/// Values the CRD takes as plain strings but no operand can use, refused before anything is
/// rendered (upstream passes them on, or silently replaces them), at any depth of a
/// ClusterPolicy or NVIDIADriver `spec`:
/// - an `imagePullPolicy` other than [`PULL_POLICIES`] or empty (`Sometimes` became
///   `IfNotPresent` without a word);
/// - a control character (NUL, newline, …) in a `hostPaths` value: no host path holds one.
///
/// # Errors
/// The first offending field, e.g. `spec.driver.imagePullPolicy: unsupported value
/// "Sometimes", expected one of Always, Never, IfNotPresent`.
pub fn check_values(spec: &serde_json::Value) -> Result<(), SpecError> {
    check_values_at(spec, "spec", None)
}

fn check_values_at(v: &serde_json::Value, path: &str, key: Option<&str>) -> Result<(), SpecError> {
    use serde_json::Value;
    let fail = |message: String| {
        Err(SpecError {
            path: path.to_string(),
            message,
        })
    };
    match v {
        Value::String(s)
            if key == Some("imagePullPolicy")
                && !s.is_empty()
                && !PULL_POLICIES.contains(&s.as_str()) =>
        {
            return fail(format!(
                "unsupported value {s:?}, expected one of {}",
                PULL_POLICIES.join(", ")
            ));
        }
        Value::Object(map) if key == Some("hostPaths") => {
            for (k, v) in map {
                if let Some(s) = v.as_str().filter(|s| s.chars().any(char::is_control)) {
                    return Err(SpecError {
                        path: format!("{path}.{k}"),
                        message: format!("{s:?} contains a control character"),
                    });
                }
            }
        }
        Value::Object(map) => {
            for (k, child) in map {
                check_values_at(child, &format!("{path}.{k}"), Some(k))?;
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                check_values_at(child, &format!("{path}[{i}]"), None)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// serde's `flatten` (every component embeds [`ComponentSpec`] that way) hides where inside a
/// component a bad value is: the error names `driver`, not `driver.enabled`. When the error
/// points at an object, its [`ComponentSpec`] fields are read again alone, with path tracking,
/// to name the field; otherwise the error is returned as it was.
fn inside_component(spec: &serde_json::Value, path: String, message: String) -> (String, String) {
    let at = path
        .split('.')
        .filter(|k| !k.is_empty() && *k != "?")
        .try_fold(spec, |v, key| v.get(key));
    match at.filter(|v| v.is_object()) {
        Some(component) => match serde_path_to_error::deserialize::<_, ComponentSpec>(component) {
            Err(e) => (
                join_path(&path, &e.path().to_string()),
                plain_message(&e.into_inner()),
            ),
            Ok(_) => (path, message),
        },
        None => (path, message),
    }
}

/// serde's message without Rust type names: `expected struct MigSpec` reads `expected a map`
/// (the policy author wrote YAML, not Rust).
fn plain_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.split_once("expected struct ") {
        Some((head, tail)) => {
            let rest = tail.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
            format!("{head}expected a map{rest}")
        }
        None => text,
    }
}

fn join_path(prefix: &str, rest: &str) -> String {
    if rest.is_empty() || rest == "." {
        prefix.to_string()
    } else {
        format!("{prefix}.{rest}")
    }
}

#[cfg(test)]
mod tests;
