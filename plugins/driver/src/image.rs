//! Driver image tags (upstream `resolveDriverTag`, gpu-operator.md §3.1 step 2).

use kiln_plugin_std::driver_family::{os_tag, with_os_tag};
use kiln_plugin_std::image::{ImageFields, resolve_image};
use kiln_plugin_std::kiln_core::spec::{ClusterPolicySpec, ComponentSpec};
use kiln_plugin_std::{TransformContext, TransformError};

/// Whether `driver.usePrecompiled` is set (nil = false).
pub fn precompiled(spec: &ClusterPolicySpec) -> bool {
    spec.driver.use_precompiled == Some(true)
}

/// The kernel of this precompiled DaemonSet, or an error naming the missing context fact.
pub fn kernel(ctx: &TransformContext) -> Result<&str, TransformError> {
    ctx.kernel_version
        .as_deref()
        .filter(|k| !k.is_empty())
        .ok_or_else(|| {
            TransformError::Failed(
                "context.kernelVersion is not set: driver.usePrecompiled needs the kernel of \
                 this per-kernel driver DaemonSet"
                    .into(),
            )
        })
}

/// The driver image: `driver.*` (fallback `DRIVER_IMAGE`) + `-<osTag>`, or, precompiled,
/// `repo/image:version-<kernel>-<osTag>` (`image-<kernel>` when only `image` is set). A digest
/// reference is used verbatim in both modes (a digest cannot take a suffix).
pub fn driver_image(
    spec: &ClusterPolicySpec,
    ctx: &TransformContext,
) -> Result<String, TransformError> {
    let c = &spec.driver.common;
    let img = resolve_image("spec.driver", c.into(), "DRIVER_IMAGE", ctx)?;
    if !precompiled(spec) {
        return Ok(with_os_tag(&img, &os_tag(ctx, "driver")?));
    }
    let kernel = kernel(ctx)?;
    if img.contains("sha256:") {
        return Ok(img);
    }
    if c.repository.is_empty() && c.version.is_empty() && !c.image.is_empty() {
        return Ok(format!("{img}-{kernel}"));
    }
    Ok(format!("{img}-{kernel}-{}", os_tag(ctx, "driver")?))
}

/// A sidecar image (`gds`, `gdrcopy`): resolved at `path` (fallback `fallback_env`) + `-<osTag>`.
pub fn sidecar_image(
    c: &ComponentSpec,
    path: &str,
    fallback_env: &str,
    ctx: &TransformContext,
) -> Result<String, TransformError> {
    let img = resolve_image(path, ImageFields::from(c), fallback_env, ctx)?;
    Ok(with_os_tag(&img, &os_tag(ctx, path)?))
}

/// Upstream precompiled DaemonSet name suffix for a kernel: drop the arch strings `x86_64`,
/// `aarch64` (and their `_64k` forms), `_` → `.`, trim a trailing `.`, lowercase.
pub fn sanitize_kernel(kernel: &str) -> String {
    let mut k = kernel.to_string();
    for arch in ["x86_64_64k", "aarch64_64k", "x86_64", "aarch64"] {
        k = k.replace(arch, "");
    }
    k.replace('_', ".").trim_end_matches('.').to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_sanitizing() {
        assert_eq!(sanitize_kernel("5.15.0-1040-AWS.x86_64"), "5.15.0-1040-aws");
        assert_eq!(sanitize_kernel("6.8.0_64k.aarch64_64k"), "6.8.0.64k");
    }
}
