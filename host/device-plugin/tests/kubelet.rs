//! The plugin against the kubelet stand-in: registration, ListAndWatch, Allocate per strategy,
//! health fan-out and recovery, kubelet restarts, config reloads and the CDI spec.

mod standin;

use std::{path::PathBuf, sync::Arc, time::Duration};

use kiln_device_plugin::{
    config::Config,
    health::XidFilter,
    proto::{
        AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
        ContainerPreferredAllocationRequest, Empty, ListAndWatchResponse,
        PreferredAllocationRequest, device_plugin_client::DevicePluginClient,
    },
    runtime::{self, ConfigSource, Control, Handle, Options, Status},
    selection::ConfigDir,
    settings::Overrides,
};
use kiln_gpu::FakeBackend;
use standin::{Kubelet, WAIT};
use tonic::{Streaming, transport::Channel};

const UUID: &str = "GPU-11111111-2222-3333-4444-555555555555";
const FIXTURE: &str = r#"
driver_version: "550.144.03"
cuda_version: "12.4"
gpus:
  - uuid: GPU-11111111-2222-3333-4444-555555555555
    name: Tesla T4
    memory_total_mib: 15360
    compute_capability: "7.5"
"#;
const TS5: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 5\n";

struct Env {
    tmp: tempfile::TempDir,
    kubelet: Kubelet,
    fake: Arc<FakeBackend>,
    handle: Handle,
}

impl Env {
    fn cdi_dir(&self) -> PathBuf {
        self.tmp.path().join("cdi")
    }
}

async fn start(source: impl FnOnce(&std::path::Path) -> ConfigSource, o: Overrides) -> Env {
    start_with_label(source, o, None).await
}

async fn start_with_label(
    source: impl FnOnce(&std::path::Path) -> ConfigSource,
    overrides: Overrides,
    label: Option<String>,
) -> Env {
    start_with_fixture(source, overrides, label, FIXTURE).await
}

async fn start_with_fixture(
    source: impl FnOnce(&std::path::Path) -> ConfigSource,
    overrides: Overrides,
    label: Option<String>,
    fixture: &str,
) -> Env {
    let tmp = tempfile::tempdir().unwrap();
    let plugin_dir = tmp.path().join("device-plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    let kubelet = Kubelet::start(&plugin_dir);
    let fake = Arc::new(FakeBackend::new(serde_yaml_ng::from_str(fixture).unwrap()));
    let opts = Options {
        overrides,
        source: source(tmp.path()),
        plugin_dir: plugin_dir.clone(),
        kubelet_socket: Some(kubelet.socket()),
        cdi_root: tmp.path().join("cdi"),
        health_interval: Duration::from_millis(20),
        recovery_after: Duration::ZERO,
        xid_filter: XidFilter::default(),
        kubelet_poll: Duration::from_millis(50),
    };
    let handle = runtime::start(opts, fake.clone(), label).await.unwrap();
    Env {
        tmp,
        kubelet,
        fake,
        handle,
    }
}

fn file_source(text: &'static str) -> impl FnOnce(&std::path::Path) -> ConfigSource {
    move |dir| {
        let p = dir.join("config.yaml");
        std::fs::write(&p, text).unwrap();
        ConfigSource::File(p)
    }
}

async fn next_list(s: &mut Streaming<ListAndWatchResponse>) -> Vec<(String, String)> {
    let msg = tokio::time::timeout(WAIT, s.message())
        .await
        .expect("a ListAndWatch update within the wait bound")
        .unwrap()
        .expect("stream open");
    msg.devices.into_iter().map(|d| (d.id, d.health)).collect()
}

async fn allocate(
    c: &mut DevicePluginClient<Channel>,
    ids: &[&str],
) -> Result<ContainerAllocateResponse, tonic::Status> {
    let req = AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        }],
    };
    Ok(c.allocate(req)
        .await?
        .into_inner()
        .container_responses
        .remove(0))
}

async fn wait_status(h: &Handle, pred: impl FnMut(&Status) -> bool) -> Status {
    let mut rx = h.status.clone();
    tokio::time::timeout(WAIT, rx.wait_for(pred))
        .await
        .expect("status within the wait bound")
        .unwrap()
        .clone()
}

fn replica_ids() -> Vec<String> {
    (0..5).map(|k| format!("{UUID}::{k}")).collect()
}

#[tokio::test]
async fn replicas_five_register_as_five_units_and_allocate_dedups() {
    let mut env = start(file_source(TS5), Overrides::default()).await;
    let reg = env.kubelet.next_registration().await;
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.resource_name, "nvidia.com/gpu");
    assert_eq!(reg.endpoint, "nvidia-gpu.sock");
    let opts = reg.options.unwrap();
    assert!(opts.get_preferred_allocation_available && !opts.pre_start_required);

    let mut c = env.kubelet.client(&reg.endpoint).await;
    let got = c
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(got.get_preferred_allocation_available);
    let mut stream = c.list_and_watch(Empty {}).await.unwrap().into_inner();
    let list = next_list(&mut stream).await;
    let want: Vec<_> = replica_ids()
        .into_iter()
        .map(|id| (id, "Healthy".to_owned()))
        .collect();
    assert_eq!(list, want);

    let one = allocate(&mut c, &[&format!("{UUID}::3")]).await.unwrap();
    assert_eq!(one.envs["NVIDIA_VISIBLE_DEVICES"], UUID);
    assert_eq!(one.envs.len(), 1);
    let two = allocate(&mut c, &[&format!("{UUID}::0"), &format!("{UUID}::4")])
        .await
        .unwrap();
    assert_eq!(two.envs["NVIDIA_VISIBLE_DEVICES"], UUID);
    let err = allocate(&mut c, &["GPU-nope::0"]).await.unwrap_err();
    assert_eq!(
        err.message(),
        "invalid allocation request for \"nvidia.com/gpu\": invalid request: unknown device: GPU-nope::0"
    );

    let pref = c
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: replica_ids().into_iter().rev().collect(),
                must_include_device_i_ds: vec![],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pref.container_responses[0].device_i_ds,
        [format!("{UUID}::0"), format!("{UUID}::1")]
    );
    env.handle.shutdown().await;
    assert!(!env.kubelet.dir.join("nvidia-gpu.sock").exists());
    env.kubelet.restart().await;
}

#[tokio::test]
async fn fail_requests_greater_than_one_is_upstreams_error() {
    const CFG: &str = "sharing: {timeSlicing: {renameByDefault: true, failRequestsGreaterThanOne: true, resources: [{name: gpu, replicas: 5}]}}";
    let env = start(file_source(CFG), Overrides::default()).await;
    let reg = env.kubelet.next_registration().await;
    assert_eq!(reg.resource_name, "nvidia.com/gpu.shared");
    assert_eq!(reg.endpoint, "nvidia-gpu.shared.sock");
    let mut c = env.kubelet.client(&reg.endpoint).await;
    let err = allocate(&mut c, &[&format!("{UUID}::0"), &format!("{UUID}::1")])
        .await
        .unwrap_err();
    assert_eq!(
        err.message(),
        "invalid allocation request for \"nvidia.com/gpu.shared\": invalid request: maximum request size for shared resources is 1; found 2"
    );
    assert!(allocate(&mut c, &[&format!("{UUID}::1")]).await.is_ok());
    env.handle.shutdown().await;
}

#[tokio::test]
async fn allocate_responses_per_list_strategy() {
    let cases = [
        ("volume-mounts", "uuid"),
        ("cdi-annotations", "uuid"),
        ("cdi-cri", "index"),
        ("envvar", "index"),
    ];
    for (list, id) in cases {
        let o = Overrides {
            device_list_strategy: Some(list.into()),
            device_id_strategy: Some(id.parse().unwrap()),
            pass_device_specs: Some(true),
            dev_root: Some("/host".into()),
            ..Overrides::default()
        };
        let env = start(|_| ConfigSource::None, o).await;
        let reg = env.kubelet.next_registration().await;
        let mut c = env.kubelet.client(&reg.endpoint).await;
        let r = allocate(&mut c, &[UUID]).await.unwrap();
        let runtime_id = if id == "uuid" { UUID } else { "0" };
        let dev = r
            .devices
            .iter()
            .find(|d| d.container_path == "/dev/nvidia0");
        if list.starts_with("cdi-") {
            // CDI-only responses end before NVIDIA_VISIBLE_DEVICES and device specs (upstream).
            assert!(dev.is_none());
        } else {
            let dev = dev.expect("device spec for /dev/nvidia0");
            assert_eq!(
                (dev.host_path.as_str(), dev.permissions.as_str()),
                ("/host/dev/nvidia0", "rw")
            );
        }
        match list {
            "volume-mounts" => {
                assert_eq!(
                    r.envs["NVIDIA_VISIBLE_DEVICES"],
                    "/var/run/nvidia-container-devices"
                );
                assert_eq!(r.mounts.len(), 1);
                assert_eq!(
                    r.mounts[0].container_path,
                    format!("/var/run/nvidia-container-devices/{UUID}")
                );
                assert_eq!(r.mounts[0].host_path, "/dev/null");
            }
            "cdi-annotations" => {
                assert!(!r.envs.contains_key("NVIDIA_VISIBLE_DEVICES"));
                assert_eq!(r.annotations.len(), 1);
                let (k, v) = r.annotations.iter().next().unwrap();
                let suffix = k
                    .strip_prefix("cdi.k8s.io/nvidia-device-plugin_")
                    .expect("annotation key shape");
                assert_eq!(suffix.len(), 36, "{k}");
                assert_eq!(v, &format!("k8s.device-plugin.nvidia.com/gpu={UUID}"));
                assert!(
                    env.cdi_dir()
                        .join("k8s.device-plugin.nvidia.com-gpu.json")
                        .exists()
                );
            }
            "cdi-cri" => {
                assert!(!r.envs.contains_key("NVIDIA_VISIBLE_DEVICES"));
                let names: Vec<_> = r.cdi_devices.iter().map(|d| d.name.as_str()).collect();
                assert_eq!(names, ["k8s.device-plugin.nvidia.com/gpu=0"]);
            }
            _ => assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], runtime_id),
        }
        env.handle.shutdown().await;
    }
}

#[tokio::test]
async fn an_xid_marks_every_replica_unhealthy_then_recovery_readvertises() {
    let env = start(file_source(TS5), Overrides::default()).await;
    let reg = env.kubelet.next_registration().await;
    let mut c = env.kubelet.client(&reg.endpoint).await;
    let mut stream = c.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert!(
        next_list(&mut stream)
            .await
            .iter()
            .all(|(_, h)| h == "Healthy")
    );

    // An application XID is skipped; XID 79 with the GPU gone is critical.
    env.fake.inject_xid(0, 31);
    env.fake.set_lost(0, true);
    env.fake.inject_xid(0, 79);
    let list = next_list(&mut stream).await;
    assert_eq!(list.len(), 5);
    assert!(list.iter().all(|(_, h)| h == "Unhealthy"), "{list:?}");

    env.fake.set_lost(0, false);
    let list = next_list(&mut stream).await;
    let ids: Vec<_> = list.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(ids, replica_ids());
    assert!(list.iter().all(|(_, h)| h == "Healthy"), "{list:?}");
    env.handle.shutdown().await;
}

#[tokio::test]
async fn kubelet_restart_recreates_sockets_and_registers_again() {
    let mut env = start(file_source(TS5), Overrides::default()).await;
    let first = env.kubelet.next_registration().await;
    wait_status(&env.handle, |s| s.registrations == 1).await;
    env.kubelet.restart().await;
    let again = env.kubelet.next_registration().await;
    assert_eq!(again, first);
    wait_status(&env.handle, |s| s.registrations == 2).await;
    let mut c = env.kubelet.client(&again.endpoint).await;
    let mut stream = c.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(next_list(&mut stream).await.len(), 5);
    env.handle.shutdown().await;
}

#[tokio::test]
async fn label_switches_config_without_reregistering_and_a_bad_key_keeps_it() {
    let dir_source = |root: &std::path::Path| {
        let d = root.join("available-configs");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("default"), "version: v1\n").unwrap();
        std::fs::write(d.join("ts5"), TS5).unwrap();
        ConfigSource::Dir(ConfigDir {
            dir: d,
            default_config: None,
            fallbacks: vec!["named".into(), "single".into()],
        })
    };
    let env = start_with_label(dir_source, Overrides::default(), None).await;
    let reg = env.kubelet.next_registration().await;
    let st = wait_status(&env.handle, |s| s.generation == 1).await;
    assert_eq!(st.config_name.as_deref(), Some("default"));
    let mut c = env.kubelet.client(&reg.endpoint).await;
    let mut stream = c.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(
        next_list(&mut stream).await,
        [(UUID.to_owned(), "Healthy".to_owned())]
    );

    env.handle
        .control
        .send(Control::Label(Some("ts5".into())))
        .await
        .unwrap();
    let st = wait_status(&env.handle, |s| s.generation == 2).await;
    assert_eq!(st.config_name.as_deref(), Some("ts5"));
    // Same stream, same registration: the kubelet just gets the new list.
    let ids: Vec<_> = next_list(&mut stream)
        .await
        .into_iter()
        .map(|d| d.0)
        .collect();
    assert_eq!(ids, replica_ids());
    assert_eq!(st.registrations, 1);

    env.handle
        .control
        .send(Control::Label(Some("missing".into())))
        .await
        .unwrap();
    let st = wait_status(&env.handle, |s| s.last_error.is_some()).await;
    assert_eq!(
        st.last_error.as_deref(),
        Some("specified config missing does not exist")
    );
    assert_eq!((st.generation, st.config_name.as_deref()), (2, Some("ts5")));
    let one = allocate(&mut c, &[&format!("{UUID}::4")]).await.unwrap();
    assert_eq!(one.envs["NVIDIA_VISIBLE_DEVICES"], UUID);
    env.handle.shutdown().await;
}

#[tokio::test]
async fn cdi_spec_mounts_libraries_from_the_linkers_configured_directories() {
    // A driver outside the standard library directories, registered with the dynamic linker
    // (as a GPU cloud image keeps it in /usr/local/nvidia/lib64): upstream's CDI generator finds
    // it through the linker cache; kiln through the ld.so.conf files the cache is built from.
    let tmp_root = tempfile::tempdir().unwrap();
    let root = tmp_root.path();
    let nvidia = root.join("usr/local/nvidia/lib64");
    std::fs::create_dir_all(&nvidia).unwrap();
    std::fs::create_dir_all(root.join("etc/ld.so.conf.d")).unwrap();
    std::fs::write(
        root.join("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n",
    )
    .unwrap();
    std::fs::write(
        root.join("etc/ld.so.conf.d/nvidia.conf"),
        "/usr/local/nvidia/lib64\n",
    )
    .unwrap();
    for lib in ["libcuda.so", "libnvidia-ml.so"] {
        std::fs::write(nvidia.join(format!("{lib}.550.144.03")), "").unwrap();
    }
    // One library also in a standard directory: that copy is mounted, the other is not.
    let std_dir = root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&std_dir).unwrap();
    std::fs::write(std_dir.join("libcuda.so.550.144.03"), "").unwrap();
    let o = Overrides {
        device_list_strategy: Some("cdi-cri".into()),
        driver_root: Some("/".into()),
        driver_root_ctr_path: Some(root.display().to_string()),
        ..Overrides::default()
    };
    let env = start(|_| ConfigSource::None, o).await;
    let spec_path = env.cdi_dir().join("k8s.device-plugin.nvidia.com-gpu.json");
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap();
    let mounts: Vec<(&str, &str)> = spec["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["hostPath"].as_str().unwrap(),
                m["containerPath"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        mounts,
        [
            (
                "/usr/lib/x86_64-linux-gnu/libcuda.so.550.144.03",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.550.144.03"
            ),
            (
                "/usr/local/nvidia/lib64/libnvidia-ml.so.550.144.03",
                "/usr/local/nvidia/lib64/libnvidia-ml.so.550.144.03"
            ),
        ]
    );
    let hook = &spec["containerEdits"]["hooks"][0];
    assert_eq!(
        hook["args"],
        serde_json::json!([
            "nvidia-cdi-hook",
            "update-ldcache",
            "--folder",
            "/usr/lib/x86_64-linux-gnu",
            "--folder",
            "/usr/local/nvidia/lib64"
        ])
    );
    env.handle.shutdown().await;
}

#[tokio::test]
async fn cdi_spec_is_rewritten_when_the_driver_version_changes() {
    let o = Overrides {
        device_list_strategy: Some("cdi-cri".into()),
        driver_root: Some("/run/nvidia/driver".into()),
        ..Overrides::default()
    };
    // The container's view of the driver root holds both versions' libraries.
    let tmp_root = tempfile::tempdir().unwrap();
    let lib = tmp_root.path().join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).unwrap();
    for v in ["550.144.03", "560.35.03"] {
        std::fs::write(lib.join(format!("libcuda.so.{v}")), "").unwrap();
    }
    let o = Overrides {
        driver_root_ctr_path: Some(tmp_root.path().display().to_string()),
        ..o
    };
    let env = start(|_| ConfigSource::None, o).await;
    let spec_path = env.cdi_dir().join("k8s.device-plugin.nvidia.com-gpu.json");
    let read = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap()
    };
    let spec = read();
    assert_eq!(spec["kind"], "k8s.device-plugin.nvidia.com/gpu");
    assert_eq!(spec["devices"][0]["name"], UUID);
    assert_eq!(
        spec["containerEdits"]["mounts"][0]["hostPath"],
        "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.550.144.03"
    );

    env.fake.set_driver_version("560.35.03");
    wait_status(&env.handle, |s| {
        s.cdi_driver_version.as_deref() == Some("560.35.03")
    })
    .await;
    let spec = read();
    assert_eq!(
        spec["annotations"]["k8s.device-plugin.nvidia.com/driver-version"],
        "560.35.03"
    );
    assert_eq!(
        spec["containerEdits"]["mounts"][0]["containerPath"],
        "/usr/lib/x86_64-linux-gnu/libcuda.so.560.35.03"
    );
    let leftovers: Vec<_> = std::fs::read_dir(env.cdi_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "no temp files left: {leftovers:?}");
    env.handle.shutdown().await;
}

#[test]
fn config_used_by_the_tests_is_valid() {
    assert_eq!(Config::from_yaml(TS5).unwrap().sharing().replicas("gpu"), 5);
}

/// The 8-GPU NVLink fixture (`tests/data/nvlink-8gpu.yaml`).
const NVLINK8: &str = include_str!("data/nvlink-8gpu.yaml");

async fn preferred(
    c: &mut DevicePluginClient<Channel>,
    available: Vec<String>,
    size: i32,
) -> Vec<String> {
    c.get_preferred_allocation(PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_i_ds: available,
            must_include_device_i_ds: vec![],
            allocation_size: size,
        }],
    })
    .await
    .unwrap()
    .into_inner()
    .container_responses
    .remove(0)
    .device_i_ds
}

#[tokio::test]
async fn v0_20_config_on_eight_nvlink_gpus_numa_topology_linked_pairs_and_packed_replicas() {
    let gpu = |i: u32| format!("GPU-{i}0000000-0000-0000-0000-000000000000");
    // Whole GPUs: NUMA nodes in ListAndWatch, a linked pair for two.
    const V020: &str =
        "version: v1\nflags:\n  plugin:\n    sharedDevicesAllocationPolicy: packed\n";
    let env = start_with_fixture(file_source(V020), Overrides::default(), None, NVLINK8).await;
    let reg = env.kubelet.next_registration().await;
    let mut c = env.kubelet.client(&reg.endpoint).await;
    let mut stream = c.list_and_watch(Empty {}).await.unwrap().into_inner();
    let msg = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let numa: Vec<(String, Vec<i64>)> = msg
        .devices
        .iter()
        .map(|d| {
            let nodes = d
                .topology
                .as_ref()
                .unwrap()
                .nodes
                .iter()
                .map(|n| n.id)
                .collect();
            (d.id.clone(), nodes)
        })
        .collect();
    let want: Vec<(String, Vec<i64>)> = (0..8).map(|i| (gpu(i), vec![i64::from(i / 4)])).collect();
    assert_eq!(numa, want);
    let all: Vec<String> = (0..8).rev().map(gpu).collect();
    assert_eq!(preferred(&mut c, all, 2).await, [gpu(0), gpu(2)]);
    env.handle.shutdown().await;

    // Four replicas per GPU, packed: one GPU's replicas before the next one's.
    const PACKED: &str = "version: v1\nflags:\n  plugin:\n    sharedDevicesAllocationPolicy: packed\n\
        sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n";
    let env = start_with_fixture(file_source(PACKED), Overrides::default(), None, NVLINK8).await;
    let reg = env.kubelet.next_registration().await;
    let mut c = env.kubelet.client(&reg.endpoint).await;
    let replicas: Vec<String> = (0..8)
        .flat_map(|i| (0..4).map(move |k| format!("{}::{k}", gpu(i))))
        .collect();
    let got = preferred(&mut c, replicas.clone(), 3).await;
    assert_eq!(got, [0, 1, 2].map(|k| format!("{}::{k}", gpu(0))));
    env.handle.shutdown().await;
}
