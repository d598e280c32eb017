//! Keeping the operator small between reconciles.
//!
//! A reconcile that renders loads the plugins of the enabled states (their precompiled code is
//! mapped into the process, about 30 MiB for the default states) and allocates while it lists
//! nodes, renders and applies. Between reconciles none of that is needed, so:
//! - [`RenderCache`] keeps each state's last successful render with the exact inputs it came
//!   from (policy spec, transform context, plugin chain); a reconcile whose inputs are unchanged
//!   (a node label change, a DaemonSet status change) reuses it and calls no plugin;
//! - [`release_idle_memory`] drops the loaded plugins once a full reconcile, or an NVIDIADriver
//!   render, is done (they reload from
//!   the precompiled disk cache, about 2 ms each, when inputs change) and returns freed heap
//!   pages to the OS;
//! - [`tune_malloc`] keeps glibc from holding on to the pages of big transient allocations,
//!   and [`run_trim`] returns what the operator frees at rest once a minute;
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
/// [`kiln_plugin_host::PluginHost::release_loaded`]) and hands freed heap memory back to the
/// OS. Returns how many plugins were dropped.
pub fn release_idle_memory(renderer: &Renderer) -> usize {
    let released = renderer.host().release_loaded();
    trim_heap();
    released
}

/// How often [`run_trim`] hands freed heap pages back to the OS: every 60 s.
pub const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// glibc's `malloc_trim(0)` every [`TRIM_EVERY`], forever (run it as a task). Between reconciles the
/// operator still frees memory: every node event replaces a node in its store (GFD rewrites
/// each GPU node's timestamp once a minute), and [`crate::events::Events`] drops its series
/// cache (at 5,000 GPU nodes, 5,000 Events) six minutes after a rollout. Without a trim
/// those pages stay with the process until the next full reconcile. At 500 GPU nodes at rest a
/// trim returned 1.0–1.5 MiB of 14.5–15.8 MiB of anonymous memory (session 22, a `gdb` call
/// into the steady_state bench's operator); what it cannot return is free memory inside pages
/// still partly in use (5 of the 15 MiB glibc held there). No request; the operator's CPU at
/// rest there was 0.30 s a minute with it, 0.31–0.34 s without.
pub async fn run_trim() {
    let mut tick = tokio::time::interval(TRIM_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        trim_heap();
    }
}

/// glibc keeps freed memory in its arenas (one per thread that allocated) at its peak;
/// `malloc_trim(0)` returns the free pages of every arena to the OS. Other C libraries: no-op.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim_heap() {
    // SAFETY: malloc_trim takes no pointers and only releases memory glibc's allocator holds
    // free; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_heap() {}

/// Most glibc malloc arenas the operator uses ([`tune_malloc`]).
pub const MALLOC_ARENAS: i32 = 2;

/// Allocations of at least this many bytes are normally served by glibc with pages of their own
/// (`mmap`, when no free heap block fits), which go back to the OS as soon as they are freed
/// ([`tune_malloc`]): 256 KiB.
pub const MALLOC_MMAP_THRESHOLD: i32 = 256 * 1024;

/// Tunes glibc's allocator for a long-running process whose big allocations are transient (a
/// page of a 5,000-node list, a render's JSON): caps the malloc arenas at [`MALLOC_ARENAS`]
/// (glibc's default is eight per core, each keeping its own free memory) and fixes the mmap
/// threshold at [`MALLOC_MMAP_THRESHOLD`]. glibc otherwise raises that threshold to the size of
/// each big block freed (up to 32 MiB), after which such blocks are carved from the heap and
/// their pages stay with the process until a `malloc_trim`. At 5,000 nodes the live heap was
/// about 12 MiB while the process kept 23 MiB of anonymous memory; this and the reconcile's
/// fixes together took that to 18 MiB (not measured one by one). Call before the
/// runtime starts its threads. `MALLOC_ARENA_MAX` and `MALLOC_MMAP_THRESHOLD_`, when set,
/// still win (`GLIBC_TUNABLES` for the same two settings does not). Other C libraries: no-op.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn tune_malloc() {
    // SAFETY: mallopt takes two integers and changes an allocator setting: M_ARENA_MAX only
    // limits how many arenas later threads may create, M_MMAP_THRESHOLD which sizes are
    // served by mmap from now on.
    unsafe {
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD);
        }
    }
}

/// No-op off glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune_malloc() {}

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
