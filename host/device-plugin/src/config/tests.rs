use std::time::Duration;

use super::*;

fn err(text: &str) -> ConfigError {
    Config::from_yaml(text).expect_err(text)
}

#[test]
fn time_slicing_with_five_replicas_is_the_shared_resource() {
    let cfg = Config::from_yaml(
        "version: v1\nflags: {migStrategy: none}\nsharing:\n  timeSlicing:\n    \
         resources: [{name: gpu, replicas: 5}]\n",
    )
    .unwrap();
    let s = cfg.sharing();
    assert_eq!(s.strategy, SharingStrategy::TimeSlicing);
    assert_eq!(s.strategy.as_str(), "time-slicing");
    assert_eq!(s.replicas("nvidia.com/gpu"), 5);
    assert_eq!(s.replicas("gpu"), 5);
    assert_eq!(s.replicas("nvidia.com/mig-1g.10gb"), 1);
    assert_eq!(s.advertised_name("nvidia.com/gpu"), "nvidia.com/gpu");
    assert!(!s.get(GPU_RESOURCE).unwrap().is_renamed());
    assert!(!s.fail_requests_greater_than_one);
    assert_eq!(cfg.flags.mig_strategy, Some(MigStrategy::None));
}

#[test]
fn rename_by_default_advertises_dot_shared_and_ignores_explicit_rename() {
    let cfg = Config::from_yaml(
        "sharing:\n  timeSlicing:\n    renameByDefault: true\n    failRequestsGreaterThanOne: true\n    \
         resources: [{name: nvidia.com/gpu, replicas: 2, rename: custom, devices: all}]\n",
    )
    .unwrap();
    let s = cfg.sharing();
    assert_eq!(s.advertised_name("gpu"), "nvidia.com/gpu.shared");
    assert!(s.get("gpu").unwrap().is_renamed());
    assert!(s.fail_requests_greater_than_one);
}

#[test]
fn empty_document_is_the_default_config_without_sharing() {
    let cfg = Config::from_yaml("").unwrap();
    assert_eq!(cfg.version.as_deref(), Some("v1"));
    assert_eq!(cfg.sharing(), Sharing::default());
    assert_eq!(cfg.sharing().strategy.as_str(), "none");
    assert_eq!(cfg.sharing().replicas("gpu"), 1);
}

#[test]
fn mps_forces_fail_requests_greater_than_one() {
    let cfg = Config::from_yaml("sharing: {mps: {resources: [{name: gpu, replicas: 3}]}}").unwrap();
    let s = cfg.sharing();
    assert_eq!(s.strategy, SharingStrategy::Mps);
    assert!(s.fail_requests_greater_than_one);
}

#[test]
fn unknown_keys_are_rejected_with_their_path() {
    // Issue #1433: renameByDefault under flags was silently ignored upstream.
    let e = err("flags:\n  renameByDefault: true\n");
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.starts_with("flags.renameByDefault: unknown field `renameByDefault`"),
        "{text}"
    );

    let e =
        err("sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2, replica: 3}]\n");
    assert!(
        e.to_string()
            .starts_with("sharing.timeSlicing.resources[0].replica: unknown field `replica`"),
        "{e}"
    );
}

#[test]
fn upstream_error_strings_with_paths() {
    let cases = [
        ("version: v2", "version", "unknown version: v2"),
        (
            "sharing: {timeSlicing: {}}",
            "sharing.timeSlicing.resources",
            "no resources specified",
        ),
        (
            "sharing: {timeSlicing: {resources: []}}",
            "sharing.timeSlicing.resources",
            "no resources specified",
        ),
        (
            "sharing: {timeSlicing: {resources: [{replicas: 2}]}}",
            "sharing.timeSlicing.resources[0].name",
            "no resource name specified",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu}]}}",
            "sharing.timeSlicing.resources[0].replicas",
            "no replicas specified",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}",
            "sharing.timeSlicing.resources[0].replicas",
            "number of replicas must be >= 2",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: some}]}}",
            "sharing.timeSlicing.resources[0].devices",
            "devices set as 'some' but the only valid string input is 'all'",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: 0}]}}",
            "sharing.timeSlicing.resources[0].devices",
            "devices set as '0' but a count of devices must be > 0",
        ),
        (
            "resources: {gpus: [{name: gpu}]}",
            "resources.gpus[0]",
            "resources must have a 'pattern' field set",
        ),
        (
            "imex: {channelIDs: [1, 2]}",
            "imex.channelIDs",
            "invalid IMEX config: channelIDs must be [] or [0]; found [1 2]",
        ),
    ];
    for (text, path, message) in cases {
        let e = err(text);
        assert!(matches!(e, ConfigError::Invalid { .. }), "{text}: {e:?}");
        assert_eq!(e.to_string(), format!("{path}: {message}"), "{text}");
        assert_eq!(e.message(), message);
    }
}

#[test]
fn resource_names_follow_upstream_rules() {
    let long = "a".repeat(60);
    let e = err(&format!(
        "sharing: {{timeSlicing: {{resources: [{{name: {long}, replicas: 2}}]}}}}"
    ));
    assert_eq!(
        e.message(),
        format!("fully-qualified resource name must be 63 characters or less: nvidia.com/{long}")
    );
    let e = err("sharing: {timeSlicing: {resources: [{name: example.com/gpu, replicas: 2}]}}");
    assert!(
        e.message()
            .starts_with("incorrect format for resource name 'nvidia.com/example.com/gpu': ["),
        "{e}"
    );
}

#[test]
fn both_sharing_kinds_together_are_rejected() {
    let e = err(
        "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}, \
         mps: {resources: [{name: gpu, replicas: 2}]}}",
    );
    assert!(e.to_string().starts_with("sharing: "), "{e}");
}

#[test]
fn strategies_parse_as_string_or_list_with_upstream_errors() {
    let cfg = Config::from_yaml("flags: {plugin: {deviceListStrategy: volume-mounts}}").unwrap();
    assert_eq!(
        cfg.flags.plugin.device_list_strategy,
        Some(vec![DeviceListStrategy::VolumeMounts])
    );
    let cfg = Config::from_yaml(
        "flags: {plugin: {deviceListStrategy: [cdi-cri, envvar], deviceIDStrategy: index}}",
    )
    .unwrap();
    assert_eq!(
        cfg.flags.plugin.device_list_strategy,
        Some(vec![DeviceListStrategy::Envvar, DeviceListStrategy::CdiCri])
    );
    assert_eq!(
        cfg.flags.plugin.device_id_strategy,
        Some(DeviceIdStrategy::Index)
    );
    let e = err("flags: {plugin: {deviceListStrategy: [envvar, bogus]}}");
    assert!(
        e.to_string().starts_with(
            "flags.plugin.deviceListStrategy: invalid --device-list-strategy option: invalid strategy: bogus"
        ),
        "{e}"
    );
    let e = err("flags: {plugin: {deviceListStrategy: 3}}");
    assert!(
        e.message().starts_with("invalid deviceListStrategy: "),
        "{e}"
    );
    let e = err("flags: {migStrategy: weird}");
    assert!(
        e.to_string()
            .starts_with("flags.migStrategy: unknown MIG strategy: weird"),
        "{e}"
    );
    assert_eq!(
        "uuids".parse::<DeviceIdStrategy>().unwrap_err(),
        "invalid --device-id-strategy option: uuids"
    );
    assert_eq!(
        DeviceListStrategy::parse_list("envvar, cdi-annotations,envvar").unwrap(),
        vec![
            DeviceListStrategy::Envvar,
            DeviceListStrategy::CdiAnnotations
        ]
    );
}

#[test]
fn gfd_sleep_interval_accepts_go_durations_numbers_and_infinite() {
    let parse = |v: &str| {
        Config::from_yaml(&format!("flags: {{gfd: {{sleepInterval: {v}}}}}"))
            .map(|c| c.flags.gfd.sleep_interval.unwrap())
    };
    assert_eq!(
        parse("60s").unwrap(),
        SleepInterval::Every(Duration::from_secs(60))
    );
    assert_eq!(
        parse("1m30s").unwrap(),
        SleepInterval::Every(Duration::from_secs(90))
    );
    assert_eq!(
        parse("1500000000").unwrap(),
        SleepInterval::Every(Duration::from_millis(1500))
    );
    assert_eq!(parse("infinite").unwrap(), SleepInterval::Infinite);
    assert!(parse("soon").is_err());
    // No busy loop: below 1 s is refused, as text and as nanoseconds.
    assert_eq!(
        parse("0s").unwrap_err().to_string(),
        "flags.gfd.sleepInterval: invalid sleepInterval: 0ns is shorter than the minimum 1s"
    );
    assert!(parse("999ms").is_err() && parse("0").is_err());
    assert_eq!(
        parse("1s").unwrap(),
        SleepInterval::Every(Duration::from_secs(1))
    );
}

#[test]
fn from_file_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    assert!(matches!(
        Config::from_file(&path),
        Err(ConfigError::Read { .. })
    ));
    std::fs::write(&path, "version: v9\n").unwrap();
    let e = Config::from_file(&path).unwrap_err();
    assert!(e.to_string().contains("config.yaml"), "{e}");
    assert_eq!(e.message(), "unknown version: v9");
}

/// Hostile input (`kiln_input`'s rules): every case an error naming the field, none a
/// panic, an OOM or a silent truncation.
#[test]
fn out_of_range_values_are_errors_naming_the_field() {
    let ts = |replicas: &str| {
        format!("sharing: {{timeSlicing: {{resources: [{{name: gpu, replicas: {replicas}}}]}}}}")
    };
    let cases = [
        (
            "flags: {gfd: {sleepInterval: 99999999999999999999999h}}".to_owned(),
            "flags.gfd.sleepInterval",
            "invalid sleepInterval: duration 99999999999999999999999h is longer than the maximum 8784h",
        ),
        (
            "flags: {gfd: {sleepInterval: 18446744073709551615}}".to_owned(),
            "flags.gfd.sleepInterval",
            "invalid sleepInterval: duration 18446744073709551615ns is longer than the maximum 8784h",
        ),
        (
            "flags: {gfd: {sleepInterval: -5s}}".to_owned(),
            "flags.gfd.sleepInterval",
            "invalid sleepInterval: time: invalid duration \"-5s\" (negative)",
        ),
        (
            ts("100000000"),
            "sharing.timeSlicing.resources[0].replicas",
            "number of replicas must be <= 1024 (got 100000000)",
        ),
        (
            ts("4294967296"),
            "sharing.timeSlicing.resources[0].replicas",
            "number of replicas must be <= 1024 (got 4294967296)",
        ),
        (
            ts("1025"),
            "sharing.timeSlicing.resources[0].replicas",
            "number of replicas must be <= 1024 (got 1025)",
        ),
    ];
    for (text, path, message) in cases {
        let e = err(&text);
        assert_eq!(e.to_string(), format!("{path}: {message}"), "{text}");
    }
    // Past i64, YAML reads the digits as a float (as the API server's go-yaml does), which a
    // count refuses by type.
    assert_eq!(
        err(&ts("99999999999999999999999")).to_string(),
        "sharing.timeSlicing.resources[0].replicas: invalid type: floating point `1e+23`, expected i64"
    );
    let cfg = Config::from_yaml(&ts("1024")).unwrap();
    assert_eq!(cfg.sharing().replicas("gpu"), 1024);
    assert_eq!(
        cfg.sharing().replicas("gpu") as i64,
        MAX_REPLICAS,
        "the documented maximum is accepted"
    );
}

#[test]
fn duplicate_keys_and_deep_nesting_are_refused() {
    let e = err("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}\nsharing: {}\n");
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("sharing: duplicate key `sharing`"),
        "{e}"
    );
    let deep = format!("flags: {}1{}", "{a: ".repeat(100_000), "}".repeat(100_000));
    let e = err(&deep);
    assert!(
        e.to_string().contains("nested deeper than 64 levels"),
        "{e}"
    );
}

#[test]
fn files_must_exist_be_regular_and_small() {
    let e = Config::from_file(Path::new("/nonexistent/config.yaml")).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }), "{e:?}");
    assert!(
        anyhow_like(&e).contains("/nonexistent/config.yaml: cannot read"),
        "{e:?}"
    );
    let e = Config::from_file(Path::new("/dev/urandom")).unwrap_err();
    assert!(
        anyhow_like(&e).contains("/dev/urandom: not a regular file (character device)"),
        "{e:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.yaml");
    std::fs::write(&big, format!("# {}\n", "x".repeat(1 << 20))).unwrap();
    let e = Config::from_file(&big).unwrap_err();
    assert!(
        anyhow_like(&e).contains("larger than 1048576 bytes"),
        "{e:?}"
    );
}

/// `e` and its sources joined by `: ` (what `{:#}` of anyhow prints).
fn anyhow_like(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

#[test]
fn lists_never_stand_for_objects_and_empty_strategy_lists_name_the_field() {
    // A list where an object is due was once read positionally (`timeSlicing: [true, true,
    // [...]]` served 16 shared devices).
    for (text, path) in [
        (
            "sharing: {timeSlicing: [true, true, [{name: gpu, replicas: 16}]]}",
            "sharing.timeSlicing",
        ),
        ("sharing: [[true, true, []]]", "sharing"),
        ("flags: [none]", "flags"),
        (
            "sharing: {timeSlicing: {resources: [[gpu, 16]]}}",
            "sharing.timeSlicing.resources[0]",
        ),
    ] {
        let e = err(text);
        assert!(
            e.to_string()
                .starts_with(&format!("{path}: invalid type: sequence, expected a map")),
            "{text}: {e}"
        );
    }
    let e = err("flags: {plugin: {deviceListStrategy: []}}");
    assert!(
        e.to_string().starts_with(
            "flags.plugin.deviceListStrategy: invalid deviceListStrategy: an empty list"
        ),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, "flags: {plugin: {deviceListStrategy: []}}\n").unwrap();
    let e = Config::from_file(&path).unwrap_err();
    let chain = format!("{:#}", anyhow::Error::from(e));
    assert!(
        chain.contains("config.yaml") && chain.contains("flags.plugin.deviceListStrategy"),
        "{chain}"
    );
}
