//! References to plugins in an OCI registry: `oci://REGISTRY/REPOSITORY@sha256:<64 hex>`.
//!
//! A chain entry of the `kiln.dev/plugins` annotation may name such a reference instead of a
//! drop-in plugin. The digest is **required**: it names the artifact's manifest, which names the
//! component's layer by its own digest, so what runs is fixed by the policy and never by what a
//! registry serves under a tag at the time. Tags are accepted only where something is pushed
//! (`kiln plugin push PLUGIN.wasm oci://REGISTRY/REPOSITORY:TAG`, [`OciTarget`]).
//!
//! The grammar follows the OCI distribution specification's names: the registry is a host name
//! or IPv4 address with an optional port; the repository is one or more `/`-separated path
//! components of lowercase letters and digits joined by `.`, `_`, `__` or runs of `-`; the digest
//! is `sha256:` and 64 lowercase hex digits (the specification's encoding for sha256). The
//! plugin a reference names is the repository's last path component
//! ([`OciRef::plugin_name`]): the component's `name()` export must return it.

use std::fmt;

/// The scheme that marks a chain entry's name as a registry reference.
pub const OCI_SCHEME: &str = "oci://";

/// Whether `name` is meant as a registry reference (starts with [`OCI_SCHEME`]); it still has to
/// pass [`OciRef::parse`].
pub fn is_oci(name: &str) -> bool {
    name.starts_with(OCI_SCHEME)
}

/// A pinned reference `oci://REGISTRY/REPOSITORY@sha256:<64 hex>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OciRef {
    registry: String,
    repository: String,
    /// 64 lowercase hex digits.
    digest: String,
}

/// A push target `oci://REGISTRY/REPOSITORY:TAG`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciTarget {
    /// Registry host (and port).
    pub registry: String,
    /// Repository path.
    pub repository: String,
    /// Tag (`[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`).
    pub tag: String,
}

/// Why a text is not a valid reference; the message quotes the text and says what is expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OciRefError {
    /// It does not start with `oci://`.
    #[error(
        "{0:?} is not an oci:// reference (expected oci://REGISTRY/REPOSITORY@sha256:<64 hex>)"
    )]
    Scheme(String),
    /// It names a tag or nothing where a digest is required.
    #[error(
        "{0:?} names no digest: a plugin is pulled by digest only (oci://REGISTRY/REPOSITORY@sha256:<64 hex>; `kiln plugin push` prints it), never by tag"
    )]
    NoDigest(String),
    /// The digest is not `sha256:` and 64 lowercase hex digits.
    #[error("{0:?}: the digest must be sha256: and 64 lowercase hex digits")]
    BadDigest(String),
    /// The registry part is empty or not a host[:port].
    #[error("{0:?}: invalid registry (expected a host name or address with an optional :port)")]
    BadRegistry(String),
    /// The repository part is empty or not lowercase path components.
    #[error(
        "{0:?}: invalid repository (lowercase letters and digits, separated by '.', '_', '__' or '-', in '/'-separated components)"
    )]
    BadRepository(String),
    /// A push target without a tag, or with an invalid one.
    #[error(
        "{0:?}: a push target needs a tag (oci://REGISTRY/REPOSITORY:TAG, tag [A-Za-z0-9_][A-Za-z0-9._-]{{0,127}})"
    )]
    BadTag(String),
}

impl OciRef {
    /// Parses `oci://REGISTRY/REPOSITORY@sha256:<64 hex>`.
    ///
    /// # Errors
    /// [`OciRefError`]: not `oci://`, no digest (a tag, or nothing), a digest that is not
    /// sha256 in lowercase hex, an invalid registry or repository.
    pub fn parse(text: &str) -> Result<Self, OciRefError> {
        let rest = text
            .strip_prefix(OCI_SCHEME)
            .ok_or_else(|| OciRefError::Scheme(text.to_string()))?;
        let Some((name, digest)) = rest.split_once('@') else {
            return Err(OciRefError::NoDigest(text.to_string()));
        };
        let hex = digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .ok_or_else(|| OciRefError::BadDigest(text.to_string()))?;
        let (registry, repository) = split_name(text, name)?;
        if tag_split(repository).is_some() {
            // `repo:tag@sha256:…`: the tag would be ignored; refuse it rather than mislead.
            return Err(OciRefError::BadRepository(text.to_string()));
        }
        check_repository(text, repository)?;
        Ok(OciRef {
            registry: registry.to_string(),
            repository: repository.to_string(),
            digest: hex.to_string(),
        })
    }

    /// Registry host (and port), e.g. `ghcr.io` or `127.0.0.1:5000`.
    pub fn registry(&self) -> &str {
        &self.registry
    }
    /// Repository path, e.g. `acme/site-tolerations`.
    pub fn repository(&self) -> &str {
        &self.repository
    }
    /// The manifest digest's 64 lowercase hex digits.
    pub fn digest_hex(&self) -> &str {
        &self.digest
    }
    /// The manifest digest, `sha256:<hex>`.
    pub fn digest(&self) -> String {
        format!("sha256:{}", self.digest)
    }
    /// The plugin the reference names: the repository's last path component, which the
    /// component's `name()` export must return.
    pub fn plugin_name(&self) -> &str {
        self.repository
            .rsplit('/')
            .next()
            .unwrap_or(&self.repository)
    }
    /// `REGISTRY/REPOSITORY@sha256:<hex>`, the reference without the scheme (as registry
    /// clients take it).
    pub fn without_scheme(&self) -> String {
        format!(
            "{}/{}@sha256:{}",
            self.registry, self.repository, self.digest
        )
    }
}

impl fmt::Display for OciRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{OCI_SCHEME}{}", self.without_scheme())
    }
}

impl OciTarget {
    /// Parses `oci://REGISTRY/REPOSITORY:TAG`.
    ///
    /// # Errors
    /// [`OciRefError`]: not `oci://`, a digest given (push by tag), no or an invalid tag, an
    /// invalid registry or repository.
    pub fn parse(text: &str) -> Result<Self, OciRefError> {
        let rest = text
            .strip_prefix(OCI_SCHEME)
            .ok_or_else(|| OciRefError::Scheme(text.to_string()))?;
        if rest.contains('@') {
            return Err(OciRefError::BadTag(text.to_string()));
        }
        let (registry, path) = split_name(text, rest)?;
        let (repository, tag) =
            tag_split(path).ok_or_else(|| OciRefError::BadTag(text.to_string()))?;
        let tag_ok = tag.len() <= 128
            && tag.bytes().enumerate().all(|(i, b)| {
                b.is_ascii_alphanumeric() || b == b'_' || (i > 0 && matches!(b, b'.' | b'-'))
            })
            && !tag.is_empty();
        if !tag_ok {
            return Err(OciRefError::BadTag(text.to_string()));
        }
        check_repository(text, repository)?;
        Ok(OciTarget {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag: tag.to_string(),
        })
    }

    /// The pinned reference to the manifest with digest `hex` (64 lowercase hex digits) pushed
    /// to this target's repository.
    ///
    /// # Errors
    /// [`OciRefError::BadDigest`] when `hex` is not 64 lowercase hex digits.
    pub fn pinned(&self, hex: &str) -> Result<OciRef, OciRefError> {
        OciRef::parse(&format!(
            "{OCI_SCHEME}{}/{}@sha256:{hex}",
            self.registry, self.repository
        ))
    }
}

impl fmt::Display for OciTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{OCI_SCHEME}{}/{}:{}",
            self.registry, self.repository, self.tag
        )
    }
}

/// `REGISTRY/PATH` → (registry, path), the registry checked.
fn split_name<'a>(text: &str, name: &'a str) -> Result<(&'a str, &'a str), OciRefError> {
    let (registry, path) = name
        .split_once('/')
        .ok_or_else(|| OciRefError::BadRepository(text.to_string()))?;
    let (host, port) = match registry.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (registry, None),
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    if host_ok && port_ok {
        Ok((registry, path))
    } else {
        Err(OciRefError::BadRegistry(text.to_string()))
    }
}

/// `repo:tag` → (repo, tag) when the last path component has a `:`.
fn tag_split(path: &str) -> Option<(&str, &str)> {
    let last = path.rfind('/').map_or(0, |i| i + 1);
    path[last..]
        .find(':')
        .map(|i| (&path[..last + i], &path[last + i + 1..]))
}

/// The distribution specification's repository name grammar.
fn check_repository(text: &str, repository: &str) -> Result<(), OciRefError> {
    let component_ok = |c: &str| {
        let bytes = c.as_bytes();
        let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
            return false;
        }
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            if alnum(b) {
                i += 1;
                continue;
            }
            // A separator: `.`, `_`, `__` or a run of `-`, between alphanumerics.
            let run = bytes[i..].iter().take_while(|&&x| x == b).count();
            let ok = match b {
                b'.' => run == 1,
                b'_' => run <= 2,
                b'-' => true,
                _ => false,
            };
            if !ok {
                return false;
            }
            i += run;
        }
        true
    };
    if !repository.is_empty() && repository.len() <= 255 && repository.split('/').all(component_ok)
    {
        Ok(())
    } else {
        Err(OciRefError::BadRepository(text.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_pinned_references() {
        let r = OciRef::parse(&format!("oci://127.0.0.1:5000/acme/site-x@sha256:{HEX}")).unwrap();
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "acme/site-x");
        assert_eq!(r.digest_hex(), HEX);
        assert_eq!(r.digest(), format!("sha256:{HEX}"));
        assert_eq!(r.plugin_name(), "site-x");
        assert_eq!(
            r.to_string(),
            format!("oci://127.0.0.1:5000/acme/site-x@sha256:{HEX}")
        );
        assert_eq!(OciRef::parse(&r.to_string()).unwrap(), r);
        let one = OciRef::parse(&format!("oci://ghcr.io/place__x.y--z@sha256:{HEX}")).unwrap();
        assert_eq!(one.plugin_name(), "place__x.y--z");
        assert!(is_oci("oci://x") && !is_oci("site-x"));
    }

    #[test]
    fn refuses_tags_and_bad_parts() {
        let tag = "oci://ghcr.io/acme/site-x:v1";
        assert_eq!(OciRef::parse(tag), Err(OciRefError::NoDigest(tag.into())));
        let msg = OciRef::parse(tag).unwrap_err().to_string();
        assert!(
            msg.contains("pulled by digest only") && msg.contains(tag),
            "{msg}"
        );
        let bad = [
            ("ghcr.io/acme/x@sha256:{HEX}", "Scheme"),
            ("oci://ghcr.io/acme/x", "NoDigest"),
            ("oci://ghcr.io/acme/x@sha256:abc", "BadDigest"),
            ("oci://ghcr.io/acme/x@sha512:{HEX}", "BadDigest"),
            ("oci://ghcr.io/acme/x@sha256:{UPPER}", "BadDigest"),
            ("oci://ghcr.io/acme/x:v1@sha256:{HEX}", "BadRepository"),
            ("oci://ghcr.io@sha256:{HEX}", "BadRepository"),
            ("oci://ghcr.io/Acme/x@sha256:{HEX}", "BadRepository"),
            ("oci://ghcr.io/acme//x@sha256:{HEX}", "BadRepository"),
            ("oci://ghcr.io/acme/x-@sha256:{HEX}", "BadRepository"),
            ("oci://ghcr.io/a...b@sha256:{HEX}", "BadRepository"),
            ("oci://gh_cr.io/x@sha256:{HEX}", "BadRegistry"),
            ("oci://ghcr.io:port/x@sha256:{HEX}", "BadRegistry"),
            ("oci:///x@sha256:{HEX}", "BadRegistry"),
        ];
        for (text, want) in bad {
            let text = text
                .replace("{HEX}", HEX)
                .replace("{UPPER}", &HEX.to_ascii_uppercase());
            let err = OciRef::parse(&text).unwrap_err();
            assert!(format!("{err:?}").starts_with(want), "{text}: {err:?}");
            assert!(err.to_string().contains(&format!("{text:?}")), "{err}");
        }
    }

    #[test]
    fn parses_push_targets() {
        let t = OciTarget::parse("oci://localhost:5000/plugins/site-x:v1.0").unwrap();
        assert_eq!(
            (t.registry.as_str(), t.repository.as_str(), t.tag.as_str()),
            ("localhost:5000", "plugins/site-x", "v1.0")
        );
        assert_eq!(t.to_string(), "oci://localhost:5000/plugins/site-x:v1.0");
        let pinned = t.pinned(HEX).unwrap();
        assert_eq!(
            pinned.to_string(),
            format!("oci://localhost:5000/plugins/site-x@sha256:{HEX}")
        );
        assert!(t.pinned("abc").is_err());
        for bad in [
            "oci://localhost:5000/plugins/site-x",
            "oci://localhost:5000/plugins/site-x:",
            "oci://localhost:5000/plugins/site-x:.v1",
            "oci://localhost:5000/plugins/site-x@sha256:{HEX}",
        ] {
            let bad = bad.replace("{HEX}", HEX);
            assert_eq!(
                OciTarget::parse(&bad),
                Err(OciRefError::BadTag(bad.clone()))
            );
        }
        assert!(matches!(
            OciTarget::parse("oci://localhost:5000/Plugins:v1"),
            Err(OciRefError::BadRepository(_))
        ));
    }
}
