use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kiln_device_plugin::{config::Config, settings::Overrides};
use kiln_gpu::{FakeBackend, GpuInventory};
use serde_json::json;

use super::*;
use crate::config::Recorder;

const FIXTURE: &str = r#"
driver_version: "550.144.03"
cuda_version: "12.4"
gpus:
  - {uuid: GPU-0, name: NVIDIA H100 80GB HBM3, memory_total_mib: 81559, compute_capability: "9.0"}
  - {uuid: GPU-1, name: NVIDIA H100 80GB HBM3, memory_total_mib: 81559, compute_capability: "9.0"}
"#;

fn claim(
    uid: &str,
    node: &str,
    devices: &[&str],
    config: Option<serde_json::Value>,
) -> ResourceClaim {
    let results: Vec<_> = devices
        .iter()
        .map(|d| json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": d}))
        .collect();
    let mut alloc = json!({"devices": {"results": results}});
    if let Some(c) = config {
        alloc["devices"]["config"] = json!([{"source": "FromClaim", "opaque": {
            "driver": "gpu.nvidia.com", "parameters": c}}]);
    }
    serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ns", "uid": uid},
        "spec": {},
        "status": {"allocation": alloc}
    }))
    .unwrap()
}

struct Fixture {
    _dir: tempfile::TempDir,
    opts: StateOptions,
    recorder: Arc<Recorder>,
    devices: Vec<Allocatable>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeBackend::new(serde_yaml_ng::from_str(FIXTURE).unwrap());
    let devices = crate::slices::allocatable(&fake.devices().unwrap(), &fake.system().unwrap());
    let recorder = Arc::new(Recorder::default());
    let opts = StateOptions {
        node: "node-a".into(),
        checkpoint: dir.path().join("plugin/checkpoint.json"),
        cdi_root: dir.path().join("cdi"),
        settings: Settings::resolve(&Overrides::default(), &Config::default()).unwrap(),
        container_driver_root: dir.path().join("driver-root"),
        applier: recorder.clone(),
    };
    Fixture {
        _dir: dir,
        opts,
        recorder,
        devices,
    }
}

#[test]
fn prepare_is_idempotent_and_survives_a_restart_without_preparing_twice() {
    let f = fixture();
    let ts = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Medium"}}});
    let c = claim("uid-1", "node-a", &["gpu-1"], Some(ts));
    let mut s = DeviceState::new(f.opts.clone(), f.devices.clone(), "550.144.03".into()).unwrap();
    let first = s.prepare(&c).unwrap();
    assert_eq!(first[0].cdi_ids, ["k8s.gpu.nvidia.com/claim=uid-1-gpu-1"]);
    assert_eq!(first[0].uuid, "GPU-1");
    assert!(cdi::spec_file(&f.opts.cdi_root, "uid-1").exists());
    assert_eq!(s.prepare(&c).unwrap(), first);
    assert_eq!(f.recorder.calls.lock().unwrap().len(), 1);

    // A restart reads the checkpoint: the same answer, the time-slice not set again.
    drop(s);
    let mut s = DeviceState::new(f.opts.clone(), f.devices.clone(), "550.144.03".into()).unwrap();
    assert_eq!(s.prepare(&c).unwrap(), first);
    assert_eq!(f.recorder.calls.lock().unwrap().len(), 1);
    // A lost spec file is written again.
    std::fs::remove_file(cdi::spec_file(&f.opts.cdi_root, "uid-1")).unwrap();
    assert_eq!(s.prepare(&c).unwrap(), first);
    assert!(cdi::spec_file(&f.opts.cdi_root, "uid-1").exists());

    s.unprepare("uid-1").unwrap();
    s.unprepare("uid-1").unwrap();
    assert!(!cdi::spec_file(&f.opts.cdi_root, "uid-1").exists());
    assert!(s.prepared().is_empty());
    assert_eq!(
        *f.recorder.calls.lock().unwrap(),
        [
            ("GPU-1".to_owned(), TimeSlice::Medium),
            ("GPU-1".to_owned(), TimeSlice::Default)
        ]
    );
    let s = DeviceState::new(f.opts.clone(), f.devices.clone(), "550.144.03".into()).unwrap();
    assert!(s.prepared().is_empty());
}

#[test]
fn refused_claims_leave_nothing_behind() {
    let f = fixture();
    let mut s = DeviceState::new(f.opts.clone(), f.devices.clone(), "550.144.03".into()).unwrap();
    let mps = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS"}});
    let err = s
        .prepare(&claim("uid-2", "node-a", &["gpu-0"], Some(mps)))
        .unwrap_err();
    assert!(
        err.starts_with("claim ns/c: MPS sharing is not supported"),
        "{err}"
    );
    let err = s
        .prepare(&claim("uid-3", "node-a", &["gpu-7"], None))
        .unwrap_err();
    assert_eq!(
        err,
        "claim ns/c: device gpu-7 is not a device of node node-a"
    );
    let err = s
        .prepare(&claim("uid-4", "node-b", &["gpu-0"], None))
        .unwrap_err();
    assert_eq!(
        err,
        "claim ns/c has no gpu.nvidia.com device allocated on node node-a"
    );
    let mut unallocated = claim("uid-5", "node-a", &["gpu-0"], None);
    unallocated.status = None;
    assert_eq!(
        s.prepare(&unallocated).unwrap_err(),
        "claim ns/c is not allocated"
    );
    assert!(s.prepared().is_empty());
    assert!(!f.opts.checkpoint.exists());
    assert!(f.recorder.calls.lock().unwrap().is_empty());
}

#[test]
fn a_corrupt_checkpoint_stops_the_start() {
    let f = fixture();
    std::fs::create_dir_all(f.opts.checkpoint.parent().unwrap()).unwrap();
    std::fs::write(
        &f.opts.checkpoint,
        b"{\"version\": 1, \"checksum\": 1, \"claims\": {}}",
    )
    .unwrap();
    assert!(matches!(
        DeviceState::new(f.opts.clone(), f.devices.clone(), "550.144.03".into()),
        Err(CheckpointError::Corrupt { .. })
    ));
}
