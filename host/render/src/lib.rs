//! Renders a ClusterPolicy into the objects of every enabled state, exactly as the operator
//! would apply them (what `helm template` is to Helm).
//!
//! ```text
//! Policy ─► enabled states (kiln_core::plan) ─► per state: assets/state-<name> (embedded)
//!        ─► placeholders (namespace, RBAC subjects) ─► plugin chain: standard, then site plugins
//!        ─► RenderedState { objects }
//! ```
//!
//! A state that fails (a plugin fault, a bad field, an object the API server would refuse:
//! [`check`]) yields its own error and does not stop the states after it.

pub mod assets;
pub mod check;
pub mod defaults;
pub mod gpucluster;
pub mod nvidiadriver;
pub mod output;
pub mod placeholders;
pub mod policy;
pub mod site;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kiln_core::State;
use kiln_core::context::TransformContext;
use kiln_plugin_host::{ChainInput, PluginError, PluginHost};
use serde_json::Value;

pub use policy::{Policy, PolicyError};

/// Why one state could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The state's assets are broken (a build defect).
    #[error(transparent)]
    Asset(#[from] assets::AssetError),
    /// A plugin of the state's chain failed; the error names the plugin.
    #[error("state {state}: {source}")]
    Plugin {
        /// The state.
        state: State,
        /// What the plugin did wrong.
        #[source]
        source: PluginError,
    },
    /// A rendered object carries a value the API server refuses (a label, an env name, a
    /// `maxUnavailable`, …; see [`check`]); the error names the object and the field.
    #[error("state {state}: {source}")]
    Invalid {
        /// The state.
        state: State,
        /// The object, field and rule.
        #[source]
        source: check::ObjectError,
    },
}

/// The rendered objects of one state.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedState {
    /// The state.
    pub state: State,
    /// Objects to apply, in apply order. An object a plugin left out is simply absent: the
    /// operator deletes it through its state label (`kiln_core::plan`), as any object a
    /// render no longer produces.
    pub objects: Vec<Value>,
}

/// What a state's input objects depend on: the state, OpenShift or not, the operator
/// namespace and the runtime class (the placeholders).
type InputKey = (State, bool, String, String);

/// Renders policies with one shared plugin host.
#[derive(Clone)]
pub struct Renderer {
    host: Arc<PluginHost>,
    /// Each state's placeholder-filled assets, serialized once (a few KiB per state).
    inputs: Arc<Mutex<HashMap<InputKey, ChainInput>>>,
}

impl Renderer {
    /// A renderer over `host` (which holds the bundled and drop-in plugins).
    pub fn new(host: Arc<PluginHost>) -> Self {
        Renderer {
            host,
            inputs: Arc::default(),
        }
    }

    /// The state's assets with placeholders filled, as the first plugin of its chain sees
    /// them; built once per distinct [`InputKey`].
    fn input(
        &self,
        state: State,
        policy: &Policy,
        ctx: &TransformContext,
    ) -> Result<ChainInput, RenderError> {
        let key = (
            state,
            ctx.openshift_version.is_some(),
            ctx.operator_namespace.clone(),
            policy.spec.runtime_class().to_string(),
        );
        if let Some(input) = self
            .inputs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(input.clone());
        }
        let objects: Vec<Value> = assets::load_state(state, key.1)?
            .into_iter()
            .map(|a| {
                let mut o = a.object;
                placeholders::fill(&mut o, &key.2, &key.3);
                o
            })
            .collect();
        let input = ChainInput::new(objects);
        self.inputs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, input.clone());
        Ok(input)
    }

    /// The plugin host.
    pub fn host(&self) -> &PluginHost {
        &self.host
    }

    /// Render one state: load its assets, fill placeholders, run its plugin chain.
    ///
    /// # Errors
    /// [`RenderError`] naming the state and, for plugin faults, the plugin.
    pub fn render_state(
        &self,
        state: State,
        policy: &Policy,
        base: &TransformContext,
    ) -> Result<RenderedState, RenderError> {
        let mut ctx = base.clone();
        ctx.state = state.name().to_string();
        ctx.default_workload = default_workload(&policy.spec).to_string();
        let input = self.input(state, policy, &ctx)?;
        let chain = policy.plugins.chain(state);
        let out = self
            .host
            .run_chain_for(&chain, &input, &policy.spec_text, &policy.meta, &ctx)
            .map_err(|source| RenderError::Plugin { state, source })?;
        for object in &out.objects {
            check::check_object(object).map_err(|source| RenderError::Invalid { state, source })?;
        }
        tracing::debug!(%state, objects = out.objects.len(), omitted = out.omitted.len(), "rendered state");
        Ok(RenderedState {
            state,
            objects: out.objects,
        })
    }

    /// Render every state `policy` enables, returned in apply order; each state's result is
    /// independent. States render on up to [`std::thread::available_parallelism`] scoped
    /// threads sharing the host (no state's transform reads another's output), each taking the
    /// next state not yet started. One thread per core, not per state: warm calls take well
    /// under a millisecond and more threads than cores only add scheduling and cross-core TLB flushes
    /// (Wasmtime changes page protections of an instance's memory when it is discarded), while
    /// a cold start still compiles plugins on every core.
    pub fn render(
        &self,
        policy: &Policy,
        base: &TransformContext,
    ) -> Vec<(State, Result<RenderedState, RenderError>)> {
        let states = kiln_core::plan::enabled_states(&policy.spec);
        let workers = std::thread::available_parallelism()
            .map_or(1, std::num::NonZero::get)
            .min(states.len());
        if workers <= 1 {
            return states
                .iter()
                .map(|&s| (s, self.render_state(s, policy, base)))
                .collect();
        }
        let next = AtomicUsize::new(0);
        let work = || {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&state) = states.get(i) else {
                    return done;
                };
                done.push((i, state, self.render_state(state, policy, base)));
            }
        };
        let mut results: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers).map(|_| scope.spawn(work)).collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        results.sort_by_key(|(i, _, _)| *i);
        results.into_iter().map(|(_, s, r)| (s, r)).collect()
    }
}

/// The default GPU workload the sandbox validators are told (`DEFAULT_GPU_WORKLOAD_CONFIG`):
/// `sandboxWorkloads.defaultWorkload` when sandbox workloads are enabled, else `container`
/// (upstream `ClusterPolicyController.init`).
pub fn default_workload(spec: &kiln_core::spec::ClusterPolicySpec) -> &'static str {
    use kiln_core::spec::Workload;
    match spec.sandbox_workloads.default_workload {
        Some(Workload::VmPassthrough) if spec.sandbox_enabled() => "vm-passthrough",
        Some(Workload::VmVgpu) if spec.sandbox_enabled() => "vm-vgpu",
        _ => "container",
    }
}
