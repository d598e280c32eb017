//! Cluster facts for transforms, read from the nodes (upstream `init()` GPU discovery,
//! `gpu-operator.md` §2.2 step 4): container runtime and GPU node OS.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ConfigMap;
use kiln_core::context::{ConfigMapKeys, ContainerRuntime, NodeOs, TransformContext};
use kiln_core::spec::ClusterPolicySpec;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;

pub use kiln_core::context::{OS_ID_LABEL, OS_VERSION_LABEL};

use crate::cluster::node::SlimNode;

/// The container runtime of the GPU nodes, from `status.nodeInfo.containerRuntimeVersion`
/// prefixes (`docker`, `containerd`, `cri-o`): containerd if any node uses it, else the last
/// one parsed, default containerd.
pub fn container_runtime(gpu_nodes: &[&SlimNode]) -> ContainerRuntime {
    let mut found = None;
    for node in gpu_nodes {
        let v = node.runtime().unwrap_or_default();
        if v.starts_with("containerd") {
            return ContainerRuntime::Containerd;
        } else if v.starts_with("docker") {
            found = Some(ContainerRuntime::Docker);
        } else if v.starts_with("cri-o") {
            found = Some(ContainerRuntime::Crio);
        }
    }
    found.unwrap_or(ContainerRuntime::Containerd)
}

/// The GPU node OS from the first GPU node carrying the NFD os_release labels; `rhel`, `rocky`
/// and `ol` keep only the major version (upstream rule).
pub fn gpu_node_os(gpu_nodes: &[&SlimNode]) -> Option<NodeOs> {
    gpu_nodes
        .iter()
        .find_map(|n| NodeOs::from_labels(n.labels()))
}

/// The transform context for this reconcile: `base` with the runtime, and the GPU node OS when
/// the nodes publish it (else `base`'s).
pub fn transform_context(base: &TransformContext, nodes: &[&SlimNode]) -> TransformContext {
    let gpu: Vec<&SlimNode> = nodes.iter().copied().filter(|n| n.is_gpu()).collect();
    let mut ctx = base.clone();
    ctx.runtime = container_runtime(&gpu);
    if let Some(os) = gpu_node_os(&gpu) {
        ctx.gpu_node_os = Some(os);
    }
    ctx
}

/// The ConfigMaps and Secrets of the operator namespace that transforms look up, by name
/// (sorted, no duplicates, empty names dropped).
///
/// Upstream reads them while rendering: `driver.kernelModuleConfig`, `driver.repoConfig`,
/// `driver.certConfig` and `vgpuManager.kernelModuleConfig` ConfigMaps become one subPath mount
/// per key, and `driver.secretEnv` must name an existing Secret. Plugins do no IO, so the
/// operator reads these once per reconcile and passes names and keys in the transform context.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct References {
    /// ConfigMap names.
    pub config_maps: Vec<String>,
    /// Secret names.
    pub secrets: Vec<String>,
}

/// The objects `spec` refers to (see [`References`]).
pub fn references(spec: &ClusterPolicySpec) -> References {
    let clean = |names: Vec<&String>| {
        let mut v: Vec<String> = names
            .into_iter()
            .filter(|n| !n.is_empty())
            .cloned()
            .collect();
        v.sort();
        v.dedup();
        v
    };
    References {
        config_maps: clean(vec![
            &spec.driver.kernel_module_config.name,
            &spec.driver.repo_config.config_map_name,
            &spec.driver.cert_config.name,
            &spec.vgpu_manager.kernel_module_config.name,
        ]),
        secrets: clean(vec![&spec.driver.secret_env]),
    }
}

/// A ConfigMap as the transform context carries it: its name and sorted `data` keys (upstream
/// mounts `data` keys only).
pub fn config_map_keys(cm: &ConfigMap) -> ConfigMapKeys {
    let mut keys: Vec<String> = cm
        .data
        .as_ref()
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default();
    keys.sort();
    ConfigMapKeys {
        name: cm.metadata.name.clone().unwrap_or_default(),
        keys,
    }
}

/// The operator namespace's ConfigMaps as a metadata-only watch shows them, and the keys of
/// each referenced one as last read with the `resourceVersion` it had: a reconcile reads a
/// referenced ConfigMap again only when the watch shows it changed, and a missing one not at
/// all (an NVIDIADriver with a `repoConfig` is reconciled on every status event of its
/// DaemonSets during a rollout). A change to a ConfigMap some reconcile asked for (created,
/// edited, deleted) calls the watch's `on_change`, so an edited repo list reaches the
/// DaemonSets without waiting for another change. Shared by both reconcilers.
pub struct ConfigMapCache {
    store: Store<PartialObjectMeta<ConfigMap>>,
    /// The names reconciles asked for (their policies' and CRs' references).
    wanted: std::sync::Arc<Mutex<std::collections::HashSet<String>>>,
    /// By name: the `resourceVersion` a read returned and the keys it found.
    read: Mutex<HashMap<String, (Option<String>, ConfigMapKeys)>>,
}

impl ConfigMapCache {
    /// A cache over `store` (the ConfigMaps' metadata in the operator namespace; tests fill one
    /// through a [`kube::runtime::reflector::store::Writer`]).
    pub fn from_store(store: Store<PartialObjectMeta<ConfigMap>>) -> Self {
        ConfigMapCache {
            store,
            wanted: Default::default(),
            read: Mutex::default(),
        }
    }

    /// The ConfigMaps' metadata as the watch holds them (the labelled-object cache's
    /// ConfigMaps: [`crate::cluster::live::LiveCache::with_config_maps`]).
    pub fn store(&self) -> Store<PartialObjectMeta<ConfigMap>> {
        self.store.clone()
    }

    /// Wait until the watch has listed the namespace once.
    pub async fn ready(&self) {
        let _ = self.store.wait_until_ready().await;
    }

    /// Whether a reconcile asked for the ConfigMap `name` (its change must wake them).
    pub fn wanted(&self, name: &str) -> bool {
        self.wanted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
    }

    /// Ask for the ConfigMap `name`: from now on its changes call the watch's `on_change`
    /// (the reconcilers' reference read does this for every name a policy or CR references).
    pub fn want(&self, name: &str) {
        let mut wanted = self.wanted.lock().unwrap_or_else(|e| e.into_inner());
        if !wanted.contains(name) {
            wanted.insert(name.to_string());
        }
    }

    /// Start the metadata watch of `namespace`'s ConfigMaps (a task on the current runtime,
    /// retrying with kube-runtime's default backoff); `on_change` runs when a wanted one
    /// ([`ConfigMapCache::wanted`]) is added, changed or deleted. The same watch serves the
    /// ConfigMaps kiln applied ([`crate::cluster::live::LiveCache::with_config_maps`]): their events
    /// wake `wake` as a watch of the labelled ones would ([`crate::cluster::live::LabelledEvents`]).
    /// The operator's Role already lists and watches ConfigMaps there (the operand Roles grant
    /// it).
    pub fn start(
        client: &kube::Client,
        namespace: &str,
        on_change: impl Fn() + Send + 'static,
        wake: &crate::cluster::live::Wake,
    ) -> Self {
        use futures::StreamExt;
        use kube::runtime::WatchStreamExt;
        let api: kube::Api<PartialObjectMeta<ConfigMap>> =
            kube::Api::namespaced(client.clone(), namespace);
        let writer = reflector::store::Writer::<PartialObjectMeta<ConfigMap>>::default();
        let store = writer.as_reader();
        let stream = watcher::watcher(api, crate::cluster::watch::config()).default_backoff();
        let cache = Self::from_store(store);
        let wanted = cache.wanted.clone();
        let mut labelled = crate::cluster::live::LabelledEvents::new(
            kube::api::ApiResource::erase::<ConfigMap>(&()),
            wake.clone(),
        );
        tokio::spawn(reflector::reflector(writer, stream).for_each(move |ev| {
            if let Ok(ev) = &ev {
                labelled.observe(ev);
            }
            match ev {
                Ok(watcher::Event::Apply(m) | watcher::Event::Delete(m)) => {
                    let name = m.metadata.name.unwrap_or_default();
                    if wanted
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .contains(&name)
                    {
                        tracing::info!(configmap = %name, "a referenced ConfigMap changed");
                        on_change();
                    }
                }
                Err(e) => tracing::warn!(error = %e, "watch of ConfigMap metadata"),
                Ok(_) => {}
            }
            futures::future::ready(())
        }));
        cache
    }

    /// What the cache knows of `name` in `ns` without a request: `Some(None)` when the watch
    /// has listed and it is not there, `Some(Some(keys))` when its keys were read at the
    /// `resourceVersion` the watch shows now, `None` when it must be read (the watch has not
    /// listed yet, or the ConfigMap changed since it was read).
    fn lookup(&self, ns: &str, name: &str) -> Option<Option<ConfigMapKeys>> {
        use futures::FutureExt;
        self.store.wait_until_ready().now_or_never()?.ok()?;
        let Some(meta) = self.store.get(&ObjectRef::new(name).within(ns)) else {
            return Some(None);
        };
        let rv = meta.metadata.resource_version.as_ref()?;
        let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        match read.get(name) {
            Some((Some(at), keys)) if at == rv => Some(Some(keys.clone())),
            _ => None,
        }
    }

    /// Remember `keys` as read from `cm`.
    fn remember(&self, cm: &ConfigMap, keys: &ConfigMapKeys) {
        let name = cm.metadata.name.clone().unwrap_or_default();
        self.read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, (cm.metadata.resource_version.clone(), keys.clone()));
    }
}

/// Reads the ConfigMaps (keys) and Secrets (existence, metadata only) that `spec` names into
/// the transform context. A missing object is simply left out (the plugin that needs it then
/// fails its state naming the field); a failed read is logged and treated as missing, so one
/// unreadable object cannot stop the other states. A ConfigMap is read only when `cache`'s
/// watch shows it new or changed since it was last read ([`ConfigMapCache`]); Secrets are
/// always a metadata GET (the operator may not list or watch Secrets).
/// Used by the ClusterPolicy reconcile and the NVIDIADriver controller alike.
pub(crate) async fn read_references(
    client: &kube::Client,
    ns: &str,
    spec: &ClusterPolicySpec,
    tctx: &mut TransformContext,
    cache: &ConfigMapCache,
) {
    use k8s_openapi::api::core::v1::Secret;
    use kube::Api;
    let refs = references(spec);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    for name in &refs.config_maps {
        cache.want(name);
        match cache.lookup(ns, name) {
            Some(Some(keys)) => {
                tctx.config_maps.push(keys);
                continue;
            }
            Some(None) => {
                tracing::debug!(configmap = %name, %ns, "referenced ConfigMap not found");
                continue;
            }
            _ => {}
        }
        match config_maps.get_opt(name).await {
            Ok(Some(cm)) => {
                let keys = config_map_keys(&cm);
                cache.remember(&cm, &keys);
                tctx.config_maps.push(keys);
            }
            Ok(None) => tracing::debug!(configmap = %name, %ns, "referenced ConfigMap not found"),
            Err(e) => {
                tracing::warn!(configmap = %name, %ns, error = %e, "cannot read a referenced ConfigMap")
            }
        }
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    for name in &refs.secrets {
        match secrets.get_metadata_opt(name).await {
            Ok(Some(_)) => tctx.secrets.push(name.clone()),
            Ok(None) => tracing::debug!(secret = %name, %ns, "referenced Secret not found"),
            Err(e) => {
                tracing::warn!(secret = %name, %ns, error = %e, "cannot read a referenced Secret")
            }
        }
    }
}

/// The node facts a render depends on (the transform context's runtime and GPU node OS) and
/// whether any GPU node exists (DaemonSets are applied only then). A node event that changes
/// them asks for a full reconcile; any other relevant node event only re-judges readiness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// Container runtime of the GPU nodes ([`container_runtime`]).
    pub runtime: ContainerRuntime,
    /// GPU node OS ([`gpu_node_os`]).
    pub os: Option<NodeOs>,
    /// Whether any node carries `nvidia.com/gpu.present=true`.
    pub any_gpu: bool,
}

impl NodeFacts {
    /// The facts of `nodes`.
    pub fn of(nodes: &[&SlimNode]) -> Self {
        let gpu: Vec<&SlimNode> = nodes.iter().copied().filter(|n| n.is_gpu()).collect();
        NodeFacts {
            runtime: container_runtime(&gpu),
            os: gpu_node_os(&gpu),
            any_gpu: !gpu.is_empty(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(labels: serde_json::Value, runtime: &str) -> SlimNode {
        serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": labels},
            "status": {"nodeInfo": {"architecture": "amd64", "bootID": "", "containerRuntimeVersion": runtime,
                "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "", "machineID": "",
                "operatingSystem": "linux", "osImage": "", "systemUUID": ""}}
        }))
        .unwrap()
    }

    #[test]
    fn runtime_and_os_from_gpu_nodes() {
        let a = node(
            json!({"nvidia.com/gpu.present": "true", OS_ID_LABEL: "rhel", OS_VERSION_LABEL: "9.4"}),
            "cri-o://1.30",
        );
        let b = node(
            json!({"nvidia.com/gpu.present": "true"}),
            "containerd://2.0",
        );
        let cpu = node(json!({}), "docker://27");
        assert_eq!(container_runtime(&[&a]), ContainerRuntime::Crio);
        assert_eq!(container_runtime(&[&a, &b]), ContainerRuntime::Containerd);
        let ctx = transform_context(&TransformContext::default(), &[&cpu, &a]);
        assert_eq!(ctx.runtime, ContainerRuntime::Crio);
        assert_eq!(
            ctx.gpu_node_os,
            Some(NodeOs {
                id: "rhel".into(),
                version_id: "9".into()
            })
        );
    }

    #[test]
    fn references_are_the_named_driver_and_vgpu_objects() {
        let spec = kiln_core::spec::ClusterPolicySpec::from_json(&serde_json::json!({
            "driver": {
                "kernelModuleConfig": {"name": "kmod"},
                "repoConfig": {"configMapName": "repos"},
                "certConfig": {"name": "kmod"},
                "secretEnv": "driver-env"
            },
            "vgpuManager": {"kernelModuleConfig": {"name": "vgpu-kmod"}}
        }))
        .unwrap();
        assert_eq!(
            references(&spec),
            References {
                config_maps: vec!["kmod".into(), "repos".into(), "vgpu-kmod".into()],
                secrets: vec!["driver-env".into()],
            }
        );
        assert_eq!(
            references(&kiln_core::spec::ClusterPolicySpec::default()),
            References::default()
        );
    }

    #[test]
    fn config_map_keys_are_the_sorted_data_keys() {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kmod"},
            "data": {"nvidia.conf": "x", "blacklist.conf": "y"},
            "binaryData": {"blob": "AA=="}
        }))
        .unwrap();
        let keys = config_map_keys(&cm);
        assert_eq!(keys.name, "kmod");
        assert_eq!(keys.keys, ["blacklist.conf", "nvidia.conf"]);
    }
}
