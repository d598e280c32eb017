//! The well-behaved Rust std guest: round trip, logs, an empty environment, chaining.

use kiln_plugin_host::{
    ChainInput, GuestError, LogSource, PluginError, PluginRef, Rendered, inspect, is_allowed_import,
};
use serde_json::json;

use crate::common::*;

#[test]
fn std_guest_imports_only_the_allowed_surface() {
    let report = inspect(good_wasm()).unwrap();
    println!("imports of a std + serde_json guest for wasm32-wasip2:");
    for import in &report.imports {
        println!("  {import}");
    }
    assert!(report.accepted(), "{:?}", report.refusal);
    assert_eq!(report.name.as_deref(), Some("good"));
    assert!(
        report.imports.iter().all(|i| is_allowed_import(i)),
        "{:?}",
        report.imports
    );
    assert!(
        report
            .imports
            .iter()
            .any(|i| i.starts_with("wasi:cli/environment@"))
    );
    assert!(
        report.exports.contains(&"transform".to_string()),
        "{:?}",
        report.exports
    );
}

#[test]
fn round_trip_applies_outcomes_and_captures_the_log() {
    let dirs = Dirs::new();
    let host = host_with_good(&dirs, dirs.config());
    let objects = vec![daemonset("ds"), config_map("drop-me"), config_map("keep")];
    let out = host
        .transform("good", &objects, &json!({}), &ctx())
        .unwrap();

    let Rendered::Keep(ds) = &out.rendered[0] else {
        panic!("daemonset omitted")
    };
    assert_eq!(
        ds.pointer("/metadata/labels/kiln.test~1seen"),
        Some(&json!("device-plugin"))
    );
    assert_eq!(ds.pointer("/metadata/labels/app"), Some(&json!("ds")));
    assert_eq!(out.rendered[1], Rendered::Omit);
    let Rendered::Keep(cm) = &out.rendered[2] else {
        panic!("configmap omitted")
    };
    assert_eq!(
        cm.pointer("/metadata/labels"),
        Some(&json!({"kiln.test/seen": "device-plugin"}))
    );

    let log = &out.log;
    assert!(!log.truncated);
    assert_eq!(log.messages(LogSource::Debug), ["debug line"]);
    assert_eq!(log.messages(LogSource::Warn), ["warn line"]);
    assert_eq!(
        log.messages(LogSource::Info),
        [
            "policy \"\" annotations []",
            "state device-plugin with 3 objects",
            "env vars: 0, args: 0"
        ]
    );
    assert_eq!(log.messages(LogSource::Stdout), ["hello from stdout"]);
    assert_eq!(log.messages(LogSource::Stderr), ["hello from stderr"]);
}

#[test]
fn guest_errors_keep_their_structure_and_the_host_recovers() {
    let dirs = Dirs::new();
    let host = host_with_good(&dirs, dirs.config());
    let one = [config_map("x")];

    let err = host
        .transform("good", &one, &json!({"mode": "refuse"}), &ctx())
        .unwrap_err();
    match &err {
        PluginError::Guest {
            plugin,
            error: GuestError::InvalidField { path, message },
        } => {
            assert_eq!(
                (plugin.as_str(), path.as_str(), message.as_str()),
                ("good", "spec.mode", "refused on request")
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().starts_with("plugin \"good\""), "{err}");
    assert_good_works(&host);

    // WASI 0.2 `exit` carries only success or failure: `exit(3)` arrives as status 1.
    let err = host
        .transform("good", &one, &json!({"mode": "exit"}), &ctx())
        .unwrap_err();
    assert!(
        matches!(err, PluginError::Exited { status: 1, .. }),
        "{err:?}"
    );
    assert_good_works(&host);

    let err = host
        .transform("good", &one, &json!({"mode": "panic"}), &ctx())
        .unwrap_err();
    match &err {
        PluginError::Trap { plugin, message } => {
            assert_eq!(plugin, "good");
            assert!(message.contains("guest panicked on request"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_good_works(&host);

    let err = host
        .transform("good", &one, &json!({"mode": "count-mismatch"}), &ctx())
        .unwrap_err();
    assert!(
        matches!(
            err,
            PluginError::WrongOutcomeCount {
                expected: 1,
                actual: 0,
                ..
            }
        ),
        "{err:?}"
    );
    assert_good_works(&host);
}

#[test]
fn stdout_is_captured_under_the_cap() {
    let dirs = Dirs::new();
    let config = kiln_plugin_host::HostConfig {
        log_limit_bytes: 1000,
        ..dirs.config()
    };
    let host = host_with_good(&dirs, config);
    let out = host
        .transform(
            "good",
            &[config_map("x")],
            &json!({"mode": "chatty", "lines": 10_000}),
            &ctx(),
        )
        .unwrap();
    assert!(out.log.truncated);
    let kept: usize = out.log.lines.iter().map(|l| l.message.len()).sum();
    assert_eq!(kept, 1000);
    assert_eq!(out.log.messages(LogSource::Stdout)[0], format!("{:099}", 0));
}

#[test]
fn chain_feeds_results_forward_and_reports_omissions() {
    let dirs = Dirs::new();
    let host = host_with_good(&dirs, dirs.config());
    let digest = kiln_plugin_host::sha256_hex(good_wasm());
    let chain = [
        PluginRef::named("good"),
        PluginRef {
            name: "good".into(),
            sha256: Some(digest),
            settings: None,
        },
    ];
    let objects = vec![config_map("drop-me"), daemonset("ds")];
    let out = host
        .run_chain(&chain, &ChainInput::new(objects), "{}", &ctx())
        .unwrap();

    assert_eq!(out.objects.len(), 1);
    assert_eq!(out.objects[0].pointer("/metadata/name"), Some(&json!("ds")));
    assert_eq!(out.omitted.len(), 1);
    assert_eq!(
        (out.omitted[0].index, out.omitted[0].object.as_str()),
        (0, "ConfigMap/drop-me")
    );
    assert_eq!(out.omitted[0].plugin, "good");
    // The second plugin saw only what the first one kept.
    assert_eq!(out.logs.len(), 2);
    assert_eq!(
        out.logs[1].1.messages(LogSource::Info)[1],
        "state device-plugin with 1 objects"
    );
}

/// The virtual WASI: the wall clock reads the epoch, an hour's sleep returns at once (the
/// monotonic clock moves by the hour), there are no files and no network, and the random
/// draws are a function of the inputs: the same inputs render the same result twice, and
/// other inputs draw other values.
#[test]
fn clocks_and_random_are_virtual_and_a_function_of_the_inputs() {
    let dirs = Dirs::new();
    let host = host_with_good(&dirs, dirs.config());
    let spec = json!({"mode": "virtual-wasi"});
    let render = |spec: &serde_json::Value| {
        let out = host
            .transform("good", &[daemonset("ds")], spec, &ctx())
            .unwrap();
        let Rendered::Keep(ds) = &out.rendered[0] else {
            panic!("omitted")
        };
        ds["metadata"]["labels"].clone()
    };
    let first = render(&spec);
    println!("what a std guest sees: {first}");
    assert_eq!(first["kiln.test/wall"], json!("0"));
    assert_eq!(first["kiln.test/slept"], json!("3600"));
    assert!(
        first["kiln.test/files"]
            .as_str()
            .is_some_and(|f| !f.ends_with("entries")),
        "{first}"
    );
    assert!(first["kiln.test/net"] != json!("connected"), "{first}");
    assert_eq!(render(&spec), first, "the same inputs rendered differently");
    let other = render(&json!({"mode": "virtual-wasi", "other": 1}));
    assert_ne!(
        other["kiln.test/random"], first["kiln.test/random"],
        "other inputs drew the same random value"
    );
}
