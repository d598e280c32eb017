//! Allocate and GetPreferredAllocation as pure functions of a [`Resource`] and [`Settings`]
//! (reference §1.8, §1.9).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::{
    config::{AllocationPolicy, DeviceIdStrategy, DeviceListStrategy, SharingStrategy},
    devices::{Resource, Unit, split_replica},
    proto::{CdiDevice, ContainerAllocateResponse, DeviceSpec, Mount},
    settings::Settings,
};

/// CDI vendor/class of the GPU devices: names are `k8s.device-plugin.nvidia.com/gpu=<id>`.
pub const CDI_KIND: &str = "k8s.device-plugin.nvidia.com/gpu";
/// Where `volume-mounts` puts the per-device `/dev/null` mounts.
pub const DEVICE_LIST_DIR: &str = "/var/run/nvidia-container-devices";
/// Control nodes passed with `passDeviceSpecs` when they exist in the plugin's container.
pub const CONTROL_NODES: [&str; 4] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

/// The response for one container asking for `ids` of `res`.
///
/// `annotation_suffix` is the random part of the CDI annotation key (upstream uses a fresh
/// UUIDv4 per response; [`random_uuid`]). `node_exists` tells whether a control node exists
/// in this container (upstream `os.Stat`).
///
/// # Errors
/// Upstream's messages: `invalid allocation request for "<resource>": invalid request:
/// unknown device: <id>` or `…: maximum request size for shared resources is 1; found <n>`.
pub fn allocate_container(
    res: &Resource,
    settings: &Settings,
    ids: &[String],
    annotation_suffix: &str,
    node_exists: &dyn Fn(&str) -> bool,
) -> Result<ContainerAllocateResponse, String> {
    let invalid = |why: String| {
        format!(
            "invalid allocation request for \"{}\": invalid request: {why}",
            res.name
        )
    };
    let mut units = Vec::with_capacity(ids.len());
    for id in ids {
        units.push(
            res.unit(id)
                .ok_or_else(|| invalid(format!("unknown device: {id}")))?,
        );
    }
    let strategy = settings.sharing.strategy;
    let fail_gt1 = settings.sharing.fail_requests_greater_than_one;
    if res.is_shared() && fail_gt1 && ids.len() > 1 {
        return Err(invalid(format!(
            "maximum request size for shared resources is 1; found {}",
            ids.len()
        )));
    }
    // Runtime ids, request order, duplicates (replicas of one device) removed.
    let mut seen = BTreeSet::new();
    let runtime_ids: Vec<String> = units
        .iter()
        .map(|u| match settings.device_id_strategy {
            DeviceIdStrategy::Uuid => split_replica(&u.id).0.to_owned(),
            DeviceIdStrategy::Index => u.physical.index.clone(),
        })
        .filter(|id| seen.insert(id.clone()))
        .collect();
    let mut resp = ContainerAllocateResponse::default();
    let strategies = &settings.device_list_strategies;
    if settings.uses_cdi() {
        let mut names: Vec<String> = runtime_ids
            .iter()
            .map(|id| format!("{CDI_KIND}={id}"))
            .collect();
        names.extend(
            settings
                .imex_channels
                .iter()
                .map(|c| format!("k8s.device-plugin.nvidia.com/imex-channel={c}")),
        );
        for (on, class) in [
            (settings.gdrcopy_enabled, "gdrcopy"),
            (settings.gds_enabled, "gds"),
            (settings.mofed_enabled, "mofed"),
        ] {
            if on {
                names.push(format!("k8s.device-plugin.nvidia.com/{class}=all"));
            }
        }
        if strategies.contains(&DeviceListStrategy::CdiAnnotations) {
            resp.annotations.insert(
                format!(
                    "{}nvidia-device-plugin_{annotation_suffix}",
                    settings.cdi_annotation_prefix
                ),
                names.join(","),
            );
        }
        if strategies.contains(&DeviceListStrategy::CdiCri) {
            resp.cdi_devices = names.into_iter().map(|name| CdiDevice { name }).collect();
        }
    }
    if strategy == SharingStrategy::Mps && res.is_shared() {
        let root = settings.mps_root.as_deref().unwrap_or_default();
        let pipe = format!("/mps/{}/pipe", res.name);
        resp.envs
            .insert("CUDA_MPS_PIPE_DIRECTORY".into(), pipe.clone());
        resp.mounts.push(Mount {
            container_path: pipe,
            host_path: format!("{root}/{}/pipe", res.name),
            read_only: false,
        });
        resp.mounts.push(Mount {
            container_path: "/dev/shm".into(),
            host_path: format!("{root}/shm"),
            read_only: false,
        });
    }
    for (on, var) in [
        (settings.gdrcopy_enabled, "NVIDIA_GDRCOPY"),
        (settings.gds_enabled, "NVIDIA_GDS"),
        (settings.mofed_enabled, "NVIDIA_MOFED"),
    ] {
        if on {
            resp.envs.insert(var.into(), "enabled".into());
        }
    }
    if strategies.iter().all(|s| s.is_cdi()) {
        return Ok(resp);
    }
    let imex: Vec<String> = settings.imex_channels.iter().map(u32::to_string).collect();
    if strategies.contains(&DeviceListStrategy::Envvar) {
        resp.envs
            .insert("NVIDIA_VISIBLE_DEVICES".into(), runtime_ids.join(","));
        if !imex.is_empty() {
            resp.envs
                .insert("NVIDIA_IMEX_CHANNELS".into(), imex.join(","));
        }
    }
    if strategies.contains(&DeviceListStrategy::VolumeMounts) {
        resp.envs
            .insert("NVIDIA_VISIBLE_DEVICES".into(), DEVICE_LIST_DIR.into());
        let mounts = runtime_ids
            .iter()
            .map(|id| format!("{DEVICE_LIST_DIR}/{id}"))
            .chain(imex.iter().map(|c| format!("{DEVICE_LIST_DIR}/imex/{c}")));
        resp.mounts.extend(mounts.map(|container_path| Mount {
            container_path,
            host_path: "/dev/null".into(),
            read_only: false,
        }));
    }
    if settings.pass_device_specs {
        let dev_root = settings.dev_root.trim_end_matches('/');
        let spec = |path: &str| DeviceSpec {
            container_path: path.to_owned(),
            host_path: format!("{dev_root}{path}"),
            permissions: "rw".into(),
        };
        resp.devices.extend(
            CONTROL_NODES
                .iter()
                .filter(|n| node_exists(n))
                .map(|n| spec(n)),
        );
        let mut paths = BTreeSet::new();
        for u in &units {
            for p in &u.physical.paths {
                if paths.insert(p.clone()) {
                    resp.devices.push(spec(p));
                }
            }
        }
        for c in &settings.imex_channels {
            resp.devices
                .push(spec(&format!("/dev/nvidia-caps-imex-channels/channel{c}")));
        }
    }
    Ok(resp)
}

/// A random RFC 4122 version-4 UUID (the CDI annotation key suffix).
#[must_use]
pub fn random_uuid() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        // No entropy source: fall back to the clock; uniqueness per response is all we need.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        b = t.to_le_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Preferred devices for one container: `must_include` first, then picks from `available`
/// (unknown ids ignored), healthy devices before unhealthy ones.
///
/// Two rules, as upstream v0.20 chooses between them:
/// - **Full GPUs** (an unshared `nvidia.com/gpu`-style resource of whole GPUs): the set of
///   `size` GPUs that contains `must_include` and has the best topology score — the sum over
///   its pairs of 100 per NVLink between them (go-gpuallocator's best-effort policy weighs one
///   NVLink 100, two 200, …), or 20 for a pair on one NUMA node and 10 across nodes (its
///   same-CPU / cross-CPU PCIe scores) when they have no NVLink. Ties go to the set that sorts
///   first by (unhealthy count, GPU UUIDs). Upstream scores the partition of all available
///   GPUs; kiln scores the chosen set only, which gives the same answer for a set NVLink
///   joins. Above [`MAX_ALIGNED_GPUS`] candidates the search is not run (sorted order).
/// - **Replicas and MIG devices**: one unit at a time from the physical device the `policy`
///   prefers by the number of its units already allocated (not in `available`, or picked in
///   this call): fewest first with [`AllocationPolicy::Distributed`] (upstream's default),
///   most first with [`AllocationPolicy::Packed`]; ties go to the device picked from least in
///   this call, then by UUID (upstream leaves them to `sort.Slice`), so answers are
///   reproducible.
///
/// # Errors
/// `not enough available devices to satisfy allocation` when too few are available.
pub fn preferred_allocation(
    res: &Resource,
    healthy: &dyn Fn(&str) -> bool,
    available: &[String],
    must_include: &[String],
    size: usize,
    policy: AllocationPolicy,
) -> Result<Vec<String>, String> {
    const NOT_ENOUGH: &str = "not enough available devices to satisfy allocation";
    let required: Vec<&String> = must_include.iter().collect();
    if size <= required.len() {
        return Ok(required.into_iter().take(size).cloned().collect());
    }
    let needed = size - required.len();
    let req_set: BTreeSet<&str> = must_include.iter().map(String::as_str).collect();
    let mut candidates: Vec<&Unit> = available
        .iter()
        .filter(|id| !req_set.contains(id.as_str()))
        .filter_map(|id| res.unit(id))
        .collect();
    candidates.sort_by(|a, b| {
        (!healthy(&a.id), &a.physical.uuid, a.replica).cmp(&(
            !healthy(&b.id),
            &b.physical.uuid,
            b.replica,
        ))
    });
    candidates.dedup_by(|a, b| a.id == b.id);
    if candidates.len() < needed {
        return Err(NOT_ENOUGH.into());
    }
    let mut out: Vec<String> = required.iter().map(|s| (*s).clone()).collect();
    let whole_gpus = !res.is_shared()
        && res
            .units
            .iter()
            .all(|u| u.physical.uuid.starts_with("GPU-"));
    if whole_gpus {
        let fixed: Vec<&Unit> = must_include.iter().filter_map(|id| res.unit(id)).collect();
        out.extend(
            aligned(&fixed, &candidates, needed, healthy)
                .into_iter()
                .map(|u| u.id.clone()),
        );
        return Ok(out);
    }
    // Per physical device: units in the resource, and candidates still free.
    let total: HashMap<&str, usize> = res.units.iter().fold(HashMap::new(), |mut m, u| {
        *m.entry(u.physical.uuid.as_str()).or_default() += 1;
        m
    });
    let mut free: BTreeMap<&str, Vec<&Unit>> = BTreeMap::new();
    for u in candidates {
        free.entry(u.physical.uuid.as_str()).or_default().push(u);
    }
    let mut picked: HashMap<&str, usize> = HashMap::new();
    for _ in 0..needed {
        let uuid = free
            .iter()
            .filter(|(_, units)| !units.is_empty())
            .min_by_key(|(uuid, units)| {
                let allocated = total[*uuid] - units.len();
                let by_policy = match policy {
                    AllocationPolicy::Distributed => allocated as i64,
                    AllocationPolicy::Packed => -(allocated as i64),
                };
                let from = picked.get(*uuid).copied().unwrap_or(0);
                (!healthy(&units[0].id), by_policy, from)
            })
            .map(|(k, _)| *k)
            .ok_or(NOT_ENOUGH)?;
        *picked.entry(uuid).or_default() += 1;
        let unit = free.get_mut(uuid).map(|v| v.remove(0));
        out.extend(unit.map(|u| u.id.clone()));
    }
    Ok(out)
}

/// The most candidate GPUs the aligned search of [`preferred_allocation`] considers (it tries
/// every set: C(16, 8) = 12,870 at most).
pub const MAX_ALIGNED_GPUS: usize = 16;

/// Topology score of two GPUs: 100 per NVLink between them, else 20 on one NUMA node, 10
/// across nodes or where unknown.
fn pair_score(a: &Unit, b: &Unit) -> u32 {
    let links = a
        .physical
        .links
        .iter()
        .find(|p| p.index == b.physical.gpu_index)
        .map_or(0, |p| p.links);
    if links > 0 {
        100 * links
    } else if a.physical.numa_node.is_some() && a.physical.numa_node == b.physical.numa_node {
        20
    } else {
        10
    }
}

/// The `needed` GPUs of `candidates` (sorted healthy first, then by UUID) that with `fixed`
/// score highest; the first such set in candidate order on ties.
fn aligned<'a>(
    fixed: &[&'a Unit],
    candidates: &[&'a Unit],
    needed: usize,
    healthy: &dyn Fn(&str) -> bool,
) -> Vec<&'a Unit> {
    if candidates.len() > MAX_ALIGNED_GPUS || needed == candidates.len() {
        return candidates.iter().take(needed).copied().collect();
    }
    // Healthy first beats topology (an unhealthy GPU only when needed), then the score.
    type Key = (std::cmp::Reverse<usize>, u32);
    let key = |set: &[&Unit]| -> Key {
        let all: Vec<&Unit> = fixed.iter().chain(set).copied().collect();
        let mut s = 0;
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                s += pair_score(a, b);
            }
        }
        let unhealthy = set.iter().filter(|u| !healthy(&u.id)).count();
        (std::cmp::Reverse(unhealthy), s)
    };
    // Every `needed`-subset of candidate positions, in lexicographic order.
    let mut idx: Vec<usize> = (0..needed).collect();
    let mut best: Option<(Key, Vec<usize>)> = None;
    loop {
        let set: Vec<&Unit> = idx.iter().map(|&i| candidates[i]).collect();
        let k = key(&set);
        if best.as_ref().is_none_or(|(b, _)| k > *b) {
            best = Some((k, idx.clone()));
        }
        let Some(pos) = (0..needed)
            .rev()
            .find(|&p| idx[p] < candidates.len() - needed + p)
        else {
            break;
        };
        idx[pos] += 1;
        for p in pos + 1..needed {
            idx[p] = idx[p - 1] + 1;
        }
    }
    best.map(|(_, idx)| idx.iter().map(|&i| candidates[i]).collect())
        .unwrap_or_default()
}

#[cfg(test)]
#[path = "allocate_tests.rs"]
mod tests;
