//! Sandbox budgets per call, not per memory: a component's memories and tables share one cap,
//! their number is bounded at load, and a hostile plugin fails alone.

use std::time::Duration;

use kiln_plugin_host::{HostConfig, PluginError};
use serde_json::json;

use crate::common::*;

/// What the 63-memory component exceeds: (bound, has, limit).
const HOG_BOUNDS: [(&str, u64, u64); 3] = [
    ("memories", 63, 4),
    ("core instances", 63, 48),
    ("bytes of initial memory", 4_160_815_104, 67_108_864),
];
const HOG_MESSAGE: &str = "plugin \"hog\": the component is over several bounds: 63 memories (limit 4), \
     63 core instances (limit 48), 4160815104 bytes of initial memory (limit 67108864)";

#[test]
fn a_component_with_63_memories_is_refused_at_load_and_others_keep_running() {
    let dirs = Dirs::new();
    dirs.install("hog", &many_memories("hog", 63, 1024));
    let host = host_with_good(&dirs, dirs.config());
    std::thread::scope(|s| {
        let good: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    for _ in 0..5 {
                        assert_good_works(&host);
                    }
                })
            })
            .collect();
        for _ in 0..5 {
            let err = host
                .transform("hog", &[daemonset("ds")], &json!({}), &ctx())
                .unwrap_err();
            // Every exceeded bound at once, before compiling.
            match &err {
                PluginError::ComponentLimit { plugin, exceeded } => {
                    assert_eq!(plugin, "hog");
                    let found: Vec<_> = exceeded
                        .iter()
                        .map(|b| (b.what, b.actual, b.limit))
                        .collect();
                    assert_eq!(found, HOG_BOUNDS);
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(err.to_string(), HOG_MESSAGE);
        }
        for g in good {
            g.join().unwrap();
        }
    });
    assert_eq!(
        kiln_plugin_host::inspect_as(&many_memories("hog", 63, 1024), "hog")
            .unwrap()
            .refusal
            .map(|e| e.to_string()),
        Some(HOG_MESSAGE.into())
    );
}

#[test]
fn all_memories_of_a_call_share_one_cap() {
    // Three extra memories of 24 MiB each: each under the 64 MiB cap, together over it, which
    // their initial sizes already show: refused at load, before compiling.
    let dirs = Dirs::new();
    dirs.install("four", &many_memories("four", 4, 384));
    let host = host_with_good(&dirs, dirs.config());
    let err = host
        .transform("four", &[daemonset("ds")], &json!({}), &ctx())
        .unwrap_err();
    assert!(
        matches!(&err, PluginError::ComponentLimit { plugin, exceeded } if plugin == "four"
            && exceeded.len() == 1
            && (exceeded[0].what, exceeded[0].actual, exceeded[0].limit)
                == ("bytes of initial memory", 3 * (24 << 20) + 65536, 67_108_864)),
        "{err:?}"
    );
    // Two fit (48 MiB and the shell's memory).
    dirs.install("three", &many_memories("three", 3, 384));
    let out = host
        .transform("three", &[daemonset("ds")], &json!({}), &ctx())
        .unwrap();
    assert_eq!(out.rendered.len(), 1);
    assert_good_works(&host);
}

#[test]
fn an_oversized_component_is_refused_before_compiling() {
    let dirs = Dirs::new();
    let bytes = hostile("trap", "big");
    dirs.install("big", &bytes);
    let host = host_with_good(
        &dirs,
        HostConfig {
            max_component_bytes: 100,
            cache_dir: Some(dirs.cache.clone()),
            ..dirs.config()
        },
    );
    let err = host.load("big", None).unwrap_err();
    match &err {
        PluginError::ComponentLimit { exceeded, .. } => assert_eq!(
            exceeded
                .iter()
                .map(|b| (b.what, b.actual, b.limit))
                .collect::<Vec<_>>(),
            [("bytes", bytes.len() as u64, 100)]
        ),
        other => panic!("{other:?}"),
    }
    // Refused before compiling: nothing was cached.
    assert_eq!(std::fs::read_dir(&dirs.cache).unwrap().count(), 0);
}

#[test]
fn a_compile_past_its_deadline_fails_the_load() {
    let dirs = Dirs::new();
    let host = host_with_good(
        &dirs,
        HostConfig {
            compile_deadline: Duration::from_nanos(1),
            ..dirs.config()
        },
    );
    let err = host.load("good", None).unwrap_err();
    assert!(
        matches!(&err, PluginError::CompileTimeout { plugin, deadline } if plugin == "good" && *deadline == Duration::from_nanos(1)),
        "{err:?}"
    );
}
