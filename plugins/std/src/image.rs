//! Image references and pull policies (upstream `ImagePath` and `ImagePullPolicy` rules).

use kiln_core::context::TransformContext;
use kiln_core::spec::{ComponentSpec, DriverManagerSpec};

use crate::TransformError;

/// The repository/image/version triple of a spec block.
#[derive(Debug, Clone, Copy)]
pub struct ImageFields<'a> {
    /// `repository`.
    pub repository: &'a str,
    /// `image`.
    pub image: &'a str,
    /// `version` (a tag, or a digest starting with `sha256:`).
    pub version: &'a str,
}

impl<'a> From<&'a ComponentSpec> for ImageFields<'a> {
    fn from(c: &'a ComponentSpec) -> Self {
        ImageFields {
            repository: &c.repository,
            image: &c.image,
            version: &c.version,
        }
    }
}

impl<'a> From<&'a DriverManagerSpec> for ImageFields<'a> {
    fn from(c: &'a DriverManagerSpec) -> Self {
        ImageFields {
            repository: &c.repository,
            image: &c.image,
            version: &c.version,
        }
    }
}

/// Resolve an image reference.
///
/// - `image` alone (repository and version empty) → `image` verbatim;
/// - all three empty → the operator's fallback image `fallback_env` (e.g. `DEVICE_PLUGIN_IMAGE`)
///   from [`TransformContext::fallback_images`];
/// - otherwise all three are required: `repo/image@sha256:…` for a digest, else
///   `repo/image:version`.
///
/// # Errors
/// [`TransformError::InvalidField`] at `path` when fields are missing or nothing resolves.
pub fn resolve_image(
    path: &str,
    f: ImageFields<'_>,
    fallback_env: &str,
    ctx: &TransformContext,
) -> Result<String, TransformError> {
    let (r, i, v) = (f.repository, f.image, f.version);
    if r.is_empty() && v.is_empty() && !i.is_empty() {
        return Ok(i.to_string());
    }
    if r.is_empty() && i.is_empty() && v.is_empty() {
        return ctx.fallback_image(fallback_env).map(str::to_string).ok_or_else(|| {
            TransformError::field(
                path,
                format!("no image: set repository, image and version, or the operator's {fallback_env}"),
            )
        });
    }
    let missing: Vec<&str> = [("repository", r), ("image", i), ("version", v)]
        .into_iter()
        .filter(|(_, val)| val.is_empty())
        .map(|(k, _)| k)
        .collect();
    if !missing.is_empty() {
        return Err(TransformError::field(
            path,
            format!("incomplete image: {} must be set too", missing.join(", ")),
        ));
    }
    if v.starts_with("sha256:") {
        Ok(format!("{r}/{i}@{v}"))
    } else {
        Ok(format!("{r}/{i}:{v}"))
    }
}

/// Resolve a pull policy for a main container: `Always`, `Never`, `IfNotPresent` map directly,
/// anything else (empty included) becomes `IfNotPresent`.
pub fn pull_policy(raw: &str) -> String {
    match raw {
        "Always" | "Never" | "IfNotPresent" => raw.to_string(),
        _ => "IfNotPresent".to_string(),
    }
}

/// Whether `image` is kiln's own image (its last path segment, before tag or digest, is `kiln`).
/// kiln-provided operands run `kiln <subcommand>`; on any other image the plugins fall back to
/// the image's own entrypoint.
pub fn is_kiln_image(image: &str) -> bool {
    let no_digest = image.split('@').next().unwrap_or(image);
    let last = no_digest.rsplit('/').next().unwrap_or(no_digest);
    last.split(':').next() == Some("kiln")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f<'a>(r: &'a str, i: &'a str, v: &'a str) -> ImageFields<'a> {
        ImageFields {
            repository: r,
            image: i,
            version: v,
        }
    }

    #[test]
    fn image_rules() {
        let ctx = TransformContext {
            fallback_images: vec![(
                "DCGM_IMAGE".into(),
                "nvcr.io/nvidia/cloud-native/dcgm:4".into(),
            )],
            ..Default::default()
        };
        assert_eq!(
            resolve_image("p", f("r", "i", "v1"), "X", &ctx).unwrap(),
            "r/i:v1"
        );
        assert_eq!(
            resolve_image("p", f("r", "i", "sha256:ab"), "X", &ctx).unwrap(),
            "r/i@sha256:ab"
        );
        assert_eq!(
            resolve_image("p", f("", "full/img:1", ""), "X", &ctx).unwrap(),
            "full/img:1"
        );
        assert_eq!(
            resolve_image("p", f("", "", ""), "DCGM_IMAGE", &ctx).unwrap(),
            "nvcr.io/nvidia/cloud-native/dcgm:4"
        );
        let e = resolve_image("spec.dcgm", f("", "", ""), "GFD_IMAGE", &ctx).unwrap_err();
        assert_eq!(
            e.to_string(),
            "spec.dcgm: no image: set repository, image and version, or the operator's GFD_IMAGE"
        );
        let e = resolve_image("spec.dcgm", f("r", "i", ""), "X", &ctx).unwrap_err();
        assert_eq!(
            e.to_string(),
            "spec.dcgm: incomplete image: version must be set too"
        );
    }

    #[test]
    fn kiln_image_detection() {
        assert!(is_kiln_image("ghcr.io/kiln-dev/kiln:0.1.0"));
        assert!(is_kiln_image("kiln@sha256:00"));
        assert!(!is_kiln_image("nvcr.io/nvidia/k8s-device-plugin:v0.20.0"));
        assert!(!is_kiln_image("registry/kiln/device-plugin:1"));
        assert_eq!(pull_policy(""), "IfNotPresent");
        assert_eq!(pull_policy("Always"), "Always");
        assert_eq!(pull_policy("sometimes"), "IfNotPresent");
    }
}
