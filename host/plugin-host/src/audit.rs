//! The audit of a component before it is compiled: its size, the size of its largest function
//! body, how many memories, tables and core instances it declares, how much initial memory,
//! and what it imports.
//!
//! It runs on the wasm bytes (one pass of `wasmparser`, about 1 ms per MiB, no validation),
//! so a component over a bound, or importing what a plugin may not, is refused before any
//! compile time is spent on it and before anything is cached; **every** bound it exceeds is
//! reported at once ([`PluginError::ComponentLimit`]). A component loaded from the cache
//! without its bytes (a bundled plugin with a build-time digest) is checked by
//! [`check_resources`] on the compiled component instead.

use wasmparser::{ComponentTypeRef, Instance, Parser, Payload};

use crate::config::{HostConfig, MAX_MEMORIES_PER_MODULE, MAX_TABLES_PER_MODULE};
use crate::error::{Bound, PluginError};
use crate::sandbox::is_allowed_import;

/// Counts of what a component declares, summed over all its (nested) core modules.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
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
    /// Initial bytes of all defined memories together.
    pub(crate) initial_memory: u64,
    /// The top-level component's imports, full names, in declaration order.
    pub(crate) imports: Vec<String>,
}

/// Counts what `bytes` declares. Bytes `wasmparser` cannot read are let through: the
/// compiler then refuses them with its own message.
pub(crate) fn declared(bytes: &[u8]) -> Declared {
    let mut d = Declared::default();
    // Nesting depth: 1 inside the top-level component, more inside nested modules/components.
    let mut depth = 0u32;
    for payload in Parser::new(0).parse_all(bytes) {
        let Ok(payload) = payload else { break };
        match payload {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            // Type imports carry no capability (and Wasmtime does not list them either).
            Payload::ComponentImportSection(r) if depth == 1 => d.imports.extend(
                r.into_iter()
                    .flatten()
                    .filter(|i| !matches!(i.ty, ComponentTypeRef::Type(_)))
                    .map(|i| i.name.name.to_string()),
            ),
            // A module has at most one section of each kind.
            Payload::MemorySection(r) => {
                d.memories += u64::from(r.count());
                d.module_memories = d.module_memories.max(u64::from(r.count()));
                for m in r.into_iter().flatten() {
                    let page = 1u64 << m.page_size_log2();
                    d.initial_memory = d
                        .initial_memory
                        .saturating_add(m.initial.saturating_mul(page));
                }
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

/// Every bound of `config` with what a component of `len` bytes declaring `d` has against it.
pub(crate) fn bounds(len: u64, d: &Declared, config: &HostConfig) -> Vec<Bound> {
    let b = |what, actual: u64, limit: u64| Bound {
        what,
        actual,
        limit,
    };
    vec![
        b("bytes", len, config.max_component_bytes as u64),
        b(
            "bytes in one function body",
            d.largest_function,
            config.max_function_body_bytes as u64,
        ),
        b("memories", d.memories, u64::from(config.max_memories)),
        b("tables", d.tables, u64::from(config.max_tables)),
        b(
            "core instances",
            d.core_instances,
            u64::from(config.max_core_instances),
        ),
        b(
            "memories in one core module",
            d.module_memories,
            u64::from(MAX_MEMORIES_PER_MODULE),
        ),
        b(
            "tables in one core module",
            d.module_tables,
            u64::from(MAX_TABLES_PER_MODULE),
        ),
        b(
            "bytes of initial memory",
            d.initial_memory,
            config.memory_limit_bytes as u64,
        ),
    ]
}

/// Refuses `bytes` of plugin `plugin` over any bound of `config` (all exceeded bounds in one
/// error), else importing anything outside the allowed surface (every such import named).
///
/// # Errors
/// [`PluginError::ComponentLimit`], [`PluginError::ForbiddenImport`].
pub(crate) fn check_bytes(
    plugin: &str,
    bytes: &[u8],
    config: &HostConfig,
) -> Result<Declared, PluginError> {
    let d = declared(bytes);
    let exceeded: Vec<Bound> = bounds(bytes.len() as u64, &d, config)
        .into_iter()
        .filter(Bound::exceeded)
        .collect();
    if !exceeded.is_empty() {
        return Err(PluginError::ComponentLimit {
            plugin: plugin.to_string(),
            exceeded,
        });
    }
    let forbidden: Vec<String> = d
        .imports
        .iter()
        .filter(|i| !is_allowed_import(i))
        .cloned()
        .collect();
    if !forbidden.is_empty() {
        return Err(PluginError::ForbiddenImport {
            plugin: plugin.to_string(),
            imports: forbidden,
        });
    }
    Ok(d)
}

/// Refuses a compiled component of `plugin` whose instantiation would create more memories
/// or tables than the bounds, or whose initial memories alone exceed the memory cap
/// (Wasmtime's count, per instantiation).
///
/// # Errors
/// [`PluginError::ComponentLimit`] with every exceeded bound.
pub(crate) fn check_resources(
    plugin: &str,
    component: &wasmtime::component::Component,
    config: &HostConfig,
) -> Result<(), PluginError> {
    let Some(r) = component.resources_required() else {
        return Ok(());
    };
    // The largest single memory's initial size: over the cap, no call could even start.
    let initial_memory = r.max_initial_memory_size.unwrap_or(0);
    let b = |what, actual: u64, limit: u64| Bound {
        what,
        actual,
        limit,
    };
    let exceeded: Vec<Bound> = [
        b(
            "memories",
            u64::from(r.num_memories),
            u64::from(config.max_memories),
        ),
        b(
            "tables",
            u64::from(r.num_tables),
            u64::from(config.max_tables),
        ),
        b(
            "bytes of initial memory",
            initial_memory,
            config.memory_limit_bytes as u64,
        ),
    ]
    .into_iter()
    .filter(Bound::exceeded)
    .collect();
    if exceeded.is_empty() {
        Ok(())
    } else {
        Err(PluginError::ComponentLimit {
            plugin: plugin.to_string(),
            exceeded,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_nested_modules_instances_and_top_level_imports() {
        let wasm = wat::parse_str(
            r#"(component
                (import "wasi:clocks/wall-clock@0.2.0" (instance))
                (component $inner (import "inner-only" (instance)))
                (core module $a (memory 1) (memory 1) (table 1 funcref) (func))
                (core module $b (memory 2))
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
                initial_memory: 4 * 65536,
                imports: vec!["wasi:clocks/wall-clock@0.2.0".into()],
            }
        );
        let config = HostConfig {
            max_component_bytes: 10,
            max_core_instances: 2,
            ..HostConfig::in_memory()
        };
        // Every exceeded bound at once, in the order `kiln plugin check` prints them.
        match check_bytes("p", &wasm, &config).unwrap_err() {
            PluginError::ComponentLimit { exceeded, .. } => {
                let what: Vec<_> = exceeded.iter().map(|b| b.what).collect();
                assert_eq!(
                    what,
                    ["bytes", "core instances", "memories in one core module"]
                );
                assert_eq!(exceeded[1].to_string(), "3 core instances (limit 2)");
            }
            other => panic!("{other:?}"),
        }
        let config = HostConfig {
            max_core_instances: 3,
            ..HostConfig::in_memory()
        };
        let one_memory_each = wat::parse_str(
            r#"(component
                (import "wasi:clocks/wall-clock@0.2.0" (instance))
                (import "wasi:keyvalue/store@0.2.0-draft" (instance))
                (import "log" (func))
                (core module $a (memory 1)))"#,
        )
        .unwrap();
        match check_bytes("p", &one_memory_each, &config).unwrap_err() {
            PluginError::ForbiddenImport { imports, .. } => {
                // The clock is the virtual WASI's; the key-value store is not.
                assert_eq!(imports, ["wasi:keyvalue/store@0.2.0-draft"]);
            }
            other => panic!("{other:?}"),
        }
    }
}
