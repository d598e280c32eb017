//! Sets `KILN_GIT_COMMIT` for `kiln version` / `kiln --version`: `$KILN_GIT_COMMIT` when set
//! (a build from a source archive, or `scripts/build-image.sh`), else `git rev-parse HEAD` of
//! the checkout, else `unknown` (no git, no `.git`: the build never fails for it). A checkout
//! with uncommitted changes to tracked files is not detected (that would rebuild on every edit).

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(std::env::var_os("CARGO_MANIFEST_DIR")?)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=KILN_GIT_COMMIT");
    let commit = std::env::var("KILN_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            // Rebuild when HEAD moves: HEAD itself (a checkout), the branch it names (a commit)
            // and packed-refs (a gc); each path as git reports it (worktrees, GIT_DIR).
            for file in ["HEAD", "packed-refs"] {
                if let Some(p) = git(&["rev-parse", "--git-path", file]) {
                    rerun_if_changed(p);
                }
            }
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
                && let Some(p) = git(&["rev-parse", "--git-path", &branch])
            {
                rerun_if_changed(p);
            }
            git(&["rev-parse", "HEAD"])
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=KILN_GIT_COMMIT={commit}");
}

/// `--git-path` answers relative to the crate directory; cargo wants a path it can stat.
fn rerun_if_changed(path: String) {
    let mut p = PathBuf::from(path);
    if p.is_relative()
        && let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR")
    {
        p = PathBuf::from(dir).join(p);
    }
    if p.exists() {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}
