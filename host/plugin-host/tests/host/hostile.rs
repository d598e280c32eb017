//! Hostile plugins (`tests/fixtures/*.wat`): each fails with its own error, and the host keeps
//! working after each one.

use std::time::{Duration, Instant};

use kiln_plugin_host::{HostConfig, PluginError, PluginHost};
use serde_json::json;

use crate::common::*;

/// Installs fixture `file` as plugin `name` next to the good guest and calls it once.
fn run_hostile(file: &str, config: impl FnOnce(&Dirs) -> HostConfig) -> (PluginHost, PluginError) {
    let dirs = Dirs::new();
    let name = file.replace('_', "-");
    dirs.install(&name, &hostile(file, &name));
    let host = host_with_good(&dirs, config(&dirs));
    let err = host
        .transform(&name, &[daemonset("ds")], &json!({}), &ctx())
        .unwrap_err();
    assert_eq!(err.plugin(), Some(name.as_str()), "{err}");
    assert!(
        err.to_string().starts_with(&format!("plugin {name:?}")),
        "{err}"
    );
    assert_good_works(&host);
    (host, err)
}

#[test]
fn infinite_loop_runs_out_of_fuel() {
    let (_, err) = run_hostile("infinite_loop", |d| HostConfig {
        fuel: Some(500_000_000),
        ..d.config()
    });
    assert!(
        matches!(
            err,
            PluginError::OutOfFuel {
                fuel: 500_000_000,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn infinite_loop_without_fuel_hits_the_deadline() {
    let deadline = Duration::from_millis(200);
    let started = Instant::now();
    let (_, err) = run_hostile("infinite_loop", |d| HostConfig {
        fuel: None,
        deadline,
        ..d.config()
    });
    assert!(
        matches!(err, PluginError::DeadlineExceeded { deadline: d, .. } if d == deadline),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn memory_growth_past_the_cap_is_refused() {
    let (_, err) = run_hostile("memory_hog", Dirs::config);
    assert!(
        matches!(
            err,
            PluginError::MemoryLimit {
                limit_bytes: 67_108_864,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn unbounded_recursion_exhausts_the_stack() {
    let (_, err) = run_hostile("recursion", Dirs::config);
    assert!(matches!(err, PluginError::StackExhausted { .. }), "{err:?}");
}

#[test]
fn unreachable_is_a_trap() {
    let (_, err) = run_hostile("trap", Dirs::config);
    match err {
        PluginError::Trap { message, .. } => assert!(message.contains("unreachable"), "{message}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn output_that_is_not_json_is_an_invalid_patch() {
    let (_, err) = run_hostile("not_json", Dirs::config);
    match err {
        PluginError::InvalidPatch {
            index,
            object,
            message,
            ..
        } => {
            assert_eq!((index, object.as_str()), (0, "DaemonSet/ds"));
            assert!(message.contains("not an RFC 6902 JSON Patch"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn removing_the_selector_is_an_invalid_result() {
    let (_, err) = run_hostile("drop_selector", Dirs::config);
    match err {
        PluginError::InvalidResult { index, message, .. } => {
            assert_eq!(index, 0);
            assert_eq!(
                message,
                r#"/spec/selector changed from {"matchLabels":{"app":"ds"}} to nothing"#
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_100_mib_output_cannot_be_produced_under_the_memory_cap() {
    let (_, err) = run_hostile("huge_output", Dirs::config);
    assert!(matches!(err, PluginError::MemoryLimit { .. }), "{err:?}");
}

#[test]
fn a_100_mib_output_is_refused_by_the_output_cap() {
    let (_, err) = run_hostile("huge_output", |d| HostConfig {
        memory_limit_bytes: 256 << 20,
        output_limit_bytes: 1 << 20,
        ..d.config()
    });
    assert!(
        matches!(
            err,
            PluginError::OutputTooLarge {
                limit_bytes: 1_048_576,
                actual_bytes: 104_857_600,
                ..
            }
        ),
        "{err:?}"
    );
}

/// Imports outside the virtual WASI are refused by name before compiling, through `load`
/// and through a transform (the host keeps working).
#[test]
fn imports_outside_the_virtual_wasi_are_refused_at_load() {
    let dirs = Dirs::new();
    dirs.install("kv", &standalone("forbidden_keyvalue"));
    dirs.install("http", &standalone("forbidden_incoming_http"));
    let host = host_with_good(&dirs, dirs.config());
    let err = host.load("kv", None).unwrap_err();
    match &err {
        PluginError::ForbiddenImport { plugin, imports } => {
            assert_eq!(
                (plugin.as_str(), imports.as_slice()),
                (
                    "kv",
                    ["wasi:keyvalue/store@0.2.0-draft".to_string()].as_slice()
                )
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string().contains("wasi:keyvalue/store@0.2.0-draft"),
        "{err}"
    );
    let err = host
        .transform("http", &[daemonset("ds")], &json!({}), &ctx())
        .unwrap_err();
    match &err {
        PluginError::ForbiddenImport { plugin, imports } => {
            assert_eq!(
                (plugin.as_str(), imports.as_slice()),
                (
                    "http",
                    ["wasi:http/incoming-handler@0.2.6".to_string()].as_slice()
                )
            );
        }
        other => panic!("{other:?}"),
    }
    assert_good_works(&host);
}

#[test]
fn every_forbidden_import_is_listed() {
    let dirs = Dirs::new();
    dirs.install("many", &standalone("forbidden_many"));
    let host = host_with_good(&dirs, dirs.config());
    let err = host.load("many", None).unwrap_err();
    let expected = [
        "wasi:keyvalue/store@0.2.0-draft",
        "wasi:config/store@0.2.0-draft",
        "wasi:http/incoming-handler@0.2.6",
    ];
    match &err {
        PluginError::ForbiddenImport { plugin, imports } => {
            assert_eq!(
                (plugin.as_str(), imports.as_slice()),
                ("many", expected.map(String::from).as_slice())
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "plugin \"many\": forbidden imports \"wasi:keyvalue/store@0.2.0-draft\", \"wasi:config/store@0.2.0-draft\", \"wasi:http/incoming-handler@0.2.6\" (plugins may import only the world's own imports and the virtual WASI)"
    );
    let report = kiln_plugin_host::inspect_as(&standalone("forbidden_many"), "many").unwrap();
    assert!(
        matches!(&report.refusal, Some(PluginError::ForbiddenImport { imports, .. }) if imports.len() == 3),
        "{:?}",
        report.refusal
    );
}

#[test]
fn a_10_mib_error_message_is_bounded_and_escaped() {
    let (_, err) = run_hostile("long_error", Dirs::config);
    let PluginError::Guest {
        error: kiln_plugin_host::GuestError::Failed(message),
        ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert!(
        message.len() <= kiln_plugin_host::text::MAX_GUEST_TEXT_BYTES,
        "{}",
        message.len()
    );
    assert!(
        message.starts_with(r"\u{1b}[31m\r\nerror: forged line\n"),
        "{message}"
    );
    assert!(
        message.ends_with("… [truncated, 10485760 bytes]"),
        "{message}"
    );
    let shown = err.to_string();
    assert!(
        !shown.contains(['\u{1b}', '\r', '\n']),
        "control characters reach the terminal: {shown:?}"
    );
}
