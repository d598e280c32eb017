//! Labels from hostile hardware strings (issue 15, Why-5): every key and value GFD writes is
//! one the API server accepts; what cannot be expressed is left out.

use std::collections::BTreeMap;

use kiln_device_plugin::config::MigStrategy;
use kiln_gfd::{GpuMode, LabelInput, Labels, expressible, make_labels};
use kiln_gpu::{FakeBackend, GpuInventory};
use kiln_input::k8s::{is_label_key, is_label_value};

fn fixture(name: &str, profiles: &[&str]) -> String {
    let migs: Vec<String> = profiles
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "{{uuid: MIG-{i:08}-bbbb-cccc-dddd-eeeeeeeeeeee, gpu_instance_id: {i}, profile: {p:?}}}"
            )
        })
        .collect();
    format!(
        "driver_version: \"550.144.03\"\ncuda_version: \"12.4\"\ngpus:\n  - uuid: GPU-1\n    \
         name: {name:?}\n    memory_total_mib: 81559\n    compute_capability: \"9.0\"\n    \
         mig_enabled: {}\n    mig_devices: [{}]\n",
        !profiles.is_empty(),
        migs.join(", ")
    )
}

fn labels(fixture: &str, mig: MigStrategy) -> Labels {
    let fake = FakeBackend::new(kiln_input::yaml::from_str(fixture).unwrap());
    let input = LabelInput {
        mig_strategy: mig,
        timestamp: Some(1),
        machine: Some("-_.PowerEdge\u{1b}[31m XE9680._-\n".into()),
        pci_modes: vec![GpuMode::Compute],
        mig_memory_mib: BTreeMap::new(),
        ..LabelInput::default()
    };
    make_labels(&fake.system().unwrap(), &fake.devices().unwrap(), &input).unwrap()
}

fn assert_all_valid(l: &Labels) {
    for (k, v) in l {
        assert!(is_label_key(k), "key {k:?}");
        assert!(is_label_value(v), "{k}={v:?}");
    }
}

#[test]
fn a_ten_thousand_character_product_name_is_cut_to_63() {
    let l = labels(&fixture(&"N".repeat(10_000), &[]), MigStrategy::None);
    assert_all_valid(&l);
    assert_eq!(l["nvidia.com/gpu.product"], "N".repeat(63));
    assert_eq!(l["nvidia.com/gpu.memory"], "81559");
}

#[test]
fn leading_and_trailing_punctuation_is_trimmed() {
    let l = labels(&fixture("-_.A100 SXM._-", &[]), MigStrategy::None);
    assert_all_valid(&l);
    assert_eq!(l["nvidia.com/gpu.product"], "A100-SXM");
    assert_eq!(l["nvidia.com/gpu.machine"], "PowerEdge31m-XE9680");
}

#[test]
fn mig_keys_from_raw_profile_names_are_skipped_when_invalid() {
    let l = labels(
        &fixture(
            "NVIDIA A100",
            &["1g.10gb", "1g 10gb", "evil/x", "2g.20gb+me"],
        ),
        MigStrategy::Mixed,
    );
    assert_all_valid(&l);
    assert_eq!(l["nvidia.com/mig-1g.10gb.count"], "1");
    assert_eq!(l["nvidia.com/mig-2g.20gb.me.count"], "1");
    assert!(
        !l.keys()
            .any(|k| k.contains("10gb.count") && k.contains(' ')),
        "{l:?}"
    );
    assert!(!l.keys().any(|k| k.contains("evil")), "{l:?}");
}

#[test]
fn values_without_an_expressible_form_are_left_out() {
    let raw: Labels = [
        ("nvidia.com/a", "---"),
        ("nvidia.com/b", "ok"),
        ("nvidia.com/c", ""),
        ("nvidia.com/d", "日本"),
        ("bad key/x", "v"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let got = expressible(raw);
    assert_eq!(
        got.into_iter().collect::<Vec<_>>(),
        [
            ("nvidia.com/b".to_owned(), "ok".to_owned()),
            ("nvidia.com/c".to_owned(), String::new())
        ]
    );
}

#[test]
fn a_fixture_memory_of_2_pow_44_mib_is_an_error_not_a_missing_label() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpus.yaml");
    std::fs::write(
        &path,
        fixture("NVIDIA A100", &[]).replace("81559", &(1u64 << 44).to_string()),
    )
    .unwrap();
    let e = FakeBackend::from_file(&path).unwrap_err();
    let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(chain.contains("gpus[0].memory_total_mib"), "{chain}");
}
