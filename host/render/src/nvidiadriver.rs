//! Rendering an NVIDIADriver (`nvidia.com/v1alpha1`): per node pool, the `state-driver`
//! objects of the ClusterPolicy spec the CR derives ([`NvidiaDriverSpec::policy_spec`]), the
//! DaemonSet renamed and narrowed to the pool ([`finish_daemonset`]). Used by the operator's
//! NVIDIADriver controller and by `kiln render --nvidia-driver`.

use kiln_core::State;
use kiln_core::context::TransformContext;
use kiln_core::spec::nvidiadriver::{
    DriverType, NVIDIADRIVER_LABEL, NodePool, NvidiaDriverSpec, daemonset_name,
    driver_containers_mut, driver_name, finish_daemonset, finish_vgpu_host_manager,
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

/// Render the CR `name` (UID `uid`) for each of `pools` with `derived` (from
/// [`derived_policy`]) and the cluster facts `base` (the pool sets the OS and kernel): per pool
/// the state's objects, its DaemonSet finished for the pool (named by [`daemonset_name`]).
/// Owner references are the caller's to set.
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
    let mut out = Vec::with_capacity(pools.len());
    for pool in pools {
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
        let objects = rendered
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
                o
            })
            .collect();
        out.push((pool.clone(), objects));
    }
    Ok(out)
}

/// The order NVIDIA's NVIDIADriver manifests give what the ClusterPolicy's driver DaemonSet
/// orders otherwise: the pod's `imagePullSecrets` as the driver's, the manager's, then GDS's and
/// GDRCopy's; in `nvidia-driver-ctr` the firmware search path mount before
/// `/sys/devices/system`.
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
    fn the_standalone_policy_hands_the_driver_to_nvidiadrivers() {
        let p = standalone_policy();
        assert_eq!(p.name, STANDALONE_POLICY);
        assert_eq!(p.spec.driver.use_nvidia_driver_crd, Some(true));
    }
}
