//! Where a ClusterPolicy names site plugins and pins: the annotation `kiln.dev/plugins`.
//!
//! An annotation leaves every upstream field untouched (the upstream CRD prunes unknown spec
//! fields, and existing policies keep working). Its value is YAML (or JSON), keyed by state:
//!
//! ```yaml
//! metadata:
//!   annotations:
//!     kiln.dev/plugins: |
//!       device-plugin:
//!         pin: 3f5a…            # optional sha256 of the standard `device-plugin` plugin
//!         then:                 # site plugins run after it, in order
//!           - name: site-tolerations
//!             sha256: 9c1e…     # optional pin
//!             settings:         # optional, any YAML: handed to the plugin as JSON
//!               tolerations: [{key: pool, operator: Exists}]
//! ```
//! Settings are for `kiln:operand@0.2.0` plugins (`wit/README.md`); the host checks them with
//! the plugin's `validate-settings` before any transform runs.
//! Site plugins are looked up by name in the drop-in directory (`/etc/kiln/plugins/<name>.wasm`),
//! then among the bundled plugins. A name `oci://REGISTRY/REPOSITORY@sha256:<64 hex>` is pulled
//! from a registry by that digest instead (a tag is refused here, naming the entry;
//! [`kiln_core::oci_ref`], `kiln_plugin_host::oci`).

use std::collections::BTreeMap;

use kiln_core::State;
use kiln_plugin_host::PluginRef;
use serde::Deserialize;

/// The annotation holding the site plugin configuration.
pub const PLUGINS_ANNOTATION: &str = "kiln.dev/plugins";

/// A state by name (`device-plugin`, or `state-device-plugin` as upstream's asset folders
/// name it), as an annotation key or `kiln plugin run --state` gives it.
///
/// # Errors
/// `unknown state "NAME" (valid: pre-requisites, …)`, listing every state of
/// [`State::ALL`] in order.
pub fn parse_state(name: &str) -> Result<State, String> {
    name.parse().map_err(|e| {
        let valid: Vec<&str> = State::ALL.iter().map(|s| s.name()).collect();
        format!("{e} (valid: {})", valid.join(", "))
    })
}

/// Plugins of one state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatePlugins {
    /// sha256 (hex) the standard plugin must have.
    #[serde(default)]
    pub pin: Option<String>,
    /// Site plugins run after the standard one, in order.
    #[serde(default)]
    pub then: Vec<SitePlugin>,
}

/// One site plugin.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SitePlugin {
    /// Plugin name (`<name>.wasm` in the drop-in directory).
    pub name: String,
    /// Optional sha256 (hex) pin.
    #[serde(default)]
    pub sha256: Option<String>,
    /// Optional settings (any YAML value), handed to the plugin as JSON text.
    #[serde(default)]
    pub settings: Option<serde_json::Value>,
}

/// The parsed annotation: plugins per state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginConfig(BTreeMap<State, StatePlugins>);

impl PluginConfig {
    /// Parse the annotation value.
    ///
    /// # Errors
    /// A message naming the annotation and the offending key (unknown state, unknown field,
    /// invalid YAML, a pin that is not 64 hex digits).
    pub fn parse(value: &str) -> Result<Self, String> {
        if value.trim().is_empty() {
            return Ok(PluginConfig::default());
        }
        // kiln's one YAML loader: size and depth bounded, duplicate keys refused.
        let raw: BTreeMap<String, StatePlugins> = kiln_input::yaml::from_str(value)
            .map_err(|e| format!("annotation {PLUGINS_ANNOTATION}: {e}"))?;
        let mut map = BTreeMap::new();
        for (key, plugins) in raw {
            let state =
                parse_state(&key).map_err(|e| format!("annotation {PLUGINS_ANNOTATION}: {e}"))?;
            let pins = plugins
                .pin
                .iter()
                .chain(plugins.then.iter().filter_map(|p| p.sha256.as_ref()));
            for (i, site) in plugins.then.iter().enumerate() {
                if kiln_core::oci_ref::is_oci(&site.name) {
                    kiln_core::oci_ref::OciRef::parse(&site.name).map_err(|e| {
                        format!("annotation {PLUGINS_ANNOTATION}: {key}: then[{i}].name: {e}")
                    })?;
                }
            }
            for pin in pins {
                if pin.len() != 64 || !pin.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(format!(
                        "annotation {PLUGINS_ANNOTATION}: {key}: pin {pin:?} is not a sha256 (64 hex digits)"
                    ));
                }
            }
            map.insert(state, plugins);
        }
        Ok(PluginConfig(map))
    }

    /// The chain for `state`: its standard plugin (pinned if configured), then the site plugins.
    pub fn chain(&self, state: State) -> Vec<PluginRef> {
        let cfg = self.0.get(&state);
        let mut chain = vec![PluginRef {
            name: state.name().to_string(),
            sha256: cfg.and_then(|c| c.pin.clone()),
            settings: None,
        }];
        for p in cfg.into_iter().flat_map(|c| &c.then) {
            chain.push(PluginRef {
                name: p.name.clone(),
                sha256: p.sha256.clone(),
                settings: p.settings.as_ref().map(serde_json::Value::to_string),
            });
        }
        chain
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_chain_and_rejects_bad_input() {
        let pin = "a".repeat(64);
        let cfg = PluginConfig::parse(&format!(
            "device-plugin:\n  pin: {pin}\n  then:\n    - name: site-x\n    - name: site-y\n      sha256: {pin}\n"
        ))
        .unwrap();
        let chain = cfg.chain(State::DevicePlugin);
        assert_eq!(chain.len(), 3);
        assert_eq!(chain[0].name, "device-plugin");
        assert_eq!(chain[0].sha256.as_deref(), Some(pin.as_str()));
        assert_eq!(chain[1], PluginRef::named("site-x"));
        let with_settings = PluginConfig::parse(
            "dcgm:\n  then:\n    - name: place\n      settings:\n        nodeSelector: {pool: a}\n        count: 1\n",
        )
        .unwrap();
        assert_eq!(
            with_settings.chain(State::Dcgm)[1].settings.as_deref(),
            Some(r#"{"count":1,"nodeSelector":{"pool":"a"}}"#)
        );
        assert_eq!(cfg.chain(State::Dcgm), vec![PluginRef::named("dcgm")]);
        assert!(
            PluginConfig::parse("bogus-state: {}")
                .unwrap_err()
                .contains("unknown state \"bogus-state\"")
        );
        let err = PluginConfig::parse("deviceplugin: {}").unwrap_err();
        let valid: Vec<&str> = State::ALL.iter().map(|s| s.name()).collect();
        assert!(valid.contains(&"device-plugin") && valid.contains(&"dcgm"));
        assert_eq!(
            err,
            format!(
                "annotation {PLUGINS_ANNOTATION}: unknown state \"deviceplugin\" (valid: {})",
                valid.join(", ")
            )
        );
        assert!(err.contains(", device-plugin, "), "{err}");
        assert!(
            PluginConfig::parse("dcgm: {pin: abc}")
                .unwrap_err()
                .contains("not a sha256")
        );
        assert!(
            PluginConfig::parse("dcgm: {extra: 1}")
                .unwrap_err()
                .contains("unknown field `extra`")
        );
        let digest = "b".repeat(64);
        let oci = PluginConfig::parse(&format!(
            "dcgm: {{then: [{{name: a}}, {{name: 'oci://ghcr.io/acme/a@sha256:{digest}'}}]}}"
        ))
        .unwrap();
        assert_eq!(
            oci.chain(State::Dcgm)[2].name,
            format!("oci://ghcr.io/acme/a@sha256:{digest}")
        );
        assert_eq!(
            PluginConfig::parse("dcgm: {then: [{name: a}, {name: 'oci://ghcr.io/acme/a:v1'}]}")
                .unwrap_err(),
            "annotation kiln.dev/plugins: dcgm: then[1].name: \"oci://ghcr.io/acme/a:v1\" names no digest: a plugin is pulled by digest only (oci://REGISTRY/REPOSITORY@sha256:<64 hex>; `kiln plugin push` prints it), never by tag"
        );
        let err = PluginConfig::parse("dcgm: {then: [{name: a}]}\ndcgm: {}\n").unwrap_err();
        assert_eq!(
            err,
            "annotation kiln.dev/plugins: dcgm: duplicate key `dcgm` (each key may appear once per mapping)"
        );
    }
}
