//! Operability of the `kiln` binary: a closed stdout pipe is not a panic, `--log-format
//! json|text` on every command, progress lines on first-time plugin compilation, and shell
//! completion scripts that complete.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/samples/clusterpolicy.yaml")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `kiln args` with stdout a pipe whose read end is already closed (what `| head -1`
/// leaves once `head` has exited): every write fails with EPIPE, deterministically.
fn into_closed_pipe(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(KILN)
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_closed_stdout_pipe_ends_every_printing_command_quietly() {
    let policy = sample();
    let policy = policy.to_str().unwrap();
    for args in [
        &["plugin", "list"][..],
        &["render", "--policy", policy],
        &["render", "--policy", policy, "-o", "json"],
        &["crdgen"],
        &["version"],
        &["completion", "bash"],
    ] {
        let out = into_closed_pipe(args);
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "kiln {args:?}: {err}");
        assert!(
            out.status.success(),
            "kiln {args:?}: {:?} {err}",
            out.status
        );
    }
}

#[test]
fn the_same_commands_print_in_full_to_an_open_pipe() {
    let out = Command::new(KILN)
        .args(["plugin", "list"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    // One line per bundled plugin: the 20 ClusterPolicy states, the 4 GPUCluster (DRA) states and
    // node-placement.
    assert_eq!(
        text.lines().count(),
        kiln_bundled_plugins::BUNDLED.len(),
        "{text}"
    );
    assert_eq!(text.lines().count(), 25, "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("device-plugin\t")),
        "{text}"
    );
}

/// `kiln … <args>` with `KILN_LOG`=`filter` and the log format from `how` (flag or env).
fn logs(args: &[&str], filter: &str, env: &[(&str, &str)]) -> Output {
    Command::new(KILN)
        .args(args)
        .env("KILN_LOG", filter)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn json_lines(o: &Output) -> Vec<Value> {
    stderr(o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn log_format_json_writes_one_object_per_line_and_text_writes_text() {
    let policy = sample();
    let policy = policy.to_str().unwrap();
    // The flag before or after the subcommand (it is global), or the env var.
    for (args, env) in [
        (
            vec!["--log-format", "json", "render", "--policy", policy],
            vec![],
        ),
        (
            vec!["render", "--policy", policy, "--log-format", "json"],
            vec![],
        ),
        (
            vec!["render", "--policy", policy],
            vec![("KILN_LOG_FORMAT", "json")],
        ),
    ] {
        let out = logs(&args, "kiln_render=debug", &env);
        assert!(out.status.success(), "{}", stderr(&out));
        let lines = json_lines(&out);
        let rendered: Vec<&Value> = lines
            .iter()
            .filter(|l| l["message"] == "rendered state")
            .collect();
        assert!(rendered.len() >= 9, "{args:?}: {lines:?}");
        for l in &rendered {
            assert_eq!(l["level"], "DEBUG");
            assert_eq!(l["target"], "kiln_render");
            assert!(l["state"].is_string(), "{l}");
            assert!(l["timestamp"].is_string(), "{l}");
        }
    }
    let out = logs(
        &["--log-format", "text", "render", "--policy", policy],
        "kiln_render=debug",
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let line = err.lines().find(|l| l.contains("rendered state")).unwrap();
    assert!(
        line.contains("DEBUG") && line.contains("kiln_render"),
        "{line}"
    );
    assert!(serde_json::from_str::<Value>(line).is_err(), "{line}");
}

#[test]
fn a_bad_log_format_is_a_usage_error_naming_the_choices() {
    let out = Command::new(KILN)
        .args(["--log-format", "yaml", "version"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("'yaml'") && err.contains("[possible values: text, json]"),
        "{err}"
    );
}

/// The sample with every optional component off: three states (pre-requisites, operator
/// metrics and validation), so three plugins to compile.
fn small_policy(dir: &Path) -> PathBuf {
    let mut p: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(sample()).unwrap()).unwrap();
    for c in [
        "driver",
        "toolkit",
        "devicePlugin",
        "dcgm",
        "dcgmExporter",
        "gfd",
        "migManager",
    ] {
        p["spec"][c]["enabled"] = Value::Bool(false);
    }
    let file = dir.join("small.yaml");
    std::fs::write(&file, serde_yaml_ng::to_string(&p).unwrap()).unwrap();
    file
}

#[test]
fn the_first_render_in_an_empty_cache_says_it_is_compiling_and_the_next_does_not() {
    let cache = tempfile::tempdir().unwrap();
    let policy = small_policy(cache.path());
    let run = || {
        let out = Command::new(KILN)
            .args(["--log-format", "json", "render", "--policy"])
            .arg(&policy)
            .env_remove("KILN_LOG")
            .env("KILN_PLUGIN_CACHE_DIR", cache.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        json_lines(&out)
    };
    let first = run();
    let progress: Vec<&Value> = first
        .iter()
        .filter(|l| l["target"] == "kiln::progress")
        .collect();
    assert_eq!(progress.len(), 2, "{first:?}");
    let msg = progress[0]["message"].as_str().unwrap();
    // The three bundled plugins are one component (the standard bundle), compiled once.
    assert!(
        msg.starts_with(
            "compiling 1 component(s) on first use, for plugin(s) operator-metrics, \
             operator-validation, pre-requisites ("
        ),
        "{msg}"
    );
    assert_eq!(progress[0]["components"].as_u64(), Some(1));
    let n = progress[0]["plugins"].as_u64().unwrap();
    assert_eq!(n, 3);
    assert_eq!(progress[1]["plugins"].as_u64(), Some(n));
    assert!(progress[1]["seconds"].as_f64().unwrap() > 0.0);
    // Compiled into the cache: the next run has nothing to say.
    let second = run();
    assert!(
        !second.iter().any(|l| l["target"] == "kiln::progress"),
        "{second:?}"
    );
}

#[test]
fn completion_scripts_name_every_subcommand() {
    let script = |shell: &str| {
        let out = Command::new(KILN)
            .args(["completion", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let bash = script("bash");
    assert!(bash.contains("_kiln()"), "{bash}");
    let zsh = script("zsh");
    assert!(zsh.starts_with("#compdef kiln"), "{zsh}");
    let fish = script("fish");
    for sub in [
        "render",
        "plugin",
        "operator",
        "validator",
        "device-plugin",
        "gfd",
        "exporter",
        "version",
        "completion",
    ] {
        assert!(bash.contains(sub), "bash: {sub}");
        assert!(zsh.contains(sub), "zsh: {sub}");
        assert!(fish.contains(&format!("-a \"{sub}\"")), "fish: {sub}");
    }
    assert!(bash.contains("--log-format"));
    for shell in ["elvish", "powershell"] {
        assert!(!script(shell).is_empty());
    }
    let out = Command::new(KILN)
        .args(["completion", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// bash itself, with the generated script sourced, completes `kiln ren` to `render` and
/// `kiln render --log-format ` to the two formats.
#[test]
fn bash_completes_with_the_generated_script() {
    let Ok(bash) = which("bash") else {
        eprintln!("SKIPPED: no bash on PATH");
        return;
    };
    let complete = |words: &str| {
        let script = format!(
            "source <('{KILN}' completion bash)\n\
             COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))\n\
             COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}\n\
             _kiln kiln \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
             printf '%s\\n' \"${{COMPREPLY[@]}}\""
        );
        let out = Command::new(&bash).args(["-c", &script]).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let mut words: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        words.sort();
        words
    };
    assert_eq!(complete("kiln ren"), ["render"]);
    assert_eq!(complete("kiln render --log-format ''"), ["json", "text"]);
}

fn which(name: &str) -> Result<PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|f| f.is_file())
        })
        .ok_or(())
}

#[test]
fn the_sample_nvidiadriver_renders_one_driver_daemonset_for_its_pool() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/samples");
    let sample_cr = dir.join("nvidiadriver.yaml");
    let render_cr = |policy: &Path, cr: &Path| {
        Command::new(KILN)
            .arg("render")
            .arg("--policy")
            .arg(policy)
            .arg("--nvidia-driver")
            .arg(cr)
            .args(["-o", "json"])
            .output()
            .unwrap()
    };
    let render = |policy: &Path| render_cr(policy, &sample_cr);
    // The sample policy keeps its own driver: an NVIDIADriver would be Disabled there.
    let refused = render(&dir.join("clusterpolicy.yaml"));
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("driver.useNvidiaDriverCRD: true"),
        "{}",
        stderr(&refused)
    );
    assert!(refused.stdout.is_empty());
    // Handed to the CR, as the sample's comment says.
    let text = std::fs::read_to_string(dir.join("clusterpolicy.yaml"))
        .unwrap()
        .replace("useNvidiaDriverCRD: false", "useNvidiaDriverCRD: true");
    assert!(text.contains("useNvidiaDriverCRD: true"));
    let tmp = tempfile::tempdir().unwrap();
    let policy = tmp.path().join("policy.yaml");
    std::fs::write(&policy, text).unwrap();
    let out = render(&policy);
    assert!(out.status.success(), "{}", stderr(&out));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let items = list["items"].as_array().expect("a List");
    let drivers: Vec<&Value> = items
        .iter()
        .filter(|o| {
            o["kind"] == "DaemonSet"
                && o["metadata"]["labels"]["app.kubernetes.io/component"] == "nvidia-driver"
        })
        .collect();
    assert_eq!(drivers.len(), 1, "{}", list);
    let name = drivers[0]["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("nvidia-gpu-driver-ubuntu22.04-"), "{name}");
    let selector = &drivers[0]["spec"]["template"]["spec"]["nodeSelector"];
    assert_eq!(selector["pool"], "a", "{selector}");
    let images: Vec<&str> = drivers[0]["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["image"].as_str())
        .collect();
    assert!(
        images
            .iter()
            .any(|i| i.starts_with("nvcr.io/nvidia/driver:595.91.07")),
        "{images:?}"
    );
    // The vGPU host manager renders its own form of the pool's DaemonSet.
    let cr = std::fs::read_to_string(&sample_cr).unwrap();
    let host_manager = tmp.path().join("vgpu-host-manager.yaml");
    std::fs::write(
        &host_manager,
        cr.replace("driverType: gpu", "driverType: vgpu-host-manager"),
    )
    .unwrap();
    let out = render_cr(&policy, &host_manager);
    assert!(out.status.success(), "{}", stderr(&out));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["kind"] == "DaemonSet"
                && o["metadata"]["labels"]["app.kubernetes.io/component"]
                    == "nvidia-vgpu-host-manager"),
        "{list}"
    );
    // What the operator refuses (ReconcileFailed, nothing applied) is refused here too:
    // GPUDirect Storage with precompiled drivers (as upstream refuses it).
    let refused_cr = tmp.path().join("precompiled-gds.yaml");
    std::fs::write(
        &refused_cr,
        format!("{cr}  usePrecompiled: true\n  gds:\n    enabled: true\n"),
    )
    .unwrap();
    let out = render_cr(&policy, &refused_cr);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cannot be enabled with spec.usePrecompiled"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());
}

/// The `kiln` binary allocates with jemalloc, with every setting of
/// `kiln_operator::memory::JEMALLOC_CONF` in effect (jemalloc prints its options at exit when
/// `_RJEM_MALLOC_CONF=stats_print:true` is added from the environment).
#[test]
fn kiln_allocates_with_jemalloc_and_kilns_settings() {
    let out = Command::new(KILN)
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let stats = stderr(&out);
    let conf = std::str::from_utf8(kiln_operator::memory::JEMALLOC_CONF)
        .unwrap()
        .trim_end_matches('\0');
    let settings: Vec<&str> = conf.split(',').collect();
    assert!(settings.len() >= 5, "{conf}");
    for setting in settings {
        let (key, value) = setting.split_once(':').unwrap();
        assert!(
            stats
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("opt.{key}: {value}"))),
            "opt.{key}: {value} not in jemalloc's stats:\n{stats}"
        );
    }
}

#[test]
fn the_sample_gpucluster_renders_its_dra_states_and_a_misnamed_one_is_refused() {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/samples/gpucluster.yaml");
    let render = |cr: &Path| {
        Command::new(KILN)
            .arg("render")
            .arg("--gpu-cluster")
            .arg(cr)
            .args([
                "--device-class-api",
                "resource.k8s.io/v1beta2",
                "-o",
                "json",
            ])
            .output()
            .unwrap()
    };
    let out = render(&sample);
    assert!(out.status.success(), "{}", stderr(&out));
    // Only a resource.k8s.io version serving DeviceClasses is accepted (usage error, exit 2).
    let bad = Command::new(KILN)
        .arg("render")
        .arg("--gpu-cluster")
        .arg(&sample)
        .args(["--device-class-api", "v1"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("resource.k8s.io/v1beta2"),
        "{}",
        stderr(&bad)
    );
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let items = list["items"].as_array().expect("a List");
    let has = |kind: &str, name: &str| {
        items
            .iter()
            .any(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    };
    assert!(has("DaemonSet", "nvidia-dra-driver-kubelet-plugin"));
    assert!(has("Deployment", "nvidia-dra-driver-controller"));
    assert!(has("DaemonSet", "nvidia-dra-validator"));
    assert!(has("DaemonSet", "nvidia-dcgm-exporter-dra"));
    assert!(
        !has("DaemonSet", "nvidia-dcgm-dra"),
        "dcgm is off in the sample"
    );
    let classes: Vec<&Value> = items
        .iter()
        .filter(|o| o["kind"] == "DeviceClass")
        .collect();
    assert_eq!(
        classes.len(),
        5,
        "gpu, mig, vfio and the two compute-domain classes"
    );
    assert!(
        classes
            .iter()
            .all(|c| c["apiVersion"] == "resource.k8s.io/v1beta2")
    );
    // The CRD's singleton rule.
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("other.yaml");
    let text = std::fs::read_to_string(&sample)
        .unwrap()
        .replace("name: gpu-cluster", "name: mine");
    std::fs::write(&other, text).unwrap();
    let refused = render(&other);
    assert!(!refused.status.success());
    assert!(refused.stdout.is_empty());
    assert!(
        stderr(&refused).contains("GPUCluster is a singleton"),
        "{}",
        stderr(&refused)
    );
}
