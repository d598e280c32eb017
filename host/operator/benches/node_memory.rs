//! What the operator keeps per node, in heap bytes: `N` nodes shaped like testcluster's GPU
//! nodes after kiln labelled them (as the API server serves them: managed fields, kwok's
//! conditions, capacity, node info) are decoded as the node watch decodes them and kept as the
//! node store keeps them ([`kiln_operator::node::SlimNode`]). A counting allocator gives the heap
//! held after the store is filled, per node, and the peak while a 500-node page is decoded.
//!
//! Then the two pods a GPU node adds to the operator's pod stores
//! ([`kiln_operator::readiness::SlimPod`]): its driver pod (the `OnDelete` rule and the driver
//! upgrade) and its validator pod (the readiness timeline). Both are decoded from pods captured
//! off testcluster at 5,000 GPU nodes, as the API server serves them to a watch
//! (`benches/data/*-pod.json`, managed fields included), renamed and rebound per node.
//!
//! Then the readiness timeline ([`kiln_operator::timeline::Tracker`]) fed those nodes and
//! validator pods, as the operator's timeline task is fed: what it keeps once every node is
//! ready.
//!
//! `cargo bench -p kiln-operator --bench node_memory` (`KILN_BENCH_NODES`, default 5000). Heap
//! bytes do not depend on the machine's load, so the figure is exact; RSS adds the allocator's
//! overhead and the executable (see the steady_state bench). Target context (issue 16): RSS
//! ≤ 40 MiB at 5,000 nodes.

#![allow(missing_docs)]
// A global allocator is an `unsafe impl`: it only forwards to `System` and counts.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln_operator::node::{SlimNode, WatchedNode};
use kiln_operator::readiness::{PodStore, PodStoreWriter, WirePod};
use kiln_operator::store::NamedWriter;
use kiln_operator::timeline::{Source, Tracker, node_facts, validator_facts};
use kube::runtime::watcher;
use serde_json::{Value, json};
use std::sync::Arc;

/// `System`, counting the bytes held now and the most held since the last reset.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = HELD.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let now = HELD.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size
                    - layout.size();
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                HELD.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// A GPU node as the API server serves it once kiln labelled it (testcluster's labels, the
/// `nvidia.com/gpu.deploy.*` labels of the sample policy, kwok's status).
fn node_json(i: usize) -> Value {
    let name = format!("kiln-gpu-{i:05}");
    let mut labels = json!({
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "type": "kwok", "kiln.dev/testcluster": "true", "node.kubernetes.io/instance-type": "kiln-sim",
        "feature.node.kubernetes.io/kernel-version.full": "6.8.0-51-generic",
        "feature.node.kubernetes.io/kernel-version.major": "6",
        "feature.node.kubernetes.io/kernel-version.minor": "8",
        "feature.node.kubernetes.io/kernel-version.revision": "0",
        "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID.major": "22",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID.minor": "04",
        "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gfd.timestamp": "1764612345",
        "nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-H200",
        "nvidia.com/gpu.memory": "143771", "nvidia.com/cuda.driver.major": "580",
    });
    for operand in [
        "driver",
        "container-toolkit",
        "device-plugin",
        "gpu-feature-discovery",
        "dcgm",
        "dcgm-exporter",
        "operator-validator",
        "node-status-exporter",
        "mig-manager",
        "operands",
    ] {
        labels[format!("nvidia.com/gpu.deploy.{operand}")] = json!("true");
    }
    let condition = |t: &str, status: &str| {
        json!({"type": t, "status": status, "lastHeartbeatTime": "2026-12-01T19:00:00Z",
               "lastTransitionTime": "2026-12-01T18:00:00Z", "reason": format!("Kubelet{t}"),
               "message": format!("kubelet reports {t}")})
    };
    let resources = json!({"cpu": "32", "memory": "128Gi", "pods": "110",
                           "ephemeral-storage": "500Gi", "nvidia.com/gpu": "8"});
    let managed = |manager: &str, op: &str, sub: Option<&str>| {
        let mut m = json!({"manager": manager, "operation": op, "apiVersion": "v1",
            "time": "2026-12-01T18:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {"f:kubernetes.io/hostname": {},
                "f:feature.node.kubernetes.io/kernel-version.full": {}, "f:type": {}}},
                "f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {"f:status": {}}}}}});
        if let Some(s) = sub {
            m["subresource"] = json!(s);
        }
        m
    };
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": format!("0c2b6f0e-6a47-4f0e-9f59-{i:012}"),
            "resourceVersion": format!("{}", 100_000 + i), "creationTimestamp": "2026-12-01T18:00:00Z",
            "labels": labels,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": [managed("testcluster", "Update", None),
                              managed("kwok", "Update", Some("status")),
                              managed("kiln", "Update", None)],
        },
        "spec": {},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [condition("Ready", "True"), condition("MemoryPressure", "False"),
                           condition("DiskPressure", "False"), condition("PIDPressure", "False"),
                           condition("NetworkUnavailable", "False")],
            "addresses": [{"type": "InternalIP", "address": format!("10.0.{}.{}", i / 250, i % 250)}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "",
                "kernelVersion": "6.8.0-51-generic", "osImage": "Ubuntu 22.04.5 LTS",
                "containerRuntimeVersion": "containerd://2.1.4", "kubeletVersion": "v1.36.0",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "phase": "Running",
        }
    })
}

/// The captured pods (one of each kind of a GPU node's pods the operator keeps).
const POD_TEMPLATES: [(&str, &str); 2] = [
    (
        "driver",
        include_str!("data/nvidia-driver-daemonset-pod.json"),
    ),
    (
        "validator",
        include_str!("data/nvidia-operator-validator-pod.json"),
    ),
];

/// `template` as the pod of node `i`: its own name, uid, resourceVersion, node and IP.
fn pod_json(template: &Value, i: usize) -> Value {
    let mut p = template.clone();
    let base = p["metadata"]["generateName"]
        .as_str()
        .unwrap_or("pod-")
        .to_string();
    p["metadata"]["name"] = json!(format!("{base}{i:05}"));
    p["metadata"]["uid"] = json!(format!("5d0c7e51-2f4b-4c1e-8a39-{i:012}"));
    p["metadata"]["resourceVersion"] = json!(format!("{}", 200_000 + i));
    p["spec"]["nodeName"] = json!(format!("kiln-gpu-{i:05}"));
    let ip = format!("10.1.{}.{}", i / 250, i % 250);
    p["status"]["podIP"] = json!(ip);
    p["status"]["podIPs"] = json!([{"ip": ip}]);
    p
}

/// Fills a pod store with the `template` pod of each of `n` nodes, decoded and kept as the
/// operator's pod watches do; returns the heap it holds afterwards.
fn pod_store(template: &Value, n: usize) -> (usize, usize, PodStore) {
    let wire: Vec<Vec<u8>> = (0..n)
        .map(|i| serde_json::to_vec(&pod_json(template, i)).unwrap())
        .collect();
    let wire_bytes = wire.iter().map(Vec::len).sum::<usize>();
    let mut writer = PodStoreWriter::default();
    let reader = writer.as_reader();
    let base = HELD.load(Ordering::Relaxed);
    writer.apply(&watcher::Event::Init);
    for bytes in &wire {
        let pod: WirePod = serde_json::from_slice(bytes).unwrap();
        writer.apply(&watcher::Event::InitApply(Arc::new(pod.object)));
    }
    writer.apply(&watcher::Event::InitDone);
    let held = HELD.load(Ordering::Relaxed) - base;
    drop(wire);
    (held, wire_bytes, reader)
}

fn mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn main() {
    let n: usize = std::env::var("KILN_BENCH_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    // The API server's bytes of each node (what a watch event carries).
    let pages: Vec<Vec<Vec<u8>>> = (0..n)
        .collect::<Vec<_>>()
        .chunks(500)
        .map(|c| {
            c.iter()
                .map(|&i| serde_json::to_vec(&node_json(i)).unwrap())
                .collect()
        })
        .collect();
    let wire: usize = pages.iter().flatten().map(Vec::len).sum();
    let mut writer = NamedWriter::<SlimNode>::default();
    let reader = writer.as_reader();
    let base = HELD.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    writer.apply(&watcher::Event::Init);
    for page in &pages {
        // A page is decoded whole before its objects are handed on (kube's list).
        let decoded: Vec<WatchedNode> = page
            .iter()
            .map(|b| serde_json::from_slice(b).unwrap())
            .collect();
        for node in decoded {
            writer.apply(&watcher::Event::InitApply(Arc::new(node.object)));
        }
    }
    writer.apply(&watcher::Event::InitDone);
    let held = HELD.load(Ordering::Relaxed) - base;
    let peak = PEAK.load(Ordering::Relaxed) - base;
    let sample = reader.state().first().cloned().unwrap();
    println!(
        "node store of {n} nodes ({:.0} bytes a node on the wire): held {:.1} MiB = {:.0} bytes a node; \
         peak while filling {:.1} MiB; a kept node has {} labels",
        wire as f64 / n as f64,
        mib(held),
        held as f64 / n as f64,
        mib(peak),
        sample.labels().len(),
    );
    assert_eq!(reader.state().len(), n);
    let mut pods_held = 0;
    for (what, text) in POD_TEMPLATES {
        let template: Value = serde_json::from_str(text).unwrap();
        let (held, wire, store) = pod_store(&template, n);
        pods_held += held;
        println!(
            "{what} pod store of {n} pods ({:.0} bytes a pod on the wire): held {:.1} MiB = {:.0} bytes a pod",
            wire as f64 / n as f64,
            mib(held),
            held as f64 / n as f64,
        );
        assert_eq!(store.state().len(), n);
        drop(store);
    }
    println!(
        "per GPU node (its node and its two pods): {:.0} bytes; {:.1} MiB for {n}",
        (held + pods_held) as f64 / n as f64,
        mib(held + pods_held)
    );
    timeline(&reader, n);
}

/// The readiness timeline's state for `n` GPU nodes and their validator pods, fed as the
/// operator's timeline task is fed (each node's facts, then each validator pod's).
fn timeline(nodes: &kiln_operator::store::NamedStore<SlimNode>, n: usize) {
    let template: Value = serde_json::from_str(POD_TEMPLATES[1].1).unwrap();
    let (_, _, pods) = pod_store(&template, n);
    let now = k8s_openapi::jiff::Timestamp::now();
    let base = HELD.load(Ordering::Relaxed);
    let mut tracker = Tracker::default();
    for source in [Source::Nodes, Source::Pods] {
        tracker.begin_list(source);
    }
    for node in nodes.state() {
        tracker.node(node_facts(&node), now);
    }
    tracker.end_list(Source::Nodes, now);
    for pod in pods.state() {
        let node = pod.node_name().unwrap_or_default();
        tracker.pod_on(pod.name(), node, || validator_facts(&pod, now), now);
    }
    tracker.end_list(Source::Pods, now);
    let held = HELD.load(Ordering::Relaxed) - base;
    println!(
        "readiness timeline of {n} GPU nodes and their validator pods: held {:.1} MiB = {:.0} bytes a node",
        mib(held),
        held as f64 / n as f64,
    );
    assert!(tracker.is_live());
}
