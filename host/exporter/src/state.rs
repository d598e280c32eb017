//! State shared between the poller, the pod-resources refresher and scrapes.
//!
//! Writers swap whole `Arc`s under a short lock; a scrape clones two `Arc`s and renders, or
//! reuses the body it rendered for the same (sample, pods) generations. A render reuses the
//! attribution made for the same pods generation and GPU devices (a new sample alone, every
//! poll, does not change who uses which GPU). Nothing here waits on NVML or the kubelet.

use std::{
    sync::{
        Arc, Mutex, PoisonError, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Instant, UNIX_EPOCH},
};

use crate::{
    attribution::{Allocation, Attribution, PodMetas, attribute},
    catalogue::Catalogue,
    exposition::{Format, Kind, encode, family, finish, sample},
    fields::Value,
    render::{RenderOptions, render_gpus},
    snapshot::Snapshot,
};

/// The latest pod-resources answer.
#[derive(Debug, Clone, Default)]
pub struct PodState {
    /// Bumped whenever `allocations` or `meta` changes.
    pub generation: u64,
    /// GPU-relevant allocations; `None` when there is no usable answer (socket missing, or the
    /// last good answer is older than the staleness bound).
    pub allocations: Option<Vec<Allocation>>,
    /// When the last successful `List` returned.
    pub last_success: Option<Instant>,
    /// Pod UIDs and labels from the API server (empty unless enabled; [`crate::podmeta`]).
    pub meta: Arc<PodMetas>,
}

/// Counters about the exporter itself, rendered as `kiln_exporter_*` on every scrape.
#[derive(Debug, Default)]
pub struct SelfMetrics {
    /// Failed pod-resources `List` calls.
    pub pod_resources_errors: AtomicU64,
    /// Pod-resources `List` calls made.
    pub pod_resources_lists: AtomicU64,
    /// Polls in which NVML failed (whole poll or one GPU).
    pub collect_errors: AtomicU64,
}

/// A rendered GPU section: (format, snapshot generation, pod generation, body).
type CachedBody = (Format, u64, u64, Arc<String>);

/// The attribution made for a pods generation over these GPU devices.
type CachedAttribution = (u64, Vec<kiln_gpu::GpuDevice>, Arc<Attribution>);

/// The shared state; see the module docs.
#[derive(Debug)]
pub struct Shared {
    catalogue: Catalogue,
    options: RenderOptions,
    extra_resources: Vec<String>,
    snapshot: RwLock<Arc<Snapshot>>,
    pods: RwLock<Arc<PodState>>,
    cache: Mutex<Vec<CachedBody>>,
    attribution: Mutex<Option<CachedAttribution>>,
    /// Self-metrics counters.
    pub metrics: SelfMetrics,
}

impl Shared {
    /// New state with no sample and no pods yet.
    #[must_use]
    pub fn new(catalogue: Catalogue, options: RenderOptions, extra_resources: Vec<String>) -> Self {
        Self {
            catalogue,
            options,
            extra_resources,
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            pods: RwLock::new(Arc::new(PodState::default())),
            cache: Mutex::new(Vec::new()),
            attribution: Mutex::new(None),
            metrics: SelfMetrics::default(),
        }
    }

    /// The catalogue in use.
    #[must_use]
    pub fn catalogue(&self) -> &Catalogue {
        &self.catalogue
    }

    /// The latest snapshot.
    #[must_use]
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Publishes a new snapshot (its `generation` must be larger than the previous one).
    pub fn set_snapshot(&self, snap: Snapshot) {
        *self
            .snapshot
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(snap);
    }

    /// The latest pod state.
    #[must_use]
    pub fn pods(&self) -> Arc<PodState> {
        self.pods
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records a successful `List`; the generation moves only if the allocations changed, so
    /// identical answers keep the cached body.
    pub fn set_allocations(&self, mut allocations: Vec<Allocation>) {
        allocations.sort_by(|a, b| {
            (&a.namespace, &a.pod, &a.container).cmp(&(&b.namespace, &b.pod, &b.container))
        });
        let mut guard = self.pods.write().unwrap_or_else(PoisonError::into_inner);
        let changed = guard.allocations.as_ref() != Some(&allocations);
        let generation = guard.generation + u64::from(changed);
        *guard = Arc::new(PodState {
            generation,
            allocations: Some(allocations),
            last_success: Some(Instant::now()),
            meta: guard.meta.clone(),
        });
    }

    /// Records the pods' UIDs and labels; the generation moves only if they changed.
    pub fn set_pod_meta(&self, meta: PodMetas) {
        let mut guard = self.pods.write().unwrap_or_else(PoisonError::into_inner);
        if *guard.meta == meta {
            return;
        }
        *guard = Arc::new(PodState {
            generation: guard.generation + 1,
            allocations: guard.allocations.clone(),
            last_success: guard.last_success,
            meta: Arc::new(meta),
        });
    }

    /// Drops the pod mapping (no pod labels until the next successful `List`).
    pub fn clear_allocations(&self) {
        let mut guard = self.pods.write().unwrap_or_else(PoisonError::into_inner);
        if guard.allocations.is_some() {
            *guard = Arc::new(PodState {
                generation: guard.generation + 1,
                allocations: None,
                last_success: guard.last_success,
                meta: guard.meta.clone(),
            });
        }
    }

    /// The full scrape body in `format`: GPU families (cached per sample and pod generation),
    /// then the `kiln_exporter_*` self-metrics, then `# EOF` for OpenMetrics.
    #[must_use]
    pub fn render(&self, format: Format) -> String {
        let snap = self.snapshot();
        let pods = self.pods();
        let gpus = self
            .cached(format, snap.generation, pods.generation)
            .unwrap_or_else(|| {
                let attribution = self.attribution(&snap, &pods);
                let families = render_gpus(&self.catalogue, &snap, &attribution, &self.options);
                // Sized from the body it replaces: a virtual-GPU body (300 KB and more) is
                // not grown, and copied, four times over.
                let mut body = String::with_capacity(self.last_len(format).max(64 * 1024));
                if let Err(e) = encode(&mut body, format, families) {
                    tracing::warn!(error = %e, "encoding the GPU families");
                }
                let body = Arc::new(body);
                self.store(format, snap.generation, pods.generation, body.clone());
                body
            });
        let mut out = String::with_capacity(gpus.len() + 1024);
        out.push_str(&gpus);
        self.render_self(&mut out, format, &snap);
        finish(&mut out, format);
        out
    }

    /// Who uses which GPU for `pods` over `snap`'s devices: the one made last, while the pods
    /// generation and the devices are the same, else made now and kept.
    fn attribution(&self, snap: &Snapshot, pods: &PodState) -> Arc<Attribution> {
        let mut kept = self
            .attribution
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((generation, devices, a)) = kept.as_ref()
            && *generation == pods.generation
            && devices.iter().eq(snap.gpus.iter().map(|g| &g.device))
        {
            return a.clone();
        }
        let devices: Vec<_> = snap.gpus.iter().map(|g| g.device.clone()).collect();
        let a = Arc::new(
            attribute(
                pods.allocations.as_deref().unwrap_or(&[]),
                &devices,
                &self.extra_resources,
            )
            .with_meta(pods.meta.clone()),
        );
        *kept = Some((pods.generation, devices, a.clone()));
        a
    }

    /// The length of the body last rendered in `format` (0 before any), with an eighth more.
    fn last_len(&self, format: Format) -> usize {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache
            .iter()
            .find(|(f, ..)| *f == format)
            .map_or(0, |c| c.3.len() + c.3.len() / 8)
    }

    fn cached(&self, format: Format, snap_gen: u64, pod_gen: u64) -> Option<Arc<String>> {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache
            .iter()
            .find(|(f, s, p, _)| *f == format && *s == snap_gen && *p == pod_gen)
            .map(|c| c.3.clone())
    }

    fn store(&self, format: Format, snap_gen: u64, pod_gen: u64, body: Arc<String>) {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.retain(|(f, ..)| *f != format);
        cache.push((format, snap_gen, pod_gen, body));
    }

    fn render_self(&self, out: &mut String, format: Format, snap: &Snapshot) {
        let m = &self.metrics;
        let mut families = Vec::with_capacity(4);
        let counters = [
            (
                "kiln_exporter_pod_resources_errors_total",
                "Failed kubelet pod-resources List calls.",
                &m.pod_resources_errors,
            ),
            (
                "kiln_exporter_pod_resources_lists_total",
                "Kubelet pod-resources List calls made.",
                &m.pod_resources_lists,
            ),
            (
                "kiln_exporter_collect_errors_total",
                "NVML reads that failed (whole poll or one GPU).",
                &m.collect_errors,
            ),
        ];
        for (name, help, v) in counters {
            let value = Value::Int(v.load(Ordering::Relaxed));
            let samples = vec![sample(Kind::Counter, Vec::new(), value)];
            families.extend(family(name, help, Kind::Counter, samples));
        }
        if let Some(t) = snap.taken_at {
            let secs = t
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let samples = vec![sample(Kind::Gauge, Vec::new(), Value::Float(secs))];
            families.extend(family(
                "kiln_exporter_last_collect_timestamp_seconds",
                "Unix time the GPUs were last read.",
                Kind::Gauge,
                samples,
            ));
        }
        if let Err(e) = encode(out, format, families) {
            tracing::warn!(error = %e, "encoding the exporter's own families");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::GpuSnapshot;
    use kiln_gpu::{GpuDevice, MigDevice};

    fn gpu(uuid: &str, migs: &[&str]) -> GpuDevice {
        GpuDevice {
            index: 0,
            uuid: uuid.into(),
            mig_devices: migs
                .iter()
                .map(|m| MigDevice {
                    uuid: (*m).into(),
                    ..MigDevice::default()
                })
                .collect(),
            ..GpuDevice::default()
        }
    }

    fn snapshot(generation: u64, device: GpuDevice) -> Snapshot {
        Snapshot {
            generation,
            gpus: vec![GpuSnapshot::new(device)],
            ..Snapshot::default()
        }
    }

    fn alloc(pod: &str, id: &str) -> Allocation {
        Allocation {
            namespace: "ns".into(),
            pod: pod.into(),
            container: "main".into(),
            resource_name: "nvidia.com/gpu".into(),
            device_ids: vec![id.into()],
        }
    }

    /// A new sample keeps the attribution; new pods or new devices (MIG turned on) make it
    /// again, and it then follows them.
    #[test]
    fn the_attribution_is_made_again_only_for_new_pods_or_devices() {
        let shared = Shared::new(
            Catalogue::default_list(),
            RenderOptions::default(),
            Vec::new(),
        );
        shared.set_allocations(vec![alloc("a", "MIG-m1")]);
        let first = shared.attribution(&snapshot(1, gpu("GPU-0", &[])), &shared.pods());
        assert!(
            first.mig_pods("MIG-m1").is_empty(),
            "no such MIG device yet"
        );
        let again = shared.attribution(&snapshot(2, gpu("GPU-0", &[])), &shared.pods());
        assert!(Arc::ptr_eq(&first, &again), "a new sample alone reuses it");
        let mig = shared.attribution(&snapshot(3, gpu("GPU-0", &["MIG-m1"])), &shared.pods());
        assert!(!Arc::ptr_eq(&first, &mig));
        assert_eq!(mig.mig_pods("MIG-m1")[0].pod, "a");
        shared.set_allocations(vec![alloc("b", "MIG-m1")]);
        let pods = shared.attribution(&snapshot(4, gpu("GPU-0", &["MIG-m1"])), &shared.pods());
        assert_eq!(pods.mig_pods("MIG-m1")[0].pod, "b");
    }
}
