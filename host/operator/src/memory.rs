//! Keeping the operator small between reconciles.
//!
//! A reconcile that renders loads the plugins of the enabled states (their precompiled code is
//! mapped into the process, about 30 MiB for the default states) and allocates while it lists
//! nodes, renders and applies. Between reconciles none of that is needed, so:
//! - [`RenderCache`] keeps each state's last successful render with the exact inputs it came
//!   from (policy spec, transform context, plugin chain); a reconcile whose inputs are unchanged
//!   (a node label change, a DaemonSet status change) reuses it and calls no plugin;
//! - [`release_idle_memory`] drops the loaded plugins once a full reconcile, or an NVIDIADriver
//!   render, is done (they reload from the precompiled disk cache, about 2 ms each, when inputs
//!   change);
//! - kiln's binaries allocate with jemalloc ([`global_allocator!`](crate::global_allocator)),
//!   which returns freed pages to the OS within a second ([`JEMALLOC_CONF`]);
//! - per-node maps that empty out after a rollout (nodes being upgraded or still reaching
//!   readiness) give their buckets back ([`shrink_if_sparse`]).

use std::collections::HashMap;
use std::sync::Mutex;

use kiln_core::State;
use kiln_core::context::TransformContext;
use kiln_render::{Policy, RenderedState, Renderer};

/// Shrinks `map` to fit when under a quarter of its capacity is in use (and it has room for
/// more than 64 entries): amortized O(1) a removal. A `HashMap` keeps its buckets when entries
/// go, so a map that held every node once during a 5,000-node rollout would otherwise keep
/// 8,192 buckets for good (1.5 MiB for the readiness timeline's pending nodes).
pub fn shrink_if_sparse<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() < map.capacity() / 4 {
        map.shrink_to_fit();
    }
}

/// The last successful render of each `K` (a state; for the NVIDIADriver controller, a CR by
/// name) and the inputs it was rendered from, as one string compared whole: a cached render
/// is only reused for identical inputs.
pub struct RenderCache<K = State, V = RenderedState>(Mutex<HashMap<K, (String, V)>>);

impl<K, V> Default for RenderCache<K, V> {
    fn default() -> Self {
        RenderCache(Mutex::default())
    }
}

impl RenderCache {
    /// Everything a state's render depends on, as one string: the policy spec (JSON), the
    /// transform context (which holds the cluster facts) and the state's plugin chain (names and
    /// pins). Compared whole, so a cached render can only be reused for identical inputs.
    pub fn inputs(state: State, policy: &Policy, ctx: &TransformContext) -> String {
        format!(
            "{state}\n{}\n{ctx:?}\n{:?}",
            policy.spec_text,
            policy.plugins.chain(state)
        )
    }
}

impl<K: Eq + std::hash::Hash, V: Clone> RenderCache<K, V> {
    /// The cached render of `key` when it was made from exactly `inputs`.
    pub fn get(&self, key: &K, inputs: &str) -> Option<V> {
        let entries = self.0.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(key)
            .filter(|(cached, _)| cached == inputs)
            .map(|(_, rendered)| rendered.clone())
    }

    /// The last render of `key`, whatever its inputs (the caller knows they are unchanged).
    pub fn last(&self, key: &K) -> Option<V> {
        let entries = self.0.lock().unwrap_or_else(|e| e.into_inner());
        entries.get(key).map(|(_, rendered)| rendered.clone())
    }

    /// Remember `rendered` as the render of `key` from `inputs` (replacing the previous one).
    pub fn put(&self, key: K, inputs: String, rendered: V) {
        let mut entries = self.0.lock().unwrap_or_else(|e| e.into_inner());
        entries.insert(key, (inputs, rendered));
    }

    /// Forget `key` (a state disabled or failed; a CR deleted or failed).
    pub fn forget(&self, key: &K) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

/// Bytes of each plugin memory slot the operator keeps mapped between calls: none. The
/// operator renders rarely and idles between reconciles, so it returns every slot's pages to
/// the OS after each call (`HostConfig::keep_resident_bytes`; the default, for hosts that
/// render repeatedly, keeps up to 2 MiB per slot — about 1 MiB of each of the 11 slots a
/// sample render uses — which would cost the operator its RSS target).
pub const PLUGIN_KEEP_RESIDENT_BYTES: usize = 0;

/// Drops the renderer's loaded plugins (see
/// [`kiln_plugin_host::PluginHost::release_loaded`]); the heap memory they held goes back to
/// the OS with jemalloc's decay ([`JEMALLOC_CONF`]). Returns how many plugins were dropped.
pub fn release_idle_memory(renderer: &Renderer) -> usize {
    renderer.host().release_loaded()
}

/// kiln's global allocator, jemalloc (`tikv-jemallocator`); each kiln binary declares it with
/// [`crate::global_allocator!`], which also hands it [`JEMALLOC_CONF`].
pub use tikv_jemallocator::Jemalloc;

/// jemalloc's settings in kiln's binaries (its `malloc_conf`; `_RJEM_MALLOC_CONF` in the
/// environment is read after it and wins), NUL-terminated for C:
/// - `narenas:1`, `tcache:false`: one arena and no per-thread caches, so freed memory is
///   reused by whatever thread allocates next (the operator's work is event-driven, not
///   allocation-bound);
/// - `dirty_decay_ms:1000`, `muzzy_decay_ms:0`, `background_thread:true`: pages freed for a
///   second go back to the OS, by jemalloc's own thread, with no trim call from kiln.
///
/// Why not glibc's malloc: it serves small blocks of every size from one heap, so the long-lived
/// per-node records of a large cluster end up spread between the blocks of watch pages,
/// renders and Events already freed, and pages that hold one live record cannot go back.
/// jemalloc keeps each size class in its own runs of pages (the two compared at 5,000 GPU
/// nodes: `deploy/operator/README.md`, Benchmark).
pub const JEMALLOC_CONF: &[u8] =
    b"narenas:1,tcache:false,dirty_decay_ms:1000,muzzy_decay_ms:0,background_thread:true\0";
const _: () = assert!(
    JEMALLOC_CONF[JEMALLOC_CONF.len() - 1] == 0,
    "C reads up to a NUL"
);

/// Declares kiln's global allocator ([`Jemalloc`]) and its settings ([`JEMALLOC_CONF`], as the
/// `_rjem_malloc_conf` symbol jemalloc reads at start) in a binary: `kiln_operator::global_allocator!();`
/// at the binary's root, once.
#[macro_export]
macro_rules! global_allocator {
    () => {
        #[global_allocator]
        static KILN_ALLOCATOR: $crate::memory::Jemalloc = $crate::memory::Jemalloc;

        /// jemalloc's settings ([`kiln_operator::memory::JEMALLOC_CONF`]), read by jemalloc at
        /// start as a `const char *`: `Option<&u8>` is one pointer (to the NUL-terminated
        /// text's first byte), `None` a null one.
        #[allow(non_upper_case_globals, unsafe_code)]
        #[unsafe(export_name = "_rjem_malloc_conf")]
        pub static malloc_conf: Option<&'static u8> = Some(&$crate::memory::JEMALLOC_CONF[0]);
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(spec: serde_json::Value) -> Policy {
        Policy::from_object(&json!({
            "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "p"}, "spec": spec
        }))
        .unwrap()
    }

    fn rendered(state: State, marker: &str) -> RenderedState {
        RenderedState {
            state,
            objects: vec![json!({"kind": "ConfigMap", "metadata": {"name": marker}})],
        }
    }

    #[test]
    fn a_render_is_reused_only_for_identical_inputs() {
        let cache = RenderCache::default();
        let ctx = kiln_render::defaults::render_context();
        let p = policy(json!({"dcgmExporter": {"enabled": true}}));
        let inputs = RenderCache::inputs(State::DcgmExporter, &p, &ctx);
        assert_eq!(cache.get(&State::DcgmExporter, &inputs), None);
        cache.put(
            State::DcgmExporter,
            inputs.clone(),
            rendered(State::DcgmExporter, "a"),
        );
        assert_eq!(
            cache.get(&State::DcgmExporter, &inputs),
            Some(rendered(State::DcgmExporter, "a"))
        );

        // Another state, another spec, another fact: all miss.
        let other_state = RenderCache::inputs(State::Dcgm, &p, &ctx);
        assert_eq!(cache.get(&State::Dcgm, &other_state), None);
        let p2 = policy(json!({"dcgmExporter": {"enabled": true, "version": "x"}}));
        let other_spec = RenderCache::inputs(State::DcgmExporter, &p2, &ctx);
        assert_eq!(cache.get(&State::DcgmExporter, &other_spec), None);
        let mut ctx2 = ctx.clone();
        ctx2.kernel_version = Some("6.8.0-kiln".into());
        let other_fact = RenderCache::inputs(State::DcgmExporter, &p, &ctx2);
        assert_ne!(other_fact, inputs);
        assert_eq!(cache.get(&State::DcgmExporter, &other_fact), None);

        cache.forget(&State::DcgmExporter);
        assert_eq!(cache.get(&State::DcgmExporter, &inputs), None);
    }
}
