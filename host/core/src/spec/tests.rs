use super::*;
use serde_json::json;

#[test]
fn upstream_sample_parses_with_null_validator_plugin() {
    // NVIDIA's sample, as the fidelity test's data holds it (one copy in the repository).
    let yaml = include_str!("../../../render/tests/data/nvidia-v26.7.0/policies/sample.yaml");
    let doc: serde_json::Value = serde_yaml_ng::from_str(yaml).unwrap();
    let spec = ClusterPolicySpec::from_json(&doc["spec"]).unwrap();
    assert_eq!(spec.mig.strategy, Some(MigStrategy::Single));
    assert_eq!(spec.validator.common.env[0].name, "WITH_WORKLOAD");
    assert_eq!(spec.validator.plugin, EnvOnlySpec::default());
    assert_eq!(spec.dcgm.common.enabled, Some(true));
    assert_eq!(spec.driver.licensing_config.nls_enabled, Some(true));
    assert_eq!(spec.runtime_class(), "nvidia");
}

#[test]
fn unknown_enum_value_names_the_field() {
    let err = ClusterPolicySpec::from_json(&json!({"mig": {"strategy": "double"}})).unwrap_err();
    assert_eq!(err.path, "spec.mig.strategy");
    assert!(
        err.message
            .starts_with("unsupported value \"double\", expected one of \"none\""),
        "{}",
        err.message
    );
    let err = ClusterPolicySpec::from_json(&json!({"driver": {"kernelModuleType": "closed"}}))
        .unwrap_err();
    assert_eq!(err.path, "spec.driver.kernelModuleType");
}

#[test]
fn a_bad_common_component_field_is_named_to_the_leaf() {
    // `enabled` and the image fields come from the flattened ComponentSpec.
    let err =
        ClusterPolicySpec::from_json(&json!({"driver": {"enabled": "yes-please"}})).unwrap_err();
    assert_eq!(err.path, "spec.driver.enabled");
    assert_eq!(err.message, "must be of type boolean, got string");
    let err =
        ClusterPolicySpec::from_json(&json!({"dcgmExporter": {"env": [{"name": 5}]}})).unwrap_err();
    assert_eq!(err.path, "spec.dcgmExporter.env[0].name");
    // A component that is not an object at all is still named as itself, without Rust names.
    let err = ClusterPolicySpec::from_json(&json!({"driver": "on"})).unwrap_err();
    assert_eq!(err.path, "spec.driver");
    let err = ClusterPolicySpec::from_json(&json!({"mig": "single"})).unwrap_err();
    assert_eq!(err.path, "spec.mig");
    assert_eq!(err.message, "must be of type object, got string");
    let err = ClusterPolicySpec::from_json_str(r#"{"mig": "single"}"#).unwrap_err();
    assert_eq!(
        (err.path.as_str(), err.message.as_str()),
        (
            "spec.mig",
            "invalid type: string \"single\", expected a map at line 1 column 16"
        )
    );
}

#[test]
fn nri_requires_cdi_and_toolkit() {
    let s =
        ClusterPolicySpec::from_json(&json!({"cdi": {"enabled": false, "nriPluginEnabled": true}}))
            .unwrap();
    assert_eq!(s.validate().unwrap_err().path, "spec.cdi.nriPluginEnabled");
    let s = ClusterPolicySpec::from_json(
        &json!({"cdi": {"nriPluginEnabled": true}, "toolkit": {"enabled": false}}),
    )
    .unwrap();
    assert!(
        s.validate()
            .unwrap_err()
            .message
            .contains("toolkit.enabled")
    );
    let s = ClusterPolicySpec::from_json(&json!({"cdi": {"nriPluginEnabled": true}})).unwrap();
    assert_eq!(s.validate(), Ok(()));
}

#[test]
fn host_paths_use_upstream_key_spelling() {
    let s = ClusterPolicySpec::from_json(
        &json!({"hostPaths": {"rootFS": "/host", "driverInstallDir": "/d"}}),
    )
    .unwrap();
    assert_eq!(s.host_paths.root_fs, "/host");
    assert_eq!(s.host_paths.driver_install_dir, "/d");
}

#[test]
fn only_a_non_default_mps_root_is_custom() {
    let mut s = ClusterPolicySpec::default();
    assert_eq!(s.device_plugin.custom_mps_root(), None);
    s.device_plugin.mps.root = Some(DEFAULT_MPS_ROOT.into());
    assert_eq!(s.device_plugin.custom_mps_root(), None);
    s.device_plugin.mps.root = Some(String::new());
    assert_eq!(s.device_plugin.custom_mps_root(), None);
    s.device_plugin.mps.root = Some("/var/mps".into());
    assert_eq!(s.device_plugin.custom_mps_root(), Some("/var/mps"));
}

#[test]
fn from_json_str_agrees_with_from_json_and_names_the_field() {
    let text = r#"{"mig": {"strategy": "mixed"}, "driver": {"enabled": false}}"#;
    let value: serde_json::Value = serde_json::from_str(text).unwrap();
    assert_eq!(
        ClusterPolicySpec::from_json_str(text).unwrap(),
        ClusterPolicySpec::from_json(&value).unwrap()
    );
    let e = ClusterPolicySpec::from_json_str(r#"{"mig": {"strategy": "double"}}"#).unwrap_err();
    assert_eq!(e.path, "spec.mig.strategy");
    assert!(e.message.starts_with("unknown variant `double`"), "{e}");
    let e = ClusterPolicySpec::from_json_str("{not json").unwrap_err();
    assert_eq!(e.path, "spec");
    assert!(e.message.starts_with("not JSON: "), "{e}");
}

#[test]
fn lists_never_decode_positionally_into_structs() {
    // Once read positionally: `gfd: [false]` disabled GFD, `startupProbe: [5, 7, 9]` set
    // three fields. The CRD's types refuse both, as the API server does.
    for (spec, path) in [
        (json!({"gfd": [false]}), "spec.gfd"),
        (
            json!({"driver": {"startupProbe": [5, 7, 9]}}),
            "spec.driver.startupProbe",
        ),
        (
            json!({"devicePlugin": {"config": ["cfg", "default"]}}),
            "spec.devicePlugin.config",
        ),
        (
            json!({"driver": {"env": [["A", "1"]]}}),
            "spec.driver.env[0]",
        ),
    ] {
        let e = ClusterPolicySpec::from_json(&spec).unwrap_err();
        assert_eq!(e.path, path, "{spec}");
        assert_eq!(e.message, "must be of type object, got array", "{spec}");
    }
}

#[test]
fn every_int_or_percent_parses_or_names_its_field() {
    let validate =
        |spec: serde_json::Value| ClusterPolicySpec::from_json(&spec).unwrap().validate();
    for bad in [
        json!("many"),
        json!("150%"),
        json!(""),
        json!("-1"),
        json!(-1),
        json!("7"),
    ] {
        let e =
            validate(json!({"driver": {"upgradePolicy": {"maxUnavailable": bad}}})).unwrap_err();
        assert_eq!(e.path, "spec.driver.upgradePolicy.maxUnavailable", "{bad}");
        assert!(
            e.message
                .starts_with("must be a non-negative integer or a percentage"),
            "{e}"
        );
    }
    for good in [json!("25%"), json!(0), json!(3), json!("100%")] {
        validate(json!({"driver": {"upgradePolicy": {"maxUnavailable": good}}})).unwrap();
    }
    for bad in ["150%", "-1", "x", "1.5"] {
        let e = validate(json!({"daemonsets": {"rollingUpdate": {"maxUnavailable": bad}}}))
            .unwrap_err();
        assert_eq!(
            e.path, "spec.daemonsets.rollingUpdate.maxUnavailable",
            "{bad}"
        );
    }
    for good in ["", "1", "10%"] {
        validate(json!({"daemonsets": {"rollingUpdate": {"maxUnavailable": good}}})).unwrap();
    }
}

#[test]
fn pull_policies_and_host_paths_are_refused_when_unusable() {
    let e = check_values(&json!({"driver": {"imagePullPolicy": "Sometimes"}})).unwrap_err();
    assert_eq!(
        e.to_string(),
        "spec.driver.imagePullPolicy: unsupported value \"Sometimes\", expected one of Always, Never, IfNotPresent"
    );
    let e =
        check_values(&json!({"validator": {"plugin": {"imagePullPolicy": "always"}}})).unwrap_err();
    assert_eq!(e.path, "spec.validator.plugin.imagePullPolicy");
    let e = check_values(&json!({"hostPaths": {"rootFS": "/host\u{0}root"}})).unwrap_err();
    assert_eq!(e.path, "spec.hostPaths.rootFS");
    assert!(e.message.contains("control character"), "{e}");
    check_values(
        &json!({"driver": {"imagePullPolicy": "Always"}, "toolkit": {"imagePullPolicy": ""},
                         "hostPaths": {"rootFS": "/host"}}),
    )
    .unwrap();
}
