//! kiln's OCI image for linux/amd64 and linux/arm64, built by `scripts/build-image.sh` with
//! buildah from this test's `kiln` binary (amd64) and a dev-profile arm64 `kiln` the script
//! cross-compiles (or the archive named by `$KILN_IMAGE_ARCHIVE`, e.g. the release build's),
//! is unpacked from its OCI layout (index.json → image index → one manifest per platform →
//! config and layers, every blob checked against its digest) and each platform's root
//! filesystem is run: the amd64 one in a chroot (`kiln --version`, `kiln validator --help`, as
//! root and as the operator's user 65532, with the image's own `PATH`), the arm64 one under
//! qemu-user with the image's loader and libraries (`kiln --version`); both render the same
//! ClusterPolicy offline (`kiln render`, every state through the Wasm plugins, compiled by
//! Cranelift for each architecture) to the same bytes.
//!
//! Needs buildah, root, and for arm64 Debian's `gcc-aarch64-linux-gnu`, `qemu-user`, the Rust
//! target `aarch64-unknown-linux-gnu` and arm64 as a dpkg foreign architecture (CI installs
//! them in `.ci/run` and runs as root). Without them the test is skipped with a loud message,
//! unless `$KILN_REQUIRE_IMAGE_TEST` is set (CI sets it), when it fails.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_render::defaults::KILN_IMAGE;
use serde_json::Value;
use sha2::Digest as _;

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|f| f.is_file())
}

fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output();
    out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Why the image cannot be built here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    if on_path("buildah").is_none() {
        return Some("buildah is not installed (apt-get install -y buildah)".into());
    }
    if !is_root() {
        return Some("not running as root (buildah's vfs storage and chroot need it)".into());
    }
    if on_path("aarch64-linux-gnu-gcc").is_none() {
        return Some("no arm64 cross compiler (apt-get install -y gcc-aarch64-linux-gnu)".into());
    }
    if on_path("qemu-aarch64").is_none() {
        return Some("qemu-user is not installed (apt-get install -y qemu-user)".into());
    }
    let targets = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    if !targets.is_ok_and(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .any(|l| l == "aarch64-unknown-linux-gnu")
    }) {
        return Some(
            "no Rust target aarch64-unknown-linux-gnu (rustup target add aarch64-unknown-linux-gnu)"
                .into(),
        );
    }
    None
}

/// The archive to check: `$KILN_IMAGE_ARCHIVE`, or one built now from this test's binary.
fn archive(dir: &Path) -> Option<PathBuf> {
    if let Some(given) = std::env::var_os("KILN_IMAGE_ARCHIVE") {
        return Some(given.into());
    }
    if let Some(why) = missing_prerequisite() {
        let msg = format!(
            "\n\n!!!!!!!! SKIPPED host/cli/tests/image.rs: {why}; kiln's image was NOT built or \
             checked !!!!!!!!\n\n"
        );
        assert!(
            std::env::var_os("KILN_REQUIRE_IMAGE_TEST").is_none(),
            "KILN_REQUIRE_IMAGE_TEST is set: {msg}"
        );
        eprintln!("{msg}");
        return None;
    }
    let out = dir.join("kiln.oci.tar");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let started = std::time::Instant::now();
    let status = Command::new(root.join("scripts/build-image.sh"))
        .args(["--platform", "linux/amd64,linux/arm64", "--profile", "dev"])
        .args(["--binary", &format!("amd64={KILN}"), "--output"])
        .arg(&out)
        .current_dir(&root)
        .status()
        .unwrap();
    assert!(status.success(), "scripts/build-image.sh: {status}");
    println!(
        "built {} ({:.1} MiB) in {:.1} s",
        out.display(),
        std::fs::metadata(&out).unwrap().len() as f64 / f64::from(1 << 20),
        started.elapsed().as_secs_f64()
    );
    Some(out)
}

/// An OCI image layout read from its tar: `oci-layout`, `index.json` and the blobs by digest.
struct Layout {
    files: BTreeMap<String, Vec<u8>>,
}

impl Layout {
    fn read(archive: &Path) -> Self {
        let mut files = BTreeMap::new();
        let mut tar = tar::Archive::new(std::fs::File::open(archive).unwrap());
        for e in tar.entries().unwrap() {
            let mut e = e.unwrap();
            if e.header().entry_type().is_file() {
                let path = e
                    .path()
                    .unwrap()
                    .to_string_lossy()
                    .trim_start_matches("./")
                    .to_owned();
                let mut bytes = Vec::new();
                e.read_to_end(&mut bytes).unwrap();
                files.insert(path, bytes);
            }
        }
        Layout { files }
    }

    fn json(&self, path: &str) -> Value {
        serde_json::from_slice(&self.files[path]).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The blob a descriptor points to, after checking its size and sha256 digest.
    fn blob(&self, descriptor: &Value) -> &[u8] {
        let digest = descriptor["digest"].as_str().unwrap();
        let hex = digest.strip_prefix("sha256:").unwrap();
        let bytes = &self.files[&format!("blobs/sha256/{hex}")];
        assert_eq!(
            hex::encode(sha2::Sha256::digest(bytes)),
            hex,
            "blob {digest}"
        );
        assert_eq!(
            descriptor["size"].as_u64(),
            Some(bytes.len() as u64),
            "{digest}"
        );
        bytes
    }
}

/// Unpacks a layer (plain or gzip tar) into `root`, applying OCI whiteouts.
fn unpack_layer(media_type: &str, bytes: &[u8], root: &Path) {
    let reader: Box<dyn std::io::Read> = match media_type {
        "application/vnd.oci.image.layer.v1.tar+gzip" => {
            Box::new(flate2::read::GzDecoder::new(bytes))
        }
        "application/vnd.oci.image.layer.v1.tar" => Box::new(bytes),
        other => panic!("layer media type {other}"),
    };
    let mut tar = tar::Archive::new(reader);
    tar.set_preserve_permissions(true);
    tar.set_preserve_ownerships(true);
    tar.set_unpack_xattrs(false);
    for e in tar.entries().unwrap() {
        let mut e = e.unwrap();
        let path = e.path().unwrap().into_owned();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if let Some(hidden) = name.as_deref().and_then(|n| n.strip_prefix(".wh.")) {
            let parent = root.join(path.parent().unwrap());
            if hidden == ".wh..opq" {
                let _ = std::fs::remove_dir_all(&parent);
                std::fs::create_dir_all(&parent).unwrap();
            } else {
                let _ = std::fs::remove_dir_all(parent.join(hidden));
                let _ = std::fs::remove_file(parent.join(hidden));
            }
            continue;
        }
        assert!(
            e.unpack_in(root).unwrap(),
            "{} escapes the root",
            path.display()
        );
    }
}

/// `chroot [--userspec U] root argv…` with only `env` (the image's `Env`).
fn chroot(
    root: &Path,
    user: Option<&str>,
    env: &[(String, String)],
    argv: &[&str],
) -> (bool, String, String) {
    let mut cmd = Command::new(on_path("chroot").expect("chroot"));
    if let Some(u) = user {
        cmd.arg(format!("--userspec={u}"));
    }
    let out = cmd
        .arg(root)
        .args(argv)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One platform of the image: its config and its unpacked root filesystem.
struct Platform {
    arch: String,
    config: Value,
    root: PathBuf,
}

/// The platform manifests `desc` leads to: itself, or each entry of an image index.
fn manifests(layout: &Layout, desc: &Value) -> Vec<Value> {
    match desc["mediaType"].as_str() {
        Some("application/vnd.oci.image.index.v1+json") => {
            let index: Value = serde_json::from_slice(layout.blob(desc)).unwrap();
            index["manifests"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|d| manifests(layout, d))
                .collect()
        }
        Some("application/vnd.oci.image.manifest.v1+json") => vec![desc.clone()],
        other => panic!("descriptor media type {other:?}: {desc}"),
    }
}

/// Checks one platform's manifest and config and unpacks its layers under `dir/rootfs-<arch>`.
fn unpack_platform(layout: &Layout, desc: &Value, dir: &Path) -> Platform {
    let manifest: Value = serde_json::from_slice(layout.blob(desc)).unwrap();
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.oci.image.config.v1+json"
    );
    let config: Value = serde_json::from_slice(layout.blob(&manifest["config"])).unwrap();
    assert_eq!(config["os"], "linux", "{config}");
    let arch = config["architecture"].as_str().unwrap().to_owned();
    if let Some(p) = desc.get("platform") {
        assert_eq!(p["architecture"].as_str(), Some(arch.as_str()), "{desc}");
    }
    let root = dir.join(format!("rootfs-{arch}"));
    std::fs::create_dir(&root).unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    let mut layer_bytes = 0;
    for l in layers {
        let bytes = layout.blob(l);
        layer_bytes += bytes.len();
        unpack_layer(l["mediaType"].as_str().unwrap(), bytes, &root);
    }
    println!(
        "linux/{arch}: {} layer(s), {:.1} MiB compressed",
        layers.len(),
        layer_bytes as f64 / f64::from(1 << 20)
    );
    Platform { arch, config, root }
}

/// The image's `Env` as pairs.
fn image_env(config: &Value) -> Vec<(String, String)> {
    config["config"]["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let (k, v) = e.as_str().unwrap().split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// `kiln argv…` of an arm64 root filesystem under qemu-user: the image's loader and libraries
/// (`-L root`), the image's `Env` only.
fn qemu(root: &Path, env: &[(String, String)], argv: &[&str]) -> (bool, String, String) {
    let out = Command::new(on_path("qemu-aarch64").expect("qemu-aarch64"))
        .arg("-L")
        .arg(root)
        .arg(root.join("usr/bin/kiln"))
        .args(argv)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_image_runs_kiln_from_its_own_root_filesystem_on_both_architectures() {
    let dir = tempfile::tempdir().unwrap();
    let Some(archive) = archive(dir.path()) else {
        return;
    };
    let layout = Layout::read(&archive);
    assert_eq!(layout.json("oci-layout")["imageLayoutVersion"], "1.0.0");
    let index = layout.json("index.json");
    let top = index["manifests"].as_array().unwrap();
    assert_eq!(top.len(), 1, "{index}");
    assert_eq!(
        top[0]["annotations"]["org.opencontainers.image.ref.name"].as_str(),
        Some(KILN_IMAGE),
        "{index}"
    );
    let platforms: Vec<Platform> = manifests(&layout, &top[0])
        .iter()
        .map(|d| unpack_platform(&layout, d, dir.path()))
        .collect();
    let mut archs: Vec<&str> = platforms.iter().map(|p| p.arch.as_str()).collect();
    archs.sort_unstable();
    if std::env::var_os("KILN_IMAGE_ARCHIVE").is_none() {
        assert_eq!(archs, ["amd64", "arm64"], "{index}");
    }

    let commit = Command::new(KILN)
        .args(["version", "--only", "commit"])
        .output()
        .unwrap();
    let commit = String::from_utf8(commit.stdout).unwrap();
    let policy =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clusterpolicy.yaml"))
            .unwrap();
    let mut renders = Vec::new();
    for p in &platforms {
        let (arch, root) = (p.arch.as_str(), p.root.as_path());
        let c = &p.config["config"];
        assert_eq!(c["Entrypoint"], serde_json::json!(["/usr/bin/kiln"]));
        let labels = &c["Labels"];
        for (key, want) in [
            (
                "org.opencontainers.image.version",
                env!("CARGO_PKG_VERSION"),
            ),
            ("org.opencontainers.image.revision", commit.trim()),
            (
                "org.opencontainers.image.source",
                env!("CARGO_PKG_REPOSITORY"),
            ),
            ("org.opencontainers.image.licenses", "Apache-2.0"),
        ] {
            if std::env::var_os("KILN_IMAGE_ARCHIVE").is_some() && key.ends_with("revision") {
                continue; // another build's binary
            }
            assert_eq!(labels[key].as_str(), Some(want), "{arch} {key}: {labels}");
        }
        let env = image_env(&p.config);
        assert!(
            env.iter()
                .any(|(k, v)| k == "PATH" && v.split(':').any(|d| d == "/usr/bin")),
            "{env:?}"
        );

        // What the binary and its agents need at run time, and nothing else to run.
        let (loader, libdir, machine) = match arch {
            "amd64" => ("lib64/ld-linux-x86-64.so.2", "x86_64-linux-gnu", [0x3e, 0]),
            "arm64" => ("lib/ld-linux-aarch64.so.1", "aarch64-linux-gnu", [0xb7, 0]),
            other => panic!("unexpected architecture {other}"),
        };
        for f in [
            "usr/bin/kiln",
            loader,
            &format!("usr/lib/{libdir}/libc.so.6"),
            &format!("usr/lib/{libdir}/libgcc_s.so.1"),
            "etc/ld.so.conf",
        ] {
            assert!(root.join(f).exists(), "{arch}: {f} missing");
        }
        let elf = std::fs::read(root.join("usr/bin/kiln")).unwrap();
        assert_eq!(
            elf[18..20],
            machine,
            "{arch}: ELF e_machine of usr/bin/kiln"
        );
        assert!(
            !root.join("bin/sh").exists(),
            "{arch}: the image has a shell"
        );
        let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
        assert!(
            passwd
                .lines()
                .any(|l| l.starts_with("nonroot:x:65532:65532:")),
            "{passwd}"
        );
        let home = std::fs::metadata(root.join("home/nonroot")).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&home), 65532);
        let certs =
            std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
        assert!(certs.matches("BEGIN CERTIFICATE").count() > 100);

        // Run from the image: amd64 by name through the image's PATH (as the rendered
        // `command: [kiln, …]` is), as root and as the operator's user; arm64 under qemu-user,
        // which runs outside the root (its files by their path here).
        std::fs::write(root.join("tmp/policy.yaml"), &policy).unwrap();
        let policy_arg = match arch {
            "amd64" => "/tmp/policy.yaml".to_owned(),
            _ => root.join("tmp/policy.yaml").display().to_string(),
        };
        let run = |argv: &[&str]| match arch {
            "amd64" => {
                let mut full = vec!["kiln"];
                full.extend_from_slice(argv);
                chroot(root, None, &env, &full)
            }
            _ => qemu(root, &env, argv),
        };
        let (ok, out, err) = run(&["--version"]);
        assert!(ok, "{arch}: {err}");
        assert!(
            out.starts_with(&format!("kiln {} (commit ", env!("CARGO_PKG_VERSION"))),
            "{arch}: {out}"
        );
        let started = std::time::Instant::now();
        let (ok, out, err) = run(&["render", "--policy", &policy_arg]);
        assert!(ok, "{arch}: kiln render: {err}");
        assert!(out.contains("kind: DaemonSet"), "{arch}: {out}");
        println!(
            "linux/{arch}: kiln render of tests/data/clusterpolicy.yaml in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        renders.push((arch.to_owned(), out));
        if arch == "amd64" {
            let (ok, out, err) = run(&["validator", "--help"]);
            assert!(ok, "{err}");
            for step in ["driver", "toolkit", "cuda", "plugin", "wait", "hold"] {
                assert!(out.contains(step), "{step} missing from\n{out}");
            }
            let (ok, out, err) = chroot(
                root,
                Some("65532:65532"),
                &env,
                &["kiln", "version", "--only", "image"],
            );
            assert!(ok, "{err}");
            assert_eq!(out.trim(), KILN_IMAGE);
        }
    }
    for pair in renders.windows(2) {
        assert!(
            pair[0].1 == pair[1].1,
            "linux/{} and linux/{} render the policy differently",
            pair[0].0,
            pair[1].0
        );
    }
}
