use super::*;
use crate::{
    config::{AllocationPolicy, Config, MigStrategy, Sharing},
    devices::build_resources,
    settings::Overrides,
};

fn setup(cfg: &str, uuids: &[&str]) -> (Resource, Settings) {
    let cfg = Config::from_yaml(cfg).unwrap();
    let s = Settings::resolve(&Overrides::default(), &cfg).unwrap();
    let gpus: Vec<_> = uuids
        .iter()
        .enumerate()
        .map(|(i, u)| kiln_gpu::GpuDevice {
            index: i as u32,
            uuid: (*u).into(),
            name: "Tesla T4".into(),
            pci_bus_id: String::new(),
            memory_total_bytes: 0,
            compute_capability: (7, 5),
            mig_enabled: None,
            mig_devices: vec![],
            ..Default::default()
        })
        .collect();
    let r = build_resources(&gpus, MigStrategy::None, &s.sharing).unwrap();
    (r.into_iter().next().unwrap(), s)
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn replicas_of_one_gpu_collapse_to_one_runtime_id_and_index_strategy() {
    let (r, mut s) = setup(
        "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 3}]}}",
        &["GPU-a", "GPU-b"],
    );
    let resp = allocate_container(
        &r,
        &s,
        &ids(&["GPU-b::2", "GPU-b::0", "GPU-a::1"]),
        "x",
        &|_| false,
    )
    .unwrap();
    assert_eq!(resp.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-b,GPU-a");
    s.device_id_strategy = crate::config::DeviceIdStrategy::Index;
    let resp =
        allocate_container(&r, &s, &ids(&["GPU-b::2", "GPU-a::1"]), "x", &|_| false).unwrap();
    assert_eq!(resp.envs["NVIDIA_VISIBLE_DEVICES"], "1,0");
}

#[test]
fn preferred_allocation_spreads_replicas_and_prefers_healthy() {
    let (r, _) = setup(
        "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}",
        &["GPU-a", "GPU-b"],
    );
    let all = ids(&["GPU-a::0", "GPU-a::1", "GPU-b::0", "GPU-b::1"]);
    let d = AllocationPolicy::Distributed;
    let got = preferred_allocation(&r, &|_| true, &all, &[], 2, d).unwrap();
    assert_eq!(got, ["GPU-a::0", "GPU-b::0"]);
    let got = preferred_allocation(&r, &|id| !id.starts_with("GPU-a"), &all, &[], 1, d).unwrap();
    assert_eq!(got, ["GPU-b::0"]);
    let got = preferred_allocation(&r, &|_| true, &all, &ids(&["GPU-a::1"]), 2, d).unwrap();
    assert_eq!(got, ["GPU-a::1", "GPU-b::0"]);
    assert_eq!(
        preferred_allocation(&r, &|_| true, &all[..1], &[], 2, d).unwrap_err(),
        "not enough available devices to satisfy allocation"
    );
}

#[test]
fn packed_fills_one_gpus_replicas_first_and_distributed_spreads_them() {
    let (r, s) = setup(
        "flags: {plugin: {sharedDevicesAllocationPolicy: packed}}\n\
         sharing: {timeSlicing: {resources: [{name: gpu, replicas: 4}]}}",
        &["GPU-a", "GPU-b"],
    );
    assert_eq!(s.shared_devices_allocation_policy, AllocationPolicy::Packed);
    let all: Vec<String> = r.units.iter().map(|u| u.id.clone()).collect();
    let pick =
        |avail: &[String], n, p| preferred_allocation(&r, &|_| true, avail, &[], n, p).unwrap();
    let packed = AllocationPolicy::Packed;
    let dist = AllocationPolicy::Distributed;
    assert_eq!(pick(&all, 3, packed), ["GPU-a::0", "GPU-a::1", "GPU-a::2"]);
    assert_eq!(pick(&all, 3, dist), ["GPU-a::0", "GPU-b::0", "GPU-a::1"]);
    // GPU-b already has a replica allocated (missing from `available`): packed goes on filling
    // it; distributed starts on the emptier GPU-a, then (one each) alternates.
    let rest: Vec<String> = all.iter().filter(|id| *id != "GPU-b::0").cloned().collect();
    assert_eq!(pick(&rest, 2, packed), ["GPU-b::1", "GPU-b::2"]);
    assert_eq!(pick(&rest, 2, dist), ["GPU-a::0", "GPU-b::1"]);
    // A GPU filled to the last replica: packed moves to the next one.
    assert_eq!(
        pick(&all, 6, packed),
        [
            "GPU-a::0", "GPU-a::1", "GPU-a::2", "GPU-a::3", "GPU-b::0", "GPU-b::1"
        ]
    );
}

#[test]
fn the_policy_is_upstreams_flag_and_a_bad_value_its_error() {
    assert_eq!(
        "spread".parse::<AllocationPolicy>().unwrap_err(),
        "invalid --shared-devices-allocation-policy option: spread"
    );
    let err = Config::from_yaml("flags: {plugin: {sharedDevicesAllocationPolicy: spread}}")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("invalid --shared-devices-allocation-policy option: spread"),
        "{err}"
    );
    let o = Overrides {
        shared_devices_allocation_policy: Some(AllocationPolicy::Distributed),
        ..Overrides::default()
    };
    let cfg =
        Config::from_yaml("flags: {plugin: {sharedDevicesAllocationPolicy: packed}}").unwrap();
    let s = Settings::resolve(&o, &cfg).unwrap();
    assert_eq!(
        s.shared_devices_allocation_policy,
        AllocationPolicy::Distributed
    );
    let s = Settings::resolve(&Overrides::default(), &Config::default()).unwrap();
    assert_eq!(
        s.shared_devices_allocation_policy,
        AllocationPolicy::Distributed
    );
}

/// The 8-GPU NVLink fixture's `nvidia.com/gpu`.
fn nvlink8() -> Resource {
    let fixture = include_str!("../tests/data/nvlink-8gpu.yaml");
    let fake = kiln_gpu::FakeBackend::new(serde_yaml_ng::from_str(fixture).unwrap());
    let gpus = kiln_gpu::GpuInventory::devices(&fake).unwrap();
    let cfg = Config::from_yaml("").unwrap();
    let s = Settings::resolve(&Overrides::default(), &cfg).unwrap();
    build_resources(&gpus, MigStrategy::None, &s.sharing)
        .unwrap()
        .remove(0)
}

fn gpu(i: u32) -> String {
    format!("GPU-{i}0000000-0000-0000-0000-000000000000")
}

#[test]
fn full_gpus_are_picked_by_nvlink_then_numa() {
    let r = nvlink8();
    assert_eq!(r.units[0].physical.numa_node, Some(0));
    assert_eq!(r.units[7].physical.numa_node, Some(1));
    let all: Vec<String> = (0..8).map(gpu).collect();
    let d = AllocationPolicy::Distributed;
    let pick = |avail: &[String], req: &[String], n| {
        preferred_allocation(&r, &|_| true, avail, req, n, d).unwrap()
    };
    // A 2-GPU request gets a linked pair, not the first two in UUID order.
    assert_eq!(pick(&all, &[], 2), [gpu(0), gpu(2)]);
    assert_eq!(pick(&all, &[gpu(1)], 2), [gpu(1), gpu(3)]);
    assert_eq!(pick(&all, &[gpu(7)], 2), [gpu(7), gpu(5)]);
    // Four: both linked pairs of one NUMA node.
    assert_eq!(pick(&all, &[], 4), [gpu(0), gpu(1), gpu(2), gpu(3)]);
    // Without a linked pair available: one NUMA node before crossing.
    let avail = [gpu(0), gpu(4), gpu(5)];
    assert_eq!(pick(&avail, &[], 2), [gpu(4), gpu(5)].map(String::from));
    let avail = [gpu(3), gpu(4)];
    assert_eq!(pick(&avail, &[], 2), avail);
    // Healthy GPUs first, even over NVLink.
    let sick = gpu(2);
    let got = preferred_allocation(&r, &|id| id != sick, &all, &[], 2, d).unwrap();
    assert_eq!(got, [gpu(1), gpu(3)]);
}

#[test]
fn mig_resource_names_follow_v0_20() {
    use kiln_gpu::{GpuDevice, MigDevice};
    let mig = |uuid: &str, profile: &str| MigDevice {
        uuid: uuid.into(),
        profile: Some(profile.into()),
        ..Default::default()
    };
    let gpus = [GpuDevice {
        index: 0,
        uuid: "GPU-a".into(),
        mig_enabled: Some(true),
        mig_devices: vec![
            mig("MIG-1", "1g.10gb"),
            mig("MIG-2", "1g.10gb+me"),
            mig("MIG-3", "1g.20gb+gfx"),
            mig("MIG-4", "1g.10gb+me.all"),
            mig("MIG-5", "1g.10gb-me"),
            mig("MIG-6", "1c.2g.20gb"),
        ],
        ..Default::default()
    }];
    let names: Vec<String> = build_resources(&gpus, MigStrategy::Mixed, &Sharing::default())
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(
        names,
        [
            "nvidia.com/mig-1c.2g.20gb",
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/mig-1g.10gb-me",
            "nvidia.com/mig-1g.10gb.me",
            "nvidia.com/mig-1g.10gb.me.all",
            "nvidia.com/mig-1g.20gb.gfx",
        ]
    );
}

#[test]
fn random_uuid_is_version_4() {
    let u = random_uuid();
    assert_eq!(u.len(), 36);
    assert_eq!(&u[14..15], "4");
    assert_ne!(u, random_uuid());
}
