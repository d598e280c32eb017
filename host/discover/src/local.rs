//! Node Feature Discovery's *local* source: the `key=value` files that node agents write into
//! the host's `/etc/kubernetes/node-feature-discovery/features.d/`, which nfd-worker turns
//! into node labels. kiln's GFD writes its `nvidia.com/*` labels there when the chart's
//! discovery replaces NFD (the chart sets `USE_NODE_FEATURE_API=false` on GFD then, as NVIDIA's
//! operator does on OpenShift), and this agent applies them to its own node.
//!
//! File format (NFD's): one label per line, `name=value` or `name` (value `true`); lines
//! starting with `#` are comments or directives (`# +expiry-time=…`, not supported: such
//! files' labels stay until the file changes); a name without a `/` gets NFD's prefix
//! [`PREFIX`](crate::PREFIX); hidden files (`.gfd.tmp`, GFD's file while it is written) are
//! skipped; files are read in name order and a later file's key wins.
//!
//! Least privilege: only keys this agent may write are taken — NFD's namespace
//! `feature.node.kubernetes.io/` and GFD's own label keys ([`is_gfd_label`], the same set the
//! chart's admission policy admits as [`GFD_LABEL_KEY_PATTERN`]); any other key (say an
//! operator label such as `nvidia.com/gpu.deploy.driver`) is left out with a warning, and a
//! value a label cannot hold likewise.

use std::path::Path;

use crate::PREFIX;
use crate::features::Labels;

/// Where the local source's files are, below the host's root (`<host>/etc/…`; the DaemonSet
/// mounts the host's `/etc` read-only at `/host/etc`).
pub const FEATURES_DIR: &str = "etc/kubernetes/node-feature-discovery/features.d";

/// The most bytes read from one feature file (64 KiB; GFD's is under 4 KiB).
const MAX_FILE_BYTES: u64 = 64 * 1024;

/// The most feature files read (in name order); the rest are skipped with a warning.
pub const MAX_FILES: usize = 64;

/// The label keys GFD writes, as the RE2 pattern the chart's admission policy
/// (`kiln-node-discovery`, variable `gfdKeys`) matches keys with; [`is_gfd_label`] is the same
/// rule. The names are kiln GFD's (`kiln_gfd::make_labels`, NVIDIA GFD v0.20's set): its
/// timestamp, the CUDA driver and runtime versions, vGPU, MIG and MPS capability, the MIG
/// strategy, and the per-resource attributes of `gpu` and of each MIG profile
/// (`mig-1g.10gb`). The operator's own `nvidia.com/` labels (`gpu.present`, `gpu.deploy.*`,
/// `gpu.workload.config`, `mig.config`, the upgrade states) do not match.
pub const GFD_LABEL_KEY_PATTERN: &str = r"^nvidia\.com/(gfd\.timestamp|cuda\.(driver|runtime|driver-version|runtime-version)\.(major|minor|rev|revision|full)|vgpu\.(present|host-driver-version|host-driver-branch)|mig\.capable|mps\.capable|mig\.strategy|(gpu|mig-[a-z0-9.+-]+)\.(product|count|replicas|sharing-strategy|memory|family|compute\.major|compute\.minor|clique|machine|mode|multiprocessors|slices\.gi|slices\.ci|engines\.(copy|decoder|encoder|jpeg|ofa)))$";

/// The per-resource attributes of [`GFD_LABEL_KEY_PATTERN`] (after `gpu.` or `mig-<profile>.`).
const RESOURCE_ATTRIBUTES: [&str; 19] = [
    "product",
    "count",
    "replicas",
    "sharing-strategy",
    "memory",
    "family",
    "compute.major",
    "compute.minor",
    "clique",
    "machine",
    "mode",
    "multiprocessors",
    "slices.gi",
    "slices.ci",
    "engines.copy",
    "engines.decoder",
    "engines.encoder",
    "engines.jpeg",
    "engines.ofa",
];

/// Whether `key` is one of GFD's label keys ([`GFD_LABEL_KEY_PATTERN`]).
#[must_use]
pub fn is_gfd_label(key: &str) -> bool {
    let Some(name) = key.strip_prefix("nvidia.com/") else {
        return false;
    };
    let one_of = |s: &str, set: &[&str]| set.contains(&s);
    if let Some(rest) = name.strip_prefix("cuda.") {
        return rest.split_once('.').is_some_and(|(what, part)| {
            one_of(
                what,
                &["driver", "runtime", "driver-version", "runtime-version"],
            ) && one_of(part, &["major", "minor", "rev", "revision", "full"])
        });
    }
    if let Some(rest) = name.strip_prefix("vgpu.") {
        return one_of(
            rest,
            &["present", "host-driver-version", "host-driver-branch"],
        );
    }
    if one_of(
        name,
        &[
            "gfd.timestamp",
            "mig.capable",
            "mps.capable",
            "mig.strategy",
        ],
    ) {
        return true;
    }
    let is_attribute = |a: &str| RESOURCE_ATTRIBUTES.contains(&a);
    if let Some(rest) = name.strip_prefix("gpu.") {
        return is_attribute(rest);
    }
    // `mig-<profile>.<attribute>`: the profile is one or more of [a-z0-9.+-], so any split at
    // a dot that leaves a known attribute after it and a non-empty profile before it matches.
    let Some(rest) = name.strip_prefix("mig-") else {
        return false;
    };
    rest.char_indices().any(|(i, c)| {
        c == '.'
            && i > 0
            && rest[..i]
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ".+-".contains(c))
            && is_attribute(&rest[i + 1..])
    })
}

/// Whether this agent may write `key`: NFD's namespace or one of GFD's keys.
#[must_use]
pub fn may_write(key: &str) -> bool {
    key.starts_with(PREFIX) || is_gfd_label(key)
}

/// The labels of the feature files in `dir` (see the module docs). A missing directory has
/// none (no agent wrote any yet); an unreadable file is skipped with a warning.
#[must_use]
pub fn local_labels(dir: &Path) -> Labels {
    let mut labels = Labels::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return labels,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot list feature files");
            return labels;
        }
    };
    let mut files: Vec<_> = entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    files.sort();
    if files.len() > MAX_FILES {
        tracing::warn!(dir = %dir.display(), files = files.len(), "more than {MAX_FILES} feature files; the rest are skipped");
        files.truncate(MAX_FILES);
    }
    for file in files {
        match kiln_input::read_bounded(&file, MAX_FILE_BYTES) {
            Ok(text) => labels.extend(parse_feature_file(&text, &file)),
            Err(e) => tracing::warn!(error = %e, "feature file skipped"),
        }
    }
    labels
}

/// One feature file's labels this agent may write (the `file` only names it in warnings).
#[must_use]
pub fn parse_feature_file(text: &str, file: &Path) -> Labels {
    let mut labels = Labels::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line.split_once('=').unwrap_or((line, "true"));
        let key = if name.contains('/') {
            name.to_string()
        } else {
            format!("{PREFIX}{name}")
        };
        if !kiln_input::k8s::is_label_key(&key) || !kiln_input::k8s::is_label_value(value) {
            tracing::warn!(file = %file.display(), line, "not a valid label; left out");
        } else if !may_write(&key) {
            tracing::warn!(file = %file.display(), key, "not a feature.node.kubernetes.io/ or GFD label key; left out");
        } else {
            labels.insert(key, value.to_string());
        }
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn gfds_keys_and_nfds_namespace_may_be_written_operator_keys_may_not() {
        for key in [
            "nvidia.com/gfd.timestamp",
            "nvidia.com/gpu.product",
            "nvidia.com/gpu.count",
            "nvidia.com/gpu.memory",
            "nvidia.com/gpu.compute.major",
            "nvidia.com/gpu.engines.ofa",
            "nvidia.com/gpu.slices.gi",
            "nvidia.com/cuda.driver.rev",
            "nvidia.com/cuda.runtime-version.full",
            "nvidia.com/vgpu.present",
            "nvidia.com/mig.strategy",
            "nvidia.com/mps.capable",
            "nvidia.com/mig-1g.10gb.count",
            "nvidia.com/mig-1g.10gb.me.product",
            "nvidia.com/mig-1c.2g.20gb.engines.copy",
            "feature.node.kubernetes.io/custom.present",
        ] {
            assert!(may_write(key), "{key}");
        }
        for key in [
            "nvidia.com/gpu.present",
            "nvidia.com/gpu.deploy.driver",
            "nvidia.com/gpu.deploy.operands",
            "nvidia.com/gpu.workload.config",
            "nvidia.com/mig.config",
            "nvidia.com/mig.config.state",
            "nvidia.com/vgpu.config",
            "nvidia.com/device-plugin.config",
            "nvidia.com/gpu-driver-upgrade-state",
            "nvidia.com/cuda.driver",
            "nvidia.com/mig-.count",
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/mig-1G.10gb.count",
            "nvidia.com/gpu.product.x",
            "node-role.kubernetes.io/control-plane",
            "kubernetes.io/hostname",
        ] {
            assert!(!may_write(key), "{key}");
        }
    }

    #[test]
    fn the_pattern_is_the_one_the_chart_admits_with() {
        let chart = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../deploy/helm/kiln/templates/discovery.yaml"),
        )
        .unwrap();
        assert!(
            chart.contains(&format!("r'{GFD_LABEL_KEY_PATTERN}'")),
            "deploy/helm/kiln/templates/discovery.yaml's gfdKeys is not GFD_LABEL_KEY_PATTERN"
        );
    }

    #[test]
    fn feature_files_are_read_as_nfd_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("gfd"),
            "nvidia.com/gfd.timestamp=1733400000\nnvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3\n\
             nvidia.com/gpu.count=8\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("site"),
            "# a comment\n# +expiry-time=2030-01-01T00:00:00Z\n\nrack.a17\nzone=b\n\
             nvidia.com/gpu.count=9\nnvidia.com/gpu.deploy.driver=false\nbad key=x\nv=not ok\n",
        )
        .unwrap();
        std::fs::write(dir.path().join(".gfd.tmp"), "nvidia.com/gpu.count=1\n").unwrap();
        let want: Labels = [
            ("nvidia.com/gfd.timestamp", "1733400000"),
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            ("nvidia.com/gpu.count", "9"),
            ("feature.node.kubernetes.io/rack.a17", "true"),
            ("feature.node.kubernetes.io/zone", "b"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(local_labels(dir.path()), want);
        assert_eq!(local_labels(&dir.path().join("absent")), Labels::new());
    }
}
