//! Rendering an NVIDIADriver (`nvidia.com/v1alpha1`): per node pool, the `state-driver`
//! objects of the ClusterPolicy spec the CR derives ([`NvidiaDriverSpec::policy_spec`]), the
//! DaemonSet renamed and narrowed to the pool ([`finish_daemonset`]). Used by the operator's
//! NVIDIADriver controller and by `kiln render --nvidia-driver`.

use kiln_core::State;
use kiln_core::context::TransformContext;
use kiln_core::spec::nvidiadriver::{NodePool, NvidiaDriverSpec, daemonset_name, finish_daemonset};
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

/// Why kiln renders no driver for `spec`, naming the field; `None` when it can. One rule for
/// the operator's NVIDIADriver controller (a `ReconcileFailed` status, nothing applied) and
/// `kiln render --nvidia-driver` (exit 1), each checking it before [`render_pools`]:
/// - `driverType: vgpu-host-manager`: not supported by kiln's NVIDIADriver controller (the
///   ClusterPolicy's `vgpuManager` runs the vGPU host driver);
/// - `gds` or `gdrcopy` enabled with `usePrecompiled` (upstream refuses it too: precompiled
///   images carry neither nvidia-fs nor gdrcopy).
pub fn unsupported(spec: &NvidiaDriverSpec) -> Option<&'static str> {
    use kiln_core::spec::nvidiadriver::DriverType;
    let on = |s: &Option<kiln_core::spec::nvidiadriver::SidecarDriverSpec>| {
        s.as_ref().is_some_and(|s| s.enabled == Some(true))
    };
    if spec.driver_type == DriverType::VgpuHostManager {
        return Some(
            "driverType vgpu-host-manager is not supported by kiln's NVIDIADriver controller \
             (use the ClusterPolicy's vgpuManager)",
        );
    }
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
        let objects = rendered
            .objects
            .into_iter()
            .map(|mut o| {
                if o["kind"] == "DaemonSet" {
                    finish_daemonset(&mut o, &ds_name, name, pool, spec.node_affinity.as_ref());
                }
                o
            })
            .collect();
        out.push((pool.clone(), objects));
    }
    Ok(out)
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
}
