//! The labels, from the node's own files: PCI devices from sysfs, the kernel release from procfs,
//! the OS from os-release. Pure apart from reading the files under [`HostPaths`], so tests run it
//! on a fake sysfs and a fake host root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::Error;

/// Label key prefix of every label written here (Node Feature Discovery's).
pub const PREFIX: &str = "feature.node.kubernetes.io/";

/// NVIDIA's PCI vendor id, as in `pci-10de.present`.
pub const NVIDIA_VENDOR: &str = "10de";

/// The PCI class prefixes NVIDIA's chart configures NFD with (`deviceClassWhitelist` of its
/// `node-feature-discovery.worker.config.sources.pci`): network (`02`, Ethernet `0200`,
/// InfiniBand `0207`), VGA (`0300`) and 3D controllers (`0302`). An NVSwitch (class `0680`)
/// alone does not make a GPU node.
pub const NVIDIA_PCI_CLASSES: [&str; 5] = ["02", "0200", "0207", "0300", "0302"];

/// The most bytes read from one host file (a sysfs attribute, os-release): 64 KiB.
const MAX_FACT_BYTES: u64 = 64 * 1024;

/// Node labels, key → value.
pub type Labels = BTreeMap<String, String>;

/// Where the agent reads the host's facts; in the DaemonSet `/sys`, `/proc` and `/host` (the
/// host's `/etc` and `/usr/lib` mounted read-only below it); in tests, a fake tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    /// sysfs (`bus/pci/devices/<address>/{vendor,class}`).
    pub sys: PathBuf,
    /// procfs (`sys/kernel/osrelease`: the kernel release `uname -r` prints; the kernel is the
    /// host's in any container).
    pub proc: PathBuf,
    /// The host's root as mounted in the pod: `etc/os-release`, else `usr/lib/os-release`;
    /// NFD's local feature files in [`crate::local::FEATURES_DIR`].
    pub host_root: PathBuf,
    /// PCI class prefixes (4 hex digits or fewer) whose devices are labelled; see
    /// [`NVIDIA_PCI_CLASSES`].
    pub pci_classes: Vec<String>,
}

impl Default for HostPaths {
    fn default() -> Self {
        Self {
            sys: "/sys".into(),
            proc: "/proc".into(),
            host_root: "/host".into(),
            pci_classes: NVIDIA_PCI_CLASSES
                .iter()
                .map(|c| (*c).to_string())
                .collect(),
        }
    }
}

/// Every label computed from this node's facts: [`pci_labels`], [`kernel_labels`],
/// [`os_release_labels`] (the agent adds the feature files' labels, `node::node_labels`). A
/// missing os-release leaves the OS labels out (a warning); a missing kernel release or an
/// unreadable PCI directory is an error (the agent runs on Linux nodes only).
///
/// # Errors
/// [`Error::Pci`] when `<sys>/bus/pci/devices` cannot be listed, [`Error::Input`] when the
/// kernel release cannot be read.
pub fn discover(paths: &HostPaths) -> Result<Labels, Error> {
    let mut labels = pci_labels(&paths.sys, &paths.pci_classes)?;
    let release =
        kiln_input::read_bounded(&paths.proc.join("sys/kernel/osrelease"), MAX_FACT_BYTES)?;
    labels.extend(kernel_labels(release.trim()));
    match read_os_release(&paths.host_root) {
        Ok(text) => labels.extend(os_release_labels(&text)),
        Err(e) => tracing::warn!(error = %e, "no os-release; OS labels left out"),
    }
    Ok(labels)
}

/// `pci-<vendor>.present=true` for each vendor with a device whose class (the first 4 hex digits
/// of sysfs's `0x030200`) starts with one of `classes` (NFD's `deviceLabelFields: [vendor]`).
/// A device whose attributes cannot be read is skipped.
///
/// # Errors
/// [`Error::Pci`] when `<sys>/bus/pci/devices` cannot be listed. A machine with no PCI bus
/// (the directory absent) has no labels.
pub fn pci_labels(sys: &Path, classes: &[String]) -> Result<Labels, Error> {
    let dir = sys.join("bus/pci/devices");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Labels::new()),
        Err(error) => return Err(Error::Pci { dir, error }),
    };
    let mut labels = Labels::new();
    for entry in entries.flatten() {
        let attr = |name: &str| {
            kiln_input::read_bounded(&entry.path().join(name), MAX_FACT_BYTES)
                .ok()
                .map(|s| s.trim().trim_start_matches("0x").to_ascii_lowercase())
        };
        let (Some(vendor), Some(class)) = (attr("vendor"), attr("class")) else {
            continue;
        };
        let class = class.get(..4).unwrap_or(&class);
        if !classes.iter().any(|c| class.starts_with(c.as_str())) {
            continue;
        }
        let key = format!("{PREFIX}pci-{vendor}.present");
        if kiln_input::k8s::is_label_key(&key) {
            labels.insert(key, "true".into());
        }
    }
    Ok(labels)
}

/// NFD's kernel labels from a kernel release: `kernel-version.full` (characters a label value
/// cannot hold replaced by `_`, trimmed of `-_.` at both ends) and, when it starts with
/// `<major>.<minor>.<revision>`, those three.
#[must_use]
pub fn kernel_labels(release: &str) -> Labels {
    let full: String = release
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let full = full.trim_matches(['-', '_', '.']);
    let mut labels = Labels::new();
    if full.is_empty() || !kiln_input::k8s::is_label_value(full) {
        return labels;
    }
    labels.insert(format!("{PREFIX}kernel-version.full"), full.to_string());
    let numbers: Vec<&str> = full
        .splitn(4, '.')
        .take(3)
        .map(|part| {
            let end = part
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(part.len());
            &part[..end]
        })
        .collect();
    // The first two parts must be whole numbers; the third may be followed by `-…`.
    let whole = |i: usize| full.split('.').nth(i).is_some_and(|p| p == numbers[i]);
    if numbers.len() == 3 && numbers.iter().all(|n| !n.is_empty()) && whole(0) && whole(1) {
        for (name, n) in ["major", "minor", "revision"].iter().zip(&numbers) {
            labels.insert(format!("{PREFIX}kernel-version.{name}"), (*n).to_string());
        }
    }
    labels
}

/// NFD's OS labels from an os-release file: `system-os_release.ID`, `.VERSION_ID` and
/// `.VERSION_ID.major` / `.VERSION_ID.minor` (its first two dot-separated parts, when there
/// are two or more). Values are unquoted (`"22.04"`, `'9.4'`); one a label cannot hold is
/// left out.
#[must_use]
pub fn os_release_labels(text: &str) -> Labels {
    let mut labels = Labels::new();
    let mut put = |key: String, value: &str| {
        if !value.is_empty() && kiln_input::k8s::is_label_value(value) {
            labels.insert(key, value.to_string());
        }
    };
    for line in text.lines() {
        let Some((key, value)) = line.trim().split_once('=') else {
            continue;
        };
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
            .unwrap_or(value);
        match key.trim() {
            "ID" => put(format!("{PREFIX}system-os_release.ID"), value),
            "VERSION_ID" => {
                put(format!("{PREFIX}system-os_release.VERSION_ID"), value);
                let mut parts = value.split('.');
                if let (Some(major), Some(minor)) = (parts.next(), parts.next()) {
                    put(format!("{PREFIX}system-os_release.VERSION_ID.major"), major);
                    put(format!("{PREFIX}system-os_release.VERSION_ID.minor"), minor);
                }
            }
            _ => {}
        }
    }
    labels
}

/// The host's os-release text: `<root>/etc/os-release`, else `<root>/usr/lib/os-release`
/// (os-release(5)). A symlink with an absolute target (`/etc/os-release` →
/// `/usr/lib/os-release`) is followed inside `root`, not the pod's own filesystem.
fn read_os_release(root: &Path) -> Result<String, kiln_input::InputError> {
    let mut last = None;
    for rel in ["etc/os-release", "usr/lib/os-release"] {
        let mut path = root.join(rel);
        if let Ok(target) = std::fs::read_link(&path)
            && let Ok(inside) = target.strip_prefix("/")
        {
            path = root.join(inside);
        }
        match kiln_input::read_bounded(&path, MAX_FACT_BYTES) {
            Ok(text) => return Ok(text),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("two candidates tried"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (format!("{PREFIX}{k}"), (*v).to_string()))
            .collect()
    }

    /// A fake host: PCI devices `(address, vendor, class)`, a kernel release, an os-release.
    fn host(devices: &[(&str, &str, &str)], release: &str, os: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (addr, vendor, class) in devices {
            let d = dir.path().join("sys/bus/pci/devices").join(addr);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("sys/bus/pci/devices")).unwrap();
        std::fs::create_dir_all(dir.path().join("proc/sys/kernel")).unwrap();
        std::fs::write(dir.path().join("proc/sys/kernel/osrelease"), release).unwrap();
        if let Some(os) = os {
            std::fs::create_dir_all(dir.path().join("host/usr/lib")).unwrap();
            std::fs::create_dir_all(dir.path().join("host/etc")).unwrap();
            std::fs::write(dir.path().join("host/usr/lib/os-release"), os).unwrap();
            // As on Debian and Ubuntu: an absolute symlink, resolved inside the host root.
            std::os::unix::fs::symlink(
                "/usr/lib/os-release",
                dir.path().join("host/etc/os-release"),
            )
            .unwrap();
        }
        dir
    }

    fn paths(dir: &Path) -> HostPaths {
        HostPaths {
            sys: dir.join("sys"),
            proc: dir.join("proc"),
            host_root: dir.join("host"),
            ..HostPaths::default()
        }
    }

    #[test]
    fn a_gpu_node_gets_the_labels_the_states_read() {
        let dir = host(
            &[
                ("0000:00:02.0", "0x8086", "0x030000"),
                ("0000:8d:00.0", "0x10de", "0x030200"),
                ("0000:8e:00.0", "0x10DE", "0x030200"),
                ("0000:1a:00.0", "0x15b3", "0x020700"),
                ("0000:00:1f.0", "0x8086", "0x060100"),
            ],
            "6.8.0-51-generic\n",
            Some("NAME=\"Ubuntu\"\nID=ubuntu\nVERSION_ID=\"22.04\"\nID_LIKE=debian\n"),
        );
        assert_eq!(
            discover(&paths(dir.path())).unwrap(),
            labels(&[
                ("pci-10de.present", "true"),
                ("pci-15b3.present", "true"),
                ("pci-8086.present", "true"),
                ("kernel-version.full", "6.8.0-51-generic"),
                ("kernel-version.major", "6"),
                ("kernel-version.minor", "8"),
                ("kernel-version.revision", "0"),
                ("system-os_release.ID", "ubuntu"),
                ("system-os_release.VERSION_ID", "22.04"),
                ("system-os_release.VERSION_ID.major", "22"),
                ("system-os_release.VERSION_ID.minor", "04"),
            ])
        );
    }

    #[test]
    fn an_nvswitch_alone_or_no_pci_bus_is_no_gpu_node() {
        let dir = host(&[("0000:05:00.0", "0x10de", "0x068000")], "5.14.0", None);
        let found = discover(&paths(dir.path())).unwrap();
        assert!(!found.contains_key(&format!("{PREFIX}pci-10de.present")));
        std::fs::remove_dir_all(dir.path().join("sys/bus")).unwrap();
        assert_eq!(
            pci_labels(&dir.path().join("sys"), &HostPaths::default().pci_classes).unwrap(),
            Labels::new()
        );
    }

    #[test]
    fn a_missing_os_release_leaves_the_os_labels_out_and_a_missing_kernel_is_an_error() {
        let dir = host(&[], "5.14.0-427.el9.x86_64", None);
        assert_eq!(
            discover(&paths(dir.path())).unwrap(),
            labels(&[
                ("kernel-version.full", "5.14.0-427.el9.x86_64"),
                ("kernel-version.major", "5"),
                ("kernel-version.minor", "14"),
                ("kernel-version.revision", "0"),
            ])
        );
        std::fs::remove_file(dir.path().join("proc/sys/kernel/osrelease")).unwrap();
        let err = discover(&paths(dir.path())).unwrap_err().to_string();
        assert!(err.contains("osrelease"), "{err}");
    }

    #[test]
    fn the_class_prefixes_are_configurable() {
        let dir = host(&[("0000:05:00.0", "0x10de", "0x068000")], "6.1.0", None);
        let found = pci_labels(&dir.path().join("sys"), &["0680".to_string()]).unwrap();
        assert_eq!(found, labels(&[("pci-10de.present", "true")]));
    }

    #[test]
    fn kernel_releases_follow_nfds_rule() {
        assert_eq!(
            kernel_labels("4.18.0-553.el8_10.x86_64"),
            labels(&[
                ("kernel-version.full", "4.18.0-553.el8_10.x86_64"),
                ("kernel-version.major", "4"),
                ("kernel-version.minor", "18"),
                ("kernel-version.revision", "0"),
            ])
        );
        // Characters a label cannot hold become `_`; no three numbers: only the full label.
        assert_eq!(
            kernel_labels("6.8+rt"),
            labels(&[("kernel-version.full", "6.8_rt")])
        );
        assert_eq!(kernel_labels("--"), Labels::new());
    }

    #[test]
    fn os_release_values_are_unquoted_and_bad_ones_left_out() {
        assert_eq!(
            os_release_labels("ID='rhel'\nVERSION_ID=\"9.4\"\n"),
            labels(&[
                ("system-os_release.ID", "rhel"),
                ("system-os_release.VERSION_ID", "9.4"),
                ("system-os_release.VERSION_ID.major", "9"),
                ("system-os_release.VERSION_ID.minor", "4"),
            ])
        );
        assert_eq!(
            os_release_labels("ID=\"arch linux\"\nVERSION_ID=rolling\n"),
            labels(&[("system-os_release.VERSION_ID", "rolling")])
        );
    }
}
