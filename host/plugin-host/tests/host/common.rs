//! Shared fixtures: the hostile `.wat` plugins, the Rust test guest, inputs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use kiln_core::context::TransformContext;
use kiln_plugin_host::{HostConfig, PluginHost};
use serde_json::{Value, json};

/// `host/plugin-host`, also when this file is included by another crate's tests (e.g.
/// `host/cli/tests/hostile.rs`).
fn crate_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-host")
}

/// A hostile fixture as a component: `tests/fixtures/<file>.wat` spliced into `shell.wat`
/// under plugin name `name`.
pub fn hostile(file: &str, name: &str) -> Vec<u8> {
    hostile_with(file, name, &[])
}

/// [`hostile`], with `@KEY@` placeholders of the core fixture replaced by `values` first.
pub fn hostile_with(file: &str, name: &str, values: &[(&str, String)]) -> Vec<u8> {
    let dir = crate_dir().join("tests/fixtures");
    let mut core = std::fs::read_to_string(dir.join(format!("{file}.wat"))).unwrap();
    for (key, value) in values {
        core = core.replace(&format!("@{key}@"), value);
    }
    let mut shell = std::fs::read_to_string(dir.join("shell.wat")).unwrap();
    let outer = values.iter().find(|(k, _)| *k == "OUTER");
    shell = shell.replace("@OUTER@", outer.map_or("", |(_, v)| v.as_str()));
    let text = shell
        .replace("@CORE@", &core)
        .replace("@NAMELEN@", &name.len().to_string())
        .replace("@NAME@", name);
    wat::parse_str(&text).unwrap_or_else(|e| panic!("{file}.wat: {e}"))
}

/// `text` as the inside of a WAT string (`"`, `\\` and non-printable bytes as `\\hh`).
pub fn wat_string(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b' '..=b'~' if b != b'"' && b != b'\\' => (b as char).to_string(),
            _ => format!("\\{b:02x}"),
        })
        .collect()
}

/// The `patch_each` fixture as plugin `name`: answers every object with the patch
/// `prefix`, `pad` bytes of `A`, `suffix`; `extra` declares more and defines `$before`.
pub fn patcher_with(name: &str, prefix: &str, pad: usize, suffix: &str, extra: &str) -> Vec<u8> {
    assert!(prefix.len() < 2048 && suffix.len() < 1024);
    hostile_with(
        "patch_each",
        name,
        &[
            ("PREFIX", wat_string(prefix)),
            ("SUFFIX", wat_string(suffix)),
            ("PREFIXLEN", prefix.len().to_string()),
            ("SUFFIXLEN", suffix.len().to_string()),
            ("PAD", pad.to_string()),
            ("PADDEDLEN", (prefix.len() + pad).to_string()),
            ("TEXTLEN", (prefix.len() + pad + suffix.len()).to_string()),
            ("EXTRA", extra.to_string()),
        ],
    )
}

/// A plugin `name` answering every object with `patch`.
pub fn patcher(name: &str, patch: &str) -> Vec<u8> {
    patcher_with(name, patch, 0, "", "(func $before)")
}

/// The WAT of `count` core modules, each with one memory of `pages` 64 KiB pages that its
/// start function writes one byte into every 4 KiB of (so that it is resident), and an
/// instance of each.
pub fn memory_modules(count: usize, pages: u32) -> String {
    let bytes = u64::from(pages) * 65536;
    (0..count)
        .map(|k| {
            format!(
                "(core module $x{k} (memory {pages}) (func $touch (local $a i32) \
                 (loop $l (i32.store8 (local.get $a) (i32.const 1)) \
                 (local.set $a (i32.add (local.get $a) (i32.const 4096))) \
                 (br_if $l (i32.lt_u (local.get $a) (i32.const {bytes}))))) (start $touch))\n\
                 (core instance (instantiate $x{k}))\n"
            )
        })
        .collect()
}

/// A plugin `name` made of `memories` core instances with one linear memory each: the
/// shell's (which answers every object with an empty patch) and `memories - 1` more of `pages`
/// 64 KiB pages, all written to (see [`memory_modules`]) when the component is instantiated.
pub fn many_memories(name: &str, memories: usize, pages: u32) -> Vec<u8> {
    let prefix = "[]";
    hostile_with(
        "patch_each",
        name,
        &[
            ("PREFIX", wat_string(prefix)),
            ("SUFFIX", String::new()),
            ("PREFIXLEN", prefix.len().to_string()),
            ("SUFFIXLEN", "0".into()),
            ("PAD", "0".into()),
            ("PADDEDLEN", prefix.len().to_string()),
            ("TEXTLEN", prefix.len().to_string()),
            ("EXTRA", "(func $before)".into()),
            ("OUTER", memory_modules(memories - 1, pages)),
        ],
    )
}

/// A standalone fixture component (`tests/fixtures/<file>.wat`).
pub fn standalone(file: &str) -> Vec<u8> {
    wat::parse_file(
        crate_dir()
            .join("tests/fixtures")
            .join(format!("{file}.wat")),
    )
    .unwrap()
}

/// The Rust std + serde_json test guest (`tests/guests/good`), built once per test run for
/// wasm32-wasip2 into `target/test-guests`.
pub fn good_wasm() -> &'static [u8] {
    static WASM: OnceLock<Vec<u8>> = OnceLock::new();
    WASM.get_or_init(|| build_guest("good"))
}

fn build_guest(name: &str) -> Vec<u8> {
    let manifest = crate_dir()
        .join("tests/guests")
        .join(name)
        .join("Cargo.toml");
    let target_dir = crate_dir().join("../../target/test-guests");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--release",
        "--quiet",
        "--target",
        "wasm32-wasip2",
        "--manifest-path",
    ])
    .arg(&manifest)
    .env("CARGO_TARGET_DIR", &target_dir);
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "RUSTC_WRAPPER",
        "CARGO_MAKEFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().expect("run cargo to build the test guest");
    assert!(
        status.success(),
        "building test guest {name} failed (is the wasm32-wasip2 target installed?)"
    );
    let artifact = format!("kiln_test_guest_{}.wasm", name.replace('-', "_"));
    std::fs::read(target_dir.join("wasm32-wasip2/release").join(artifact)).unwrap()
}

/// A scratch directory holding a drop-in dir and a cache dir.
pub struct Dirs {
    pub _root: tempfile::TempDir,
    pub drop_in: PathBuf,
    pub cache: PathBuf,
}

impl Dirs {
    pub fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let drop_in = root.path().join("plugins");
        let cache = root.path().join("cache");
        std::fs::create_dir_all(&drop_in).unwrap();
        Dirs {
            _root: root,
            drop_in,
            cache,
        }
    }

    /// Installs `bytes` as drop-in plugin `name`.
    pub fn install(&self, name: &str, bytes: &[u8]) {
        std::fs::write(self.drop_in.join(format!("{name}.wasm")), bytes).unwrap();
    }

    /// Default limits, this drop-in dir, no disk cache.
    pub fn config(&self) -> HostConfig {
        HostConfig {
            drop_in_dir: Some(self.drop_in.clone()),
            cache_dir: None,
            ..HostConfig::default()
        }
    }
}

/// A host over `dirs` with the good guest installed as drop-in `good`.
pub fn host_with_good(dirs: &Dirs, config: HostConfig) -> PluginHost {
    dirs.install("good", good_wasm());
    PluginHost::new(config, &[]).unwrap()
}

/// A minimal valid DaemonSet.
pub fn daemonset(name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": "gpu-operator", "labels": {"app": name}},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": name, "image": "nvcr.io/nvidia/x:1"}]}
            }
        }
    })
}

/// A ConfigMap without labels.
pub fn config_map(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "gpu-operator"}})
}

/// The default context for state `device-plugin`.
pub fn ctx() -> TransformContext {
    TransformContext {
        state: "device-plugin".into(),
        ..TransformContext::default()
    }
}

/// Asserts that the good guest still works on `host` (after a fault).
pub fn assert_good_works(host: &PluginHost) {
    let out = host
        .transform("good", &[daemonset("ds")], &json!({}), &ctx())
        .expect("good plugin call after a fault");
    assert_eq!(out.rendered.len(), 1);
}
