//! Builds the standard plugins under `plugins/` for wasm32-wasip2 as one component, the
//! standard bundle (`plugins/bundle`), and generates `BUNDLED`: every plugin's name with the
//! bundle's bytes.
//!
//! The nested cargo uses its own target directory (`<workspace>/target/plugins`) so it never
//! waits on the outer build's lock, and runs without the outer build's flags and wrappers.
//!
//! Progress: the nested build's lines go to this script's stderr as they come (`cargo build
//! -vv` shows them live, prefixed `[kiln-bundled-plugins …]`), and a build that took longer
//! than [`REPORT_AFTER`] (a first build: minutes on 2 cores) ends with a `cargo:warning` saying
//! how many plugins were built, in how long, and when they are rebuilt.

use std::io::{BufRead as _, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TARGET: &str = "wasm32-wasip2";
/// The nested build's rustflags (the outer build's are cleared, [`CLEARED_ENV`]): Wasm SIMD
/// (`simd128`, which Wasmtime compiles on every host it runs on) lets `memchr` and the JSON
/// scanners in the plugins use 128-bit vectors. Measured with `cargo bench -p kiln-render`
/// (issue 16), a full render of the sample: 2.54–2.73 ms of CPU without it, 2.29–2.54 ms with
/// it, alternating runs on one machine. Fields are separated by 0x1f, as cargo's encoding asks.
///
/// `--cfg kiln_standard_bundle` turns off each plugin crate's own exports, so that the bundle's
/// are the only ones (`kiln_plugin_std::export_standard_bundle!`).
const GUEST_RUSTFLAGS: &str = "-Ctarget-feature=+simd128\x1f--cfg\x1fkiln_standard_bundle";
/// The crate directory (under `plugins/`) of the standard bundle; not a plugin itself.
const BUNDLE_DIR: &str = "bundle";
/// A nested build at least this long (it compiled something) is reported as a warning.
const REPORT_AFTER: Duration = Duration::from_secs(60);
/// Variables of the outer build that must not leak into the nested one.
const CLEARED_ENV: &[&str] = &[
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "RUSTDOCFLAGS",
    "CARGO_ENCODED_RUSTDOCFLAGS",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_RUSTFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET_DIR",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_BUILD_RUSTC_WRAPPER",
    "CARGO_MAKEFLAGS",
    "MAKEFLAGS",
    "MFLAGS",
    "RUSTC_LINKER",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_LLVM_COV",
    "LLVM_PROFILE_FILE",
];

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    // host/bundled-plugins → the workspace root.
    let workspace = manifest_dir
        .parent()
        .and_then(Path::parent)
        .expect("workspace root")
        .to_path_buf();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap()).join("bundled.rs");
    for path in ["plugins", "wit", "host/core", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", workspace.join(path).display());
    }
    println!("cargo:rerun-if-env-changed=KILN_SKIP_PLUGIN_BUILD");
    // Profile overrides (e.g. CARGO_PROFILE_PLUGIN_STRIP=false to keep function names for a
    // profiler) must rebuild the plugins.
    for key in ["OPT_LEVEL", "STRIP", "LTO", "CODEGEN_UNITS", "DEBUG"] {
        println!("cargo:rerun-if-env-changed=CARGO_PROFILE_PLUGIN_{key}");
    }

    let skip =
        std::env::var_os("KILN_SKIP_PLUGIN_BUILD").is_some_and(|v| !v.is_empty() && v != "0");
    let plugins = if skip {
        Vec::new()
    } else {
        plugin_dirs(&workspace.join("plugins"))
    };
    if !plugins.is_empty() {
        check_target_installed();
        build(&workspace, &plugins);
    }
    let artifacts = workspace.join("target/plugins").join(TARGET).join("plugin");
    let bundle = artifacts.join(format!("kiln_plugin_{BUNDLE_DIR}.wasm"));
    let mut code = String::new();
    let digest = if plugins.is_empty() {
        String::new()
    } else {
        assert!(bundle.is_file(), "{} was not built", bundle.display());
        let bytes = std::fs::read(&bundle).expect("read the built bundle");
        code.push_str(&format!(
            "/// The standard bundle: one component carrying every standard plugin ({} bytes).\n\
             static BUNDLE: [u8; {}] = *include_bytes!({:?});\n",
            bytes.len(),
            bytes.len(),
            bundle.display().to_string()
        ));
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes))
    };
    code.push_str(
        "/// Every bundled plugin as (name, wasm component bytes), sorted by name: each is the\n\
         /// standard bundle, which the host calls with the context's `state` set to the name.\n",
    );
    code.push_str("pub static BUNDLED: &[(&str, &[u8])] = &[\n");
    for name in &plugins {
        code.push_str(&format!("    ({name:?}, &BUNDLE),\n"));
    }
    code.push_str("];\n");
    code.push_str(
        "/// SHA-256 (lowercase hex) of each bundled plugin's bytes, computed at build time, in\n\
         /// [`BUNDLED`] order; see [`kiln_plugin_host::PluginHost::with_bundled_digests`].\n",
    );
    code.push_str("pub static BUNDLED_SHA256: &[(&str, &str)] = &[\n");
    for name in &plugins {
        code.push_str(&format!("    ({name:?}, {digest:?}),\n"));
    }
    code.push_str("];\n");
    std::fs::write(&out, code).expect("write bundled.rs");
}

/// Names of the plugin directories (all but the SDK, `std` and the bundle, with a Cargo.toml),
/// sorted.
fn plugin_dirs(plugins: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(plugins) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().join("Cargo.toml").is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n != "sdk" && n != "std" && n != BUNDLE_DIR)
        .collect();
    names.sort();
    names
}

fn rustc() -> Command {
    Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
}

fn check_target_installed() {
    let out = rustc()
        .args(["--print", "sysroot"])
        .output()
        .expect("run rustc --print sysroot");
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !sysroot.join("lib/rustlib").join(TARGET).is_dir() {
        panic!(
            "the {TARGET} target is not installed for {} (needed to build the bundled plugins): \
             run `rustup target add {TARGET}`",
            sysroot.display()
        );
    }
}

fn build(workspace: &Path, plugins: &[String]) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    for var in CLEARED_ENV {
        cmd.env_remove(var);
    }
    cmd.current_dir(workspace)
        .args(["build", "--profile", "plugin", "--target", TARGET])
        .env("CARGO_TARGET_DIR", workspace.join("target/plugins"))
        .env("CARGO_ENCODED_RUSTFLAGS", GUEST_RUSTFLAGS);
    cmd.args(["-p", &format!("kiln-plugin-{BUNDLE_DIR}")]);
    eprintln!(
        "building the {} standard plugins for {TARGET} as one component (profile `plugin`) in {}",
        plugins.len(),
        workspace.join("target/plugins").display()
    );
    let started = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cargo to build the plugins");
    let mut stdout = child.stdout.take().expect("piped stdout");
    let stdout = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    // Relayed line by line (not to stdout: cargo reads directives there).
    let mut stderr = String::new();
    for line in std::io::BufReader::new(child.stderr.take().expect("piped stderr"))
        .lines()
        .map_while(Result::ok)
    {
        eprintln!("{line}");
        stderr.push_str(&line);
        stderr.push('\n');
    }
    let status = child.wait().expect("wait for the plugin build");
    let stdout = stdout.join().unwrap_or_default();
    if !status.success() {
        panic!("building the plugins for {TARGET} failed ({status}):\n{stdout}{stderr}");
    }
    let took = started.elapsed();
    if took >= REPORT_AFTER {
        println!(
            "cargo:warning=built the {} bundled Wasm plugins ({TARGET}) in {:.0} s; they are rebuilt \
             only when plugins/, wit/, host/core or Cargo.lock change",
            plugins.len(),
            took.as_secs_f64()
        );
    }
}
