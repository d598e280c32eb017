//! The CDI spec of one claim, `<cdi root>/k8s.gpu.nvidia.com-claim_<claim uid>.json` (NVIDIA's
//! transient spec name): kind `k8s.gpu.nvidia.com/claim`, one device per allocated GPU or MIG
//! device named `<claim uid>-<device name>`, so the kubelet passes the runtime
//! `k8s.gpu.nvidia.com/claim=<uid>-gpu-0`.
//!
//! The content is what kiln's device plugin generates
//! ([`kiln_device_plugin::cdi::build_spec`]: the device nodes, the control nodes that exist,
//! the driver libraries of the running driver version, its firmware and the `update-ldcache`
//! hook), renamed to the claim's kind and device names. Written atomically (temp file + rename,
//! mode 0644) by the same writer.

use std::path::{Path, PathBuf};

use kiln_device_plugin::{
    cdi::{Spec, build_spec},
    devices::{Physical, Resource, Unit},
    settings::Settings,
};

use crate::slices::Allocatable;

/// The claim spec's kind (vendor `k8s.gpu.nvidia.com`, class `claim`).
pub const CLAIM_KIND: &str = "k8s.gpu.nvidia.com/claim";

/// The spec file of claim `uid`.
#[must_use]
pub fn spec_file(cdi_root: &Path, uid: &str) -> PathBuf {
    cdi_root.join(format!(
        "k8s.gpu.nvidia.com-claim_{}.json",
        uid.replace('/', "_")
    ))
}

/// The CDI device name of `device` in claim `uid`.
#[must_use]
pub fn device_name(uid: &str, device: &str) -> String {
    format!("{uid}-{device}")
}

/// The fully qualified CDI device id the kubelet passes to the runtime.
#[must_use]
pub fn qualified(uid: &str, device: &str) -> String {
    format!("{CLAIM_KIND}={}", device_name(uid, device))
}

/// Builds claim `uid`'s spec for `devices` with the device plugin's generator (`settings`:
/// driver root, dev root, hook path; host files looked up under `container_driver_root`).
#[must_use]
pub fn claim_spec(
    uid: &str,
    devices: &[&Allocatable],
    settings: &Settings,
    driver_version: &str,
    container_driver_root: &Path,
) -> Spec {
    let units = devices
        .iter()
        .map(|a| Unit {
            id: a.uuid.clone(),
            replica: 0,
            physical: Physical {
                uuid: a.uuid.clone(),
                index: a.index.clone(),
                gpu_index: a.gpu_index,
                paths: a.paths.clone(),
                numa_node: None,
                links: Vec::new(),
            },
        })
        .collect();
    let resource = Resource {
        name: format!("{}/claim", crate::DRIVER_NAME),
        replicas: 1,
        units,
    };
    let mut settings = settings.clone();
    settings.device_id_strategy = kiln_device_plugin::config::DeviceIdStrategy::Uuid;
    let mut spec = build_spec(
        &[resource],
        &settings,
        driver_version,
        container_driver_root,
    );
    spec.kind = CLAIM_KIND.into();
    for d in &mut spec.devices {
        if let Some(a) = devices.iter().find(|a| a.uuid == d.name) {
            d.name = device_name(uid, &a.name);
        }
    }
    spec.devices.sort_by(|a, b| a.name.cmp(&b.name));
    spec
}

/// Writes claim `uid`'s spec under `cdi_root`; returns its path.
///
/// # Errors
/// The write error, naming the file.
pub fn write(
    cdi_root: &Path,
    uid: &str,
    spec: &Spec,
) -> Result<PathBuf, kiln_device_plugin::cdi::CdiError> {
    // The device plugin's writer writes its own file name; write there in a private
    // directory and move the file to the claim's name (same file system: an atomic rename).
    let target = spec_file(cdi_root, uid);
    let staging = cdi_root.join(format!(".claim-{}.d", uid.replace('/', "_")));
    let written = kiln_device_plugin::cdi::write_spec(&staging, spec)?;
    let err = |source| kiln_device_plugin::cdi::CdiError {
        path: target.clone(),
        source,
    };
    std::fs::rename(&written, &target).map_err(err)?;
    std::fs::remove_dir(&staging).map_err(err)?;
    Ok(target)
}

/// Removes claim `uid`'s spec; a missing file is fine.
///
/// # Errors
/// The remove error.
pub fn remove(cdi_root: &Path, uid: &str) -> std::io::Result<()> {
    match std::fs::remove_file(spec_file(cdi_root, uid)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use kiln_device_plugin::{config::Config, settings::Overrides};
    use kiln_gpu::{FakeBackend, GpuInventory};

    use super::*;

    #[test]
    fn a_claim_spec_names_the_claims_devices_and_mounts_the_drivers_libraries() {
        let fake = FakeBackend::new(
            serde_yaml_ng::from_str(include_str!("../tests/data/h100-1.yaml")).unwrap(),
        );
        let sys = fake.system().unwrap();
        let all = crate::slices::allocatable(&fake.devices().unwrap(), &sys);
        assert_eq!(crate::slices::published(&all, &BTreeSet::new()).len(), 1);
        let root = tempfile::tempdir().unwrap();
        let lib = root.path().join("usr/lib64");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libcuda.so.570.86.15"), b"").unwrap();
        let mut settings = Settings::resolve(&Overrides::default(), &Config::default()).unwrap();
        settings.driver_root = "/run/nvidia/driver".into();
        settings.dev_root = "/".into();
        let spec = claim_spec(
            "uid-1",
            &[&all[0]],
            &settings,
            &sys.driver_version,
            root.path(),
        );
        assert_eq!(spec.kind, CLAIM_KIND);
        assert_eq!(spec.devices.len(), 1);
        assert_eq!(spec.devices[0].name, "uid-1-gpu-0");
        assert_eq!(
            spec.devices[0].container_edits.device_nodes[0].path,
            "/dev/nvidia0"
        );
        let mounts: Vec<&str> = spec
            .container_edits
            .mounts
            .iter()
            .map(|m| m.host_path.as_str())
            .collect();
        assert_eq!(
            mounts,
            ["/run/nvidia/driver/usr/lib64/libcuda.so.570.86.15"]
        );

        let cdi = tempfile::tempdir().unwrap();
        let path = write(cdi.path(), "uid-1", &spec).unwrap();
        assert_eq!(path, cdi.path().join("k8s.gpu.nvidia.com-claim_uid-1.json"));
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(json["kind"], CLAIM_KIND);
        assert_eq!(json["devices"][0]["name"], "uid-1-gpu-0");
        // Only the spec is left in the CDI directory.
        assert_eq!(std::fs::read_dir(cdi.path()).unwrap().count(), 1);
        assert_eq!(
            qualified("uid-1", "gpu-0"),
            "k8s.gpu.nvidia.com/claim=uid-1-gpu-0"
        );
        remove(cdi.path(), "uid-1").unwrap();
        remove(cdi.path(), "uid-1").unwrap();
        assert!(!path.exists());
    }
}
