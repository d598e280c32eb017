//! Kubernetes name and label syntax (apimachinery `validation.IsDNS1123Subdomain`,
//! `IsDNS1123Label`, `IsQualifiedName`, `IsValidLabelValue`), and the sanitiser GFD applies to
//! label values computed from hardware strings.

/// Longest label value and label name (the part after the `/`): 63 characters.
pub const MAX_LABEL_LEN: usize = 63;
/// Longest DNS-1123 subdomain (object names, label key prefixes): 253 characters.
pub const MAX_SUBDOMAIN_LEN: usize = 253;

fn is_label_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
}

/// A DNS-1123 label: 1–63 of `[a-z0-9-]`, alphanumeric at both ends (namespace names).
#[must_use]
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL_LEN
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A DNS-1123 subdomain: 1–253 characters, dot-separated DNS-1123 labels (most object names,
/// label key prefixes).
#[must_use]
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SUBDOMAIN_LEN && s.split('.').all(is_dns1123_label)
}

/// Why a name is not a DNS-1123 subdomain, in apimachinery's words; `None` when it is one.
#[must_use]
pub fn dns1123_subdomain_error(s: &str) -> Option<String> {
    if is_dns1123_subdomain(s) {
        return None;
    }
    if s.len() > MAX_SUBDOMAIN_LEN {
        return Some(format!(
            "must be no more than {MAX_SUBDOMAIN_LEN} characters"
        ));
    }
    Some(format!(
        "\"{}\" is not a lowercase RFC 1123 subdomain: it must consist of lower case \
         alphanumeric characters, '-' or '.', and must start and end with an alphanumeric \
         character",
        s.escape_debug()
    ))
}

/// A label value: empty, or at most 63 of `[-_.A-Za-z0-9]` with an alphanumeric at both ends.
#[must_use]
pub fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    b.is_empty()
        || (b.len() <= MAX_LABEL_LEN
            && b.iter().copied().all(is_label_char)
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric())
}

/// A label key: `[prefix/]name`, the prefix a DNS-1123 subdomain, the name a non-empty label
/// value (1–63 of `[-_.A-Za-z0-9]`, alphanumeric at both ends).
#[must_use]
pub fn is_label_key(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    prefix.is_none_or(is_dns1123_subdomain) && !name.is_empty() && is_label_value(name)
}

/// `raw` as a valid label value: characters outside `[-_.A-Za-z0-9]` become `-` (a run of
/// them one `-`), then the value is cut to 63 characters and trimmed to alphanumerics at both
/// ends. `None` when nothing is left of a non-empty `raw` (it cannot be expressed). A valid
/// value is returned unchanged.
#[must_use]
pub fn sanitize_label_value(raw: &str) -> Option<String> {
    if is_label_value(raw) {
        return Some(raw.to_owned());
    }
    let mut out = String::with_capacity(raw.len().min(MAX_LABEL_LEN * 4));
    for c in raw.chars() {
        let c = if c.is_ascii() && is_label_char(c as u8) {
            c
        } else {
            '-'
        };
        if !(c == '-' && out.ends_with('-')) {
            out.push(c);
        }
        if out.len() > MAX_LABEL_LEN * 2 {
            break; // enough to cut from; the rest is dropped anyway
        }
    }
    let trimmed = out.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    let cut = &trimmed[..trimmed.len().min(MAX_LABEL_LEN)];
    let value = cut.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    (!value.is_empty()).then(|| value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_follow_the_api_server() {
        for ok in [
            "",
            "a",
            "NVIDIA-H100-80GB-HBM3",
            "1g.10gb",
            "a_b.c-d",
            &"x".repeat(63),
        ] {
            assert!(is_label_value(ok), "{ok}");
        }
        for bad in [
            "-a",
            "a-",
            "_a",
            "a.",
            "a b",
            "a/b",
            "é",
            &"x".repeat(64),
            "a\n",
        ] {
            assert!(!is_label_value(bad), "{bad}");
        }
    }

    #[test]
    fn label_keys_follow_the_api_server() {
        for ok in [
            "nvidia.com/gpu.count",
            "nvidia.com/mig-1g.10gb.count",
            "plain",
        ] {
            assert!(is_label_key(ok), "{ok}");
        }
        for bad in [
            "nvidia.com/mig-1g 10gb.count",
            "nvidia.com/",
            "Nvidia.com/x",
            "nvidia.com/mig-1g.10gb+me.count",
            &format!("nvidia.com/{}", "x".repeat(64)),
            "a/b/c",
        ] {
            assert!(!is_label_key(bad), "{bad}");
        }
    }

    #[test]
    fn sanitising_keeps_valid_values_and_repairs_or_refuses_the_rest() {
        assert_eq!(
            sanitize_label_value("NVIDIA-A100").as_deref(),
            Some("NVIDIA-A100")
        );
        assert_eq!(sanitize_label_value("-_.A100._-").as_deref(), Some("A100"));
        assert_eq!(
            sanitize_label_value("A100 (PCIe)").as_deref(),
            Some("A100-PCIe")
        );
        let long = "N".repeat(10_000);
        assert_eq!(sanitize_label_value(&long), Some("N".repeat(63)));
        assert_eq!(
            sanitize_label_value(&format!("{}-.x", "a".repeat(62))).as_deref(),
            Some(&*"a".repeat(62))
        );
        assert_eq!(sanitize_label_value("---"), None);
        assert_eq!(sanitize_label_value("日本"), None);
        assert_eq!(sanitize_label_value("").as_deref(), Some(""));
        for raw in ["\u{1b}[31mred", "a\0b", &"é-".repeat(100)] {
            if let Some(v) = sanitize_label_value(raw) {
                assert!(is_label_value(&v), "{raw:?} -> {v:?}");
            }
        }
    }

    #[test]
    fn dns_names() {
        assert!(is_dns1123_subdomain("cluster-policy"));
        assert!(is_dns1123_subdomain("a.b-c.d"));
        assert!(is_dns1123_label("gpu-operator"));
        assert!(!is_dns1123_label("a.b"));
        for bad in ["", "A", "a\nb", "a..b", "-a", &"a".repeat(254)] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
        assert!(dns1123_subdomain_error("ok").is_none());
        let e = dns1123_subdomain_error("bad\u{7}name").unwrap();
        assert!(e.contains("bad\\u{7}name"), "{e}");
    }
}
