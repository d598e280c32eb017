//! What a new user meets first: empty env values the operator renders, errors that name the
//! env var or list the valid values, help text that matches the commands, and plain-text
//! `info` logs from the agents when stderr is not a terminal.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

#[allow(dead_code)]
#[path = "../../plugin-host/tests/host/common.rs"]
mod common;

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

/// One fake H100 (see `kiln_gpu::fixtures`).
const FIXTURE: &str = kiln_gpu::fixtures::ONE_H100;

/// `kiln` with the env vars these tests set removed from the inherited environment.
fn kiln(args: &[&str]) -> Command {
    let mut c = Command::new(KILN);
    c.args(args);
    for var in [
        "KILN_LOG",
        "KILN_CHECK_ARGS",
        "MIG_STRATEGY",
        "GFD_MIG_STRATEGY",
        "KILN_DRIVER_READY_FILE",
        "NODE_NAME",
        "CONFIG_FILE",
    ] {
        c.env_remove(var);
    }
    c
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn operator_without_a_usable_kubeconfig_says_so_once_and_what_to_pass() {
    let missing = kiln(&["operator", "--kubeconfig", "/nonexistent/kubeconfig"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    let err = stderr(&missing);
    assert!(
        err.contains("cannot read --kubeconfig /nonexistent/kubeconfig"),
        "{err}"
    );
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    let home = tempfile::tempdir().unwrap();
    for args in [&["operator"][..], &["operator", "cleanup"]] {
        let none = kiln(args)
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("HOME", home.path())
            .output()
            .unwrap();
        assert!(!none.status.success());
        let err = stderr(&none);
        assert!(err.contains("no Kubernetes configuration"), "{err}");
        assert!(
            err.contains("pass --kubeconfig FILE or set KUBECONFIG"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
}

#[test]
fn an_empty_driver_ready_file_parses_as_flag_and_as_env_var() {
    let out = kiln(&["device-plugin", "--driver-ready-file", ""])
        .env("KILN_CHECK_ARGS", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = kiln(&["device-plugin"])
        .env("KILN_CHECK_ARGS", "1")
        .env("KILN_DRIVER_READY_FILE", "")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn gfd_names_mig_strategy_when_it_is_bad_and_ignores_it_when_empty() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = dir.path().join("gpus.yaml");
    std::fs::write(&fixture, FIXTURE).unwrap();
    let backend = format!("fake:{}", fixture.display());
    let args = [
        "gfd",
        "--oneshot",
        "--no-timestamp",
        "--output",
        "stdout",
        "--gpu-backend",
        &backend,
        "--machine-type-file",
        "/nonexistent",
    ];
    // No --config-file: a named config file that is missing is an error of its own.
    let out = kiln(&args).env("MIG_STRATEGY", "bogus").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("invalid value 'bogus' for env var MIG_STRATEGY (valid: none, single, mixed)")
            && !err.contains("--mig-strategy-env"),
        "{err}"
    );
    let out = kiln(&args).env("MIG_STRATEGY", "").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nvidia.com/gpu.count=1\n"));
}

#[test]
fn help_texts_match_the_commands() {
    let help = |args: &[&str]| {
        let out = kiln(args).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let top = help(&["--help"]);
    assert!(!top.contains("try plugins"), "{top}");
    assert!(top.contains("kiln render --plugins-dir"), "{top}");
    let wait = help(&["validator", "wait", "--help"]);
    assert!(
        wait.contains("driver-ready") && wait.contains("vgpu-devices-ready"),
        "{wait}"
    );
    let render = help(&["render", "--help"]);
    assert!(
        render.contains("DRIVER_IMAGE, ") && render.contains("GFD_IMAGE"),
        "{render}"
    );
    for agent in [
        &["device-plugin"][..],
        &["gfd"],
        &["exporter"],
        &["validator", "driver"],
    ] {
        let text = help(&[agent, &["--help"]].concat());
        assert!(text.contains("host/gpu/src/fake.rs"), "{agent:?}: {text}");
    }
}

#[test]
fn device_plugin_logs_what_it_serves_at_info_without_colours_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = dir.path().join("gpus.yaml");
    std::fs::write(&fixture, FIXTURE).unwrap();
    let backend = format!("fake:{}", fixture.display());
    let plugin_dir = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let mut child = kiln(&[
        "device-plugin",
        "--gpu-backend",
        &backend,
        "--kubelet-socket",
        "",
        "--driver-ready-file",
        "",
        "--plugin-dir",
        plugin_dir.to_str().unwrap(),
        "--cdi-root",
        dir.path().join("cdi").to_str().unwrap(),
        "--device-list-strategy",
        "envvar",
    ])
    .stderr(Stdio::piped())
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    let (tx, rx) = mpsc::channel();
    let pipe = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    let found = loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line.contains("serving the device plugin") => break Some(line),
            Ok(line) => seen.push(line),
            Err(_) => break None,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let line = found.unwrap_or_else(|| panic!("no serving line in {seen:#?}"));
    assert!(!line.contains('\x1b'), "ANSI escapes in {line:?}");
    assert!(
        line.contains(" INFO ")
            && line.contains("resource=nvidia.com/gpu")
            && line.contains("devices=1")
            && line.contains(&format!(
                "socket={}",
                plugin_dir.join("nvidia-gpu.sock").display()
            )),
        "{line}"
    );
}

#[test]
fn precompile_fills_the_cache_once_and_names_a_broken_drop_in() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cache_arg = cache.to_str().unwrap();
    let bundled = kiln_bundled_plugins::BUNDLED.len();
    // The bundled plugins are one component (the standard bundle): compiled once, under the
    // first name; every other name finds it compiled.
    let components = kiln_bundled_plugins::BUNDLED_SHA256
        .iter()
        .map(|(_, d)| *d)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    assert_eq!(components, 1);

    let out = kiln(&["plugin", "precompile", "--cache-dir", cache_arg])
        .env_remove("KILN_PLUGINS_DIR")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("\tcompiled\tbundled\t"),
        "per-plugin lines say compiled: {text}"
    );
    assert!(
        text.contains(&format!(
            "{components} compiled, {} already cached, 0 refused",
            bundled - components
        )),
        "{text}"
    );
    // One artifact per component, each with the record of its digest.
    let names: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let artifacts = names.iter().filter(|n| n.ends_with(".cwasm")).count();
    let records = names
        .iter()
        .filter(|n| n.ends_with(".cwasm.sha256"))
        .count();
    assert_eq!(
        (artifacts, records, names.len()),
        (components, components, 2 * components)
    );

    // Again: nothing to compile. With a drop-in that is not Wasm: named, exit 1.
    let drop_in = dir.path().join("plugins");
    std::fs::create_dir(&drop_in).unwrap();
    std::fs::write(drop_in.join("junk.wasm"), b"not wasm").unwrap();
    let out = kiln(&["plugin", "precompile", "--cache-dir", cache_arg])
        .arg("--plugins-dir")
        .arg(&drop_in)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains(&format!("0 compiled, {bundled} already cached, 1 refused")),
        "{text}"
    );
    assert!(
        stderr(&out).contains("junk") && stderr(&out).contains("not a WebAssembly file"),
        "{}",
        stderr(&out)
    );

    // --prune removes artifacts of other builds and keeps the current ones.
    let stale = cache.join("0000-stale.cwasm");
    std::fs::write(&stale, b"old").unwrap();
    let out = kiln(&["plugin", "precompile", "--prune", "--cache-dir", cache_arg])
        .env_remove("KILN_PLUGINS_DIR")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("pruned 1 stale artifacts"), "{text}");
    assert!(!stale.exists());
    // The current artifacts and their records stay.
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 2 * components);

    // A cache directory that cannot exist: one error with the OS reason.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let out = kiln(&["plugin", "precompile", "--cache-dir"])
        .arg(file.join("sub"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("cannot be created") && err.contains("Not a directory"),
        "{err}"
    );
    assert!(!err.contains("caching in memory only"), "{err}");
}

/// `kiln plugin run --state` with a name that is not a state lists the states, in the words the
/// `kiln.dev/plugins` annotation uses for an unknown key, before anything is read.
#[test]
fn plugin_run_with_an_unknown_state_lists_the_states() {
    let out = kiln(&[
        "plugin",
        "run",
        "/nonexistent/p.wasm",
        "--state",
        "deviceplugin",
        "--policy",
        "/nonexistent/policy.yaml",
    ])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    let valid: Vec<&str> = kiln_core::State::ALL.iter().map(|s| s.name()).collect();
    assert!(
        err.contains(&format!(
            "invalid value 'deviceplugin' for '--state <STATE>': unknown state \"deviceplugin\" (valid: {})",
            valid.join(", ")
        )),
        "{err}"
    );
    assert!(!err.contains("/nonexistent"), "{err}");
}

#[test]
fn plugin_check_says_under_which_file_name_to_install_a_build_output() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let check = |path: &std::path::Path| {
        kiln(&["plugin", "check"])
            .arg(path)
            .env("KILN_PLUGIN_CACHE_DIR", &cache)
            .output()
            .unwrap()
    };
    let cached = || std::fs::read_dir(&cache).map_or(0, |d| d.count());
    // A standalone plugin that calls itself `dcgm`, as `cargo build -p kiln-plugin-dcgm
    // --target wasm32-wasip2` builds one.
    let name = "dcgm";
    let bytes = common::patcher(name, "[]");
    // As cargo names the build output, then as the drop-in directory wants it.
    for (file, rename) in [("kiln_plugin_dcgm.wasm", true), ("dcgm.wasm", false)] {
        let path = dir.path().join(file);
        std::fs::write(&path, &bytes).unwrap();
        let out = check(path.as_path());
        // Under a file name the host would look it up by, it would be refused: exit 1.
        assert_eq!(out.status.success(), !rename, "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(text.contains(&format!("name:    {name}\n")), "{text}");
        let verdict = if rename {
            "verdict: refused: plugin \"kiln_plugin_dcgm\": the component calls itself \"dcgm\""
        } else {
            "verdict: accepted"
        };
        assert!(text.contains(verdict), "{text}");
        assert!(!text.contains("warning"), "{text}");
        assert!(
            text.contains(&format!("install: as {name}.wasm in the drop-in directory")),
            "{text}"
        );
        assert_eq!(
            text.contains("would be looked up as \"kiln_plugin_dcgm\""),
            rename,
            "{text}"
        );
        // Compiled into the cache as `kiln render` compiles it (the artifact and its digest
        // record); a refused plugin leaves nothing there.
        let compiled = if rename {
            " s, not cached (refused)\n"
        } else {
            " s, cached in "
        };
        assert!(text.contains(compiled), "{text}");
        assert_eq!(cached(), if rename { 0 } else { 2 }, "{text}");
    }
    // Checked again, it is not compiled again.
    let out = check(dir.path().join("dcgm.wasm").as_path());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains(&format!("compile: from the cache in {}\n", cache.display())),
        "{text}"
    );
    // The standard bundle (what kiln embeds) calls itself `kiln-standard-plugins`: accepted
    // under any file name, to be installed once per plugin it carries.
    let bundle = dir.path().join("kiln_plugin_bundle.wasm");
    std::fs::write(&bundle, kiln_bundled_plugins::get("dcgm").unwrap()).unwrap();
    let out = check(bundle.as_path());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in [
        "name:    kiln-standard-plugins\n",
        "verdict: accepted",
        "install: as <plugin>.wasm in the drop-in directory, once per plugin it carries",
    ] {
        assert!(text.contains(line), "{line:?} in {text}");
    }
    // Not Wasm at all: exit 1, naming the file and the plugin name it would be looked up by.
    let notes = dir.path().join("notes.md");
    std::fs::write(&notes, "# not a plugin\n").unwrap();
    let out = check(notes.as_path());
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("notes.md: plugin \"notes\": cannot load component: not a WebAssembly file"),
        "{err}"
    );
}

#[test]
fn render_heads_each_yaml_document_with_its_state_and_plugin_chain() {
    let sample = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/samples/clusterpolicy.yaml"
    );
    let out = kiln(&["render", "--policy", sample]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.starts_with("---\n# Source: state-pre-requisites via pre-requisites\n"),
        "{}",
        &text[..text.len().min(200)]
    );
    let documents = text.lines().filter(|l| *l == "---").count();
    let sources = text.lines().filter(|l| l.starts_with("# Source: ")).count();
    assert!(documents > 40, "{documents} documents");
    assert_eq!(sources, documents);
    assert!(text.contains("---\n# Source: state-driver via driver\napiVersion: "));
}
