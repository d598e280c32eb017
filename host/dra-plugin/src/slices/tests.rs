use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kiln_gpu::{FakeBackend, GpuInventory};
use pretty_assertions::assert_eq;

use super::*;

/// Attributes kiln publishes and NVIDIA's current driver does not: v25.3's `index`, `minor`
/// and `pcieBusID`, kept for selectors written against that release.
const KILN_ONLY: [&str; 3] = ["index", "minor", "pcieBusID"];
/// Attributes NVIDIA publishes and kiln does not: the PCIe root (sysfs) and the addressing
/// mode (an NVML call kiln's GPU seam does not make).
const NVIDIA_ONLY: [&str; 2] = ["resource.kubernetes.io/pcieRoot", "addressingMode"];

fn fixture(yaml: &str) -> FakeBackend {
    FakeBackend::new(serde_yaml_ng::from_str(yaml).unwrap())
}

#[test]
fn a_gpu_is_published_as_nvidias_driver_publishes_it() {
    let golden: ResourceSlice =
        serde_yaml_ng::from_str(include_str!("../../tests/data/nvidia-slice-h100.yaml")).unwrap();
    let fake = fixture(include_str!("../../tests/data/h100-1.yaml"));
    let all = allocatable(&fake.devices().unwrap(), &fake.system().unwrap());
    let ours = slice("gpu-node-0", published(&all, &BTreeSet::new()), 1);
    // Everything outside the devices' attributes is the same.
    let strip = |s: &ResourceSlice| {
        let mut s = s.clone();
        for d in s.spec.devices.iter_mut().flatten() {
            d.attributes = None;
        }
        (s.spec.driver, s.spec.node_name, s.spec.pool, s.spec.devices)
    };
    assert_eq!(strip(&ours), strip(&golden));
    let theirs = golden.spec.devices.unwrap()[0].attributes.clone().unwrap();
    let mine = ours.spec.devices.unwrap()[0].attributes.clone().unwrap();
    let mut only_kiln = BTreeSet::new();
    let mut only_nvidia = BTreeSet::new();
    for (k, v) in &theirs {
        match mine.get(k) {
            Some(m) => assert_eq!(m, v, "attribute {k}"),
            None => {
                only_nvidia.insert(k.as_str());
            }
        }
    }
    for k in mine.keys() {
        if !theirs.contains_key(k) {
            only_kiln.insert(k.as_str());
        }
    }
    // The allowlists fail on unlisted and on stale entries alike.
    assert_eq!(only_kiln, KILN_ONLY.into_iter().collect());
    assert_eq!(only_nvidia, NVIDIA_ONLY.into_iter().collect());
}

#[test]
fn mig_devices_replace_their_gpu_and_unhealthy_gpus_leave_the_slice() {
    let fake = fixture(
        r#"
driver_version: "550.144.03"
cuda_version: "12.4"
gpus:
  - {uuid: GPU-a, name: NVIDIA A100-SXM4-40GB, memory_total_mib: 40960, compute_capability: "8.0",
     mig_enabled: true, mig_devices: [
       {uuid: MIG-a1, gpu_instance_id: 7, compute_instance_id: 0, profile: 1g.5gb,
        attributes: {multiprocessors: 14, copy_engines: 1, decoders: 0}},
       {uuid: MIG-a2, gpu_instance_id: 8, compute_instance_id: 0, profile: 1g.5gb}]}
  - {uuid: GPU-b, name: NVIDIA A100-SXM4-40GB, memory_total_mib: 40960, compute_capability: "8.0"}
"#,
    );
    let all = allocatable(&fake.devices().unwrap(), &fake.system().unwrap());
    let names: Vec<&str> = all.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(
        names,
        ["gpu-0-mig-1g5gb-7-0", "gpu-0-mig-1g5gb-8-0", "gpu-1"]
    );
    let mig = &all[0].device;
    let attrs = mig.attributes.as_ref().unwrap();
    assert_eq!(attrs["type"].string.as_deref(), Some("mig"));
    assert_eq!(attrs["parentUUID"].string.as_deref(), Some("GPU-a"));
    assert_eq!(attrs["profile"].string.as_deref(), Some("1g.5gb"));
    assert_eq!(attrs["architecture"].string.as_deref(), Some("Ampere"));
    assert_eq!(attrs["driverVersion"].version.as_deref(), Some("550.144.3"));
    let cap = mig.capacity.as_ref().unwrap();
    assert_eq!(cap["multiprocessors"].value.0, "14");
    assert_eq!(cap["decoders"].value.0, "0");
    assert!(all[1].device.capacity.is_none());
    assert_eq!(
        all[2].device.capacity.as_ref().unwrap()["memory"].value.0,
        "40Gi"
    );
    // GPU 0 unhealthy: both MIG devices go, GPU 1 stays.
    let left: Vec<String> = published(&all, &[0].into())
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(left, ["gpu-1"]);
}

#[test]
fn versions_quantities_and_bus_ids_take_the_api_servers_forms() {
    assert_eq!(semver("9.0").as_deref(), Some("9.0.0"));
    assert_eq!(semver("550.144.03").as_deref(), Some("550.144.3"));
    assert_eq!(semver("12").as_deref(), Some("12.0.0"));
    assert_eq!(semver("1.2.3.4"), None);
    assert_eq!(semver("12.x"), None);
    assert_eq!(semver(""), None);
    assert_eq!(binary_quantity(85_520_809_984).0, "81559Mi");
    assert_eq!(binary_quantity(1000).0, "1000");
    assert_eq!(binary_quantity(1 << 30).0, "1Gi");
    assert_eq!(binary_quantity(0).0, "0");
    assert_eq!(
        pci_bus_id("00000000:8D:00.0").as_deref(),
        Some("0000:8d:00.0")
    );
    assert_eq!(pci_bus_id("0000:8d:00.0").as_deref(), Some("0000:8d:00.0"));
    assert_eq!(pci_bus_id("garbage"), None);
    assert_eq!(pci_bus_id("00000000:8D:20.0"), None);
    assert_eq!(brand(Some("NVIDIA")), "Nvidia");
    assert_eq!(brand(None), "Unknown");
    assert_eq!(architecture((12, 0)), "Blackwell");
    assert_eq!(architecture((8, 9)), "Ada Lovelace");
    assert_eq!(profile_name_part("1g.10gb+me"), "1g10gb-me");
}
