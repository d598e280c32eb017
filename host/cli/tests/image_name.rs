//! One image name and tag everywhere: `kiln_render::defaults::KILN_IMAGE` (repository
//! `ghcr.io/kiln-dev/kiln`, tag = the workspace version) is what the chart, the plain
//! Deployment, the plugin test cases, the goldens and `kiln version` say.

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_render::defaults::{KILN_IMAGE, KILN_IMAGE_REPOSITORY};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn yaml(path: &str) -> serde_yaml_ng::Value {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_image_is_the_repository_tagged_with_the_workspace_version() {
    assert_eq!(KILN_IMAGE_REPOSITORY, "ghcr.io/kiln-dev/kiln");
    assert_eq!(
        KILN_IMAGE,
        format!("{KILN_IMAGE_REPOSITORY}:{}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn the_chart_names_the_same_image() {
    let chart = yaml("deploy/helm/kiln/Chart.yaml");
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    let values = yaml("deploy/helm/kiln/values.yaml");
    let kiln = &values["kiln"];
    let repo = format!(
        "{}/{}",
        kiln["repository"].as_str().unwrap(),
        kiln["image"].as_str().unwrap()
    );
    assert_eq!(repo, KILN_IMAGE_REPOSITORY);
    // Empty: the template takes the chart's appVersion (checked above).
    assert_eq!(kiln["version"].as_str(), Some(""));
}

#[test]
fn the_plain_deployment_runs_the_image() {
    let text = std::fs::read_to_string(root().join("deploy/operator/deployment.yaml")).unwrap();
    let mut images = Vec::new();
    for doc in text.split("\n---\n") {
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(doc).unwrap();
        if doc["kind"] != "Deployment" {
            continue;
        }
        let pod = &doc["spec"]["template"]["spec"];
        for list in ["initContainers", "containers"] {
            for c in pod[list].as_sequence().into_iter().flatten() {
                images.push(c["image"].as_str().unwrap().to_owned());
            }
        }
    }
    assert_eq!(images, [KILN_IMAGE, KILN_IMAGE]);
}

/// Every `ghcr.io/kiln-…/kiln:…` reference in the repository's docs, manifests and test data
/// is [`KILN_IMAGE`] (a version bump or a rename must update them all).
#[test]
fn no_other_kiln_image_reference_is_left() {
    let mut stale = Vec::new();
    let mut seen = 0;
    for dir in ["README.md", "deploy", "plugins", "host", "assets", "docs"] {
        scan(&root().join(dir), &mut |path, text| {
            for (i, _) in text.match_indices("ghcr.io/kiln-") {
                let rest = &text[i..];
                let end = rest
                    .find(|c: char| c.is_whitespace() || "\"'`,)]}\\".contains(c))
                    .unwrap_or(rest.len());
                let reference = &rest[..end];
                // Also fine: the repository or its registry/owner part alone (the chart's
                // `kiln.repository`), and prose with a placeholder tag (`…/kiln:<version>`).
                let fine = reference == KILN_IMAGE
                    || KILN_IMAGE_REPOSITORY.starts_with(reference)
                    || reference.starts_with(&format!("{KILN_IMAGE_REPOSITORY}:<"));
                if !fine {
                    stale.push(format!("{}: {reference}", path.display()));
                }
                seen += 1;
            }
        });
    }
    assert!(stale.is_empty(), "not {KILN_IMAGE}:\n{}", stale.join("\n"));
    assert!(seen > 20, "only {seen} references found");
}

fn scan(dir: &Path, f: &mut dyn FnMut(&Path, &str)) {
    if dir.is_file() {
        f(dir, &std::fs::read_to_string(dir).unwrap());
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        if path.is_dir() {
            if name != "target" && name != "testcluster" {
                scan(&path, f);
            }
        } else if path.extension().is_some_and(|x| {
            ["rs", "yaml", "yml", "md", "tpl", "json"].contains(&&*x.to_string_lossy())
        }) && let Ok(text) = std::fs::read_to_string(&path)
        {
            // This file spells the pattern out.
            if !path.ends_with("image_name.rs") {
                f(&path, &text);
            }
        }
    }
}

#[test]
fn kiln_version_reports_the_version_commit_and_image() {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], format!("kiln {}", env!("CARGO_PKG_VERSION")));
    let commit = lines[1].strip_prefix("commit: ").unwrap();
    assert!(
        commit == "unknown"
            || (commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "{commit}"
    );
    assert_eq!(lines[2], format!("image: {KILN_IMAGE}"));
    assert!(lines[3].starts_with("source: https://"), "{}", lines[3]);

    // Built in a git checkout, the commit is HEAD's at build time (a later commit by someone
    // else moves HEAD, so only the form is checked when they differ).
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success());
    if head.is_some() {
        assert_ne!(commit, "unknown", "built in a git checkout, but no commit");
    }

    let only = |field: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["version", "--only", field])
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(only("image"), format!("{KILN_IMAGE}\n"));
    assert_eq!(only("version"), format!("{}\n", env!("CARGO_PKG_VERSION")));
    assert_eq!(only("commit"), format!("{commit}\n"));

    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("kiln {} (commit {commit})\n", env!("CARGO_PKG_VERSION"))
    );
}
