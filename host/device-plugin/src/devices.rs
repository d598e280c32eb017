//! From the node's GPUs to the resources the kubelet sees (reference §1.5): one [`Resource`]
//! per advertised name, each with a sorted list of [`Unit`]s (a GPU, a MIG device, or a
//! replica `<uuid>::<k>`).

use std::collections::BTreeMap;

use kiln_gpu::{GpuDevice, NvLinkPeer};

use crate::config::{GPU_RESOURCE, MigStrategy, RESOURCE_PREFIX, Sharing};

/// Separator between a device id and its replica number (`GPU-…::3`).
pub const REPLICA_SEPARATOR: &str = "::";

/// A physical device the runtime can be given: a full GPU or a MIG device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Physical {
    /// `GPU-…` or `MIG-…`.
    pub uuid: String,
    /// Upstream's index: `"<gpu>"` or `"<gpu>:<mig position>"`.
    pub index: String,
    /// The NVML index of the (parent) GPU; XIDs arrive per GPU index.
    pub gpu_index: u32,
    /// Device nodes inside the container, e.g. `/dev/nvidia0` (the minor is taken to be the
    /// NVML index; `GpuDevice` has no minor number).
    pub paths: Vec<String>,
    /// NUMA node of the parent GPU when known (ListAndWatch's `TopologyInfo`).
    pub numa_node: Option<i64>,
    /// NVLink neighbours of a full GPU (by NVML index, with link counts); empty for a MIG
    /// device. GetPreferredAllocation's topology.
    pub links: Vec<NvLinkPeer>,
}

/// One unit the kubelet counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// The id sent to the kubelet: the UUID, or `<uuid>::<k>` for a replica.
    pub id: String,
    /// Replica number (0 when not shared).
    pub replica: u32,
    /// The device behind it.
    pub physical: Physical,
}

/// One advertised extended resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// Full name, e.g. `nvidia.com/gpu`, `nvidia.com/gpu.shared`, `nvidia.com/mig-1g.10gb`.
    pub name: String,
    /// Replicas per physical device (1 when not shared).
    pub replicas: u32,
    /// Units sorted by (physical UUID, replica number).
    pub units: Vec<Unit>,
}

impl Resource {
    /// Socket file name: `nvidia-<name without nvidia.com/>.sock` (upstream §1.1).
    #[must_use]
    pub fn socket_name(&self) -> String {
        let short = self
            .name
            .strip_prefix(RESOURCE_PREFIX)
            .unwrap_or(&self.name);
        format!("nvidia-{}.sock", short.replace('/', "_"))
    }

    /// True when units are replicas of shared devices.
    #[must_use]
    pub fn is_shared(&self) -> bool {
        self.replicas > 1
    }

    /// The unit with this id.
    #[must_use]
    pub fn unit(&self, id: &str) -> Option<&Unit> {
        self.units.iter().find(|u| u.id == id)
    }
}

/// Why the device list could not be built (upstream's messages, §1.5).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// `single` with some GPUs in MIG mode and some not.
    #[error("all devices on the node must be configured with the same migEnabled value")]
    MixedMigEnabled,
    /// `single` with more than one MIG profile.
    #[error("more than one MIG device type present on node")]
    SeveralMigProfiles,
    /// `single` with a MIG-enabled GPU without MIG devices.
    #[error("device {0} has no MIG devices configured")]
    NoMigDevices(String),
}

/// Builds the resources for `gpus` under `mig` strategy and `sharing`, sorted by name; a
/// resource without units is left out.
///
/// # Errors
/// [`DeviceError`] for an invalid `single` layout.
pub fn build_resources(
    gpus: &[GpuDevice],
    mig: MigStrategy,
    sharing: &Sharing,
) -> Result<Vec<Resource>, DeviceError> {
    let mut by_name: BTreeMap<String, Vec<Physical>> = BTreeMap::new();
    if mig == MigStrategy::Single {
        let enabled: Vec<bool> = gpus.iter().map(|g| g.mig_enabled == Some(true)).collect();
        if enabled.iter().any(|e| *e) && !enabled.iter().all(|e| *e) {
            return Err(DeviceError::MixedMigEnabled);
        }
        let profiles: std::collections::BTreeSet<_> = gpus
            .iter()
            .flat_map(|g| g.mig_devices.iter().map(|m| m.profile.clone()))
            .collect();
        if profiles.len() > 1 {
            return Err(DeviceError::SeveralMigProfiles);
        }
        if let Some(g) = gpus
            .iter()
            .find(|g| g.mig_enabled == Some(true) && g.mig_devices.is_empty())
        {
            return Err(DeviceError::NoMigDevices(g.uuid.clone()));
        }
    }
    for gpu in gpus {
        let gpu_path = format!("/dev/nvidia{}", gpu.index);
        let mig_on = gpu.mig_enabled == Some(true) && mig != MigStrategy::None;
        if !mig_on {
            by_name
                .entry(GPU_RESOURCE.to_owned())
                .or_default()
                .push(Physical {
                    uuid: gpu.uuid.clone(),
                    index: gpu.index.to_string(),
                    gpu_index: gpu.index,
                    paths: vec![gpu_path],
                    numa_node: gpu.numa_node.map(i64::from),
                    links: gpu.nvlinks.clone(),
                });
            continue;
        }
        if gpu.mig_devices.is_empty() {
            tracing::warn!(gpu = %gpu.uuid, "MIG is enabled but the GPU has no MIG devices");
        }
        for (pos, m) in gpu.mig_devices.iter().enumerate() {
            let name = match mig {
                MigStrategy::Mixed => match &m.profile {
                    Some(p) => format!("{RESOURCE_PREFIX}mig-{}", p.replace('+', ".")),
                    None => {
                        tracing::warn!(mig = %m.uuid, "MIG device without a known profile; skipped");
                        continue;
                    }
                },
                _ => GPU_RESOURCE.to_owned(),
            };
            by_name.entry(name).or_default().push(Physical {
                uuid: m.uuid.clone(),
                index: format!("{}:{pos}", gpu.index),
                gpu_index: gpu.index,
                paths: vec![gpu_path.clone()],
                numa_node: gpu.numa_node.map(i64::from),
                links: Vec::new(),
            });
        }
    }
    let mut out: BTreeMap<String, Resource> = BTreeMap::new();
    for (name, mut physicals) in by_name {
        physicals.sort_by(|a, b| a.uuid.cmp(&b.uuid));
        let replicas = sharing.replicas(&name);
        let advertised = sharing.advertised_name(&name);
        let units = physicals
            .into_iter()
            .flat_map(|p| {
                (0..replicas).map(move |k| Unit {
                    id: if replicas > 1 {
                        format!("{}{REPLICA_SEPARATOR}{k}", p.uuid)
                    } else {
                        p.uuid.clone()
                    },
                    replica: k,
                    physical: p.clone(),
                })
            })
            .collect::<Vec<_>>();
        let entry = out.entry(advertised.clone()).or_insert_with(|| Resource {
            name: advertised,
            replicas,
            units: Vec::new(),
        });
        entry.units.extend(units);
        entry
            .units
            .sort_by(|a, b| (&a.physical.uuid, a.replica).cmp(&(&b.physical.uuid, b.replica)));
    }
    Ok(out.into_values().filter(|r| !r.units.is_empty()).collect())
}

/// Splits `<id>::<k>` into `(id, k)`; a missing or non-numeric suffix is replica 0 (upstream
/// rule).
#[must_use]
pub fn split_replica(id: &str) -> (&str, u32) {
    match id.split_once(REPLICA_SEPARATOR) {
        Some((base, k)) => (base, k.parse().unwrap_or(0)),
        None => (id, 0),
    }
}

#[cfg(test)]
mod tests {
    use kiln_gpu::MigDevice;

    use super::*;
    use crate::config::Config;

    fn gpu(index: u32, uuid: &str) -> GpuDevice {
        GpuDevice {
            index,
            uuid: uuid.into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: "00000000:8D:00.0".into(),
            memory_total_bytes: 80 << 30,
            compute_capability: (9, 0),
            mig_enabled: None,
            mig_devices: vec![],
            ..Default::default()
        }
    }

    fn mig(uuid: &str, profile: &str) -> MigDevice {
        MigDevice {
            uuid: uuid.into(),
            gpu_instance_id: None,
            compute_instance_id: None,
            profile: Some(profile.into()),
            ..Default::default()
        }
    }

    fn sharing(text: &str) -> Sharing {
        Config::from_yaml(text).unwrap().sharing()
    }

    #[test]
    fn five_replicas_of_one_gpu_are_five_sorted_units() {
        let s = sharing("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 5}]}}");
        let r = build_resources(&[gpu(0, "GPU-a")], MigStrategy::None, &s).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].name, "nvidia.com/gpu");
        assert_eq!(r[0].socket_name(), "nvidia-gpu.sock");
        let ids: Vec<_> = r[0].units.iter().map(|u| u.id.as_str()).collect();
        assert_eq!(
            ids,
            ["GPU-a::0", "GPU-a::1", "GPU-a::2", "GPU-a::3", "GPU-a::4"]
        );
    }

    #[test]
    fn replicas_sort_numerically_and_renamed_resources_get_their_socket() {
        let s = sharing(
            "sharing: {timeSlicing: {renameByDefault: true, resources: [{name: gpu, replicas: 11}]}}",
        );
        let r =
            build_resources(&[gpu(1, "GPU-b"), gpu(0, "GPU-a")], MigStrategy::None, &s).unwrap();
        assert_eq!(r[0].name, "nvidia.com/gpu.shared");
        assert_eq!(r[0].socket_name(), "nvidia-gpu.shared.sock");
        assert_eq!(r[0].units.len(), 22);
        assert_eq!(r[0].units[9].id, "GPU-a::9");
        assert_eq!(r[0].units[10].id, "GPU-a::10");
        assert_eq!(r[0].units[11].id, "GPU-b::0");
        assert_eq!(r[0].units[11].physical.paths, ["/dev/nvidia1"]);
    }

    #[test]
    fn mig_strategies() {
        let mut g = gpu(0, "GPU-a");
        g.mig_enabled = Some(true);
        g.mig_devices = vec![mig("MIG-2", "1g.10gb+me"), mig("MIG-1", "3g.40gb")];
        let none = Sharing::default();
        let r = build_resources(&[g.clone()], MigStrategy::None, &none).unwrap();
        assert_eq!(r[0].units[0].id, "GPU-a");
        let r = build_resources(&[g.clone()], MigStrategy::Mixed, &none).unwrap();
        let names: Vec<_> = r.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            ["nvidia.com/mig-1g.10gb.me", "nvidia.com/mig-3g.40gb"]
        );
        assert_eq!(r[0].socket_name(), "nvidia-mig-1g.10gb.me.sock");
        assert_eq!(r[0].units[0].physical.index, "0:0");
        assert_eq!(
            build_resources(&[g.clone()], MigStrategy::Single, &none),
            Err(DeviceError::SeveralMigProfiles)
        );
        assert_eq!(
            build_resources(&[g, gpu(1, "GPU-b")], MigStrategy::Single, &none),
            Err(DeviceError::MixedMigEnabled)
        );
    }

    #[test]
    fn replica_ids_split_like_upstream() {
        assert_eq!(split_replica("GPU-a::3"), ("GPU-a", 3));
        assert_eq!(split_replica("GPU-a::x"), ("GPU-a", 0));
        assert_eq!(split_replica("GPU-a"), ("GPU-a", 0));
    }
}
