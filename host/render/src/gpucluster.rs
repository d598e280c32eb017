//! Rendering a GPUCluster (`nvidia.com/v1alpha1`): every DRA state its spec enables
//! ([`DraState::enabled_states`]), each from its assets and its standard plugin, as a
//! ClusterPolicy's states are. Used by `kiln render --gpu-cluster` and by the operator's
//! GPUCluster controller.
//!
//! ```text
//! GPUCluster ─► GpuClusterDoc (CRD defaults, pruning, schema) ─► per DRA state:
//!   assets/state-<name> ─► placeholders ─► plugin <name> (spec: the GPUCluster's, as JSON)
//!   ─► DeviceClass apiVersion from discovery ─► objects
//! ```
//!
//! Two facts are the host's, not the plugins':
//! - the DeviceClass `apiVersion` is the `resource.k8s.io` version the cluster serves
//!   (discovery; [`DEVICE_CLASS_API`] offline), as NVIDIA takes it;
//! - the validator and exporter images: kiln's validator and exporter do not implement the DRA
//!   contracts (the driver-validation `driver-ready` file, GPU-to-pod mapping through
//!   ResourceClaims), so where the operator's `VALIDATOR_IMAGE` / `DCGM_EXPORTER_IMAGE` is
//!   kiln's image the DRA states run NVIDIA's ([`NVIDIA_VALIDATOR_IMAGE`],
//!   [`NVIDIA_DCGM_EXPORTER_IMAGE`]).

use kiln_core::context::TransformContext;
use kiln_core::spec::gpucluster::{
    DraState, GPU_CLUSTER_NAME, GpuClusterSpec, default_spec, openapi_schema,
};
use kiln_plugin_host::{ChainInput, PluginError, PluginRef};
use serde_json::{Value, json};

use crate::defaults::{KILN_IMAGE_REPOSITORY, NVIDIA_VALIDATOR_IMAGE, set_fallback_image};
use crate::{PolicyError, Renderer, assets, check, placeholders};

/// The DeviceClass `apiVersion` when nothing was discovered (`kiln render` offline): the GA
/// version, served since Kubernetes 1.34.
pub const DEVICE_CLASS_API: &str = "resource.k8s.io/v1";

/// NVIDIA's dcgm-exporter image, which the DRA exporter runs where the operator's
/// `DCGM_EXPORTER_IMAGE` is kiln's (the image of NVIDIA's sample GPUCluster).
pub const NVIDIA_DCGM_EXPORTER_IMAGE: &str =
    "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.1-4.8.0-distroless";

/// A parsed GPUCluster document.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuClusterDoc {
    /// `metadata.name` (always [`GPU_CLUSTER_NAME`]).
    pub name: String,
    /// `metadata.uid` (empty offline, when the file has none).
    pub uid: String,
    /// The spec as the API server stores it (CRD defaults applied, unknown fields pruned), as
    /// JSON text: what the plugins get.
    pub spec_text: String,
    /// The typed spec.
    pub spec: GpuClusterSpec,
    /// Unknown spec fields removed (paths below `spec`), as the API server prunes them.
    pub pruned: Vec<String>,
}

impl GpuClusterDoc {
    /// Validate and parse a GPUCluster object (`apiVersion: nvidia.com/v1alpha1`, `kind:
    /// GPUCluster`, named [`GPU_CLUSTER_NAME`], as the CRD's rule requires): the CRD's defaults
    /// and pruning, its schema (types, patterns, the health port's range, …), the values no
    /// operand can use ([`kiln_core::spec::check_values`]), then the typed parse.
    ///
    /// # Errors
    /// [`PolicyError`] naming the field (`metadata.name: GPUCluster is a singleton, …`,
    /// `spec.draDriver: required`, `spec.draDriver.gpus.kubeletPlugin.healthcheck.port: 0 is
    /// less than the minimum 1`).
    pub fn from_object(doc: &Value) -> Result<Self, PolicyError> {
        let obj = doc.as_object().ok_or(PolicyError::NotAnObject)?;
        let shown = |v: Option<&Value>| v.map_or("nothing".to_string(), Value::to_string);
        let wrong = |path: &str, message: String| {
            PolicyError::Spec(kiln_core::SpecError {
                path: path.into(),
                message,
            })
        };
        if obj.get("apiVersion").and_then(Value::as_str) != Some("nvidia.com/v1alpha1") {
            return Err(wrong(
                "apiVersion",
                format!(
                    "expected nvidia.com/v1alpha1, got {}",
                    shown(obj.get("apiVersion"))
                ),
            ));
        }
        if obj.get("kind").and_then(Value::as_str) != Some("GPUCluster") {
            return Err(wrong(
                "kind",
                format!("expected GPUCluster, got {}", shown(obj.get("kind"))),
            ));
        }
        let meta = |k: &str| {
            obj.get("metadata")
                .and_then(|m| m.get(k))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let name = meta("name");
        if name != GPU_CLUSTER_NAME {
            return Err(PolicyError::Metadata {
                field: ".name",
                message: format!(
                    "GPUCluster is a singleton, metadata.name must be '{GPU_CLUSTER_NAME}' (got {name:?})"
                ),
            });
        }
        let mut spec_json = match obj.get("spec") {
            None | Some(Value::Null) => json!({}),
            Some(v) => v.clone(),
        };
        let pruned = default_spec(&mut spec_json);
        let schema = &openapi_schema()["properties"]["spec"];
        if spec_json.get("draDriver").is_none() {
            return Err(wrong("spec.draDriver", "required".into()));
        }
        kiln_core::spec::schema::validate(schema, &spec_json, "spec")?;
        kiln_core::spec::check_values(&spec_json)?;
        let spec: GpuClusterSpec =
            serde_json::from_value(spec_json.clone()).map_err(|e| kiln_core::SpecError {
                path: "spec".into(),
                message: e.to_string(),
            })?;
        Ok(GpuClusterDoc {
            name,
            uid: meta("uid"),
            spec_text: spec_json.to_string(),
            spec,
            pruned,
        })
    }
}

/// Why one DRA state could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum GpuClusterError {
    /// The state's assets are broken (a build defect).
    #[error(transparent)]
    Asset(#[from] assets::AssetError),
    /// The state's plugin failed; the error names the plugin.
    #[error("state {state}: {source}")]
    Plugin {
        /// The state.
        state: DraState,
        /// What the plugin did wrong.
        #[source]
        source: PluginError,
    },
    /// A rendered object carries a value the API server refuses ([`check`]).
    #[error("state {state}: {source}")]
    Invalid {
        /// The state.
        state: DraState,
        /// The object, field and rule.
        #[source]
        source: check::ObjectError,
    },
}

/// The context the DRA states render with: `base` for `state`, with kiln's validator and
/// exporter images replaced by NVIDIA's (see the module doc).
pub fn context(state: DraState, base: &TransformContext) -> TransformContext {
    let mut ctx = base.clone();
    ctx.state = state.name().to_string();
    for (env, nvidia) in [
        ("VALIDATOR_IMAGE", NVIDIA_VALIDATOR_IMAGE),
        ("DCGM_EXPORTER_IMAGE", NVIDIA_DCGM_EXPORTER_IMAGE),
    ] {
        let kiln = ctx
            .fallback_image(env)
            .is_some_and(|i| i.starts_with(KILN_IMAGE_REPOSITORY));
        if kiln {
            set_fallback_image(&mut ctx, env, nvidia);
        }
    }
    ctx
}

/// Render one DRA state of `doc`: its assets with placeholders filled (operator namespace from
/// `base`), its standard plugin, the API server's rules ([`check`]), and every DeviceClass at
/// `device_class_api` (the `resource.k8s.io` version the cluster serves, e.g.
/// [`DEVICE_CLASS_API`]).
///
/// # Errors
/// [`GpuClusterError`] naming the state and, for plugin faults, the plugin.
pub fn render_state(
    renderer: &Renderer,
    doc: &GpuClusterDoc,
    state: DraState,
    base: &TransformContext,
    device_class_api: &str,
) -> Result<Vec<Value>, GpuClusterError> {
    let ctx = context(state, base);
    let objects: Vec<Value> = assets::load_dra_state(state)?
        .into_iter()
        .map(|a| {
            let mut o = a.object;
            // No runtime class in the DRA assets: the placeholder is the namespace's only.
            placeholders::fill(&mut o, &ctx.operator_namespace, "");
            o
        })
        .collect();
    let out = renderer
        .host()
        .run_chain(
            &[PluginRef::named(state.name())],
            &ChainInput::new(objects),
            &doc.spec_text,
            &ctx,
        )
        .map_err(|source| GpuClusterError::Plugin { state, source })?;
    let mut objects = out.objects;
    for o in &mut objects {
        if o["kind"] == "DeviceClass" {
            o["apiVersion"] = json!(device_class_api);
        }
        check::check_object(o).map_err(|source| GpuClusterError::Invalid { state, source })?;
    }
    Ok(objects)
}

/// Render every DRA state `doc` enables, in apply order (see [`render_state`]); each state's
/// result is independent.
pub fn render(
    renderer: &Renderer,
    doc: &GpuClusterDoc,
    base: &TransformContext,
    device_class_api: &str,
) -> Vec<(DraState, Result<Vec<Value>, GpuClusterError>)> {
    DraState::enabled_states(&doc.spec)
        .into_iter()
        .map(|s| (s, render_state(renderer, doc, s, base, device_class_api)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(v: Value) -> Result<GpuClusterDoc, PolicyError> {
        GpuClusterDoc::from_object(&v)
    }

    #[test]
    fn documents_are_refused_naming_the_field() {
        let ok = json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
            "metadata": {"name": "gpu-cluster"}, "spec": {"draDriver": {"image": "x"}, "bogus": 1}});
        let d = doc(ok.clone()).unwrap();
        assert_eq!(d.pruned, ["bogus"]);
        assert_eq!(d.spec.dra_driver.image, "x");
        let mut other = ok.clone();
        other["metadata"]["name"] = json!("mine");
        assert!(doc(other).unwrap_err().to_string().contains("singleton"));
        let mut other = ok.clone();
        other["kind"] = json!("ClusterPolicy");
        assert!(doc(other).unwrap_err().to_string().starts_with("kind:"));
        let mut other = ok.clone();
        other["spec"] = json!({});
        assert_eq!(
            doc(other).unwrap_err().to_string(),
            "spec.draDriver: required"
        );
        let mut other = ok;
        other["spec"]["draDriver"]["gpus"] = json!({"kubeletPlugin": {"healthcheck": {"port": 0}}});
        assert!(
            doc(other)
                .unwrap_err()
                .to_string()
                .starts_with("spec.draDriver.gpus.kubeletPlugin.healthcheck.port:")
        );
    }

    #[test]
    fn kilns_validator_and_exporter_images_give_way_to_nvidias() {
        let base = crate::defaults::render_context();
        let ctx = context(DraState::DraDriver, &base);
        assert_eq!(ctx.state, "dra-driver");
        assert_eq!(
            ctx.fallback_image("VALIDATOR_IMAGE"),
            Some(NVIDIA_VALIDATOR_IMAGE)
        );
        assert_eq!(
            ctx.fallback_image("DCGM_EXPORTER_IMAGE"),
            Some(NVIDIA_DCGM_EXPORTER_IMAGE)
        );
        // A GPUCluster that names no DRA driver image gets NVIDIA's chart default.
        assert_eq!(
            ctx.fallback_image("DRA_DRIVER_IMAGE"),
            Some("nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0")
        );
        let mut mine = base;
        set_fallback_image(&mut mine, "VALIDATOR_IMAGE", "a/validator:1");
        assert_eq!(
            context(DraState::DraValidation, &mine).fallback_image("VALIDATOR_IMAGE"),
            Some("a/validator:1")
        );
    }
}
