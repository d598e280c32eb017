//! The structural audit of a component before it is compiled: its size, the size of its
//! largest function body, and how many memories, tables and core instances it declares.
//!
//! It runs on the wasm bytes (one pass of `wasmparser`, about 1 ms per MiB, no validation),
//! so a component over a bound is refused before any compile time is spent on it; a component
//! loaded from the cache without its bytes (a bundled plugin with a build-time digest) is
//! checked by [`check_resources`] on the compiled component instead.

use wasmparser::{Instance, Parser, Payload};

use crate::config::{
    MAX_CORE_INSTANCES, MAX_FUNCTION_BODY_BYTES, MAX_MEMORIES, MAX_MEMORIES_PER_MODULE, MAX_TABLES,
    MAX_TABLES_PER_MODULE,
};
use crate::error::PluginError;

/// Counts of what a component declares, summed over all its (nested) core modules.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Declared {
    /// Memories defined (not imported) by core modules.
    pub(crate) memories: u64,
    /// Tables defined by core modules.
    pub(crate) tables: u64,
    /// `instantiate` core instances.
    pub(crate) core_instances: u64,
    /// Bytes of the largest function body.
    pub(crate) largest_function: u64,
    /// Memories of the core module defining the most.
    pub(crate) module_memories: u64,
    /// Tables of the core module defining the most.
    pub(crate) module_tables: u64,
}

/// Counts what `bytes` declares. Bytes `wasmparser` cannot read are let through: the
/// compiler then refuses them with its own message.
pub(crate) fn declared(bytes: &[u8]) -> Declared {
    let mut d = Declared::default();
    for payload in Parser::new(0).parse_all(bytes) {
        let Ok(payload) = payload else { break };
        match payload {
            // A module has at most one section of each kind.
            Payload::MemorySection(r) => {
                d.memories += u64::from(r.count());
                d.module_memories = d.module_memories.max(u64::from(r.count()));
            }
            Payload::TableSection(r) => {
                d.tables += u64::from(r.count());
                d.module_tables = d.module_tables.max(u64::from(r.count()));
            }
            Payload::InstanceSection(r) => {
                d.core_instances += r
                    .into_iter()
                    .filter(|i| matches!(i, Ok(Instance::Instantiate { .. })))
                    .count() as u64;
            }
            Payload::CodeSectionEntry(body) => {
                d.largest_function = d.largest_function.max(body.range().len() as u64);
            }
            _ => {}
        }
    }
    d
}

/// Refuses `bytes` of plugin `plugin` over `max_bytes`, or declaring more than the per-plugin
/// bounds ([`MAX_MEMORIES`], [`MAX_TABLES`], [`MAX_CORE_INSTANCES`], per module
/// [`MAX_MEMORIES_PER_MODULE`] and [`MAX_TABLES_PER_MODULE`], [`MAX_FUNCTION_BODY_BYTES`]).
///
/// # Errors
/// [`PluginError::ComponentLimit`] naming the plugin and the first bound exceeded.
pub(crate) fn check_bytes(plugin: &str, bytes: &[u8], max_bytes: usize) -> Result<(), PluginError> {
    let over = |what, actual: u64, limit: u64| {
        (actual > limit).then(|| PluginError::ComponentLimit {
            plugin: plugin.to_string(),
            what,
            actual,
            limit,
        })
    };
    if let Some(e) = over("bytes", bytes.len() as u64, max_bytes as u64) {
        return Err(e);
    }
    let d = declared(bytes);
    let checks = [
        ("memories", d.memories, u64::from(MAX_MEMORIES)),
        ("tables", d.tables, u64::from(MAX_TABLES)),
        (
            "core instances",
            d.core_instances,
            u64::from(MAX_CORE_INSTANCES),
        ),
        (
            "memories in one core module",
            d.module_memories,
            u64::from(MAX_MEMORIES_PER_MODULE),
        ),
        (
            "tables in one core module",
            d.module_tables,
            u64::from(MAX_TABLES_PER_MODULE),
        ),
        (
            "bytes in one function body",
            d.largest_function,
            MAX_FUNCTION_BODY_BYTES as u64,
        ),
    ];
    for (what, actual, limit) in checks {
        if let Some(e) = over(what, actual, limit) {
            return Err(e);
        }
    }
    Ok(())
}

/// Refuses a compiled component of `plugin` whose instantiation would create more memories
/// or tables than the bounds, or whose initial memories alone exceed `memory_limit_bytes`
/// (Wasmtime's count, per instantiation).
///
/// # Errors
/// [`PluginError::ComponentLimit`].
pub(crate) fn check_resources(
    plugin: &str,
    component: &wasmtime::component::Component,
    memory_limit_bytes: usize,
) -> Result<(), PluginError> {
    let Some(r) = component.resources_required() else {
        return Ok(());
    };
    // The largest single memory's initial size: over the cap, no call could even start.
    let initial_memory = r.max_initial_memory_size.unwrap_or(0);
    let checks = [
        (
            "memories",
            u64::from(r.num_memories),
            u64::from(MAX_MEMORIES),
        ),
        ("tables", u64::from(r.num_tables), u64::from(MAX_TABLES)),
        (
            "bytes of initial memory",
            initial_memory,
            memory_limit_bytes as u64,
        ),
    ];
    for (what, actual, limit) in checks {
        if actual > limit {
            return Err(PluginError::ComponentLimit {
                plugin: plugin.to_string(),
                what,
                actual,
                limit,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_nested_modules_and_instances() {
        let wasm = wat::parse_str(
            r#"(component
                (core module $a (memory 1) (memory 1) (table 1 funcref) (func))
                (core module $b (memory 1))
                (core instance (instantiate $a))
                (core instance (instantiate $b))
                (core instance (instantiate $b)))"#,
        )
        .unwrap();
        let d = declared(&wasm);
        assert_eq!(
            d,
            Declared {
                memories: 3,
                tables: 1,
                core_instances: 3,
                largest_function: 2,
                module_memories: 2,
                module_tables: 1,
            }
        );
        match check_bytes("p", &wasm, 1 << 20).unwrap_err() {
            PluginError::ComponentLimit {
                what: "memories in one core module",
                actual: 2,
                limit: 1,
                ..
            } => {}
            other => panic!("{other:?}"),
        }
        match check_bytes("p", &wasm, 10).unwrap_err() {
            PluginError::ComponentLimit {
                what: "bytes",
                limit: 10,
                ..
            } => {}
            other => panic!("{other:?}"),
        }
    }
}
