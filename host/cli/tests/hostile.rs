//! `kiln render` and `kiln plugin check` with hostile plugins (the fixtures of
//! `host/plugin-host/tests/fixtures`): a hostile site plugin fails its own state alone, with an
//! error that is bounded, escaped and names it; shadowing is shown and refusable.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[allow(dead_code)]
#[path = "../../plugin-host/tests/host/common.rs"]
mod common;

const KILN: &str = env!("CARGO_BIN_EXE_kiln");
const SAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/samples/clusterpolicy.yaml"
);

/// A scratch dir with a drop-in directory and a policy chaining `site` after the
/// device-plugin state's standard plugin.
struct Site {
    dir: tempfile::TempDir,
}

impl Site {
    fn new(site: Option<(&str, &[u8])>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        let sample = std::fs::read_to_string(SAMPLE).unwrap();
        let policy = match site {
            Some((name, bytes)) => {
                std::fs::write(dir.path().join(format!("plugins/{name}.wasm")), bytes).unwrap();
                sample.replacen(
                    "metadata:\n",
                    &format!(
                        "metadata:\n  annotations:\n    kiln.dev/plugins: |\n      device-plugin:\n        then:\n          - name: {name}\n"
                    ),
                    1,
                )
            }
            None => sample,
        };
        std::fs::write(dir.path().join("policy.yaml"), policy).unwrap();
        Site { dir }
    }

    fn plugins(&self) -> PathBuf {
        self.dir.path().join("plugins")
    }

    fn render(&self, extra: &[&str]) -> Output {
        let mut c = Command::new(KILN);
        c.arg("render")
            .arg("--policy")
            .arg(self.dir.path().join("policy.yaml"))
            .arg("--plugins-dir")
            .arg(self.plugins())
            .args(extra)
            .env_remove("KILN_REFUSE_SHADOWING")
            .env_remove("KILN_SITE_POD_PRIVILEGES")
            .env("KILN_PLUGIN_CACHE_DIR", cache_dir());
        c.output().unwrap()
    }
}

/// One artifact cache for all these tests (artifacts are named by digest, written atomically,
/// and checked against their records), so the standard plugins compile once, not per render.
fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-plugin-cache")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `error:` lines of a failed render: one per failed state, then the count.
fn error_lines(out: &Output) -> Vec<String> {
    stderr(out)
        .lines()
        .filter(|l| l.starts_with("error:"))
        .map(str::to_string)
        .collect()
}

/// Asserts that the render failed in state device-plugin alone, blaming `plugin`, and returns
/// that state's error line.
fn fails_alone(out: &Output, plugin: &str) -> String {
    assert_eq!(out.status.code(), Some(1), "{}", stderr(out));
    assert!(out.stdout.is_empty());
    let lines = error_lines(out);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert_eq!(lines[1], "error: 1 state(s) failed to render");
    assert!(
        lines[0].contains(&format!("state device-plugin: plugin \"{plugin}\"")),
        "{}",
        lines[0]
    );
    lines[0].clone()
}

#[test]
fn a_site_plugin_with_63_memories_fails_its_state_alone() {
    let site = Site::new(Some(("hog", &common::many_memories("hog", 63, 1024))));
    let line = fails_alone(&site.render(&[]), "hog");
    assert!(
        line.ends_with(
            "the component is over several bounds: 63 memories (limit 4), 63 core instances (limit 48), \
             4160815104 bytes of initial memory (limit 67108864)"
        ),
        "{line}"
    );
}

#[test]
fn a_10_mib_guest_error_is_printed_bounded_and_escaped() {
    let bytes = common::hostile("long_error", "loud");
    let site = Site::new(Some(("loud", &bytes)));
    let out = site.render(&[]);
    let line = fails_alone(&out, "loud");
    assert!(
        out.stderr.len() < 8 << 10,
        "{} bytes of stderr",
        out.stderr.len()
    );
    assert!(!stderr(&out).contains('\u{1b}') && !stderr(&out).contains('\r'));
    assert!(
        line.contains(r"refused: failed: \u{1b}[31m\r\nerror: forged line\n"),
        "{line}"
    );
    assert!(line.ends_with("… [truncated, 10485760 bytes]"), "{line}");
}

#[test]
fn a_site_plugin_returning_a_2_mib_object_is_refused() {
    let bytes = common::patcher_with(
        "big",
        r#"[{"op":"add","path":"/x-pad","value":""#,
        2 << 20,
        r#""}]"#,
        "(func $before)",
    );
    let site = Site::new(Some(("big", &bytes)));
    let out = site.render(&["-o", "json"]);
    let line = fails_alone(&out, "big");
    assert!(
        line.contains("serializes to more than 1048576 bytes"),
        "{line}"
    );
}

#[test]
fn a_site_plugin_cannot_escalate_rbac() {
    // The patch goes to every object of the state; the first binding (the RoleBinding)
    // refuses it.
    let bytes = common::patcher(
        "escalate",
        r#"[{"op":"add","path":"/subjects","value":[{"apiGroup":"rbac.authorization.k8s.io","kind":"Group","name":"system:authenticated"}]}]"#,
    );
    let site = Site::new(Some(("escalate", &bytes)));
    let line = fails_alone(&site.render(&[]), "escalate");
    assert!(
        line.contains("/subjects changed; a site plugin may not change RBAC rules"),
        "{line}"
    );
}

#[test]
fn a_drop_in_shadowing_a_bundled_plugin_is_named_in_the_source_line_and_refusable() {
    let (_, bytes) = kiln_bundled_plugins::BUNDLED
        .iter()
        .find(|(n, _)| *n == "device-plugin")
        .unwrap();
    let site = Site::new(None);
    std::fs::write(site.plugins().join("device-plugin.wasm"), bytes).unwrap();
    let out = site.render(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let path = site.plugins().join("device-plugin.wasm");
    let expected = format!(
        "# Source: state-device-plugin via device-plugin (drop-in {}, shadows bundled)\n",
        path.display()
    );
    assert!(text.contains(&expected), "{expected} not in the output");
    assert!(text.contains("# Source: state-driver via driver\n"));

    for refuse in [site.render(&["--refuse-shadowing"]), {
        let mut c = Command::new(KILN);
        c.args(["render", "--policy"])
            .arg(site.dir.path().join("policy.yaml"))
            .arg("--plugins-dir")
            .arg(site.plugins())
            .env("KILN_REFUSE_SHADOWING", "true")
            .env("KILN_PLUGIN_CACHE_DIR", cache_dir());
        c.output().unwrap()
    }] {
        let line = fails_alone(&refuse, "device-plugin");
        assert!(
            line.contains("shadows the bundled plugin of that name, which this host refuses"),
            "{line}"
        );
    }
}

#[test]
fn plugin_check_refuses_a_name_that_differs_from_the_file_name() {
    let dir = tempfile::tempdir().unwrap();
    let path: &Path = &dir.path().join("site-x.wasm");
    std::fs::write(path, common::patcher("site-y", "[]")).unwrap();
    // The check's compile goes to the cache directory (a refused plugin leaves nothing there).
    let cache = dir.path().join("cache");
    let out = Command::new(KILN)
        .args(["plugin", "check"])
        .arg(path)
        .env("KILN_PLUGIN_CACHE_DIR", &cache)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("verdict: refused: plugin \"site-x\": the component calls itself \"site-y\""),
        "{text}"
    );
    assert!(text.contains(" s, not cached (refused)\n"), "{text}");
    assert_eq!(std::fs::read_dir(&cache).map_or(0, |d| d.count()), 0);
    // Every forbidden import is listed and marked.
    let forbidden = dir.path().join("fs.wasm");
    std::fs::write(&forbidden, common::standalone("forbidden_many")).unwrap();
    let out = Command::new(KILN)
        .args(["plugin", "check"])
        .arg(&forbidden)
        .env("KILN_PLUGIN_CACHE_DIR", &cache)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(text.matches("(FORBIDDEN)").count(), 3, "{text}");
    // Every bound with its value, and the host's limits.
    for line in [
        "  core instances: 0 (limit 48, ok)",
        "  memories: 0 (limit 4, ok)",
        "  component bytes: 33554432",
        "  deadline per call: 2000 ms",
    ] {
        assert!(text.contains(line), "{line:?} in {text}");
    }
    assert!(
        text.contains("compile: not compiled (refused before compiling)\n"),
        "{text}"
    );
    assert!(
        text.contains("verdict: refused: plugin \"fs\": forbidden imports \"wasi:keyvalue/store@0.2.0-draft\", \"wasi:config/store@0.2.0-draft\", \"wasi:http/incoming-handler@0.2.6\""),
        "{text}"
    );
}
