use super::*;
use crate::{
    config::{Config, MigStrategy},
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
    let got = preferred_allocation(&r, &|_| true, &all, &[], 2).unwrap();
    assert_eq!(got, ["GPU-a::0", "GPU-b::0"]);
    let got = preferred_allocation(&r, &|id| !id.starts_with("GPU-a"), &all, &[], 1).unwrap();
    assert_eq!(got, ["GPU-b::0"]);
    let got = preferred_allocation(&r, &|_| true, &all, &ids(&["GPU-a::1"]), 2).unwrap();
    assert_eq!(got, ["GPU-a::1", "GPU-b::0"]);
    assert_eq!(
        preferred_allocation(&r, &|_| true, &all[..1], &[], 2).unwrap_err(),
        "not enough available devices to satisfy allocation"
    );
}

#[test]
fn random_uuid_is_version_4() {
    let u = random_uuid();
    assert_eq!(u.len(), 36);
    assert_eq!(&u[14..15], "4");
    assert_ne!(u, random_uuid());
}
