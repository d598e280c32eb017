//! Standard plugin of the `dcgm` state: the standalone DCGM host engine DaemonSet
//! (upstream `TransformDCGM`, gpu-operator.md §3.7).

use kiln_plugin_std::k8s_openapi::api::apps::v1::DaemonSet;
use kiln_plugin_std::pod::{
    apply_component_basics, apply_host_network, ds_name, first_container, pod_spec,
    set_nri_annotation, set_runtime_class, transform_validation_init_containers,
};
use kiln_plugin_std::{ClusterPolicySpec, Operand, TransformContext, TransformError, env, image};

/// The `dcgm` operand.
pub struct Dcgm;

impl Operand for Dcgm {
    const NAME: &'static str = "dcgm";

    /// Validation init containers; image, pull policy, secrets, resources, args and env from
    /// `dcgm.*` (fallback `DCGM_IMAGE`); NRI annotation; runtime class; `dcgm.hostNetwork`.
    fn daemonset(
        ds: &mut DaemonSet,
        spec: &ClusterPolicySpec,
        ctx: &TransformContext,
    ) -> Result<(), TransformError> {
        let name = ds_name(ds);
        let c = &spec.dcgm.common;
        let img = image::resolve_image("spec.dcgm", c.into(), "DCGM_IMAGE", ctx)?;
        let pod = pod_spec(ds);
        transform_validation_init_containers(pod, spec, ctx)?;
        apply_component_basics(pod, &name, None, &img, c)?;
        env::apply_env(first_container(pod, &name)?, &c.env);
        set_runtime_class(pod, spec, ctx);
        apply_host_network(pod, c.host_network);
        let main = first_container(pod, &name)?.name.clone();
        set_nri_annotation(ds, spec, &main);
        Ok(())
    }
}

kiln_plugin_std::export_operand!(Dcgm);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cases() {
        kiln_plugin_std::testing::assert_cases::<Dcgm>(env!("CARGO_MANIFEST_DIR"), 2);
    }

    #[test]
    fn sets_image_env_and_runtime_class() {
        let ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "nvidia-dcgm", "namespace": "gpu-operator"},
            "spec": {"selector": {"matchLabels": {"app": "nvidia-dcgm"}},
                     "template": {"metadata": {"labels": {"app": "nvidia-dcgm"}},
                                  "spec": {"containers": [{"name": "nvidia-dcgm-ctr"}]}}}});
        let spec = json!({"dcgm": {"repository": "r", "image": "dcgm", "version": "4", "env": [{"name": "A", "value": "b"}]}});
        let out = kiln_plugin_std::apply_native::<Dcgm>(&[ds], &spec, &TransformContext::default())
            .unwrap();
        let pod = &out[0].as_ref().unwrap()["spec"]["template"]["spec"];
        assert_eq!(pod["containers"][0]["image"], "r/dcgm:4");
        assert_eq!(pod["containers"][0]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(
            pod["containers"][0]["env"],
            json!([{"name": "A", "value": "b"}])
        );
        assert_eq!(pod["runtimeClassName"], "nvidia");
    }
}
