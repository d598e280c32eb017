//! A plugin author's loop, as CI runs it: `kiln plugin new` → `cargo build` → `kiln plugin test`
//! (and a wrong expectation fails it), `kiln plugin run` showing the plugin's patch and log.
//! The Python and JavaScript templates go through the same loop with their toolchains' default
//! commands (componentize-py, componentize-js) and pass the same case files.
//! The Rust project builds against its own `Cargo.lock` into the target directory the host's test
//! guests use (`target/test-guests`), so its dependencies are compiled once.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

/// `kiln`, with the compiled-plugin cache the other tests share (`target/kiln-test-plugin-cache`).
fn kiln(args: &[&str]) -> Output {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/kiln-test-plugin-cache");
    Command::new(KILN)
        .args(args)
        .env("KILN_PLUGIN_CACHE_DIR", cache)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Builds the project at `dir` for wasm32-wasip2; the `.wasm` cargo wrote.
fn build(dir: &Path, krate: &str) -> PathBuf {
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-guests");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--quiet", "--target", "wasm32-wasip2"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", &target);
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "RUSTC_WRAPPER",
        "CARGO_MAKEFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().unwrap();
    assert!(status.success(), "building the new project failed");
    target.join(format!("wasm32-wasip2/release/{krate}.wasm"))
}

#[test]
fn a_new_rust_project_builds_and_passes_its_own_cases() {
    let root = tempfile::tempdir().unwrap();
    let out = kiln(&[
        "plugin",
        "new",
        "site-labels",
        "--dir",
        root.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let project = root.path().join("site-labels");
    let wasm = project.join("site-labels.wasm");
    std::fs::copy(build(&project, "site_labels"), &wasm).unwrap();
    let (wasm_arg, cases) = (wasm.to_str().unwrap(), project.join("cases"));

    let out = kiln(&["plugin", "test", wasm_arg, cases.to_str().unwrap()]);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(
        report.contains("2 cases, 2 passed, 0 failed (site-labels, kiln:operand@0.2.0)"),
        "{report}"
    );

    // A wrong expectation fails the run, naming the file and the field.
    let case = cases.join("labels.yaml");
    let wrong = std::fs::read_to_string(&case).unwrap().replace(
        "{metadata: {labels: {team: gpu}}}\n  - ",
        "{metadata: {labels: {team: cpu}}}\n  - ",
    );
    std::fs::write(&case, wrong).unwrap();
    let out = kiln(&["plugin", "test", wasm_arg, cases.to_str().unwrap()]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains("FAILED")
            && report.contains(r#"[0].metadata.labels.team: got "gpu", expected "cpu""#),
        "{report}"
    );

    // `kiln plugin run`: the plugin's patch of each object of the state, and its log.
    let policy = root.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: cluster-policy}\nspec: {}\n",
    )
    .unwrap();
    let settings = root.path().join("settings.yaml");
    std::fs::write(&settings, "labels: {team: gpu}\n").unwrap();
    let out = kiln(&[
        "plugin",
        "run",
        wasm_arg,
        "--state",
        "dcgm-exporter",
        "--policy",
        policy.to_str().unwrap(),
        "--settings",
        settings.to_str().unwrap(),
    ]);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(
        report.contains(r#"DaemonSet/nvidia-dcgm-exporter: [{"op":"add","path":"/metadata/labels/team","value":"gpu"}]"#),
        "{report}"
    );
    assert!(report.contains("log Info: "), "{report}");
}

/// A standard bundle answers to the name it is loaded by: `kiln plugin test` and `kiln plugin
/// run` run it under its file's stem, as `kiln render` finds it in a drop-in directory, so the
/// bundle saved as `node-placement.wasm` passes node-placement's own case files.
#[test]
fn a_bundled_plugin_saved_under_its_name_runs_through_test_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = kiln_bundled_plugins::get("node-placement").expect("node-placement is bundled");
    let wasm = dir.path().join("node-placement.wasm");
    std::fs::write(&wasm, bytes).unwrap();
    let cases = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins/node-placement/cases");
    let out = kiln(&[
        "plugin",
        "test",
        wasm.to_str().unwrap(),
        cases.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("0 failed"), "{}", text(&out));
    let policy =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/samples/clusterpolicy.yaml");
    let out = kiln(&[
        "plugin",
        "run",
        wasm.to_str().unwrap(),
        "--state",
        "device-plugin",
        "--policy",
        policy.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
}

/// A plugin toolchain that `.ci/run` installs under `target/plugin-tools` (pinned by the
/// templates: `templates/python/requirements.txt`, `templates/js/package.json`), else found on
/// `PATH`. Missing, the test is skipped with a loud message, unless
/// `$KILN_REQUIRE_PLUGIN_TOOLS` is set (CI sets it), when it fails.
fn toolchain(lang: &str) -> Option<Command> {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/plugin-tools");
    let (installed, program, pythonpath) = match lang {
        "python" => (
            tools.join("python/bin/componentize-py"),
            "componentize-py",
            Some(tools.join("python")),
        ),
        _ => (
            tools.join("js/node_modules/.bin/componentize-js"),
            "componentize-js",
            None,
        ),
    };
    if installed.exists() {
        let mut cmd = Command::new(installed);
        if let Some(path) = pythonpath {
            cmd.env("PYTHONPATH", path);
        }
        return Some(cmd);
    }
    let on_path = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|dir| dir.join(program).is_file());
    if on_path {
        return Some(Command::new(program));
    }
    let msg = format!(
        "\n\n!!!!!!!! {program} not found (in target/plugin-tools or on PATH): the {lang} \
         template is NOT checked !!!!!!!!\n\n"
    );
    assert!(
        std::env::var_os("KILN_REQUIRE_PLUGIN_TOOLS").is_none(),
        "KILN_REQUIRE_PLUGIN_TOOLS is set: {msg}"
    );
    eprintln!("{msg}");
    None
}

/// `kiln plugin new NAME --lang LANG`, then the template's build with its toolchain's default
/// command, then `kiln plugin test` with the cases every template ships (the Rust template's),
/// then `kiln plugin run` twice: the same patch as the Rust plugin, byte for byte the same
/// output both times (the virtual WASI keeps the plugin a function of its inputs).
fn new_build_test_run(lang: &str, name: &str) {
    let Some(mut build) = toolchain(lang) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let out = kiln(&[
        "plugin",
        "new",
        name,
        "--lang",
        lang,
        "--dir",
        root.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let project = root.path().join(name);
    let wasm = project.join(format!("{name}.wasm"));
    // The tools' default commands, as the templates' READMEs give them.
    match lang {
        "python" => build.args([
            "-d",
            "wit",
            "-w",
            "operand-transform-validated",
            "componentize",
            "app",
            "-o",
        ]),
        _ => build.args(["--wit", "wit", "-n", "operand-transform-validated", "-o"]),
    };
    build.arg(&wasm).current_dir(&project);
    if lang == "js" {
        build.arg("plugin.js");
    }
    let started = std::time::Instant::now();
    let built = build.output().unwrap();
    assert!(built.status.success(), "{}", text(&built));
    println!(
        "{lang}: built {} bytes in {:.1} s",
        std::fs::metadata(&wasm).unwrap().len(),
        started.elapsed().as_secs_f64()
    );

    let (wasm_arg, cases) = (wasm.to_str().unwrap(), project.join("cases"));
    let out = kiln(&["plugin", "test", wasm_arg, cases.to_str().unwrap()]);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(
        report.contains(&format!(
            "2 cases, 2 passed, 0 failed ({name}, kiln:operand@0.2.0)"
        )),
        "{report}"
    );

    let policy = root.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: cluster-policy}\nspec: {}\n",
    )
    .unwrap();
    let settings = root.path().join("settings.yaml");
    std::fs::write(&settings, "labels: {team: gpu}\n").unwrap();
    let run = || {
        let out = kiln(&[
            "plugin",
            "run",
            wasm_arg,
            "--state",
            "dcgm-exporter",
            "--policy",
            policy.to_str().unwrap(),
            "--settings",
            settings.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let first = run();
    assert!(
        first.contains(r#"DaemonSet/nvidia-dcgm-exporter: [{"op":"add","path":"/metadata/labels/team","value":"gpu"}]"#),
        "{first}"
    );
    assert_eq!(first, run(), "a second run printed something else");
}

#[test]
fn a_new_python_project_builds_with_componentize_py_and_passes_the_same_cases() {
    new_build_test_run("python", "py-labels");
}

#[test]
fn a_new_js_project_builds_with_componentize_js_and_passes_the_same_cases() {
    new_build_test_run("js", "js-labels");
}
