//! The validator DaemonSets' shared edits (upstream `TransformValidatorShared` and
//! `TransformValidatorComponent`, gpu-operator.md §3.9), used by the `operator-validation` and
//! `sandbox-validation` plugins.

use k8s_openapi::api::core::v1::{Container, PodSpec};
use kiln_core::context::TransformContext;
use kiln_core::spec::ClusterPolicySpec;

use crate::TransformError;
use crate::env::{apply_env, set_env};
use crate::pod::{
    add_pull_secrets, first_container, fit_command_args_to_image, run_as_root, set_main_image,
    set_resources, set_resources_all, set_side_image, validator_image,
};

/// Components of the operator validator, in upstream order.
pub const OPERATOR_COMPONENTS: [&str; 6] = [
    "driver",
    "nvidia-fs",
    "gdrcopy",
    "toolkit",
    "cuda",
    "plugin",
];

/// Components of the sandbox validator, in upstream order.
pub const SANDBOX_COMPONENTS: [&str; 4] =
    ["cc-manager", "vfio-pci", "vgpu-manager", "vgpu-devices"];

/// Entrypoint of NVIDIA's validator image for a component init container (it reads `COMPONENT`).
pub const UPSTREAM_VALIDATOR: &str = "nvidia-validator";

/// Upstream's main validator container script (run as `sh -c <script>`): hold after every init
/// container succeeded.
pub const UPSTREAM_HOLD_SCRIPT: &str =
    "echo all validations are successful; while true; do sleep 86400; done";

/// Upstream `TransformValidatorShared`, on container[0]: validator image (`validator.*`,
/// fallback `VALIDATOR_IMAGE`; an error naming `spec.validator` when nothing resolves), pull
/// policy, pull secrets, resources on every container, args, `validator.env`, `runAsUser: 0`.
/// On a non-kiln image, `kiln validator hold` becomes upstream's shell hold loop.
/// Returns the resolved image.
pub fn apply_validator_shared(
    pod: &mut PodSpec,
    ds: &str,
    spec: &ClusterPolicySpec,
    ctx: &TransformContext,
) -> Result<String, TransformError> {
    let v = &spec.validator.common;
    let image = validator_image(spec, ctx)?;
    let main = first_container(pod, ds)?;
    set_main_image(main, &image, &v.image_pull_policy);
    add_pull_secrets(pod, &v.image_pull_secrets);
    set_resources_all(pod, v.resources.as_ref());
    let main = first_container(pod, ds)?;
    if !v.args.is_empty() {
        main.args = Some(v.args.clone());
    }
    apply_env(main, &v.env);
    run_as_root(main);
    fit_command_args_to_image(main, &["sh", "-c"], &[UPSTREAM_HOLD_SCRIPT]);
    Ok(image)
}

/// Upstream `TransformValidatorComponent`: the first init container whose name contains
/// `<component>-validation` gets the validator image, pull policy (if set),
/// `validator.resources` and `runAsUser: 0`, plus per component:
/// - `cuda`: `VALIDATOR_IMAGE`, `VALIDATOR_IMAGE_PULL_POLICY` (raw spec string),
///   `VALIDATOR_IMAGE_PULL_SECRETS` (comma list, if any), `VALIDATOR_RUNTIME_CLASS` (pod
///   runtimeClassName, if set), then `validator.cuda.env`;
/// - `plugin`: removed when the device plugin is disabled; else the same four envs,
///   `MIG_STRATEGY=<mig.strategy>`, then `validator.plugin.env`;
/// - `driver` / `toolkit`: `validator.driver.env` / `validator.toolkit.env`;
/// - `nvidia-fs`, `gdrcopy`: nothing more;
/// - `cc-manager`: removed when `ccManager` is disabled;
/// - `vfio-pci` / `vgpu-manager` / `vgpu-devices`: `DEFAULT_GPU_WORKLOAD_CONFIG=<default
///   workload>`, then `validator.vfioPCI` / `vgpuManager` / `vgpuDevices` `.env`.
///
/// No matching init container is a no-op (the image is not even resolved). On a non-kiln image
/// `kiln validator <component>` becomes `nvidia-validator` with `COMPONENT=<component>`; on
/// kiln's image the cuda container gains `NVIDIA_VISIBLE_DEVICES=all`, since kiln's step runs
/// CUDA in that container where upstream's starts a `vectorAdd` pod.
///
/// # Errors
/// An unknown component whose init container exists, or an unresolvable validator image.
pub fn transform_validator_component(
    pod: &mut PodSpec,
    spec: &ClusterPolicySpec,
    ctx: &TransformContext,
    component: &str,
) -> Result<(), TransformError> {
    let needle = format!("{component}-validation");
    let Some(idx) = pod
        .init_containers
        .iter()
        .flatten()
        .position(|c| c.name.contains(&needle))
    else {
        return Ok(());
    };
    let removed = match component {
        "plugin" => !spec.device_plugin.common.enabled_or(true),
        "cc-manager" => !spec.cc_manager.common.enabled_or(false),
        _ => false,
    };
    if removed {
        if let Some(list) = pod.init_containers.as_mut() {
            list.remove(idx);
        }
        return Ok(());
    }
    let v = &spec.validator;
    let image = validator_image(spec, ctx)?;
    let runtime_class = pod.runtime_class_name.clone();
    let Some(ctr) = pod.init_containers.as_mut().and_then(|l| l.get_mut(idx)) else {
        return Ok(());
    };
    set_side_image(ctr, &image, &v.common.image_pull_policy);
    set_resources(ctr, v.common.resources.as_ref());
    match component {
        "cuda" => {
            workload_pod_env(ctr, spec, &image, runtime_class.as_deref());
            apply_env(ctr, &v.cuda.env);
        }
        "plugin" => {
            workload_pod_env(ctr, spec, &image, runtime_class.as_deref());
            let strategy = spec.mig.strategy.map(|s| s.as_str()).unwrap_or_default();
            set_env(ctr, "MIG_STRATEGY", strategy);
            apply_env(ctr, &v.plugin.env);
        }
        "driver" => apply_env(ctr, &v.driver.env),
        "toolkit" => apply_env(ctr, &v.toolkit.env),
        "nvidia-fs" | "gdrcopy" | "cc-manager" => {}
        "vfio-pci" | "vgpu-manager" | "vgpu-devices" => {
            set_env(
                ctr,
                "DEFAULT_GPU_WORKLOAD_CONFIG",
                ctx.default_workload.clone(),
            );
            let env = match component {
                "vfio-pci" => &v.vfio_pci.env,
                "vgpu-manager" => &v.vgpu_manager.env,
                _ => &v.vgpu_devices.env,
            };
            apply_env(ctr, env);
        }
        other => {
            return Err(TransformError::Failed(format!(
                "invalid component {other:?} provided to apply validator changes"
            )));
        }
    }
    run_as_root(ctr);
    if runs_kiln(ctr) && !crate::image::is_kiln_image(&image) {
        set_env(ctr, "COMPONENT", component);
    }
    if component == "cuda" && runs_kiln(ctr) && crate::image::is_kiln_image(&image) {
        // kiln's cuda step opens CUDA in this container (upstream's starts a workload pod
        // instead), so the NVIDIA runtime must inject the driver's libraries and every GPU.
        set_env(ctr, "NVIDIA_VISIBLE_DEVICES", "all");
    }
    fit_command_args_to_image(ctr, &["sh", "-c"], &[UPSTREAM_VALIDATOR]);
    Ok(())
}

fn runs_kiln(ctr: &Container) -> bool {
    ctr.command
        .as_ref()
        .and_then(|c| c.first())
        .is_some_and(|c| c == "kiln")
}

/// The envs the cuda and plugin validators use to spin off their workload pods.
fn workload_pod_env(
    ctr: &mut Container,
    spec: &ClusterPolicySpec,
    image: &str,
    runtime_class: Option<&str>,
) {
    let v = &spec.validator.common;
    set_env(ctr, "VALIDATOR_IMAGE", image);
    set_env(
        ctr,
        "VALIDATOR_IMAGE_PULL_POLICY",
        v.image_pull_policy.clone(),
    );
    if !v.image_pull_secrets.is_empty() {
        set_env(
            ctr,
            "VALIDATOR_IMAGE_PULL_SECRETS",
            v.image_pull_secrets.join(","),
        );
    }
    if let Some(rc) = runtime_class {
        set_env(ctr, "VALIDATOR_RUNTIME_CLASS", rc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(names: &[&str]) -> PodSpec {
        PodSpec {
            init_containers: Some(
                names
                    .iter()
                    .map(|n| Container {
                        name: n.to_string(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn spec_with_image() -> ClusterPolicySpec {
        let mut s = ClusterPolicySpec::default();
        s.validator.common.image = "validator:1".into();
        s
    }

    #[test]
    fn unknown_component_with_a_matching_init_container_is_an_error() {
        let mut p = pod(&["bogus-validation"]);
        let e = transform_validator_component(
            &mut p,
            &spec_with_image(),
            &TransformContext::default(),
            "bogus",
        )
        .unwrap_err();
        assert!(e.to_string().contains("invalid component"));
    }

    #[test]
    fn no_matching_init_container_is_a_no_op_even_with_a_nil_spec() {
        let mut p = pod(&["other"]);
        let before = p.clone();
        for c in OPERATOR_COMPONENTS.iter().chain(&SANDBOX_COMPONENTS) {
            transform_validator_component(
                &mut p,
                &ClusterPolicySpec::default(),
                &TransformContext::default(),
                c,
            )
            .unwrap();
        }
        assert_eq!(p, before);
    }

    #[test]
    fn non_kiln_image_runs_nvidia_validator_with_component() {
        let mut p = pod(&["driver-validation"]);
        p.init_containers.as_mut().unwrap()[0].command =
            Some(vec!["kiln".into(), "validator".into(), "driver".into()]);
        transform_validator_component(
            &mut p,
            &spec_with_image(),
            &TransformContext::default(),
            "driver",
        )
        .unwrap();
        let c = &p.init_containers.unwrap()[0];
        assert_eq!(c.command, Some(vec!["sh".to_string(), "-c".to_string()]));
        assert_eq!(c.args, Some(vec![UPSTREAM_VALIDATOR.to_string()]));
        assert_eq!(crate::env::get_env(c, "COMPONENT"), Some("driver"));
        assert_eq!(c.security_context.as_ref().unwrap().run_as_user, Some(0));
    }
}
