//! Rendering an NVIDIADriver (`nvidia.com/v1alpha1`): per node pool, the `state-driver`
//! objects of the ClusterPolicy spec the CR derives ([`NvidiaDriverSpec::policy_spec`]), the
//! DaemonSet renamed and narrowed to the pool ([`finish_daemonset`]). Used by the operator's
//! NVIDIADriver controller and by `kiln render --nvidia-driver`.

use kiln_core::State;
use kiln_core::context::TransformContext;
use kiln_core::spec::nvidiadriver::{
    DRIVER_CONTAINER, DriverType, MANIFEST_DRIVER_MOUNTS, NVIDIADRIVER_LABEL, NodePool,
    NvidiaDriverSpec, OpenShiftFacts, OpenShiftRender, daemonset_name, driver_containers_mut,
    driver_name, finish_daemonset, finish_vgpu_host_manager, install_state,
};
use serde_json::{Value, json};

use crate::{Policy, PolicyError, Renderer};

/// A parsed NVIDIADriver document.
#[derive(Debug, Clone, PartialEq)]
pub struct NvidiaDriverDoc {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid` (empty offline, when the file has none).
    pub uid: String,
    /// The typed spec, after the CRD's defaulting and pruning.
    pub spec: NvidiaDriverSpec,
    /// Unknown spec fields removed (paths below `spec`), as the API server prunes them.
    pub pruned: Vec<String>,
}

impl NvidiaDriverDoc {
    /// Validate and parse an NVIDIADriver object (`apiVersion: nvidia.com/v1alpha1`, `kind:
    /// NVIDIADriver`): the CRD's defaults and pruning, its enums and minimums, then the typed
    /// parse.
    ///
    /// # Errors
    /// [`PolicyError`] naming the field (`spec.driverType: unsupported value "cpu", …`,
    /// `apiVersion: expected nvidia.com/v1alpha1, got "nvidia.com/v1"`).
    pub fn from_object(doc: &Value) -> Result<Self, PolicyError> {
        let obj = doc.as_object().ok_or(PolicyError::NotAnObject)?;
        let shown = |v: Option<&Value>| v.map_or("nothing".to_string(), Value::to_string);
        let wrong = |path: &str, expected: &str, got: Option<&Value>| {
            PolicyError::Spec(kiln_core::SpecError {
                path: path.into(),
                message: format!("expected {expected}, got {}", shown(got)),
            })
        };
        if obj.get("apiVersion").and_then(Value::as_str) != Some("nvidia.com/v1alpha1") {
            return Err(wrong(
                "apiVersion",
                "nvidia.com/v1alpha1",
                obj.get("apiVersion"),
            ));
        }
        if obj.get("kind").and_then(Value::as_str) != Some("NVIDIADriver") {
            return Err(wrong("kind", "NVIDIADriver", obj.get("kind")));
        }
        let meta = |k: &str| {
            obj.get("metadata")
                .and_then(|m| m.get(k))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let name = meta("name");
        if name.is_empty() {
            return Err(PolicyError::Metadata {
                field: ".name",
                message: "an NVIDIADriver needs a name".into(),
            });
        }
        let mut spec_json = match obj.get("spec") {
            None | Some(Value::Null) => json!({}),
            Some(v) => v.clone(),
        };
        let pruned = kiln_core::spec::schema::default_nvidia_driver_spec(&mut spec_json);
        kiln_core::spec::schema::check_nvidia_driver_spec(&spec_json)?;
        kiln_core::spec::check_values(&spec_json)?;
        let spec = serde_json::from_value(spec_json).map_err(|e| kiln_core::SpecError {
            path: "spec".into(),
            message: e.to_string(),
        })?;
        Ok(NvidiaDriverDoc {
            name,
            uid: meta("uid"),
            spec,
            pruned,
        })
    }
}

/// Why an NVIDIADriver could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum NvidiaDriverError {
    /// The ClusterPolicy spec the CR derives is invalid (a field of the CR or the policy).
    #[error("NVIDIADriver {name}: {source}")]
    Spec {
        /// The CR.
        name: String,
        /// What is wrong.
        #[source]
        source: PolicyError,
    },
    /// The driver state's chain failed.
    #[error("NVIDIADriver {name}: {source}")]
    Render {
        /// The CR.
        name: String,
        /// The render error (naming the plugin).
        #[source]
        source: Box<crate::RenderError>,
    },
}

/// The ClusterPolicy `policy` as the CR `name` renders its driver with: the spec of
/// [`NvidiaDriverSpec::policy_spec`], the policy's site plugins and pins.
///
/// # Errors
/// [`NvidiaDriverError::Spec`].
pub fn derived_policy(
    policy: &Policy,
    name: &str,
    spec: &NvidiaDriverSpec,
) -> Result<Policy, NvidiaDriverError> {
    let fail = |source: PolicyError| NvidiaDriverError::Spec {
        name: name.to_string(),
        source,
    };
    let spec_json = spec
        .policy_spec(&policy.spec_json)
        .map_err(|e| fail(e.into()))?;
    let doc = json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": policy.name}, "spec": spec_json});
    let mut derived = Policy::from_object(&doc).map_err(fail)?;
    derived.plugins = policy.plugins.clone();
    Ok(derived)
}

/// The name [`standalone_policy`] carries (no ClusterPolicy of that name exists).
pub const STANDALONE_POLICY: &str = "nvidiadriver-standalone";

/// The ClusterPolicy an NVIDIADriver renders with when the cluster has none (NVIDIA v26.7.0
/// reconciles NVIDIADrivers without a ClusterPolicy, e.g. next to a GPUCluster, with host root
/// `/`): the CRD's defaults with `driver.useNvidiaDriverCRD: true`, and no site plugins.
pub fn standalone_policy() -> Policy {
    Policy::from_object(&json!({
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": STANDALONE_POLICY},
        "spec": {"driver": {"useNvidiaDriverCRD": true}},
    }))
    .expect("the standalone policy is valid")
}

/// Why kiln renders no driver for `spec`, naming the field; `None` when it can. One rule for
/// the operator's NVIDIADriver controller (a `ReconcileFailed` status, nothing applied) and
/// `kiln render --nvidia-driver` (exit 1), each checking it before [`render_pools`]:
/// - `gds` or `gdrcopy` enabled with `usePrecompiled` (upstream refuses it too: precompiled
///   images carry neither nvidia-fs nor gdrcopy).
pub fn unsupported(spec: &NvidiaDriverSpec) -> Option<&'static str> {
    let on = |s: &Option<kiln_core::spec::nvidiadriver::SidecarDriverSpec>| {
        s.as_ref().is_some_and(|s| s.enabled == Some(true))
    };
    if spec.precompiled() && (on(&spec.gds) || on(&spec.gdrcopy)) {
        return Some("spec.gds and spec.gdrcopy cannot be enabled with spec.usePrecompiled");
    }
    None
}

/// [`render_pools_with`] without OpenShift facts (no Driver Toolkit, no cluster proxy).
///
/// # Errors
/// [`NvidiaDriverError::Render`] for the first pool whose chain fails.
pub fn render_pools(
    renderer: &Renderer,
    derived: &Policy,
    name: &str,
    uid: &str,
    spec: &NvidiaDriverSpec,
    pools: &[NodePool],
    base: &TransformContext,
) -> Result<Vec<(NodePool, Vec<Value>)>, NvidiaDriverError> {
    render_pools_with(
        renderer,
        derived,
        name,
        uid,
        spec,
        pools,
        base,
        &OpenShiftFacts::default(),
    )
}

/// Render the CR `name` (UID `uid`) for each of `pools` with `derived` (from
/// [`derived_policy`]), the cluster facts `base` (the pool sets the OS and kernel) and, on
/// OpenShift (`base.openshift_version`), the cluster's `openshift` facts: per pool the state's
/// objects, its DaemonSet finished for the pool (named by [`daemonset_name`]), in OpenShift's
/// Driver Toolkit form where the pool has one ([`finish_openshift`]), with the NVIDIADriver
/// path's `DRIVER_CONFIG_DIGEST` ([`install_state`]). Owner references are the caller's to set.
///
/// # Errors
/// [`NvidiaDriverError::Render`] for the first pool whose chain fails.
#[allow(clippy::too_many_arguments)]
pub fn render_pools_with(
    renderer: &Renderer,
    derived: &Policy,
    name: &str,
    uid: &str,
    spec: &NvidiaDriverSpec,
    pools: &[NodePool],
    base: &TransformContext,
    openshift: &OpenShiftFacts,
) -> Result<Vec<(NodePool, Vec<Value>)>, NvidiaDriverError> {
    let mut out = Vec::with_capacity(pools.len());
    for pool in pools {
        let os = openshift.for_pool(base.openshift_version.as_deref(), spec, pool);
        let mut ctx = base.clone();
        ctx.gpu_node_os = Some(pool.os.clone());
        ctx.kernel_version = pool.kernel.clone();
        let rendered = renderer
            .render_state(State::Driver, derived, &ctx)
            .map_err(|source| NvidiaDriverError::Render {
                name: name.to_string(),
                source: Box::new(source),
            })?;
        let ds_name = daemonset_name(spec.driver_type, pool, uid);
        let own = driver_name(spec.driver_type, name, pool);
        let mut objects: Vec<Value> = rendered
            .objects
            .into_iter()
            .map(|mut o| {
                if o["kind"] == "DaemonSet" {
                    finish_daemonset(&mut o, &ds_name, name, pool, spec.node_affinity.as_ref());
                }
                name_pool_identity(&mut o, &own, name);
                // The startup-probe ConfigMap names the pool's DaemonSet, as upstream's does.
                if o["kind"] == "ConfigMap"
                    && let Some(labels) = o
                        .pointer_mut("/metadata/labels")
                        .and_then(Value::as_object_mut)
                    && labels.contains_key("app")
                {
                    labels.insert("app".into(), json!(ds_name));
                }
                if o["kind"] == "DaemonSet" {
                    nvidiadriver_pod_order(&mut o, spec);
                }
                if spec.driver_type == DriverType::VgpuHostManager {
                    finish_vgpu_host_manager(&mut o);
                }
                if o["kind"] == "DaemonSet" {
                    share_additional_configs(&mut o);
                    if let Some(os) = &os {
                        finish_openshift(&mut o, spec, os);
                    }
                    set_config_digest(&mut o, spec, pool, &derived.spec.driver.rdma, os.as_ref());
                }
                o
            })
            .collect();
        if let Some(cm) = os
            .as_ref()
            .and_then(|os| trusted_ca_config_map(os, &base.operator_namespace))
        {
            objects.push(cm);
        }
        out.push((pool.clone(), objects));
    }
    Ok(out)
}

/// The sidecars that mount the driver container's additional configs in NVIDIA's NVIDIADriver
/// manifest.
const CONFIG_SIDECARS: [&str; 3] = ["nvidia-peermem-ctr", "nvidia-fs-ctr", "nvidia-gdrcopy-ctr"];

/// Mount the driver container's additional configs (its mounts beyond
/// [`MANIFEST_DRIVER_MOUNTS`]: repository, certificates, subscriptions, kernel module
/// parameters, licensing, topology) in the [`CONFIG_SIDECARS`] of the DaemonSet `ds` too, after
/// their own mounts, as NVIDIA's NVIDIADriver manifest does; a sidecar's mount of the same
/// volume and path (the ClusterPolicy's GDS container has the repository and certificates) stays
/// where it is.
fn share_additional_configs(ds: &mut Value) {
    let Some(containers) = ds
        .pointer_mut("/spec/template/spec/containers")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let extra: Vec<Value> = containers
        .iter()
        .find(|c| c["name"] == DRIVER_CONTAINER)
        .and_then(|c| c["volumeMounts"].as_array())
        .into_iter()
        .flatten()
        .filter(|m| {
            !m["name"]
                .as_str()
                .is_some_and(|n| MANIFEST_DRIVER_MOUNTS.contains(&n))
        })
        .cloned()
        .collect();
    for c in containers.iter_mut().filter(|c| {
        c["name"]
            .as_str()
            .is_some_and(|n| CONFIG_SIDECARS.contains(&n))
    }) {
        let Some(mounts) = c
            .as_object_mut()
            .map(|m| m.entry("volumeMounts").or_insert_with(|| json!([])))
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        for m in &extra {
            if !mounts
                .iter()
                .any(|x| x["name"] == m["name"] && x["mountPath"] == m["mountPath"])
            {
                mounts.push(m.clone());
            }
        }
    }
}

/// The Driver Toolkit sidecar of an OpenShift driver pod (it builds the driver with the
/// toolkit image of the node's RHCOS version).
pub const TOOLKIT_CONTAINER: &str = "openshift-driver-toolkit-ctr";

/// The `emptyDir` volume the driver container and the Driver Toolkit sidecar share, and where
/// they mount it.
const TOOLKIT_SHARED: (&str, &str) = (
    "shared-nvidia-driver-toolkit",
    "/mnt/shared-nvidia-driver-toolkit",
);

/// The ConfigMap OpenShift injects the cluster proxy's CA bundle into (label
/// `config.openshift.io/inject-trusted-cabundle`), its volume, and where the driver mounts it.
pub const TRUSTED_CA_CONFIG_MAP: &str = "gpu-operator-trusted-ca";
const TRUSTED_CA_MOUNT: &str = "/etc/pki/ca-trust/extracted/pem";

/// Whether `os`'s render mounts the cluster proxy's CA bundle: with the Driver Toolkit and a
/// proxy naming a trusted CA ConfigMap (upstream's manifest condition).
fn trusts_proxy_ca(os: &OpenShiftRender) -> bool {
    os.toolkit.is_some() && os.proxy.as_ref().is_some_and(|p| !p.trusted_ca.is_empty())
}

/// The ConfigMap [`TRUSTED_CA_CONFIG_MAP`] in `namespace`, empty for OpenShift to fill, when
/// `os`'s render mounts it ([`trusts_proxy_ca`]).
fn trusted_ca_config_map(os: &OpenShiftRender, namespace: &str) -> Option<Value> {
    trusts_proxy_ca(os).then(|| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": TRUSTED_CA_CONFIG_MAP, "namespace": namespace,
                "labels": {"config.openshift.io/inject-trusted-cabundle": "true"}},
            "data": {"ca-bundle.crt": ""}})
    })
}

/// Make an NVIDIADriver pool's DaemonSet `ds` the Driver Toolkit form NVIDIA's NVIDIADriver
/// manifests render on OpenShift, when `os` has a toolkit (else it is left as is):
/// - labels `openshift.driver-toolkit: "true"` on the DaemonSet and its pods,
///   `openshift.driver-toolkit.rhcos: <version>` on the DaemonSet, and
///   `openshift.driver-toolkit.rhcos-image-missing: "true"` on both when the version has no
///   toolkit image;
/// - `nvidia-driver-ctr` runs `ocp_dtk_entrypoint nv-ctr-run-with-dtk` (the nvidia-fs and
///   gdrcopy sidecars `nv-fs-ctr-run-with-dtk` / `gdrcopy-ctr-run-with-dtk`), and they mount the
///   shared `emptyDir` at `/mnt/shared-nvidia-driver-toolkit` (the driver after its other
///   mounts, the sidecars after `/dev/log`);
/// - the driver's env gets `RHCOS_IMAGE_MISSING`/`RHCOS_VERSION` when the image is missing, then
///   the cluster proxy (`HTTP_PROXY`, `http_proxy`, `HTTPS_PROXY`, `https_proxy`, `NO_PROXY`,
///   `no_proxy`, each when set), and with a trusted CA the bundle mounted read-only at
///   `/etc/pki/ca-trust/extracted/pem` (volume [`TRUSTED_CA_CONFIG_MAP`], key `ca-bundle.crt` as
///   `tls-ca-bundle.pem`);
/// - the sidecar [`TOOLKIT_CONTAINER`] (the toolkit image, else the driver image; the driver's
///   resources) waits for the shared directory and builds the driver.
pub fn finish_openshift(ds: &mut Value, spec: &NvidiaDriverSpec, os: &OpenShiftRender) {
    let Some(toolkit) = &os.toolkit else {
        return;
    };
    let missing = toolkit.image.is_none();
    let label = |ds: &mut Value, ptr: &str, k: &str, v: &str| {
        if let Some(m) = ds.pointer_mut(ptr).and_then(Value::as_object_mut) {
            m.insert(k.into(), json!(v));
        }
    };
    label(
        ds,
        "/metadata/labels",
        "openshift.driver-toolkit.rhcos",
        &toolkit.rhcos_version,
    );
    for ptr in ["/metadata/labels", "/spec/template/metadata/labels"] {
        label(ds, ptr, "openshift.driver-toolkit", "true");
        if missing {
            label(
                ds,
                ptr,
                "openshift.driver-toolkit.rhcos-image-missing",
                "true",
            );
        }
    }
    let trusted = trusts_proxy_ca(os);
    let Some(pod) = ds
        .pointer_mut("/spec/template/spec")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let shared_mount = json!({"name": TOOLKIT_SHARED.0, "mountPath": TOOLKIT_SHARED.1});
    let mut driver_image = Value::Null;
    let mut driver_resources = None;
    for c in pod
        .get_mut("containers")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        let entry = match c["name"].as_str() {
            Some(DRIVER_CONTAINER) => "nv-ctr-run-with-dtk",
            Some("nvidia-fs-ctr") => "nv-fs-ctr-run-with-dtk",
            Some("nvidia-gdrcopy-ctr") => "gdrcopy-ctr-run-with-dtk",
            _ => continue,
        };
        c["command"] = json!(["ocp_dtk_entrypoint"]);
        c["args"] = json!([entry]);
        if c["name"] != DRIVER_CONTAINER {
            if let Some(mounts) = c.get_mut("volumeMounts").and_then(Value::as_array_mut) {
                let at = mounts
                    .iter()
                    .position(|m| m["name"] == "dev-log")
                    .map_or(mounts.len(), |i| i + 1);
                mounts.insert(at, shared_mount.clone());
            }
            continue;
        }
        driver_image = c["image"].clone();
        driver_resources = c.get("resources").cloned();
        let mut env = Vec::new();
        if missing {
            env.push(json!({"name": "RHCOS_IMAGE_MISSING", "value": "true"}));
            env.push(json!({"name": "RHCOS_VERSION", "value": toolkit.rhcos_version}));
        }
        if let Some(p) = &os.proxy {
            for (names, value) in [
                (["HTTP_PROXY", "http_proxy"], &p.http_proxy),
                (["HTTPS_PROXY", "https_proxy"], &p.https_proxy),
                (["NO_PROXY", "no_proxy"], &p.no_proxy),
            ] {
                if !value.is_empty() {
                    env.extend(names.map(|n| json!({"name": n, "value": value})));
                }
            }
        }
        if let Some(list) = c.get_mut("env").and_then(Value::as_array_mut) {
            list.extend(env);
        }
        if let Some(mounts) = c.get_mut("volumeMounts").and_then(Value::as_array_mut) {
            mounts.push(shared_mount.clone());
            if trusted {
                mounts.push(json!({"name": TRUSTED_CA_CONFIG_MAP,
                    "mountPath": TRUSTED_CA_MOUNT, "readOnly": true}));
            }
        }
    }
    let on = |s: &Option<kiln_core::spec::nvidiadriver::SidecarDriverSpec>| {
        s.as_ref().is_some_and(|s| s.enabled == Some(true))
    };
    let mut env = vec![
        json!({"name": "RHCOS_VERSION", "value": toolkit.rhcos_version}),
        json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}),
        json!({"name": kiln_core::driver_digest::ENV, "value": ""}),
    ];
    if missing {
        env.push(json!({"name": "RHCOS_IMAGE_MISSING", "value": "true"}));
    }
    if on(&spec.gds) {
        env.push(json!({"name": "GDS_ENABLED", "value": "true"}));
    }
    if on(&spec.gdrcopy) {
        env.push(json!({"name": "GDRCOPY_ENABLED", "value": "true"}));
    }
    let mut sidecar = json!({
        "image": toolkit.image.as_ref().map_or(driver_image, |i| json!(i)),
        "imagePullPolicy": "IfNotPresent",
        "name": TOOLKIT_CONTAINER,
        "command": ["bash", "-xc"],
        "args": ["until [ -f /mnt/shared-nvidia-driver-toolkit/dir_prepared ]; do echo  Waiting for nvidia-driver-ctr container to prepare the shared directory ...; sleep 10; done; exec /mnt/shared-nvidia-driver-toolkit/ocp_dtk_entrypoint dtk-build-driver"],
        "securityContext": {"privileged": true, "seLinuxOptions": {"level": "s0"}},
        "env": env,
        "volumeMounts": [
            shared_mount,
            {"name": "var-log", "mountPath": "/var/log"},
            {"name": "mlnx-ofed-usr-src", "mountPath": "/run/mellanox/drivers/usr/src",
                "mountPropagation": "HostToContainer"},
            {"name": "host-os-release", "mountPath": "/host-etc/os-release", "readOnly": true},
            {"name": "firmware-search-path",
                "mountPath": "/sys/module/firmware_class/parameters/path"},
            {"name": "nv-firmware", "mountPath": "/lib/firmware"},
        ],
    });
    if let Some(r) = driver_resources {
        sidecar["resources"] = r;
    }
    if let Some(list) = pod.get_mut("containers").and_then(Value::as_array_mut) {
        list.push(sidecar);
    }
    if let Some(vols) = pod.get_mut("volumes").and_then(Value::as_array_mut) {
        vols.push(json!({"name": TOOLKIT_SHARED.0, "emptyDir": {}}));
        if trusted {
            vols.push(json!({"name": TRUSTED_CA_CONFIG_MAP, "configMap": {
                "name": TRUSTED_CA_CONFIG_MAP,
                "items": [{"key": "ca-bundle.crt", "path": "tls-ca-bundle.pem"}]}}));
        }
    }
}

/// Set the NVIDIADriver path's `DRIVER_CONFIG_DIGEST` ([`install_state`] of the CR, the pool
/// and the rendered pod) on the pool's DaemonSet `ds`, where NVIDIA's NVIDIADriver manifest
/// puts it: in `k8s-driver-manager` after `OPERATOR_NAMESPACE`, in `nvidia-driver-ctr` after
/// `NODE_IP`, in [`TOOLKIT_CONTAINER`] after `NVIDIA_VISIBLE_DEVICES` (the ClusterPolicy path's
/// value, computed from the final pod, is replaced).
fn set_config_digest(
    ds: &mut Value,
    spec: &NvidiaDriverSpec,
    pool: &NodePool,
    rdma: &kiln_core::spec::RdmaSpec,
    os: Option<&OpenShiftRender>,
) {
    use kiln_core::driver_digest::ENV;
    let Some(pod_json) = ds.pointer("/spec/template/spec") else {
        return;
    };
    let Ok(pod) = serde_json::from_value(pod_json.clone()) else {
        return;
    };
    let digest = install_state(spec, pool, rdma, os, &pod).digest();
    let entry = json!({"name": ENV, "value": digest});
    for (list, container, after) in [
        ("initContainers", "k8s-driver-manager", "OPERATOR_NAMESPACE"),
        ("containers", DRIVER_CONTAINER, "NODE_IP"),
        ("containers", TOOLKIT_CONTAINER, "NVIDIA_VISIBLE_DEVICES"),
    ] {
        let Some(env) = ds
            .pointer_mut(&format!("/spec/template/spec/{list}"))
            .and_then(Value::as_array_mut)
            .and_then(|cs| cs.iter_mut().find(|c| c["name"] == container))
            .and_then(|c| c.get_mut("env"))
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        env.retain(|e| e["name"] != ENV);
        let at = env
            .iter()
            .position(|e| e["name"] == after)
            .map_or(env.len(), |i| i + 1);
        env.insert(at, entry.clone());
    }
}

/// The order NVIDIA's NVIDIADriver manifests give what the ClusterPolicy's driver DaemonSet
/// orders otherwise: the pod's `imagePullSecrets` as the driver's, the manager's, then GDS's and
/// GDRCopy's; in `nvidia-driver-ctr` the firmware search path mount before
/// `/sys/devices/system`, and `GDS_ENABLED` before `GDRCOPY_ENABLED`.
fn nvidiadriver_pod_order(ds: &mut Value, spec: &NvidiaDriverSpec) {
    let Some(pod) = ds
        .pointer_mut("/spec/template/spec")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let sidecar = |s: &Option<kiln_core::spec::nvidiadriver::SidecarDriverSpec>| {
        s.as_ref()
            .map(|s| s.image_pull_secrets.clone())
            .unwrap_or_default()
    };
    let order: Vec<String> = spec
        .image_pull_secrets
        .iter()
        .chain(&spec.manager.image_pull_secrets)
        .cloned()
        .chain(sidecar(&spec.gds))
        .chain(sidecar(&spec.gdrcopy))
        .collect();
    if let Some(secrets) = pod
        .get_mut("imagePullSecrets")
        .and_then(Value::as_array_mut)
    {
        secrets.sort_by_key(|s| {
            order
                .iter()
                .position(|n| s["name"] == n.as_str())
                .unwrap_or(order.len())
        });
    }
    for c in driver_containers_mut(pod) {
        if let Some(env) = c.get_mut("env").and_then(Value::as_array_mut) {
            let at = |name: &str| env.iter().position(|e| e["name"] == name);
            if let (Some(gdrcopy), Some(gds)) = (at("GDRCOPY_ENABLED"), at("GDS_ENABLED"))
                && gds > gdrcopy
            {
                let e = env.remove(gds);
                env.insert(gdrcopy, e);
            }
        }
        let Some(mounts) = c.get_mut("volumeMounts").and_then(Value::as_array_mut) else {
            continue;
        };
        let at = |path: &str| mounts.iter().position(|m| m["mountPath"] == path);
        if let (Some(sys), Some(fw)) = (
            at("/sys/devices/system"),
            at("/sys/module/firmware_class/parameters/path"),
        ) && fw > sys
        {
            let m = mounts.remove(fw);
            mounts.insert(sys, m);
        }
    }
}

/// Kinds of the driver state that are per node pool under an NVIDIADriver: its identity (named
/// by [`driver_name`], as upstream's NVIDIADriver manifests name them).
const POOL_IDENTITY_KINDS: [&str; 6] = [
    "ServiceAccount",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "SecurityContextConstraints",
];

/// Give the driver state's object `o` the pool's identity `own` ([`driver_name`]): the service
/// account, RBAC objects and SCC are renamed to it (bindings' `roleRef` and service-account
/// subjects, and the SCC's service-account user, follow) and labelled
/// [`NVIDIADRIVER_LABEL`]`=<cr>`; the DaemonSet runs as it (`serviceAccountName`, the
/// `openshift.io/scc` annotation). Other objects (the shared startup-probe ConfigMap) are left
/// as rendered.
fn name_pool_identity(o: &mut Value, own: &str, cr: &str) {
    let kind = o["kind"].as_str().unwrap_or_default().to_string();
    if kind == "DaemonSet" {
        if let Some(pod) = o
            .pointer_mut("/spec/template/spec")
            .and_then(Value::as_object_mut)
        {
            pod.insert("serviceAccountName".into(), json!(own));
        }
        if let Some(a) = o
            .pointer_mut("/metadata/annotations")
            .and_then(Value::as_object_mut)
            && a.contains_key("openshift.io/scc")
        {
            a.insert("openshift.io/scc".into(), json!(own));
        }
        return;
    }
    if !POOL_IDENTITY_KINDS.contains(&kind.as_str()) {
        return;
    }
    let old = o["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    o["metadata"]["name"] = json!(own);
    if !o["metadata"]["labels"].is_object() {
        o["metadata"]["labels"] = json!({});
    }
    o["metadata"]["labels"][NVIDIADRIVER_LABEL] = json!(cr);
    if let Some(role) = o.pointer_mut("/roleRef/name")
        && *role == old.as_str()
    {
        *role = json!(own);
    }
    for s in o
        .get_mut("subjects")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if s["kind"] == "ServiceAccount" && s["name"] == old.as_str() {
            s["name"] = json!(own);
        }
    }
    for u in o
        .get_mut("users")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(text) = u.as_str()
            && let Some(ns) = text
                .strip_prefix("system:serviceaccount:")
                .and_then(|r| r.strip_suffix(&format!(":{old}")))
        {
            *u = json!(format!("system:serviceaccount:{ns}:{own}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_defaulted_pruned_and_checked() {
        let doc = NvidiaDriverDoc::from_object(&json!({
            "apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
            "metadata": {"name": "pool-a", "uid": "u1"},
            "spec": {"version": "570.1", "imagePullPolicy": "Always", "typo": 1}
        }))
        .unwrap();
        assert_eq!((doc.name.as_str(), doc.uid.as_str()), ("pool-a", "u1"));
        assert_eq!(doc.spec.image, "nvcr.io/nvidia/driver", "the CRD default");
        assert_eq!(doc.pruned, ["typo"]);
        let err = |v: Value| NvidiaDriverDoc::from_object(&v).unwrap_err().to_string();
        assert_eq!(
            err(json!({"apiVersion": "nvidia.com/v1", "kind": "NVIDIADriver"})),
            "apiVersion: expected nvidia.com/v1alpha1, got \"nvidia.com/v1\""
        );
        assert!(
            err(
                json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
                "metadata": {"name": "x"}, "spec": {"driverType": "cpu"}})
            )
            .starts_with("spec.driverType: unsupported value \"cpu\""),
        );
        assert!(
            err(json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver"}))
                .contains("needs a name")
        );
    }

    #[test]
    fn pool_identity_renames_account_rbac_and_scc_and_points_the_daemonset_at_them() {
        let mut sa = json!({"kind": "ServiceAccount", "metadata": {"name": "nvidia-driver"}});
        let mut rb = json!({"kind": "RoleBinding", "metadata": {"name": "nvidia-driver"},
            "roleRef": {"kind": "Role", "name": "nvidia-driver"},
            "subjects": [{"kind": "ServiceAccount", "name": "nvidia-driver", "namespace": "ns"}]});
        let mut scc = json!({"kind": "SecurityContextConstraints", "metadata": {"name": "nvidia-driver"},
            "users": ["system:serviceaccount:ns:nvidia-driver", "someone"]});
        let mut ds = json!({"kind": "DaemonSet",
            "metadata": {"name": "d", "annotations": {"openshift.io/scc": "nvidia-driver"}},
            "spec": {"template": {"spec": {"serviceAccountName": "nvidia-driver"}}}});
        let mut cm =
            json!({"kind": "ConfigMap", "metadata": {"name": "nvidia-driver-startup-probe"}});
        let cm_before = cm.clone();
        for o in [&mut sa, &mut rb, &mut scc, &mut ds, &mut cm] {
            name_pool_identity(o, "own", "cr");
        }
        assert_eq!(sa["metadata"]["name"], "own");
        assert_eq!(sa["metadata"]["labels"][NVIDIADRIVER_LABEL], "cr");
        assert_eq!(rb["roleRef"]["name"], "own");
        assert_eq!(rb["subjects"][0]["name"], "own");
        assert_eq!(
            scc["users"],
            json!(["system:serviceaccount:ns:own", "someone"])
        );
        assert_eq!(ds["spec"]["template"]["spec"]["serviceAccountName"], "own");
        assert_eq!(ds["metadata"]["annotations"]["openshift.io/scc"], "own");
        assert_eq!(cm, cm_before, "shared objects keep their names");
    }

    #[test]
    fn sidecars_mount_the_drivers_additional_configs_once() {
        let lic = json!({"name": "licensing-config", "mountPath": "/drivers/gridd.conf",
            "subPath": "gridd.conf", "readOnly": true});
        let repo = json!({"name": "repo", "mountPath": "/etc/apt/sources.list.d/a.list",
            "subPath": "a.list", "readOnly": true});
        let own = json!({"name": "run-nvidia", "mountPath": "/run/nvidia"});
        let mut ds = json!({"spec": {"template": {"spec": {"containers": [
            {"name": DRIVER_CONTAINER, "volumeMounts": [own, repo, lic]},
            {"name": "nvidia-fs-ctr", "volumeMounts": [own, repo]},
            {"name": "nvidia-peermem-ctr"},
            {"name": "other", "volumeMounts": []}]}}}});
        share_additional_configs(&mut ds);
        let c = &ds["spec"]["template"]["spec"]["containers"];
        assert_eq!(
            c[1]["volumeMounts"],
            json!([own, repo, lic]),
            "the repo mount stays, once"
        );
        assert_eq!(c[2]["volumeMounts"], json!([repo, lic]));
        assert_eq!(
            c[3]["volumeMounts"],
            json!([]),
            "only the driver's sidecars"
        );
    }

    /// The Driver Toolkit form when the RHCOS version has no toolkit image (no golden covers
    /// it): the driver image builds, `rhcos-image-missing` labels and env, no proxy without
    /// one, and the digest placed after the manifest's anchors.
    #[test]
    fn a_missing_toolkit_image_builds_in_the_driver_image() {
        use kiln_core::spec::nvidiadriver::Toolkit;
        let mut ds = json!({"kind": "DaemonSet", "metadata": {"labels": {}},
            "spec": {"template": {"metadata": {"labels": {}}, "spec": {
                "initContainers": [{"name": "k8s-driver-manager", "image": "m:1",
                    "env": [{"name": "OPERATOR_NAMESPACE", "value": "x"},
                        {"name": "FOO", "value": "1"}]}],
                "containers": [{"name": DRIVER_CONTAINER, "image": "d:1",
                    "command": ["nvidia-driver"], "args": ["init"],
                    "env": [{"name": "NODE_IP", "value": "x"}, {"name": "BAR", "value": "1"}],
                    "volumeMounts": []}],
                "volumes": []}}}});
        let spec = NvidiaDriverSpec::default();
        let os = OpenShiftRender {
            version: "4.16".into(),
            proxy: None,
            toolkit: Some(Toolkit {
                rhcos_version: "416.94.1".into(),
                image: None,
            }),
        };
        finish_openshift(&mut ds, &spec, &os);
        assert_eq!(
            ds["metadata"]["labels"]["openshift.driver-toolkit.rhcos-image-missing"],
            "true"
        );
        assert_eq!(
            ds["metadata"]["labels"]["openshift.driver-toolkit.rhcos"],
            "416.94.1"
        );
        let pod = &ds["spec"]["template"]["spec"];
        let names = |c: &Value| -> Vec<String> {
            c["env"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            names(&pod["containers"][0]),
            ["NODE_IP", "BAR", "RHCOS_IMAGE_MISSING", "RHCOS_VERSION"]
        );
        assert_eq!(
            pod["containers"][0]["command"],
            json!(["ocp_dtk_entrypoint"])
        );
        assert_eq!(pod["containers"][1]["name"], TOOLKIT_CONTAINER);
        assert_eq!(
            pod["containers"][1]["image"], "d:1",
            "the driver image builds"
        );
        assert!(
            trusted_ca_config_map(&os, "ns").is_none(),
            "no proxy, no CA"
        );
        let pool = NodePool {
            os: kiln_core::context::NodeOs {
                id: "rhcos".into(),
                version_id: "4.16".into(),
            },
            name: "rhcos4.16".into(),
            kernel: None,
            rhcos_version: Some("416.94.1".into()),
            node_selector: Default::default(),
        };
        set_config_digest(&mut ds, &spec, &pool, &Default::default(), Some(&os));
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(
            names(&pod["initContainers"][0]),
            ["OPERATOR_NAMESPACE", kiln_core::driver_digest::ENV, "FOO"]
        );
        assert_eq!(
            names(&pod["containers"][0])[1],
            kiln_core::driver_digest::ENV
        );
        let digest = &pod["containers"][0]["env"][1]["value"];
        assert_eq!(pod["containers"][1]["env"][2]["value"], *digest);
        assert_eq!(pod["initContainers"][0]["env"][1]["value"], *digest);
    }

    #[test]
    fn the_standalone_policy_hands_the_driver_to_nvidiadrivers() {
        let p = standalone_policy();
        assert_eq!(p.name, STANDALONE_POLICY);
        assert_eq!(p.spec.driver.use_nvidia_driver_crd, Some(true));
    }
}
