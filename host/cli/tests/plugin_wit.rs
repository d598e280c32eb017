//! `kiln plugin wit`: the WIT package plugins are written against, as a binary WIT package a
//! component tool can depend on; it decodes back to the package name, version and worlds.

use std::process::{Command, Output};

use kiln_plugin_host::wit_package::decode_wit_package;

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn writes_each_version_as_a_binary_wit_package() {
    let dir = tempfile::tempdir().unwrap();
    for (version, worlds) in [
        (
            None,
            "kiln:operand@0.2.0 (worlds operand-transform, operand-transform-validated)",
        ),
        (
            Some("0.1.0"),
            "kiln:operand@0.1.0 (worlds operand-transform)",
        ),
    ] {
        let file = dir.path().join(format!("{version:?}.wasm"));
        let mut args = vec!["plugin", "wit", "-o", file.to_str().unwrap()];
        args.extend(version.map(|v| ["--version", v]).into_iter().flatten());
        let out = kiln(&args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains(worlds), "{stdout}");
        let info = decode_wit_package(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(
            info.package,
            format!("kiln:operand@{}", version.unwrap_or("0.2.0"))
        );
    }
    let out = kiln(&["plugin", "wit", "--version", "9.9.9", "-o", "/dev/null"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("known: 0.2.0, 0.1.0"), "{stderr}");
}

/// `-o -` writes the package to stdout (the bytes a file would hold) and the summary to stderr.
#[test]
fn a_dash_writes_the_package_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.wasm");
    assert!(
        kiln(&["plugin", "wit", "-o", file.to_str().unwrap()])
            .status
            .success()
    );
    let out = kiln(&["plugin", "wit", "-o", "-"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, std::fs::read(&file).unwrap());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("stdout: kiln:operand@0.2.0"), "{stderr}");
    assert!(!std::path::Path::new("-").exists(), "no file named -");
}
