//! The cluster facts a plugin may read: the Rust face of the WIT `context` record
//! (`kiln:operand@0.2.0`, `wit/operand.wit`), field for field.

/// Container runtime of the GPU nodes (WIT `container-runtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContainerRuntime {
    /// containerd.
    #[default]
    Containerd,
    /// CRI-O (always, on OpenShift).
    Crio,
    /// Docker.
    Docker,
}

impl ContainerRuntime {
    /// The lowercase name: `containerd`, `crio` or `docker`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ContainerRuntime::Containerd => "containerd",
            ContainerRuntime::Crio => "crio",
            ContainerRuntime::Docker => "docker",
        }
    }
}

/// Operating-system facts of the GPU nodes, from Node Feature Discovery labels (WIT `node-os`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeOs {
    /// `feature.node.kubernetes.io/system-os_release.ID`, e.g. `ubuntu`.
    pub id: String,
    /// `…system-os_release.VERSION_ID`, e.g. `22.04` (the major version only for `rhel`,
    /// `rocky` and `ol`).
    pub version_id: String,
}

/// The data keys of a ConfigMap the policy references and that exists (WIT `config-map-keys`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfigMapKeys {
    /// ConfigMap name (in the operator namespace).
    pub name: String,
    /// Its `data` keys, sorted.
    pub keys: Vec<String>,
}

/// Every cluster fact a transform may read (WIT `context`); nothing else reaches a plugin.
/// [`Default`] is all empty (containerd, no OS, no policy), for native tests.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Context {
    /// The state being rendered, e.g. `device-plugin`.
    pub state: String,
    /// The name the plugin was loaded by (its chain entry's `name`).
    pub plugin: String,
    /// Container runtime of the GPU nodes.
    pub runtime: ContainerRuntime,
    /// OpenShift `major.minor`; none when the cluster is not OpenShift.
    pub openshift_version: Option<String>,
    /// Kubernetes server version, e.g. `v1.36.3`.
    pub kubernetes_version: String,
    /// Namespace of the operator and its namespaced operands.
    pub operator_namespace: String,
    /// OS of the GPU nodes; none when no GPU node is known.
    pub gpu_node_os: Option<NodeOs>,
    /// Kernel this object is rendered for; set only for per-kernel precompiled driver
    /// DaemonSets.
    pub kernel_version: Option<String>,
    /// Keys of every ConfigMap the policy references that exists.
    pub config_maps: Vec<ConfigMapKeys>,
    /// Names of the Secrets the policy references that exist.
    pub secrets: Vec<String>,
    /// Fallback images as (upstream env-var name, image), e.g. (`DRIVER_IMAGE`, `nvcr.io/…`).
    pub fallback_images: Vec<(String, String)>,
    /// Default sandbox workload (`container`, `vm-passthrough` or `vm-vgpu`).
    pub default_workload: String,
    /// Whether the `servicemonitors.monitoring.coreos.com` CRD exists.
    pub has_service_monitor_crd: bool,
    /// `metadata.name` of the policy (the ClusterPolicy, or the NVIDIADriver for its driver
    /// states).
    pub policy_name: String,
    /// `metadata.annotations` of the policy as (key, value), sorted by key.
    pub policy_annotations: Vec<(String, String)>,
}
