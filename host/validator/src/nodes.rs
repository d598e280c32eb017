//! The Kubernetes side of the plugin step behind a small trait, so the step tests without a
//! cluster: [`NodeSource`] answers "what does this node advertise", [`KubeNodes`] asks the API
//! server.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

/// Reads a node's allocatable resources.
pub trait NodeSource {
    /// `status.allocatable` of `node` as resource name → quantity string (`"8"`).
    ///
    /// # Errors
    /// A message with the client error's causes; the plugin step retries on it.
    fn allocatable(&self, node: &str) -> Result<BTreeMap<String, String>, String>;

    /// `metadata.labels` of `node`.
    ///
    /// # Errors
    /// As [`NodeSource::allocatable`].
    fn labels(&self, node: &str) -> Result<BTreeMap<String, String>, String>;

    /// Runs the plugin step's workload pod ([`crate::workload`]) for `spec`, requesting one
    /// `resource`, until it succeeds. The default (no API server) refuses.
    ///
    /// # Errors
    /// Why the pod did not succeed (its failing container and reason, or that it did not finish
    /// in time), or the client error.
    fn run_workload(
        &self,
        spec: &crate::workload::WorkloadSpec,
        resource: &str,
    ) -> Result<(), String> {
        let _ = (spec, resource);
        Err("no API server to run a workload pod on".into())
    }
}

/// A fixed answer, for tests and dry runs: the same map serves as allocatable and labels.
impl NodeSource for BTreeMap<String, String> {
    fn allocatable(&self, _node: &str) -> Result<BTreeMap<String, String>, String> {
        Ok(self.clone())
    }

    fn labels(&self, _node: &str) -> Result<BTreeMap<String, String>, String> {
        Ok(self.clone())
    }
}

/// [`NodeSource`] over the API server (in-cluster config or `KUBECONFIG`); needs `get` on
/// `nodes` (the validator's ClusterRole has it), and for the workload pod `get` on
/// DaemonSets and `list`, `create`, `get`, `delete` on pods in the operator's namespace (its
/// Role has them).
pub struct KubeNodes {
    client: kube::Client,
    rt: tokio::runtime::Runtime,
    /// How often the workload pod is read, and how many times before giving up (upstream:
    /// every 5 s, 60 times).
    workload_poll: (std::time::Duration, usize),
}

impl std::fmt::Debug for KubeNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeNodes").finish_non_exhaustive()
    }
}

impl KubeNodes {
    /// Connects with the default client config (service account in a pod).
    ///
    /// # Errors
    /// The client error when no config is found.
    pub fn connect() -> Result<Self, kube::Error> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| kube::Error::Service(Box::new(e)))?;
        let client = rt.block_on(kube::Client::try_default())?;
        Ok(Self::with_client(client, rt))
    }

    /// Over `client`, driven by `rt` (tests).
    pub fn with_client(client: kube::Client, rt: tokio::runtime::Runtime) -> Self {
        Self {
            client,
            rt,
            workload_poll: (std::time::Duration::from_secs(5), 60),
        }
    }

    /// Reads the workload pod every `every`, at most `times` times (default 5 s, 60).
    #[must_use]
    pub fn workload_poll(mut self, every: std::time::Duration, times: usize) -> Self {
        self.workload_poll = (every, times.max(1));
        self
    }

    async fn workload(
        &self,
        spec: &crate::workload::WorkloadSpec,
        resource: &str,
    ) -> Result<(), String> {
        use crate::workload::{VALIDATOR_DAEMONSET, WORKLOAD_APP, WorkloadOutcome};
        use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::Pod};
        use kube::api::{DeleteParams, ListParams, PostParams};
        let chain = |e: kube::Error| crate::retry::chain(&e);
        let ds = kube::Api::<DaemonSet>::namespaced(self.client.clone(), &spec.namespace)
            .get(VALIDATOR_DAEMONSET)
            .await
            .map_err(|e| format!("reading DaemonSet {VALIDATOR_DAEMONSET}: {}", chain(e)))?;
        let pods = kube::Api::<Pod>::namespaced(self.client.clone(), &spec.namespace);
        // An earlier workload pod on this node goes first (upstream does the same).
        let earlier = ListParams::default()
            .labels(&format!("app={WORKLOAD_APP}"))
            .fields(&format!("spec.nodeName={}", spec.node));
        for p in pods.list(&earlier).await.map_err(chain)? {
            let name = p.metadata.name.unwrap_or_default();
            let gone = DeleteParams::background().grace_period(0);
            match pods.delete(&name, &gone).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    return Err(format!(
                        "deleting the earlier workload pod {name}: {}",
                        chain(e)
                    ));
                }
            }
        }
        let pod = crate::workload::workload_pod(spec, resource, &ds);
        let created = pods
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| format!("creating the workload pod: {}", chain(e)))?;
        let name = created.metadata.name.unwrap_or_default();
        let (every, times) = self.workload_poll;
        let mut last = String::from("Pending");
        for i in 0..times {
            if i > 0 {
                tokio::time::sleep(every).await;
            }
            let p = pods.get(&name).await.map_err(chain)?;
            match crate::workload::workload_outcome(&p) {
                WorkloadOutcome::Succeeded => return Ok(()),
                WorkloadOutcome::Failed(why) => {
                    return Err(format!("{name} (requesting one {resource}): {why}"));
                }
                WorkloadOutcome::Waiting(phase) => last = phase,
            }
        }
        Err(format!(
            "{name} (requesting one {resource}) still {last} after {} reads {} apart",
            times,
            crate::error::human_duration(every)
        ))
    }
}

impl KubeNodes {
    fn get(&self, node: &str) -> Result<Node, String> {
        let api: kube::Api<Node> = kube::Api::all(self.client.clone());
        self.rt
            .block_on(api.get(node))
            .map_err(|e| crate::retry::chain(&e))
    }
}

impl NodeSource for KubeNodes {
    fn run_workload(
        &self,
        spec: &crate::workload::WorkloadSpec,
        resource: &str,
    ) -> Result<(), String> {
        self.rt.block_on(self.workload(spec, resource))
    }

    fn labels(&self, node: &str) -> Result<BTreeMap<String, String>, String> {
        Ok(self.get(node)?.metadata.labels.unwrap_or_default())
    }

    fn allocatable(&self, node: &str) -> Result<BTreeMap<String, String>, String> {
        let n = self.get(node)?;
        Ok(n.status
            .and_then(|s| s.allocatable)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect())
    }
}
