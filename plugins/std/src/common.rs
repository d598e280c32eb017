//! Common DaemonSet processing that wraps every standard transform (upstream
//! `preProcessDaemonSet`, §4): common config, host-path rewrites, then (after the per-operand
//! transform) common metadata.

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetUpdateStrategy, RollingUpdateDaemonSet};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kiln_core::spec::{ClusterPolicySpec, UpdateStrategy};

use crate::TransformError;
use crate::env::set_env;
use crate::pod::{ds_name, mount, pod_spec, set_host_path, template_annotations, template_labels};

/// Template labels never overwritten by `daemonsets.labels`: selectors are immutable.
const PROTECTED_TEMPLATE_LABELS: [&str; 2] = ["app", "app.kubernetes.io/part-of"];

/// Upstream `applyCommonDaemonsetConfig`:
/// - `updateStrategy: OnDelete` → `{type: OnDelete}` on every DaemonSet; otherwise, only when
///   `rollingUpdate.maxUnavailable` is set and the name does not start with
///   `nvidia-driver-daemonset`: `{type: RollingUpdate, maxUnavailable}` (an int, or a string
///   ending in `%`);
/// - `priorityClassName`, `tolerations` (replace, not merge) and `podSecurityContext` when set.
///
/// # Errors
/// `spec.daemonsets.rollingUpdate.maxUnavailable` that is neither an int nor a percentage.
pub fn apply_common_config(
    ds: &mut DaemonSet,
    spec: &ClusterPolicySpec,
) -> Result<(), TransformError> {
    let d = &spec.daemonsets;
    let name = ds_name(ds);
    if d.update_strategy == Some(UpdateStrategy::OnDelete) {
        ds.spec.get_or_insert_with(Default::default).update_strategy =
            Some(DaemonSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                rolling_update: None,
            });
    } else if !d.rolling_update.max_unavailable.is_empty()
        && !name.starts_with("nvidia-driver-daemonset")
    {
        let max = parse_max_unavailable(&d.rolling_update.max_unavailable)?;
        ds.spec.get_or_insert_with(Default::default).update_strategy =
            Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_unavailable: Some(max),
                    max_surge: None,
                }),
            });
    }
    let pod = pod_spec(ds);
    if !d.priority_class_name.is_empty() {
        pod.priority_class_name = Some(d.priority_class_name.clone());
    }
    if !d.tolerations.is_empty() {
        pod.tolerations = Some(d.tolerations.clone());
    }
    if let Some(psc) = &d.pod_security_context {
        pod.security_context = Some(psc.clone());
    }
    Ok(())
}

/// `"1"` → int 1, `"10%"` → string `"10%"`, by the one int-or-percent rule
/// ([`kiln_core::intstr::IntOrPercent::parse_str`]); anything else (`"150%"`, `"-1"`) is an
/// error naming the field.
pub fn parse_max_unavailable(raw: &str) -> Result<IntOrString, TransformError> {
    kiln_core::intstr::IntOrPercent::parse_str(raw)
        .map(kiln_core::intstr::IntOrPercent::to_int_or_string)
        .map_err(|message| {
            TransformError::field("spec.daemonsets.rollingUpdate.maxUnavailable", message)
        })
}

/// Upstream host-path rewrites, run on every DaemonSet before its transform:
/// - `hostPaths.rootFS` not in {"", "/"}: volume `host-root` → rootFS and `HOST_ROOT=<rootFS>`
///   on every container and init container (only when `host-root` exists); volume
///   `host-dev-char` → `<rootFS>/dev/char`;
/// - `hostPaths.driverInstallDir` not in {"", "/run/nvidia/driver"}: volume
///   `driver-install-dir` → dir, and the `driver-validation` init container gets
///   `DRIVER_INSTALL_DIR` and `DRIVER_INSTALL_DIR_CTR_PATH` = dir and its mount moved to dir.
pub fn apply_host_paths(ds: &mut DaemonSet, spec: &ClusterPolicySpec) {
    let hp = &spec.host_paths;
    let pod = pod_spec(ds);
    let root = hp.root_fs.as_str();
    if !root.is_empty() && root != "/" {
        if set_host_path(pod, "host-root", root) {
            for ctr in pod
                .init_containers
                .iter_mut()
                .flatten()
                .chain(pod.containers.iter_mut())
            {
                set_env(ctr, "HOST_ROOT", root);
            }
        }
        set_host_path(
            pod,
            "host-dev-char",
            &format!("{}/dev/char", root.trim_end_matches('/')),
        );
    }
    let dir = hp.driver_install_dir.as_str();
    if !dir.is_empty() && dir != "/run/nvidia/driver" {
        set_host_path(pod, "driver-install-dir", dir);
        if let Some(ctr) = crate::pod::init_container(pod, "driver-validation") {
            set_env(ctr, "DRIVER_INSTALL_DIR", dir);
            set_env(ctr, "DRIVER_INSTALL_DIR_CTR_PATH", dir);
            if let Some(m) = ctr
                .volume_mounts
                .iter_mut()
                .flatten()
                .find(|m| m.name == "driver-install-dir")
            {
                *m = mount("driver-install-dir", dir);
            }
        }
    }
}

/// Upstream `applyCommonDaemonsetMetadata` plus the DaemonSet-control step that copies
/// `daemonsets.labels`/`annotations` onto the DaemonSet itself: pod template labels (except
/// `app` and `app.kubernetes.io/part-of`) and annotations (unfiltered), and the DaemonSet's own
/// labels and annotations (unfiltered).
pub fn apply_common_metadata(ds: &mut DaemonSet, spec: &ClusterPolicySpec) {
    let d = &spec.daemonsets;
    if !d.labels.is_empty() {
        let tl = template_labels(ds);
        for (k, v) in &d.labels {
            if !PROTECTED_TEMPLATE_LABELS.contains(&k.as_str()) {
                tl.insert(k.clone(), v.clone());
            }
        }
        let ml = ds.metadata.labels.get_or_insert_with(Default::default);
        ml.extend(d.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    if !d.annotations.is_empty() {
        template_annotations(ds).extend(d.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
        let ma = ds.metadata.annotations.get_or_insert_with(Default::default);
        ma.extend(d.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
}
