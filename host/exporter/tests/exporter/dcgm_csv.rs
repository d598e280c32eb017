//! dcgm-exporter's own metrics CSVs (`tests/data/dcp-metrics-included.csv`, the file the GPU
//! Operator mounts, and `dcgm-default-counters.csv`, both from NVIDIA/dcgm-exporter at
//! d5e5f510, the commit that renamed `Hostname`) against the H100 fixture: golden output, and
//! every field served but an allowlist that fails on unlisted and stale entries.

use std::{collections::BTreeSet, path::Path};

use kiln_exporter::{
    attribution::attribute,
    catalogue::Catalogue,
    exposition::{Format, encode},
    poller::collect,
    render::{RenderOptions, render_gpus},
    snapshot::Snapshot,
};
use kiln_gpu::{FakeBackend, GpuInventory};

use crate::{exposition::allocations, exposition::golden, fixture, parse};

/// Fields of the CSVs the H100 fixture does not serve, and why. Nothing else may be missing,
/// and everything listed must really be missing.
const NOT_SERVED: &[(&str, &str)] = &[(
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "a vGPU guest's licence state; NVML has no reading for it",
)];

fn data(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name),
    )
    .unwrap()
}

/// The CSV with every commented-out field row switched on.
fn all_rows_on(csv: &str) -> String {
    csv.lines()
        .map(|l| {
            l.strip_prefix("# ")
                .filter(|r| r.starts_with("DCGM_"))
                .unwrap_or(l)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The field names of a CSV's records.
fn names(csv: &str) -> BTreeSet<String> {
    csv.lines()
        .filter(|l| l.starts_with("DCGM_"))
        .map(|l| l.split(',').next().unwrap().trim().to_owned())
        .collect()
}

fn render(cat: &Catalogue) -> String {
    let inv = FakeBackend::from_file(&fixture()).unwrap();
    let (snap, errors) = collect(&inv, &Snapshot::default(), None);
    assert_eq!(errors, 0);
    let attribution = attribute(&allocations(), &inv.devices().unwrap(), &[]);
    let opts = RenderOptions {
        hostname: Some("node-a".into()),
        ..Default::default()
    };
    let mut out = String::new();
    encode(
        &mut out,
        Format::Text,
        render_gpus(cat, &snap, &attribution, &opts),
    )
    .unwrap();
    out
}

/// Checks that the H100 (`gpu="0"`) has a series of, or a label named after, every field of
/// `csv` except [`NOT_SERVED`], and none of those.
fn every_field_served(csv: &str, text: &str) {
    let scrape = parse(text);
    let h100: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.labels.get("gpu") == Some("0"))
        .collect();
    let served = |name: &str| {
        h100.iter()
            .any(|s| s.metric == name || s.labels.get(name).is_some())
    };
    for name in names(csv) {
        let allowed = NOT_SERVED.iter().any(|(n, _)| *n == name);
        assert_eq!(
            served(&name),
            !allowed,
            "{name}: {}",
            if allowed {
                "served but listed in NOT_SERVED (stale entry)"
            } else {
                "not served for the H100"
            }
        );
    }
    for (name, _) in NOT_SERVED {
        assert!(
            names(csv).contains(*name),
            "NOT_SERVED lists {name}, which the CSV lacks"
        );
    }
}

#[test]
fn dcp_metrics_included_is_served_whole_and_matches_golden() {
    let csv = data("dcp-metrics-included.csv");
    let cat = Catalogue::parse(&csv).unwrap();
    assert!(cat.unknown.is_empty(), "{:?}", cat.unknown);
    assert_eq!(cat.unavailable, ["DCGM_FI_DEV_VGPU_LICENSE_STATUS"]);
    let text = render(&cat);
    golden("golden-dcp-metrics-included.prom", &text);
    every_field_served(&csv, &text);
    // dcgm-exporter's other default list names the same fields.
    let other = data("dcgm-default-counters.csv");
    assert_eq!(names(&other), names(&csv));
    let other = Catalogue::parse(&other).unwrap();
    let ids = |c: &Catalogue| c.metrics.iter().map(|m| m.field.id).collect::<Vec<_>>();
    assert_eq!(ids(&other), ids(&cat));
}

#[test]
fn the_commented_rows_switched_on_are_served_too() {
    let csv = all_rows_on(&data("dcp-metrics-included.csv"));
    assert!(csv.contains("\nDCGM_FI_DEV_SYNC_BOOST_VIOLATION,"));
    let cat = Catalogue::parse(&csv).unwrap();
    assert!(cat.unknown.is_empty(), "{:?}", cat.unknown);
    assert_eq!(cat.unavailable, ["DCGM_FI_DEV_VGPU_LICENSE_STATUS"]);
    assert_eq!(
        cat.labels.len(),
        9,
        "driver and NVML versions, brand, serial, 4 infoROM, VBIOS"
    );
    let text = render(&cat);
    golden("golden-dcp-all-rows.prom", &text);
    every_field_served(&csv, &text);
    let line = text
        .lines()
        .find(|l| l.starts_with("DCGM_FI_DEV_SYNC_BOOST_VIOLATION{gpu=\"0\""))
        .unwrap();
    assert!(
        line.contains("DCGM_FI_DEV_VBIOS_VERSION=\"96.00.89.00.01\""),
        "{line}"
    );
    let t4 = text
        .lines()
        .find(|l| l.starts_with("DCGM_FI_DEV_GPU_TEMP{gpu=\"1\""))
        .unwrap();
    assert!(
        !t4.contains("VBIOS") && t4.contains("DCGM_FI_DRIVER_VERSION="),
        "{t4}"
    );
}

#[test]
fn names_kiln_does_not_know_are_skipped_not_fatal() {
    let csv = format!(
        "{}\nDCGM_FI_DEV_FUTURE_FIELD, gauge, A field of a newer DCGM.\n",
        data("dcp-metrics-included.csv")
    );
    let cat = Catalogue::parse(&csv).unwrap();
    assert_eq!(cat.unknown, ["DCGM_FI_DEV_FUTURE_FIELD"]);
    assert!(!render(&cat).contains("FUTURE"));
}
