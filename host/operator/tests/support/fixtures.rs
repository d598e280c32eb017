//! Fixture builders for the objects the tests feed the operator: nodes, pods and
//! ClusterPolicies as the API server returns them (JSON), each starting from the fewest
//! fields the operator reads and adding what a test names. Put them into the in-memory API
//! with `mock_api::Server::insert`, or create them on a test cluster.

use serde_json::{Map, Value, json};

/// Node Feature Discovery's label on a node with an NVIDIA (PCI vendor 10de) device.
pub const NFD_GPU: &str = "feature.node.kubernetes.io/pci-10de.present";

/// The namespace the operator and its operands run in, in every test.
pub const NS: &str = "gpu-operator";

/// A Node: `node("gpu-node-0").nfd_gpu().node_info().json()`.
#[derive(Debug, Clone)]
pub struct NodeFixture {
    name: String,
    labels: Map<String, Value>,
    resource_version: Option<String>,
    node_info: bool,
    ready: bool,
}

/// A Node named `name` with no labels and no status.
pub fn node(name: &str) -> NodeFixture {
    NodeFixture {
        name: name.into(),
        labels: Map::new(),
        resource_version: None,
        node_info: false,
        ready: false,
    }
}

impl NodeFixture {
    /// Adds the label `key=value`.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Labelled as NFD labels a node with an NVIDIA device ([`NFD_GPU`]`=true`).
    pub fn nfd_gpu(self) -> Self {
        self.label(NFD_GPU, "true")
    }

    /// `metadata.resourceVersion`.
    pub fn resource_version(mut self, rv: &str) -> Self {
        self.resource_version = Some(rv.into());
        self
    }

    /// `status.nodeInfo` of an amd64 Linux node running containerd 2.0.0 on kernel 6.8.0.
    pub fn node_info(mut self) -> Self {
        self.node_info = true;
        self
    }

    /// An empty `spec` and a `Ready=True` condition.
    pub fn ready(mut self) -> Self {
        self.ready = true;
        self
    }

    /// The object.
    pub fn json(self) -> Value {
        let mut metadata = json!({"name": self.name, "labels": self.labels});
        if let Some(rv) = self.resource_version {
            metadata["resourceVersion"] = rv.into();
        }
        let mut node = json!({"apiVersion": "v1", "kind": "Node", "metadata": metadata});
        if self.ready {
            node["spec"] = json!({});
            node["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
        }
        if self.node_info {
            node["status"]["nodeInfo"] = json!({"containerRuntimeVersion": "containerd://2.0.0",
                "architecture": "amd64", "bootID": "", "kernelVersion": "6.8.0",
                "kubeProxyVersion": "", "kubeletVersion": "", "machineID": "",
                "operatingSystem": "linux", "osImage": "", "systemUUID": ""});
        }
        node
    }
}

/// A Pod: `pod(NS, "nvidia-driver-daemonset-a").on("gpu-node-1").owned_by_daemon_set(..)`.
#[derive(Debug, Clone)]
pub struct PodFixture {
    pod: Value,
}

/// A Pod `namespace/name` with no containers, unscheduled and without status.
pub fn pod(namespace: &str, name: &str) -> PodFixture {
    PodFixture {
        pod: json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {}},
            "spec": {"containers": []}}),
    }
}

impl PodFixture {
    /// Bound to node `node` (`spec.nodeName`).
    pub fn on(mut self, node: &str) -> Self {
        self.pod["spec"]["nodeName"] = node.into();
        self
    }

    /// Adds the label `key=value`.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.pod["metadata"]["labels"][key] = value.into();
        self
    }

    /// `metadata.resourceVersion`.
    pub fn resource_version(mut self, rv: &str) -> Self {
        self.pod["metadata"]["resourceVersion"] = rv.into();
        self
    }

    /// Controlled by the DaemonSet `name` (uid `uid`), as its pods are.
    pub fn owned_by_daemon_set(mut self, name: &str, uid: &str) -> Self {
        self.pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
            "kind": "DaemonSet", "name": name, "uid": uid, "controller": true}]);
        self
    }

    /// Adds the container `container` (a JSON `Container`).
    pub fn container(mut self, container: Value) -> Self {
        if let Some(list) = self.pod["spec"]["containers"].as_array_mut() {
            list.push(container);
        }
        self
    }

    /// `status.phase` `phase`, with a `Ready` condition and one ready (or not) status per
    /// container, each with image `image`.
    pub fn phase(mut self, phase: &str, ready: bool, image: &str) -> Self {
        let statuses: Vec<Value> = self.pod["spec"]["containers"]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        json!({"name": c["name"], "ready": ready, "restartCount": 0,
                            "image": image, "imageID": ""})
                    })
                    .collect()
            })
            .unwrap_or_default();
        let status = if ready { "True" } else { "False" };
        self.pod["status"] = json!({"phase": phase,
            "conditions": [{"type": "Ready", "status": status}],
            "containerStatuses": statuses});
        self
    }

    /// The object.
    pub fn json(self) -> Value {
        self.pod
    }
}

/// A ClusterPolicy `name` (uid `uid-<name>`, generation 1) created at `created` (RFC 3339)
/// with `spec`.
pub fn policy(name: &str, created: &str, spec: Value) -> Value {
    json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "generation": 1,
            "creationTimestamp": created},
        "spec": spec})
}

/// The repository's sample ClusterPolicy (`deploy/samples/clusterpolicy.yaml`), whole.
pub fn sample_policy() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/samples/clusterpolicy.yaml"
    );
    let text = std::fs::read_to_string(path).expect("the sample policy is readable");
    serde_yaml_ng::from_str(&text).expect("the sample policy parses")
}

/// The sample policy's `spec`.
pub fn sample_spec() -> Value {
    sample_policy()["spec"].clone()
}
