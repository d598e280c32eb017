//! Hostile inputs (issue 15, Why-5 and Why-6): agent configs, flags, env vars, fixture files and
//! policy files that used to panic, exhaust memory, be silently ignored or mis-reported. Every
//! one is now an error naming the file (or flag/env var) and the field; plus a property test
//! over mutated sample policies through `kiln render`'s library path.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

use kiln_render::{Policy, Renderer};
use proptest::prelude::*;
use serde_json::Value;

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

/// The sample ClusterPolicy (`deploy/samples/clusterpolicy.yaml`, copied).
const SAMPLE: &str = include_str!("data/clusterpolicy.yaml");

fn kiln(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(KILN);
    c.args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KILN_LOG", "warn")
        .env("HOME", std::env::temp_dir());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts a clean failure: exit code `code` (1 for errors, 2 for clap's flag errors), no
/// panic, and every `needle` in stderr.
fn assert_fails(o: &Output, code: i32, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "missing {n:?} in: {err}");
    }
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Self {
        let f = Files {
            dir: tempfile::tempdir().unwrap(),
        };
        f.write("gpus.yaml", kiln_gpu::fixtures::ONE_H100);
        f
    }

    fn write(&self, name: &str, text: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    fn backend(&self) -> String {
        format!("fake:{}", self.path("gpus.yaml").display())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

const HUGE: &str = "99999999999999999999999h";

#[test]
fn gfd_refuses_a_huge_sleep_interval_from_file_flag_and_env() {
    let f = Files::new();
    let be = f.backend();
    let cfg = f.write(
        "config.yaml",
        &format!("version: v1\nflags:\n  gfd:\n    sleepInterval: {HUGE}\n"),
    );
    let base = [
        "gfd",
        "--oneshot",
        "--output",
        "stdout",
        "--gpu-backend",
        &be,
    ];
    let o = kiln(&[&base[..], &["--config-file", &cfg]].concat(), &[]);
    assert_fails(
        &o,
        1,
        &[
            &cfg,
            "flags.gfd.sleepInterval",
            "longer than the maximum 8784h",
        ],
    );
    let o = kiln(&[&base[..], &["--sleep-interval", HUGE]].concat(), &[]);
    assert_fails(
        &o,
        2,
        &["--sleep-interval", "longer than the maximum 8784h"],
    );
    let o = kiln(&base, &[("GFD_SLEEP_INTERVAL", HUGE)]);
    assert_fails(
        &o,
        2,
        &["--sleep-interval", "longer than the maximum 8784h"],
    );
    // In range, it runs and labels.
    let o = kiln(&[&base[..], &["--sleep-interval", "8784h"]].concat(), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3")
    );
}

#[test]
fn the_device_plugin_refuses_out_of_range_config_values() {
    let f = Files::new();
    let be = f.backend();
    let sock = f.path("plugins");
    std::fs::create_dir(&sock).unwrap();
    let sock = sock.display().to_string();
    let run = |cfg: &str| {
        kiln(
            &[
                "device-plugin",
                "--gpu-backend",
                &be,
                "--config-file",
                cfg,
                "--kubelet-socket",
                "",
                "--plugin-dir",
                &sock,
                "--driver-ready-file",
                "",
            ],
            &[],
        )
    };
    let cfg = f.write(
        "sleep.yaml",
        &format!("flags: {{gfd: {{sleepInterval: {HUGE}}}}}\n"),
    );
    assert_fails(
        &run(&cfg),
        1,
        &[&cfg, "flags.gfd.sleepInterval", "longer than the maximum"],
    );
    for replicas in ["100000000", "4294967296"] {
        let cfg = f.write(
            &format!("r{replicas}.yaml"),
            &format!(
                "sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: {replicas}\n"
            ),
        );
        assert_fails(
            &run(&cfg),
            1,
            &[
                &cfg,
                "sharing.timeSlicing.resources[0].replicas",
                &format!("number of replicas must be <= 1024 (got {replicas})"),
            ],
        );
    }
    assert_fails(&run("/nonexistent"), 1, &["/nonexistent: cannot read"]);
    let o = kiln(
        &[
            "device-plugin",
            "--gpu-backend",
            &be,
            "--health-interval-ms",
            "99999999999999999999",
        ],
        &[],
    );
    assert_fails(&o, 2, &["--health-interval-ms"]);
}

#[test]
fn missing_config_files_and_non_regular_fixtures_are_errors() {
    let f = Files::new();
    let be = f.backend();
    let o = kiln(
        &[
            "gfd",
            "--oneshot",
            "--output",
            "stdout",
            "--gpu-backend",
            &be,
            "--config-file",
            "/nonexistent",
        ],
        &[],
    );
    assert_fails(&o, 1, &["/nonexistent: cannot read"]);
    let o = kiln(
        &[
            "gfd",
            "--oneshot",
            "--output",
            "stdout",
            "--gpu-backend",
            &be,
        ],
        &[("CONFIG_FILE", "/nonexistent")],
    );
    assert_fails(&o, 1, &["/nonexistent: cannot read"]);
    for agent in [
        &["gfd", "--oneshot", "--output", "stdout"][..],
        &["device-plugin"][..],
    ] {
        let o = kiln(
            &[agent, &["--gpu-backend", "fake:/dev/urandom"]].concat(),
            &[],
        );
        assert_fails(
            &o,
            1,
            &["/dev/urandom: not a regular file (character device)"],
        );
    }
    let big = f.write("big.yaml", &format!("# {}\n", "x".repeat(2 << 20)));
    let o = kiln(
        &[
            "gfd",
            "--oneshot",
            "--output",
            "stdout",
            "--gpu-backend",
            &format!("fake:{big}"),
        ],
        &[],
    );
    assert_fails(&o, 1, &[&big, "larger than 1048576 bytes"]);
}

/// `kiln render --policy <text>`: the error, which must fail with exit 1.
fn render_error(f: &Files, name: &str, text: &str) -> String {
    let p = f.write(name, text);
    let o = kiln(&["render", "--policy", &p], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains(&p), "the error names the file: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn policy_files_refuse_duplicates_deep_nesting_bad_identity_and_bad_names() {
    let f = Files::new();
    let dup = format!("{SAMPLE}\n  driver: {{}}\n");
    let err = render_error(&f, "dup.yaml", &dup);
    assert!(err.contains("spec.driver: duplicate key `driver`"), "{err}");

    let n = 100_000;
    let deep = format!(
        "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nspec: {}1{}\n",
        "{a: ".repeat(n),
        "}".repeat(n)
    );
    let err = render_error(&f, "deep.yaml", &deep);
    assert!(err.contains("nested deeper than 64 levels"), "{err}");

    let api = SAMPLE.replace("apiVersion: nvidia.com/v1", "apiVersion: 12345");
    let err = render_error(&f, "api.yaml", &api);
    assert!(
        err.contains("apiVersion: expected nvidia.com/v1, got 12345 (a number, not a string)"),
        "{err}"
    );

    let name = SAMPLE.replace("name: cluster-policy", "name: \"cluster\\u0007policy\"");
    let err = render_error(&f, "name.yaml", &name);
    assert!(
        err.contains("metadata.name: \"cluster\\u{7}policy\" is not"),
        "{err}"
    );

    let o = kiln(&["render", "--policy", "/dev/urandom"], &[]);
    assert_fails(&o, 1, &["/dev/urandom: not a regular file"]);
}

#[test]
fn policy_files_are_as_strict_as_the_api_server() {
    let f = Files::new();
    // A list where an object is due is refused, not read positionally (`gfd: [false]` once
    // disabled GFD); a leading byte order mark is skipped, not "more than one document".
    let gfd = SAMPLE.replace("  gfd:\n    enabled: true\n", "  gfd: [false]\n");
    assert_ne!(gfd, SAMPLE);
    let err = render_error(&f, "gfd.yaml", &format!("\u{feff}{gfd}"));
    assert!(
        err.contains("spec.gfd: must be of type object, got array"),
        "{err}"
    );
    let max = SAMPLE.replace(
        "      maxParallelUpgrades: 1\n",
        "      maxParallelUpgrades: 1\n      maxUnavailable: 150%\n",
    );
    assert_ne!(max, SAMPLE);
    let err = render_error(&f, "max.yaml", &max);
    assert!(
        err.contains(
            "spec.driver.upgradePolicy.maxUnavailable: must be a non-negative integer or a \
             percentage from 0% to 100% (e.g. 25%), got \"150%\""
        ),
        "{err}"
    );
    assert!(err.len() < 400, "{err}");
}

// ---- property test: mutated sample policies through the render library path ----

/// One renderer (plugins compiled once) for every case.
fn renderer() -> &'static Renderer {
    static R: OnceLock<Renderer> = OnceLock::new();
    R.get_or_init(|| {
        let cfg = kiln_plugin_host::HostConfig {
            drop_in_dir: None,
            ..Default::default()
        };
        let host = kiln_plugin_host::PluginHost::new(cfg, kiln_bundled_plugins::BUNDLED)
            .unwrap()
            .with_bundled_digests(kiln_bundled_plugins::BUNDLED_SHA256);
        Renderer::new(std::sync::Arc::new(host))
    })
}

fn sample() -> &'static Value {
    static V: OnceLock<Value> = OnceLock::new();
    V.get_or_init(|| kiln_input::yaml::to_value(SAMPLE).unwrap())
}

/// JSON pointers of every node of the sample (the mutation targets).
fn pointers() -> &'static [String] {
    static P: OnceLock<Vec<String>> = OnceLock::new();
    P.get_or_init(|| {
        fn walk(v: &Value, at: String, out: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    for (k, c) in m {
                        walk(
                            c,
                            format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                            out,
                        );
                    }
                }
                Value::Array(a) => {
                    for (i, c) in a.iter().enumerate() {
                        walk(c, format!("{at}/{i}"), out);
                    }
                }
                _ => {}
            }
            out.push(at);
        }
        let mut out = Vec::new();
        walk(sample(), String::new(), &mut out);
        out
    })
}

/// What replaces a node.
#[derive(Debug, Clone)]
enum Mutation {
    Delete,
    Replace(Value),
    /// Nested arrays this deep (over the limit from 65 on).
    Nest(usize),
}

fn replacement() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        Just(Mutation::Delete),
        Just(Mutation::Replace(Value::Null)),
        any::<bool>().prop_map(|b| Mutation::Replace(Value::Bool(b))),
        prop_oneof![
            Just(u64::MAX),
            Just(1u64 << 53),
            Just(4_294_967_296u64),
            any::<u64>()
        ]
        .prop_map(|n| Mutation::Replace(n.into())),
        any::<i64>().prop_map(|n| Mutation::Replace(n.into())),
        prop_oneof![Just(1e300f64), Just(-0.5f64), Just(f64::MIN_POSITIVE)]
            .prop_map(|x| Mutation::Replace(x.into())),
        (1usize..100_000).prop_map(|n| Mutation::Replace("x".repeat(n).into())),
        prop::collection::vec(0u32..0x80, 1..40).prop_map(|cs| {
            Mutation::Replace(Value::String(
                cs.into_iter().filter_map(char::from_u32).collect(),
            ))
        }),
        Just(Mutation::Replace(Value::Object(Default::default()))),
        Just(Mutation::Replace(Value::Array(Vec::new()))),
        Just(Mutation::Replace("nvidia\u{7}\n\u{1b}[31m".into())),
        (1usize..120).prop_map(Mutation::Nest),
    ]
}

fn apply(doc: &mut Value, pointer: &str, m: &Mutation) {
    if pointer.is_empty() {
        *doc = match m {
            Mutation::Delete => Value::Null,
            Mutation::Replace(v) => v.clone(),
            Mutation::Nest(n) => nest(*n),
        };
        return;
    }
    let (parent, last) = pointer.rsplit_once('/').unwrap();
    let Some(p) = doc.pointer_mut(parent) else {
        return; // removed by an earlier mutation
    };
    let key = last.replace("~1", "/").replace("~0", "~");
    match (p, m) {
        (Value::Object(o), Mutation::Delete) => {
            o.remove(&key);
        }
        (Value::Array(a), Mutation::Delete) => {
            if let Ok(i) = key.parse::<usize>()
                && i < a.len()
            {
                a.remove(i);
            }
        }
        (p, m) => {
            if let Some(slot) = p.pointer_mut(&format!("/{last}")) {
                *slot = match m {
                    Mutation::Replace(v) => v.clone(),
                    Mutation::Nest(n) => nest(*n),
                    Mutation::Delete => unreachable!(),
                };
            }
        }
    }
}

fn nest(n: usize) -> Value {
    (0..n).fold(Value::Null, |v, _| Value::Array(vec![v]))
}

/// True when a policy error names where it is: a field path, or the document as a whole.
fn names_a_field(e: &str) -> bool {
    [
        "apiVersion",
        "kind",
        "metadata",
        "spec",
        "not a Kubernetes object",
    ]
    .iter()
    .any(|p| e.starts_with(p))
}

/// One mutated policy through the library path of `kiln render`: load, parse, render.
fn check(text: &str) -> Result<(), TestCaseError> {
    let doc = match kiln_input::yaml::to_value(text) {
        Ok(doc) => doc,
        Err(e) => {
            prop_assert!(!e.path.is_empty() && !e.message.is_empty(), "{e}");
            return Ok(());
        }
    };
    let policy = match Policy::from_object(&doc) {
        Ok(p) => p,
        Err(e) => {
            let e = e.to_string();
            prop_assert!(names_a_field(&e), "policy error names no field: {e}");
            return Ok(());
        }
    };
    let ctx = kiln_render::defaults::render_context();
    for (state, result) in renderer().render(&policy, &ctx) {
        if let Err(e) = result {
            // A standard plugin may refuse a value (a transform error); it must not crash.
            let text = e.to_string();
            prop_assert!(
                !(text.contains("trapped")
                    || text.contains("exited with status")
                    || text.contains("exhausted its stack")),
                "state {state}: a standard plugin crashed: {text}"
            );
        }
    }
    Ok(())
}

proptest! {
    // ~100 ms a case in a debug build (YAML round trip, parse, 11 states rendered in Wasm).
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn mutated_policies_never_panic_and_errors_name_a_field(
        muts in prop::collection::vec((any::<prop::sample::Index>(), replacement()), 1..5)
    ) {
        let mut doc = sample().clone();
        for (idx, m) in &muts {
            let ptrs = pointers();
            apply(&mut doc, &ptrs[idx.index(ptrs.len())], m);
        }
        let text = serde_yaml_ng::to_string(&doc).unwrap();
        check(&text)?;
    }

    #[test]
    fn text_level_mutations_never_panic(
        cut in any::<prop::sample::Index>(),
        insert in prop_oneof![
            Just("\n  driver: {}\n".to_owned()),
            Just("\nspec: {}\n".to_owned()),
            Just("\u{0}".to_owned()),
            Just("{[".repeat(50)),
            Just("&a [*a]".to_owned()),
            Just("\t".to_owned()),
            Just("!!binary AAAA".to_owned()),
            Just("\n---\n".to_owned()),
        ],
    ) {
        let at = cut.index(SAMPLE.len());
        let at = (0..=at).rev().find(|&i| SAMPLE.is_char_boundary(i)).unwrap_or(0);
        let text = format!("{}{insert}{}", &SAMPLE[..at], &SAMPLE[at..]);
        check(&text)?;
    }
}

#[test]
fn the_sample_itself_renders_through_the_same_path() {
    let policy = Policy::from_object(sample()).unwrap();
    let ctx = kiln_render::defaults::render_context();
    let results = renderer().render(&policy, &ctx);
    assert!(results.len() > 5);
    for (state, r) in results {
        assert!(r.is_ok(), "{state}: {:?}", r.err());
    }
    assert!(Path::new(KILN).exists());
}
