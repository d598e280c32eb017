//! The cluster facts a transform may read: the Rust face of the WIT `context` record.
//!
//! The host fills a [`TransformContext`] from the cluster (or from `kiln render` flags), the plugin
//! host converts it to the WIT record, and the plugin SDK converts the record back, so host,
//! plugins and native tests share one type.

use serde::{Deserialize, Serialize};

/// What the `name()` export of a **standard bundle** returns: one component carrying the code of
/// several standard plugins (the one `kiln-bundled-plugins` embeds, built from `plugins/bundle`
/// with `kiln_plugin_std::export_standard_bundle!`). The plugin host accepts such a component
/// under any name it is loaded by and calls it with the context's `state` set to that name, which
/// the component dispatches on (a plugin it does not carry is a `failed` error naming it). The
/// standard plugins share most of their code (the SDK, the spec and DaemonSet parsers), and one
/// compiled copy of it stays in the CPU's caches across the calls of a render, where twenty
/// copies did not.
pub const STANDARD_BUNDLE_NAME: &str = "kiln-standard-plugins";

/// Container runtime of the GPU nodes (upstream: parsed from the kubelet's
/// `containerRuntimeVersion`; OpenShift is always CRI-O).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerRuntime {
    /// containerd (the default when nothing is known).
    #[default]
    Containerd,
    /// CRI-O.
    Crio,
    /// Docker.
    Docker,
}

impl ContainerRuntime {
    /// The lowercase name used in env values (`RUNTIME=containerd`) and volume names.
    pub const fn as_str(self) -> &'static str {
        match self {
            ContainerRuntime::Containerd => "containerd",
            ContainerRuntime::Crio => "crio",
            ContainerRuntime::Docker => "docker",
        }
    }
}

impl std::str::FromStr for ContainerRuntime {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "containerd" => Ok(Self::Containerd),
            "crio" | "cri-o" => Ok(Self::Crio),
            "docker" => Ok(Self::Docker),
            other => Err(format!(
                "unknown container runtime {other:?} (expected containerd, crio or docker)"
            )),
        }
    }
}

/// OS facts of the GPU nodes, from NFD's `system-os_release` labels.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeOs {
    /// `ID`, e.g. `ubuntu`.
    pub id: String,
    /// `VERSION_ID`, e.g. `22.04` (major only for rhel, rocky, ol).
    pub version_id: String,
}

/// NFD label with the OS id (`ubuntu`, `rhel`, …).
pub const OS_ID_LABEL: &str = "feature.node.kubernetes.io/system-os_release.ID";
/// NFD label with the OS version (`22.04`, `9.4`, …).
pub const OS_VERSION_LABEL: &str = "feature.node.kubernetes.io/system-os_release.VERSION_ID";

/// `NodeOs::from_labels` (reading a node's NFD labels) is defined beside the label rules in
/// [`crate::labels`], so this module of plain facts imports no rule module.
impl NodeOs {
    /// The upstream OS tag appended to driver images: ID + VERSION_ID, e.g. `ubuntu22.04`.
    pub fn tag(&self) -> String {
        format!("{}{}", self.id, self.version_id)
    }
}

/// The data keys of a referenced ConfigMap that exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigMapKeys {
    /// ConfigMap name (operator namespace).
    pub name: String,
    /// Sorted `data` keys.
    pub keys: Vec<String>,
}

/// Every cluster fact a transform may read (WIT record `context`). Deserializing fills missing
/// fields from [`Default`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TransformContext {
    /// State being rendered (`device-plugin`, …).
    pub state: String,
    /// Container runtime of the GPU nodes.
    pub runtime: ContainerRuntime,
    /// OpenShift `major.minor`, none on plain Kubernetes.
    pub openshift_version: Option<String>,
    /// Kubernetes server version, e.g. `v1.36.3`.
    pub kubernetes_version: String,
    /// Operator namespace.
    pub operator_namespace: String,
    /// OS of the GPU nodes, none when no GPU node is known.
    pub gpu_node_os: Option<NodeOs>,
    /// Kernel of a per-kernel precompiled driver DaemonSet.
    pub kernel_version: Option<String>,
    /// Referenced ConfigMaps that exist, with their keys.
    pub config_maps: Vec<ConfigMapKeys>,
    /// Referenced Secrets that exist.
    pub secrets: Vec<String>,
    /// Fallback images as (upstream env-var name, image).
    pub fallback_images: Vec<(String, String)>,
    /// Default sandbox workload (`container`, `vm-passthrough`, `vm-vgpu`).
    pub default_workload: String,
    /// Whether the ServiceMonitor CRD exists.
    pub has_service_monitor_crd: bool,
}

impl Default for TransformContext {
    /// The test-case convention of `transform-cases.md`: containerd, not OpenShift, namespace
    /// `gpu-operator`, Ubuntu 22.04 GPU nodes, no fallback images.
    fn default() -> Self {
        TransformContext {
            state: String::new(),
            runtime: ContainerRuntime::Containerd,
            openshift_version: None,
            kubernetes_version: "v1.36.3".into(),
            operator_namespace: "gpu-operator".into(),
            gpu_node_os: Some(NodeOs {
                id: "ubuntu".into(),
                version_id: "22.04".into(),
            }),
            kernel_version: None,
            config_maps: Vec::new(),
            secrets: Vec::new(),
            fallback_images: Vec::new(),
            default_workload: "container".into(),
            has_service_monitor_crd: false,
        }
    }
}

impl TransformContext {
    /// The fallback image registered under `env` (e.g. `DRIVER_IMAGE`), if any.
    pub fn fallback_image(&self, env: &str) -> Option<&str> {
        self.fallback_images
            .iter()
            .find(|(k, _)| k == env)
            .map(|(_, v)| v.as_str())
    }

    /// The keys of ConfigMap `name`, or none when it does not exist.
    pub fn config_map_keys(&self, name: &str) -> Option<&[String]> {
        self.config_maps
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.keys.as_slice())
    }

    /// Whether Secret `name` exists.
    pub fn has_secret(&self, name: &str) -> bool {
        self.secrets.iter().any(|s| s == name)
    }
}
