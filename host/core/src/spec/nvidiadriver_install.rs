//! What an NVIDIADriver's driver pods are rendered with beyond the CR and the node pool: the
//! OpenShift cluster's facts ([`OpenShiftFacts`]: Driver Toolkit images, cluster proxy) and the
//! `DRIVER_CONFIG_DIGEST` record of the NVIDIADriver path ([`install_state`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, Volume, VolumeMount};

use super::{DRIVER_CONTAINER, EnvVarSpec, NameSpec, NodePool, NvidiaDriverSpec, RdmaSpec};
use crate::driver_digest::{Field, InstallState, env_field, mounts_field, volumes_field};

/// The OpenShift cluster's facts an NVIDIADriver render reads (upstream `ClusterInfo`), empty
/// on plain Kubernetes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenShiftFacts {
    /// Driver Toolkit image per RHCOS version: the tags of the `driver-toolkit` ImageStream in
    /// namespace `openshift` (tag name → image). Empty: the cluster offers no Driver Toolkit.
    pub toolkit_images: BTreeMap<String, String>,
    /// The cluster-wide proxy (`config.openshift.io/v1` `Proxy` `cluster`), when it has one.
    pub proxy: Option<ClusterProxy>,
}

/// The spec of OpenShift's cluster-wide proxy: each field empty when unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterProxy {
    /// `httpProxy`.
    pub http_proxy: String,
    /// `httpsProxy`.
    pub https_proxy: String,
    /// `noProxy`.
    pub no_proxy: String,
    /// `trustedCA.name`: a ConfigMap of namespace `openshift-config` with the proxy's CA bundle.
    pub trusted_ca: String,
}

/// The OpenShift part of one pool's render (upstream `driverRuntimeSpec` and `openshiftSpec`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenShiftRender {
    /// The OpenShift version (`major.minor`).
    pub version: String,
    /// The cluster proxy, on OpenShift without precompiled drivers.
    pub proxy: Option<ClusterProxy>,
    /// The Driver Toolkit, when the cluster offers one and drivers are not precompiled.
    pub toolkit: Option<Toolkit>,
}

/// The Driver Toolkit of a pool: its RHCOS version and that version's toolkit image.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Toolkit {
    /// The pool's RHCOS version ([`NodePool::rhcos_version`]).
    pub rhcos_version: String,
    /// The toolkit image of that version; `None` when the ImageStream has no such tag (upstream
    /// then runs the build in the driver image and labels the DaemonSet
    /// `openshift.driver-toolkit.rhcos-image-missing`).
    pub image: Option<String>,
}

impl OpenShiftFacts {
    /// The OpenShift part of `pool`'s render for `spec` on a cluster of OpenShift `version`
    /// (`None`: plain Kubernetes, no OpenShift part), as upstream's `getRuntimeSpec`: the proxy
    /// and the Driver Toolkit only without precompiled drivers, the toolkit only when the
    /// cluster has toolkit images at all.
    pub fn for_pool(
        &self,
        version: Option<&str>,
        spec: &NvidiaDriverSpec,
        pool: &NodePool,
    ) -> Option<OpenShiftRender> {
        let version = version?;
        let compiled = !spec.precompiled();
        let toolkit = (compiled && !self.toolkit_images.is_empty()).then(|| {
            let rhcos_version = pool.rhcos_version.clone().unwrap_or_default();
            Toolkit {
                image: self.toolkit_images.get(&rhcos_version).cloned(),
                rhcos_version,
            }
        });
        Some(OpenShiftRender {
            version: version.to_string(),
            proxy: if compiled { self.proxy.clone() } else { None },
            toolkit,
        })
    }
}

/// The driver container's mounts that NVIDIA's NVIDIADriver DaemonSet manifest has itself; every
/// other mount of it is one of upstream's "additional configs" (repository, certificates,
/// subscriptions, kernel module parameters, licensing, topology).
pub const MANIFEST_DRIVER_MOUNTS: [&str; 16] = [
    "run-nvidia",
    "run-nvidia-fabricmanager",
    "run-nvidia-topologyd",
    "var-log",
    "dev-log",
    "host-os-release",
    "cgroup",
    "vfio",
    "mlnx-ofed-usr-src",
    "run-mellanox-drivers",
    "firmware-search-path",
    "host-sys-devices-system",
    "nv-firmware",
    "driver-startup-probe-script",
    "shared-nvidia-driver-toolkit",
    "gpu-operator-trusted-ca",
];

/// The additional configs of a rendered driver pod: the driver container's mounts beyond
/// [`MANIFEST_DRIVER_MOUNTS`], and the pod volumes they mount.
pub fn additional_configs(pod: &PodSpec) -> (Vec<VolumeMount>, Vec<Volume>) {
    let mounts: Vec<VolumeMount> = pod
        .containers
        .iter()
        .find(|c| c.name == DRIVER_CONTAINER)
        .and_then(|c| c.volume_mounts.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|m| !MANIFEST_DRIVER_MOUNTS.contains(&m.name.as_str()))
        .collect();
    let volumes = pod
        .volumes
        .iter()
        .flatten()
        .filter(|v| mounts.iter().any(|m| m.name == v.name))
        .cloned()
        .collect();
    (mounts, volumes)
}

/// The `DRIVER_CONFIG_DIGEST` record of an NVIDIADriver's pool (upstream
/// `buildDriverInstallConfig`, hashed by [`InstallState::digest`]), from the CR `spec`, the
/// `pool`, the effective GPUDirect RDMA settings `rdma`, the OpenShift part `openshift` and the
/// rendered driver pod `pod` (whose images are the image paths upstream computes, whose
/// `host-root` volume is the host root, and whose additional configs are
/// [`additional_configs`]):
/// - `DriverImage`, `DriverManagerImage`, `DriverType`, `KernelModuleType`, `DriverArgs`,
///   `SecretEnvSource`, `DriverEnv`, `ManagerEnv` (the CR's env, sorted by name),
///   `LicensingConfigName` (the licensing Secret only), `VirtualTopologyConfig`,
///   `KernelModuleConfig`, `RepoConfig`, `CertConfig` (ConfigMap names);
/// - with RDMA on: `GPUDirectRDMAEnabled`, `PeermemImage` (the driver image), `UseHostMOFED`;
/// - with GDS / GDRCopy on: their image, `…Enabled` and env;
/// - on OpenShift: `OpenshiftVersion`, `DTKEnabled`, the proxy fields and
///   `TrustedCAConfigMapName`, and with the toolkit `DTKImage` and `RHCOSVersion`;
/// - precompiled: `UsePrecompiled`, `KernelVersion`;
/// - `AdditionalVolumeMounts`, `AdditionalVolumes`, `HostRoot`.
pub fn install_state(
    spec: &NvidiaDriverSpec,
    pool: &NodePool,
    rdma: &RdmaSpec,
    openshift: Option<&OpenShiftRender>,
    pod: &PodSpec,
) -> InstallState {
    let ctr = |name: &str| pod.containers.iter().find(|c| c.name == name);
    let image =
        |c: Option<&Container>| Field::Str(c.and_then(|c| c.image.clone()).unwrap_or_default());
    let s = |v: &str| Field::Str(v.to_string());
    let env = |e: &[EnvVarSpec]| env_field(e.iter().map(|e| (e.name.clone(), e.value.clone())));
    let name =
        |n: &Option<NameSpec>| Field::Str(n.as_ref().map(|n| n.name.clone()).unwrap_or_default());
    let driver_image = image(ctr(DRIVER_CONTAINER));
    let mut st = InstallState::default();
    st.set("DriverImage", driver_image.clone())
        .set(
            "DriverManagerImage",
            image(
                pod.init_containers
                    .iter()
                    .flatten()
                    .find(|c| c.name == "k8s-driver-manager"),
            ),
        )
        .set("DriverType", s(spec.driver_type.as_str()))
        .set(
            "KernelModuleType",
            s(spec
                .kernel_module_type
                .and_then(|k| serde_json::to_value(k).ok())
                .as_ref()
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()),
        )
        .set("DriverArgs", Field::Strings(spec.args.clone()))
        .set("SecretEnvSource", s(&spec.secret_env))
        .set("DriverEnv", env(&spec.env))
        .set("ManagerEnv", env(&spec.manager.env))
        .set(
            "LicensingConfigName",
            s(spec
                .licensing_config
                .as_ref()
                .map_or("", |l| l.secret_name.as_str())),
        )
        .set("VirtualTopologyConfig", name(&spec.virtual_topology_config))
        .set("KernelModuleConfig", name(&spec.kernel_module_config))
        .set("RepoConfig", name(&spec.repo_config))
        .set("CertConfig", name(&spec.cert_config));
    if rdma.enabled == Some(true) {
        st.set("GPUDirectRDMAEnabled", Field::Bool(true))
            .set("PeermemImage", driver_image)
            .set(
                "UseHostMOFED",
                Field::Bool(rdma.use_host_mofed == Some(true)),
            );
    }
    for (sidecar, ctr_name, img, on, envs) in [
        (
            &spec.gds,
            "nvidia-fs-ctr",
            "GDSImage",
            "GDSEnabled",
            "GDSEnv",
        ),
        (
            &spec.gdrcopy,
            "nvidia-gdrcopy-ctr",
            "GDRCopyImage",
            "GDRCopyEnabled",
            "GDRCopyEnv",
        ),
    ] {
        let Some(sc) = sidecar.as_ref().filter(|s| s.enabled == Some(true)) else {
            continue;
        };
        st.set(img, image(ctr(ctr_name)))
            .set(on, Field::Bool(true))
            .set(envs, env(&sc.env));
    }
    if let Some(os) = openshift {
        st.set("OpenshiftVersion", s(&os.version))
            .set("DTKEnabled", Field::Bool(os.toolkit.is_some()));
        if let Some(p) = &os.proxy {
            st.set("HTTPProxy", s(&p.http_proxy))
                .set("HTTPSProxy", s(&p.https_proxy))
                .set("NoProxy", s(&p.no_proxy))
                .set("TrustedCAConfigMapName", s(&p.trusted_ca));
        }
        if let Some(t) = &os.toolkit {
            st.set("DTKImage", s(t.image.as_deref().unwrap_or_default()))
                .set("RHCOSVersion", s(&t.rhcos_version));
        }
    }
    if spec.precompiled() {
        st.set("UsePrecompiled", Field::Bool(true)).set(
            "KernelVersion",
            s(pool.kernel.as_deref().unwrap_or_default()),
        );
    }
    let (mounts, volumes) = additional_configs(pod);
    st.set("AdditionalVolumeMounts", mounts_field(&mounts))
        .set("AdditionalVolumes", volumes_field(&volumes))
        .set(
            "HostRoot",
            s(pod
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == "host-root")
                .and_then(|v| v.host_path.as_ref())
                .map_or("", |h| h.path.as_str())),
        );
    st
}
