//! `kiln:operand@0.2.0`: settings, `validate-settings`, the policy's metadata in the context,
//! and `0.1.0` components still loading beside it.

use kiln_plugin_host::{
    CallInput, ChainInput, Interface, LogSource, PluginError, PluginRef, PolicyMeta, Rendered,
};
use serde_json::json;

use crate::common::{Dirs, config_map, ctx, daemonset, host_with_good};

/// The `good` guest as it was built against `kiln:operand@0.1.0` (committed: it proves that a
/// component built for the old package keeps loading, however the guest sources change).
const GOOD_0_1_0: &[u8] = include_bytes!("../fixtures/good-0.1.0.wasm");

fn settings_ref(settings: &str) -> PluginRef {
    PluginRef {
        settings: Some(settings.into()),
        ..PluginRef::named("good")
    }
}

#[test]
fn a_0_1_0_component_still_loads_and_renders() {
    let dirs = Dirs::new();
    dirs.install("good", GOOD_0_1_0);
    let host = kiln_plugin_host::PluginHost::new(dirs.config(), &[]).unwrap();
    let plugin = host.load("good", None).unwrap();
    assert_eq!(plugin.interface(), Interface::V0_1);
    assert_eq!(plugin.interface().package(), "kiln:operand@0.1.0");
    assert!(!plugin.validates_settings());
    assert!(
        plugin
            .imports()
            .iter()
            .any(|i| i == "kiln:operand/types@0.1.0"),
        "{:?}",
        plugin.imports()
    );
    let out = host
        .transform(
            "good",
            &[config_map("drop-me"), daemonset("ds")],
            &json!({}),
            &ctx(),
        )
        .unwrap();
    assert_eq!(out.rendered[0], Rendered::Omit);
    let Rendered::Keep(ds) = &out.rendered[1] else {
        panic!("kept")
    };
    assert_eq!(ds["metadata"]["labels"]["kiln.test/seen"], "device-plugin");

    // It takes no settings: giving it some is refused before it runs.
    let err = host
        .run_chain(
            &[settings_ref(r#"{"label":"x"}"#)],
            &ChainInput::new(vec![daemonset("ds")]),
            "{}",
            &ctx(),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "plugin \"good\": invalid settings: settings: the plugin implements kiln:operand@0.1.0, which takes no settings"
    );
}

#[test]
fn settings_and_policy_metadata_reach_the_plugin() {
    let dirs = Dirs::new();
    let host = host_with_good(&dirs, dirs.config());
    let plugin = host.load("good", None).unwrap();
    assert_eq!(plugin.interface(), Interface::V0_2);
    assert!(plugin.validates_settings());
    let meta = PolicyMeta::from_metadata(Some(&json!({
        "name": "cluster-policy",
        "annotations": {"z": "1", "a": "2", "n": 3}
    })));
    assert_eq!(
        meta.annotations,
        [("a".into(), "2".into()), ("z".into(), "1".into())]
    );
    let out = host
        .call_with(
            &plugin,
            &[daemonset("ds")],
            &CallInput {
                spec: "{}",
                settings: Some(r#"{"label":"pool-a"}"#),
                policy: &meta,
            },
            &ctx(),
        )
        .unwrap();
    let Rendered::Keep(ds) = &out.rendered[0] else {
        panic!("kept")
    };
    assert_eq!(ds["metadata"]["labels"]["kiln.test/setting"], "pool-a");
    assert_eq!(
        out.log.messages(LogSource::Info)[0],
        r#"policy "cluster-policy" annotations ["a", "z"]"#
    );
}

#[test]
fn bad_settings_fail_the_chain_before_any_transform_runs() {
    let dirs = Dirs::new();
    let host = host_with_good(&dirs, dirs.config());
    // The first step is fine; the second's settings are refused: nothing runs at all.
    let chain = [PluginRef::named("good"), settings_ref(r#"{"reject":1}"#)];
    let before = host.calls();
    let err = host
        .run_chain(
            &chain,
            &ChainInput::new(vec![daemonset("ds")]),
            "{}",
            &ctx(),
        )
        .unwrap_err();
    let PluginError::InvalidSettings { plugin, errors } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(plugin, "good");
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].path, "settings.reject");
    assert_eq!(
        err.to_string(),
        "plugin \"good\": invalid settings: settings.reject: refused on request"
    );
    assert_eq!(host.calls(), before, "no transform ran");
    // Settings that are not JSON the guest can read are named as the whole value.
    let err = host
        .check_settings(&host.load("good", None).unwrap(), Some("[1,"))
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("plugin \"good\": invalid settings: settings: "),
        "{err}"
    );
    // Accepted settings run.
    let out = host
        .run_chain(
            &[settings_ref(r#"{"label":"b"}"#)],
            &ChainInput::new(vec![daemonset("ds")]),
            "{}",
            &ctx(),
        )
        .unwrap();
    assert_eq!(
        out.objects[0]["metadata"]["labels"]["kiln.test/setting"],
        "b"
    );
}
