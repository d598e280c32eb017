//! Which pods use which GPU: a pure function of the kubelet's allocations and the node's GPUs.
//!
//! # The rule (why labels never flap)
//!
//! For each GPU, collect every `(namespace, pod, container)` whose allocated device ids resolve to
//! it (the whole GPU, a time-slicing/MPS replica `GPU-x::n`, GKE `nvidiaN/vgpuK`, or one of its
//! MIG devices), de-duplicate, and sort by namespace, then pod, then container (byte order).
//! The **first** of that list owns the GPU's single series in the default mode; the whole list
//! feeds the `kiln_gpu_pod_info` metric. Virtual-GPU mode uses [`Share`]s instead: the same
//! containers, once per replica they hold (the `vgpu` label), sorted the same way.
//!
//! The same rule runs per MIG device, over the containers whose ids name that MIG device
//! (`MIG-<uuid>`, `MIG-GPU-<uuid>/<gi>/<ci>` or `nvidia<N>/gi<G>`, the last two through the
//! device's GPU-instance id): those label the MIG device's own series (see [`crate::render`]).
//!
//! The result depends only on the *set* of allocations, never on the kubelet's List order, so the
//! owner stays the same for as long as the same pods run. dcgm-exporter instead lets the last pod
//! in List order win (reference §3.5), which the kubelet does not keep stable.

use std::collections::{BTreeMap, BTreeSet};

use kiln_gpu::GpuDevice;

use crate::devid::{DeviceRef, is_gpu_resource, parse_device_id};

/// One container's allocation of one resource, as pod-resources `List` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Extended resource name, e.g. `nvidia.com/gpu`.
    pub resource_name: String,
    /// Device ids the device plugin allocated.
    pub device_ids: Vec<String>,
}

/// A container using a GPU. Field order is the sort order of the attribution rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
}

/// A container and the shared-GPU replica it holds: one series per share in virtual-GPU mode
/// (`--kubernetes-virtual-gpus`), as dcgm-exporter emits one per (container, device id). Field
/// order is the sort order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Share {
    /// The container.
    pub pod: PodRef,
    /// The replica number from the device id (`GPU-<uuid>::<n>`, `MIG-<uuid>::<n>`,
    /// `nvidia<N>[/gi<G>]/vgpu<n>`), dcgm-exporter's `vgpu` label; `None` for an unshared device.
    pub vgpu: Option<u32>,
}

/// What the API server says about a pod, for the `pod_uid` label and the pod's own labels
/// (`--kubernetes-enable-pod-uid` / `--kubernetes-enable-pod-labels`; see [`crate::podmeta`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodMeta {
    /// `metadata.uid`, when the UID label is on.
    pub uid: Option<String>,
    /// The pod's labels that pass the allowlist, names sanitised to `[a-zA-Z0-9_]`, sorted by
    /// name; empty when pod labels are off.
    pub labels: Vec<(String, String)>,
}

/// `(namespace, name)` → [`PodMeta`] of the pods on this node.
pub type PodMetas = BTreeMap<(String, String), PodMeta>;

/// GPU index → the containers using it, sorted by the rule above (never empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attribution {
    by_gpu: BTreeMap<u32, Vec<PodRef>>,
    by_mig: BTreeMap<String, Vec<PodRef>>,
    shares_by_gpu: BTreeMap<u32, Vec<Share>>,
    shares_by_mig: BTreeMap<String, Vec<Share>>,
    meta: std::sync::Arc<PodMetas>,
    /// GPU-resource device ids that matched no GPU on this node (kept for debug logs).
    pub unresolved: Vec<String>,
}

impl Attribution {
    /// The containers using GPU `index`, owner first; empty when none.
    #[must_use]
    pub fn pods(&self, index: u32) -> &[PodRef] {
        self.by_gpu.get(&index).map_or(&[], Vec::as_slice)
    }

    /// The containers using MIG device `mig_uuid`, owner first; empty when none.
    #[must_use]
    pub fn mig_pods(&self, mig_uuid: &str) -> &[PodRef] {
        self.by_mig.get(mig_uuid).map_or(&[], Vec::as_slice)
    }

    /// The (container, replica) pairs on GPU `index`, sorted; empty when none. A container
    /// holding two replicas of the GPU appears twice.
    #[must_use]
    pub fn shares(&self, index: u32) -> &[Share] {
        self.shares_by_gpu.get(&index).map_or(&[], Vec::as_slice)
    }

    /// The (container, replica) pairs on MIG device `mig_uuid`, sorted; empty when none.
    #[must_use]
    pub fn mig_shares(&self, mig_uuid: &str) -> &[Share] {
        self.shares_by_mig.get(mig_uuid).map_or(&[], Vec::as_slice)
    }

    /// The container whose labels the GPU's single series carries (default mode).
    #[must_use]
    pub fn owner(&self, index: u32) -> Option<&PodRef> {
        self.pods(index).first()
    }

    /// Attaches the API server's view of the pods (UIDs, labels) for the renderer.
    #[must_use]
    pub fn with_meta(mut self, meta: std::sync::Arc<PodMetas>) -> Self {
        self.meta = meta;
        self
    }

    /// The UID and labels of `pod`'s pod, when known.
    #[must_use]
    pub fn meta(&self, pod: &PodRef) -> Option<&PodMeta> {
        // Borrowed lookup without allocating a key: the map is small (pods on one node).
        self.meta
            .iter()
            .find(|((ns, name), _)| *ns == pod.namespace && *name == pod.pod)
            .map(|(_, m)| m)
    }

    /// Number of GPUs with at least one pod.
    #[must_use]
    pub fn gpus_in_use(&self) -> usize {
        self.by_gpu.len()
    }
}

/// Applies the attribution rule to `allocations` over the node's `gpus`. Resources that are not
/// GPU resources (see [`is_gpu_resource`]; `extra_resources` adds names) are ignored.
#[must_use]
pub fn attribute(
    allocations: &[Allocation],
    gpus: &[GpuDevice],
    extra_resources: &[String],
) -> Attribution {
    let mut sets: BTreeMap<u32, BTreeSet<PodRef>> = BTreeMap::new();
    let mut migs: BTreeMap<String, BTreeSet<PodRef>> = BTreeMap::new();
    let mut shares: BTreeMap<u32, BTreeSet<Share>> = BTreeMap::new();
    let mut mig_shares: BTreeMap<String, BTreeSet<Share>> = BTreeMap::new();
    let mut unresolved = BTreeSet::new();
    for a in allocations
        .iter()
        .filter(|a| is_gpu_resource(&a.resource_name, extra_resources))
    {
        for id in &a.device_ids {
            let parsed = parse_device_id(id);
            let Some(index) = parsed.as_ref().and_then(|r| resolve(r, gpus)) else {
                unresolved.insert(id.clone());
                continue;
            };
            let pod = PodRef {
                namespace: a.namespace.clone(),
                pod: a.pod.clone(),
                container: a.container.clone(),
            };
            let share = Share {
                pod: pod.clone(),
                vgpu: parsed.as_ref().and_then(DeviceRef::replica),
            };
            if let Some(mig) = parsed.as_ref().and_then(|r| resolve_mig(r, gpus)) {
                migs.entry(mig.to_owned()).or_default().insert(pod.clone());
                mig_shares
                    .entry(mig.to_owned())
                    .or_default()
                    .insert(share.clone());
            }
            shares.entry(index).or_default().insert(share);
            sets.entry(index).or_default().insert(pod);
        }
    }
    Attribution {
        by_gpu: sets
            .into_iter()
            .map(|(k, v)| (k, v.into_iter().collect()))
            .collect(),
        by_mig: migs
            .into_iter()
            .map(|(k, v)| (k, v.into_iter().collect()))
            .collect(),
        shares_by_gpu: shares
            .into_iter()
            .map(|(k, v)| (k, v.into_iter().collect()))
            .collect(),
        shares_by_mig: mig_shares
            .into_iter()
            .map(|(k, v)| (k, v.into_iter().collect()))
            .collect(),
        meta: std::sync::Arc::default(),
        unresolved: unresolved.into_iter().collect(),
    }
}

/// The NVML index of the physical GPU a device reference lands on.
fn resolve(r: &DeviceRef, gpus: &[GpuDevice]) -> Option<u32> {
    let by_uuid = |u: &str| gpus.iter().find(|g| g.uuid == u).map(|g| g.index);
    match r {
        DeviceRef::GpuUuid { uuid, .. } | DeviceRef::MigOfGpu { gpu_uuid: uuid, .. } => {
            by_uuid(uuid)
        }
        DeviceRef::MigUuid { uuid, .. } => gpus
            .iter()
            .find(|g| g.mig_devices.iter().any(|m| &m.uuid == uuid))
            .map(|g| g.index),
        DeviceRef::Index { index, .. } => gpus.iter().any(|g| g.index == *index).then_some(*index),
    }
}

/// The UUID of the MIG device a reference names, when it names one on this node.
fn resolve_mig<'g>(r: &DeviceRef, gpus: &'g [GpuDevice]) -> Option<&'g str> {
    let by_gi = |g: &'g GpuDevice, gi: u32| {
        g.mig_devices
            .iter()
            .find(|m| m.gpu_instance_id == Some(gi))
            .map(|m| m.uuid.as_str())
    };
    match r {
        DeviceRef::MigUuid { uuid, .. } => gpus
            .iter()
            .flat_map(|g| &g.mig_devices)
            .find(|m| &m.uuid == uuid)
            .map(|m| m.uuid.as_str()),
        DeviceRef::MigOfGpu {
            gpu_uuid,
            gpu_instance,
        } => by_gi(gpus.iter().find(|g| &g.uuid == gpu_uuid)?, *gpu_instance),
        DeviceRef::Index {
            index,
            gpu_instance: Some(gi),
            ..
        } => by_gi(gpus.iter().find(|g| g.index == *index)?, *gi),
        DeviceRef::GpuUuid { .. } | DeviceRef::Index { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use kiln_gpu::MigDevice;

    use super::*;

    fn gpu(index: u32, uuid: &str, migs: &[&str]) -> GpuDevice {
        GpuDevice {
            index,
            uuid: uuid.into(),
            name: "T".into(),
            pci_bus_id: String::new(),
            memory_total_bytes: 0,
            compute_capability: (8, 0),
            mig_enabled: Some(!migs.is_empty()),
            mig_devices: migs
                .iter()
                .zip(1..)
                .map(|(u, gi)| MigDevice {
                    uuid: (*u).into(),
                    gpu_instance_id: Some(gi),
                    compute_instance_id: None,
                    profile: None,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn alloc(ns: &str, pod: &str, res: &str, ids: &[&str]) -> Allocation {
        Allocation {
            namespace: ns.into(),
            pod: pod.into(),
            container: "main".into(),
            resource_name: res.into(),
            device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn names(a: &Attribution, i: u32) -> Vec<String> {
        a.pods(i)
            .iter()
            .map(|p| format!("{}/{}", p.namespace, p.pod))
            .collect()
    }

    #[test]
    fn owner_is_the_smallest_namespace_pod_container_in_any_list_order() {
        let gpus = [gpu(0, "GPU-a", &[])];
        let mut allocs = vec![
            alloc("ml", "zeta", "nvidia.com/gpu", &["GPU-a::0"]),
            alloc("ml", "alpha", "nvidia.com/gpu", &["GPU-a::1"]),
            alloc("batch", "yak", "nvidia.com/gpu.shared", &["GPU-a::2"]),
        ];
        let first = attribute(&allocs, &gpus, &[]);
        assert_eq!(names(&first, 0), ["batch/yak", "ml/alpha", "ml/zeta"]);
        assert_eq!(first.owner(0).unwrap().pod, "yak");
        allocs.reverse();
        assert_eq!(attribute(&allocs, &gpus, &[]), first);
        allocs.swap(0, 1);
        assert_eq!(attribute(&allocs, &gpus, &[]), first);
    }

    #[test]
    fn every_id_shape_resolves_to_its_physical_gpu() {
        let gpus = [gpu(0, "GPU-a", &[]), gpu(1, "GPU-b", &["MIG-m1", "MIG-m2"])];
        let allocs = vec![
            alloc("n", "by-uuid", "nvidia.com/gpu", &["GPU-a"]),
            alloc("n", "by-index", "nvidia.com/gpu", &["nvidia0/vgpu2"]),
            alloc("n", "mig", "nvidia.com/mig-1g.10gb", &["MIG-m2"]),
            alloc("n", "old-mig", "nvidia.com/mig-1g.10gb", &["MIG-GPU-b/1/0"]),
            alloc("n", "gke-mig", "nvidia.com/gpu", &["nvidia1/gi3"]),
            alloc("n", "ghost", "nvidia.com/gpu", &["GPU-zzz", "nvidia9"]),
            alloc("n", "not-gpu", "example.com/fpga", &["GPU-a"]),
        ];
        let a = attribute(&allocs, &gpus, &[]);
        assert_eq!(names(&a, 0), ["n/by-index", "n/by-uuid"]);
        assert_eq!(names(&a, 1), ["n/gke-mig", "n/mig", "n/old-mig"]);
        assert_eq!(a.unresolved, ["GPU-zzz", "nvidia9"]);
        let mig = |u: &str| {
            a.mig_pods(u)
                .iter()
                .map(|p| p.pod.as_str())
                .collect::<Vec<_>>()
        };
        // MIG-m1 is GPU instance 1, MIG-m2 instance 2 (see `gpu`).
        assert_eq!(mig("MIG-m1"), ["old-mig"]);
        assert_eq!(mig("MIG-m2"), ["mig"]);
        assert!(mig("MIG-zz").is_empty());
        assert_eq!(a.gpus_in_use(), 2);
        assert!(a.owner(2).is_none());
    }

    #[test]
    fn a_container_holding_several_replicas_is_listed_once_and_extra_names_count() {
        let gpus = [gpu(0, "GPU-a", &[])];
        let allocs = vec![alloc(
            "n",
            "p",
            "example.com/gpu",
            &["GPU-a::0", "GPU-a::5"],
        )];
        assert!(attribute(&allocs, &gpus, &[]).pods(0).is_empty());
        let a = attribute(&allocs, &gpus, &["example.com/gpu".to_owned()]);
        assert_eq!(names(&a, 0), ["n/p"]);
        let vgpus: Vec<_> = a.shares(0).iter().map(|s| s.vgpu).collect();
        assert_eq!(vgpus, [Some(0), Some(5)], "one share per replica held");
    }

    #[test]
    fn shares_carry_the_replica_of_each_id_shape() {
        let gpus = [gpu(0, "GPU-a", &[]), gpu(1, "GPU-b", &["MIG-m1"])];
        let allocs = vec![
            alloc("n", "whole", "nvidia.com/gpu", &["GPU-a"]),
            alloc("n", "gke", "nvidia.com/gpu", &["nvidia0/vgpu3"]),
            alloc("n", "eks-mig", "nvidia.com/mig-1g.10gb", &["MIG-m1::7"]),
        ];
        let a = attribute(&allocs, &gpus, &[]);
        let pairs = |s: &[Share]| {
            s.iter()
                .map(|s| (s.pod.pod.clone(), s.vgpu))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            pairs(a.shares(0)),
            [("gke".to_owned(), Some(3)), ("whole".to_owned(), None)]
        );
        assert_eq!(pairs(a.shares(1)), [("eks-mig".to_owned(), Some(7))]);
        assert_eq!(
            pairs(a.mig_shares("MIG-m1")),
            [("eks-mig".to_owned(), Some(7))]
        );
    }
}
