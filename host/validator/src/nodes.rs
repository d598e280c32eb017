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
/// `nodes` (the validator's ClusterRole has it).
pub struct KubeNodes {
    client: kube::Client,
    rt: tokio::runtime::Runtime,
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
        Ok(Self { client, rt })
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
