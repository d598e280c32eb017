//! Every bundled plugin loads in the host under its own name and imports only what is allowed.

use kiln_plugin_host::{HostConfig, PluginHost, PluginSource};

#[test]
fn every_bundled_plugin_loads() {
    let host = PluginHost::new(HostConfig::in_memory(), kiln_bundled_plugins::BUNDLED).unwrap();
    let mut failures = Vec::new();
    for (name, bytes) in kiln_bundled_plugins::BUNDLED {
        match host.load(name, None) {
            Ok(plugin) => {
                assert_eq!(plugin.name(), *name);
                assert_eq!(plugin.source(), &PluginSource::Bundled);
                assert_eq!(plugin.sha256(), kiln_plugin_host::sha256_hex(bytes));
                println!(
                    "{name}: {} bytes, imports {:?}",
                    bytes.len(),
                    plugin.imports()
                );
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(
        failures.is_empty(),
        "bundled plugins that do not load:\n{}",
        failures.join("\n")
    );
    let mut names: Vec<&str> = kiln_bundled_plugins::BUNDLED
        .iter()
        .map(|(n, _)| *n)
        .collect();
    names.dedup();
    assert_eq!(names.len(), kiln_bundled_plugins::BUNDLED.len());
}
