//! Running a chain of plugins over the objects of one state.

use std::sync::Arc;

use kiln_core::context::TransformContext;
use serde_json::Value;

use crate::capture::PluginLog;
use crate::error::PluginError;
use crate::host::{CallInput, PluginHost};
use crate::meta::PolicyMeta;
use crate::outcome::{StepObjects, describe};

/// One step of a chain: a plugin name, optionally pinned by SHA-256, with its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginRef {
    /// Plugin name (drop-in file name or bundled name).
    pub name: String,
    /// Lowercase or uppercase hex SHA-256 the plugin's wasm must have.
    pub sha256: Option<String>,
    /// The entry's `settings` as compact JSON text, or `None` (the plugin gets `null`). Only
    /// `kiln:operand@0.2.0` plugins take settings; a `0.1.0` plugin given some is refused with
    /// [`PluginError::InvalidSettings`].
    pub settings: Option<String>,
}

impl PluginRef {
    /// An unpinned reference without settings.
    pub fn named(name: impl Into<String>) -> Self {
        PluginRef {
            name: name.into(),
            sha256: None,
            settings: None,
        }
    }
}

/// The input objects of a chain with their JSON text, serialized once and shared: a caller that
/// runs the same objects repeatedly (a renderer, per state) keeps one and clones it cheaply.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainInput {
    objects: Arc<[Value]>,
    texts: Arc<[String]>,
}

impl ChainInput {
    /// Serializes `objects` (the state's objects, in apply order).
    pub fn new(objects: Vec<Value>) -> Self {
        let texts = objects.iter().map(Value::to_string).collect();
        ChainInput {
            objects: objects.into(),
            texts,
        }
    }
}

/// An object a plugin of the chain left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Omitted {
    /// Position of the object in the chain's input.
    pub index: usize,
    /// `kind/name` of the object.
    pub object: String,
    /// The plugin that omitted it.
    pub plugin: String,
}

/// What a chain produced.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainOutput {
    /// The objects that survived, in input order, as the last plugin left them.
    pub objects: Vec<Value>,
    /// The objects left out, and by which plugin.
    pub omitted: Vec<Omitted>,
    /// Each plugin's log, in chain order.
    pub logs: Vec<(String, PluginLog)>,
}

impl PluginHost {
    /// [`PluginHost::run_chain_for`] a policy without name or annotations.
    ///
    /// # Errors
    /// As [`PluginHost::run_chain_for`].
    pub fn run_chain(
        &self,
        chain: &[PluginRef],
        input: &ChainInput,
        spec: &str,
        ctx: &TransformContext,
    ) -> Result<ChainOutput, PluginError> {
        self.run_chain_for(chain, input, spec, &PolicyMeta::default(), ctx)
    }

    /// Runs `chain` over the `input` objects: each plugin sees the previous one's result, and
    /// an object one plugin omits is neither shown to later plugins nor returned. With an empty
    /// chain the input is returned unchanged. `spec` is the ClusterPolicy spec as JSON text,
    /// handed to every plugin as is; `policy` goes into `0.2.0` plugins' context.
    ///
    /// Every step is loaded and its settings checked ([`PluginHost::check_settings`]) before
    /// the first transform runs, so a bad setting anywhere in the chain fails it untouched.
    ///
    /// # Errors
    /// The first [`PluginError`] of any step (lookup, pin, settings, call or output), naming
    /// its plugin.
    pub fn run_chain_for(
        &self,
        chain: &[PluginRef],
        input: &ChainInput,
        spec: &str,
        policy: &PolicyMeta,
        ctx: &TransformContext,
    ) -> Result<ChainOutput, PluginError> {
        let plugins = chain
            .iter()
            .map(|step| {
                let plugin = self.plugin(&step.name, step.sha256.as_deref())?;
                self.check_settings(&plugin, step.settings.as_deref())?;
                Ok(plugin)
            })
            .collect::<Result<Vec<_>, PluginError>>()?;
        let mut indices: Vec<usize> = (0..input.objects.len()).collect();
        // The first step reads the input as serialized once (copying objects only as far as
        // their patches need); later steps patch the previous results in place.
        let mut current: Option<Vec<Value>> = None;
        let mut omitted = Vec::new();
        let mut logs = Vec::with_capacity(chain.len());
        for (step, plugin) in chain.iter().zip(plugins) {
            let (objects, texts) = match current.take() {
                None => (StepObjects::Input(&input.objects), Some(&input.texts[..])),
                Some(owned) => (StepObjects::Owned(owned), None),
            };
            let call = CallInput {
                spec,
                settings: step.settings.as_deref(),
                policy,
            };
            let (results, log) = self.call_step(&plugin, objects, texts, &call, ctx)?;
            logs.push((step.name.clone(), log));
            let mut next = Vec::with_capacity(results.len());
            let mut next_indices = Vec::with_capacity(results.len());
            for (index, result) in indices.into_iter().zip(results) {
                match result {
                    Some(object) => {
                        next.push(object);
                        next_indices.push(index);
                    }
                    None => omitted.push(Omitted {
                        index,
                        object: describe(&input.objects[index]),
                        plugin: step.name.clone(),
                    }),
                }
            }
            current = Some(next);
            indices = next_indices;
        }
        let current = current.unwrap_or_else(|| input.objects.to_vec());
        Ok(ChainOutput {
            objects: current,
            omitted,
            logs,
        })
    }
}
