//! From the node's GPUs to the devices of its ResourceSlice (`resource.k8s.io/v1`), with the
//! attribute and capacity names and value types NVIDIA's DRA driver publishes, so its
//! DeviceClasses (`gpu.nvidia.com`: `device.attributes['gpu.nvidia.com'].type == 'gpu'`,
//! `mig.nvidia.com`) and users' CEL selectors keep working.
//!
//! A full GPU is device `gpu-<minor>` of type `gpu`: strings `type`, `uuid`, `productName`,
//! `brand`, `architecture`; versions `cudaComputeCapability`, `driverVersion`,
//! `cudaDriverVersion` (semver, `9.0` → `9.0.0`, `550.144.03` → `550.144.3`); the standard
//! `resource.kubernetes.io/pciBusID`; capacity `memory` in bytes (a binary quantity,
//! `81559Mi`). NVIDIA's v25.3 releases also published ints `index` and `minor` and the string
//! `pcieBusID`; kiln keeps them so selectors written against those releases keep matching.
//! With MIG on, a GPU's MIG devices replace it (static MIG, as NVIDIA's driver):
//! `gpu-<minor>-mig-<profile without dots>-<GI id>-<CI id>` of type `mig` with `parentUUID`,
//! `profile`, the parent's strings and versions, and capacities `multiprocessors`,
//! `copyEngines`, `decoders`, `encoders`, `jpegEngines`, `ofaEngines` where known. (NVIDIA's
//! name ends in the profile id and placement start, which kiln's GPU seam does not read; the GI
//! and CI ids identify the device as uniquely.)
//!
//! The minor number is taken to be the NVML index, as in kiln's device plugin (`GpuDevice` has
//! no minor number).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    api::resource::v1::{Device, DeviceAttribute, DeviceCapacity, ResourcePool, ResourceSlice},
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
};
use kiln_gpu::{GpuDevice, MigDevice, SystemInfo};

use crate::DRIVER_NAME;

/// Device type attribute of a full GPU.
pub const GPU_TYPE: &str = "gpu";
/// Device type attribute of a MIG device.
pub const MIG_TYPE: &str = "mig";
/// The standard PCI bus id attribute (KEP 4381's `resource.kubernetes.io/` prefix).
pub const STANDARD_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";

/// What the plugin knows of one device it publishes: where it is on the node (for CDI) and its
/// published form.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocatable {
    /// The device's name in the slice (`gpu-0`, `gpu-0-mig-1g10gb-7-0`).
    pub name: String,
    /// `GPU-…` or `MIG-…`.
    pub uuid: String,
    /// NVML index of the (parent) GPU: XIDs arrive per GPU index.
    pub gpu_index: u32,
    /// The device-plugin style index (`"0"`, `"0:1"`), the CDI generator's input.
    pub index: String,
    /// Device nodes the container needs, e.g. `/dev/nvidia0`.
    pub paths: Vec<String>,
    /// `gpu` or `mig`.
    pub kind: &'static str,
    /// The published device.
    pub device: Device,
}

/// Every device of the node, sorted by name. A GPU whose MIG mode is on publishes its MIG
/// devices instead of itself (none when it has none configured).
#[must_use]
pub fn allocatable(gpus: &[GpuDevice], sys: &SystemInfo) -> Vec<Allocatable> {
    let mut out = Vec::new();
    for gpu in gpus {
        let path = format!("/dev/nvidia{}", gpu.index);
        if gpu.mig_enabled == Some(true) {
            for (pos, mig) in gpu.mig_devices.iter().enumerate() {
                let d = mig_device(gpu, mig, sys);
                // The parent's node, as kiln's device plugin gives a MIG device.
                let paths = vec![path.clone()];
                out.push(Allocatable {
                    name: d.name.clone(),
                    uuid: mig.uuid.clone(),
                    gpu_index: gpu.index,
                    index: format!("{}:{pos}", gpu.index),
                    paths,
                    kind: MIG_TYPE,
                    device: d,
                });
            }
        } else {
            let d = gpu_device(gpu, sys);
            out.push(Allocatable {
                name: d.name.clone(),
                uuid: gpu.uuid.clone(),
                gpu_index: gpu.index,
                index: gpu.index.to_string(),
                paths: vec![path],
                kind: GPU_TYPE,
                device: d,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The devices to publish: every allocatable device whose GPU is not in `unhealthy` (NVML
/// indexes), in name order.
#[must_use]
pub fn published(all: &[Allocatable], unhealthy: &BTreeSet<u32>) -> Vec<Device> {
    all.iter()
        .filter(|a| !unhealthy.contains(&a.gpu_index))
        .map(|a| a.device.clone())
        .collect()
}

fn string(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.to_owned()),
        ..DeviceAttribute::default()
    }
}

fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..DeviceAttribute::default()
    }
}

fn version_attr(v: &str) -> Option<DeviceAttribute> {
    semver(v).map(|s| DeviceAttribute {
        version: Some(s),
        ..DeviceAttribute::default()
    })
}

/// `v` as a strict semantic version: up to three dot-separated numbers, leading zeros dropped,
/// missing ones 0 (`9.0` → `9.0.0`, `550.144.03` → `550.144.3`), as NVIDIA's driver parses its
/// versions leniently before publishing them. `None` for anything else (the attribute is then
/// left out rather than rejected by the API server).
#[must_use]
pub fn semver(v: &str) -> Option<String> {
    let parts: Vec<&str> = v.trim().split('.').collect();
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let mut nums = Vec::with_capacity(3);
    for p in parts {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        nums.push(p.parse::<u64>().ok()?);
    }
    nums.resize(3, 0);
    Some(format!("{}.{}.{}", nums[0], nums[1], nums[2]))
}

/// The architecture name NVML reports for a compute capability, as NVIDIA's libraries spell it
/// (`Volta`, `Turing`, `Ampere`, `Ada Lovelace`, `Hopper`, `Blackwell`; `Unknown` otherwise).
#[must_use]
pub fn architecture(cc: (u32, u32)) -> &'static str {
    match cc {
        (3, _) => "Kepler",
        (5, _) => "Maxwell",
        (6, _) => "Pascal",
        (7, 0 | 2) => "Volta",
        (7, 5) => "Turing",
        (8, 9) => "Ada Lovelace",
        (8, _) => "Ampere",
        (9, _) => "Hopper",
        (10..=12, _) => "Blackwell",
        _ => "Unknown",
    }
}

/// The brand as NVIDIA's libraries spell it: DCGM's `NVIDIA` is NVML's `Nvidia`; other names
/// (`Tesla`, `Quadro`, `GeForce`, …) are the same in both; none is `Unknown`.
#[must_use]
pub fn brand(dcgm: Option<&str>) -> String {
    match dcgm {
        None | Some("") => "Unknown".into(),
        Some(b) if b.eq_ignore_ascii_case("nvidia") => "Nvidia".into(),
        Some(b) => b.to_owned(),
    }
}

/// NVML's PCI bus id (`00000000:8D:00.0`, 8-digit domain) in the standard attribute's form
/// (`0000:8d:00.0`: 4-digit domain, lower case). `None` when it does not parse.
#[must_use]
pub fn pci_bus_id(nvml: &str) -> Option<String> {
    let (domain, rest) = nvml.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    let hex = |s: &str, max: u64| u64::from_str_radix(s, 16).ok().filter(|v| *v <= max);
    let (d, b, v, f) = (
        hex(domain, 0xffff)?,
        hex(bus, 0xff)?,
        hex(dev, 0x1f)?,
        hex(func, 0x7)?,
    );
    Some(format!("{d:04x}:{b:02x}:{v:02x}.{f:x}"))
}

/// `bytes` as the API server writes a binary-SI quantity: the largest of `Ki`, `Mi`, `Gi`,
/// `Ti`, `Pi`, `Ei` that divides it exactly (`85520809984` → `81559Mi`), else plain bytes.
#[must_use]
pub fn binary_quantity(bytes: u64) -> Quantity {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return Quantity("0".into());
    }
    let mut v = bytes;
    let mut suffix = "";
    for s in SUFFIXES {
        if !v.is_multiple_of(1024) {
            break;
        }
        v /= 1024;
        suffix = s;
    }
    Quantity(format!("{v}{suffix}"))
}

fn capacity(v: u64) -> DeviceCapacity {
    DeviceCapacity {
        value: binary_quantity(v),
        ..DeviceCapacity::default()
    }
}

/// Attributes shared by a GPU and its MIG devices.
fn common_attributes(gpu: &GpuDevice, sys: &SystemInfo) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    a.insert("productName".into(), string(&gpu.name));
    a.insert("brand".into(), string(&brand(gpu.info.brand.as_deref())));
    a.insert(
        "architecture".into(),
        string(architecture(gpu.compute_capability)),
    );
    let (maj, min) = gpu.compute_capability;
    for (k, v) in [
        ("cudaComputeCapability", format!("{maj}.{min}")),
        ("driverVersion", sys.driver_version.clone()),
        ("cudaDriverVersion", sys.cuda_version.clone()),
    ] {
        if let Some(attr) = version_attr(&v) {
            a.insert(k.into(), attr);
        }
    }
    if let Some(id) = pci_bus_id(&gpu.pci_bus_id) {
        a.insert("pcieBusID".into(), string(&id));
        a.insert(STANDARD_PCI_BUS_ID.into(), string(&id));
    }
    a
}

/// The published form of a full GPU (see the module docs).
#[must_use]
pub fn gpu_device(gpu: &GpuDevice, sys: &SystemInfo) -> Device {
    let mut a = common_attributes(gpu, sys);
    a.insert("type".into(), string(GPU_TYPE));
    a.insert("uuid".into(), string(&gpu.uuid));
    a.insert("index".into(), int(i64::from(gpu.index)));
    a.insert("minor".into(), int(i64::from(gpu.index)));
    let cap = (gpu.memory_total_bytes > 0)
        .then(|| [("memory".to_owned(), capacity(gpu.memory_total_bytes))].into());
    Device {
        name: format!("gpu-{}", gpu.index),
        attributes: Some(a),
        capacity: cap,
        ..Device::default()
    }
}

/// A MIG profile as a device-name part: lower case, dots dropped, other characters outside
/// `[a-z0-9-]` as `-` (`1g.10gb+me` → `1g10gb-me`).
#[must_use]
pub fn profile_name_part(profile: &str) -> String {
    profile
        .to_ascii_lowercase()
        .replace('.', "")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The published form of MIG device `mig` of `parent` (see the module docs).
#[must_use]
pub fn mig_device(parent: &GpuDevice, mig: &MigDevice, sys: &SystemInfo) -> Device {
    let mut a = common_attributes(parent, sys);
    let profile = mig.profile.clone().unwrap_or_else(|| "unknown".into());
    a.insert("type".into(), string(MIG_TYPE));
    a.insert("uuid".into(), string(&mig.uuid));
    a.insert("parentUUID".into(), string(&parent.uuid));
    a.insert("profile".into(), string(&profile));
    a.insert("parentIndex".into(), int(i64::from(parent.index)));
    a.insert("parentMinor".into(), int(i64::from(parent.index)));
    let mut cap = BTreeMap::new();
    if let Some(m) = mig.attributes {
        for (k, v) in [
            ("multiprocessors", m.multiprocessors),
            ("copyEngines", m.copy_engines),
            ("decoders", m.decoders),
            ("encoders", m.encoders),
            ("jpegEngines", m.jpeg_engines),
            ("ofaEngines", m.ofa_engines),
        ] {
            cap.insert(k.to_owned(), capacity(u64::from(v)));
        }
    }
    Device {
        name: format!(
            "gpu-{}-mig-{}-{}-{}",
            parent.index,
            profile_name_part(&profile),
            mig.gpu_instance_id.unwrap_or(0),
            mig.compute_instance_id.unwrap_or(0)
        ),
        attributes: Some(a),
        capacity: (!cap.is_empty()).then_some(cap),
        ..Device::default()
    }
}

/// The name of the node's one slice: `<node>-gpu.nvidia.com`.
#[must_use]
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER_NAME}")
}

/// The node's slice: pool `<node>` at `generation`, one slice in the pool, `devices`.
#[must_use]
pub fn slice(node: &str, devices: Vec<Device>, generation: i64) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node)),
            ..ObjectMeta::default()
        },
        spec: k8s_openapi::api::resource::v1::ResourceSliceSpec {
            driver: DRIVER_NAME.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests;
