//! The API side (`kube` feature): the node's ResourceSlice and the ResourceClaim cache.
//!
//! [`Publisher`] keeps one slice per node (`<node>-gpu.nvidia.com`, pool `<node>`, one slice in
//! the pool, owned by the Node so it goes with it) and writes it only when the device list
//! changed: at start it reads the slice once and leaves it alone when it already lists the same
//! devices; afterwards it compares with what it last wrote, so a node at rest costs no request
//! and a change costs one write. Writes are `create` and `update` (with the last
//! resourceVersion), the verbs NVIDIA's kubelet-plugin ClusterRole grants on ResourceSlices (it
//! grants no `patch`); a conflict makes the next attempt read the slice again. The pool
//! generation goes up by one with every change, as the API requires for the scheduler to drop
//! the old devices.
//!
//! [`ClaimCache`] is a reflector over ResourceClaims: prepare reads from it and waits (bounded)
//! for the allocation the scheduler wrote to arrive, instead of a GET per call.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::StreamExt as _;
use k8s_openapi::{
    api::{
        core::v1::Node,
        resource::v1::{Device, ResourceClaim, ResourceSlice},
    },
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client,
    api::PostParams,
    runtime::{
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};

use crate::{server::ClaimSource, slices};

/// Publishes the node's slice (see the module docs).
#[derive(Debug)]
pub struct Publisher {
    api: Api<ResourceSlice>,
    node: String,
    owner: Option<OwnerReference>,
    /// Whether the slice was read since the start or the last conflict.
    read: bool,
    /// The slice's generation, resourceVersion and the devices it lists, when it exists.
    current: Option<(i64, Option<String>, Vec<Device>)>,
    requests: Arc<AtomicU64>,
}

impl Publisher {
    /// A publisher for `node`; reads the Node once for the owner reference (without it the
    /// slice is published unowned).
    pub async fn new(client: Client, node: &str) -> Self {
        let requests = Arc::new(AtomicU64::new(1));
        let owner = match Api::<Node>::all(client.clone()).get(node).await {
            Ok(n) => n.metadata.uid.map(|uid| OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.into(),
                uid,
                controller: Some(true),
                block_owner_deletion: None,
            }),
            Err(e) => {
                tracing::warn!(node, "reading the Node for the slice's owner: {e}");
                None
            }
        };
        Self {
            api: Api::all(client),
            node: node.into(),
            owner,
            read: false,
            current: None,
            requests,
        }
    }

    /// API requests made so far (the benchmark's figure).
    #[must_use]
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Makes the slice list `devices`. Returns true when it wrote.
    ///
    /// # Errors
    /// The API error of the read or the write.
    pub async fn publish(&mut self, devices: Vec<Device>) -> Result<bool, kube::Error> {
        let name = slices::slice_name(&self.node);
        if !self.read {
            self.requests.fetch_add(1, Ordering::Relaxed);
            self.current = self.api.get_opt(&name).await?.map(|s| {
                (
                    s.spec.pool.generation,
                    s.metadata.resource_version,
                    s.spec.devices.unwrap_or_default(),
                )
            });
            self.read = true;
        }
        let (generation, resource_version) = match &self.current {
            Some((_, _, d)) if *d == devices => return Ok(false),
            Some((g, rv, _)) => (g + 1, rv.clone()),
            None => (1, None),
        };
        let mut slice = slices::slice(&self.node, devices.clone(), generation);
        slice.metadata.owner_references = self.owner.clone().map(|o| vec![o]);
        self.requests.fetch_add(1, Ordering::Relaxed);
        let written = match resource_version {
            None => self.api.create(&PostParams::default(), &slice).await,
            Some(rv) => {
                slice.metadata.resource_version = Some(rv);
                self.api
                    .replace(&name, &PostParams::default(), &slice)
                    .await
            }
        };
        let written = match written {
            Ok(s) => s,
            Err(e) => {
                // A conflict or a slice created or deleted behind our back: read it again.
                self.read = false;
                return Err(e);
            }
        };
        tracing::info!(
            node = %self.node,
            generation,
            devices = devices.len(),
            "ResourceSlice published"
        );
        self.current = Some((generation, written.metadata.resource_version, devices));
        Ok(true)
    }
}

/// The ResourceClaim watch cache prepare reads from.
#[derive(Clone)]
pub struct ClaimCache {
    store: Store<ResourceClaim>,
    wait: Duration,
}

impl std::fmt::Debug for ClaimCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimCache")
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl ClaimCache {
    /// Starts the reflector over every namespace's claims on the current runtime; a claim not
    /// yet in the cache (or not yet allocated) is waited for up to `wait`.
    #[must_use]
    pub fn start(client: Client, wait: Duration) -> Self {
        let (store, writer) = reflector::store();
        let stream = reflector::reflector(
            writer,
            watcher(
                Api::<ResourceClaim>::all(client),
                watcher::Config::default(),
            ),
        );
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                if let Err(e) = ev {
                    tracing::warn!("ResourceClaim watch: {e}");
                }
            }
        });
        Self { store, wait }
    }
}

#[tonic::async_trait]
impl ClaimSource for ClaimCache {
    async fn claim(&self, namespace: &str, name: &str, uid: &str) -> Result<ResourceClaim, String> {
        let key = ObjectRef::new(name).within(namespace);
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            let found = self.store.get(&key);
            let state = match found.as_deref() {
                None => "not in the cache",
                Some(c) if c.metadata.uid.as_deref() != Some(uid) => {
                    "in the cache with another UID"
                }
                Some(c)
                    if c.status
                        .as_ref()
                        .and_then(|s| s.allocation.as_ref())
                        .is_none() =>
                {
                    "not allocated"
                }
                Some(c) => return Ok(c.clone()),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "claim {namespace}/{name} (uid {uid}) is {state} after {:?}",
                    self.wait
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
