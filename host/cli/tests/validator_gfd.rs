//! `kiln validator` and `kiln gfd` as the DaemonSets run them: every validator/GFD command in
//! the assets parses, the driver step and GFD work end to end on a fake GPU.

use std::{path::Path, process::Command};

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

/// One fake H100 (see `kiln_gpu::fixtures`).
const FIXTURE: &str = kiln_gpu::fixtures::ONE_H100;

fn kiln(args: &[&str], env: &[(&str, &Path)]) -> std::process::Output {
    let mut c = Command::new(KILN);
    c.args(args).env_remove("NODE_NAME").env("KILN_LOG", "warn");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// `command: [kiln, validator|gfd, …]` lines of every asset DaemonSet.
fn asset_commands() -> Vec<Vec<String>> {
    let assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets");
    let mut out = Vec::new();
    for state in std::fs::read_dir(assets).unwrap().flatten() {
        let Ok(text) = std::fs::read_to_string(state.path().join("0500_daemonset.yaml")) else {
            continue;
        };
        for line in text.lines() {
            let Some(list) = line.trim().strip_prefix("command: [") else {
                continue;
            };
            let words: Vec<String> = list
                .trim_end_matches(']')
                .split(',')
                .map(|w| w.trim().to_owned())
                .collect();
            if words[0] == "kiln" && matches!(words[1].as_str(), "validator" | "gfd") {
                out.push(words[1..].to_vec());
            }
        }
    }
    out
}

#[test]
fn every_validator_and_gfd_command_in_the_assets_parses() {
    let cmds = asset_commands();
    assert!(cmds.iter().any(|c| c == &["validator", "driver"]));
    assert!(cmds.iter().any(|c| c == &["gfd"]));
    assert!(
        cmds.iter()
            .any(|c| c == &["validator", "wait", "--for", "toolkit-ready"])
    );
    for c in cmds {
        let mut args: Vec<&str> = c.iter().map(String::as_str).collect();
        args.push("--help");
        let out = kiln(&args, &[]);
        assert!(
            out.status.success(),
            "kiln {c:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn driver_step_and_wait_run_against_a_temporary_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let fixture = root.join("gpus.yaml");
    std::fs::write(&fixture, FIXTURE).unwrap();
    std::fs::create_dir_all(root.join("proc/driver/nvidia")).unwrap();
    std::fs::write(
        root.join("proc/driver/nvidia/version"),
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.144.03  Thu Nov 28 2024\n",
    )
    .unwrap();
    // The unified-memory module's character device, and its device nodes on the host (the
    // driver step creates them when missing, which needs mknod).
    std::fs::write(
        root.join("proc/devices"),
        "Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n",
    )
    .unwrap();
    std::fs::create_dir_all(root.join("host/dev")).unwrap();
    for node in ["host/dev/nvidia-uvm", "host/dev/nvidia-uvm-tools"] {
        std::fs::write(root.join(node), "").unwrap();
    }
    let lib = root.join("host/usr/lib64");
    std::fs::create_dir_all(&lib).unwrap();
    std::os::unix::fs::symlink("libnvidia-ml.so.550.144.03", lib.join("libnvidia-ml.so.1"))
        .unwrap();
    let backend = format!("fake:{}", fixture.display());
    let common = ["validator", "--gpu-backend", &backend, "--retries", "1"];

    let out = kiln(
        &[&common[..], &["driver"]].concat(),
        &[("KILN_VALIDATOR_ROOT", root)],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "driver 550.144.03 ok (host driver, root {}), GPUs: GPU-11111111-2222-3333-4444-555555555555\n",
            root.join("host").display()
        )
    );
    let ready = std::fs::read_to_string(root.join("run/nvidia/validations/driver-ready")).unwrap();
    assert!(ready.starts_with("IS_HOST_DRIVER=true\n"), "{ready}");

    let wait = kiln(
        &[&common[..], &["wait", "--for", "driver-ready"]].concat(),
        &[("KILN_VALIDATOR_ROOT", root)],
    );
    assert!(wait.status.success());
    let wait = kiln(
        &[&common[..], &["wait", "--for", "toolkit-ready"]].concat(),
        &[("KILN_VALIDATOR_ROOT", root)],
    );
    assert_eq!(wait.status.code(), Some(1));
    let err = String::from_utf8_lossy(&wait.stderr);
    assert!(
        err.contains("error: wait: not ready after 1 attempt over 0s: ")
            && err.contains("toolkit-ready does not exist yet"),
        "{err}"
    );
    for bad in ["toolkit", "bogus-ready"] {
        let wait = kiln(
            &[&common[..], &["wait", "--for", bad]].concat(),
            &[("KILN_VALIDATOR_ROOT", root)],
        );
        assert_eq!(wait.status.code(), Some(2), "usage error for {bad}");
        let err = String::from_utf8_lossy(&wait.stderr);
        assert!(
            err.contains(&format!("invalid value '{bad}' for '--for <FILE>'"))
                && err.contains(
                    "[possible values: driver-ready, toolkit-ready, cuda-ready, plugin-ready, \
                     vfio-pci-ready, vgpu-manager-ready, vgpu-devices-ready, cc-manager-ready]"
                ),
            "{err}"
        );
    }
}

#[test]
fn gfd_oneshot_prints_time_sliced_labels_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = dir.path().join("gpus.yaml");
    std::fs::write(&fixture, FIXTURE).unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 5\n",
    )
    .unwrap();
    let backend = format!("fake:{}", fixture.display());
    let out = kiln(
        &[
            "gfd",
            "--oneshot",
            "--no-timestamp",
            "--output",
            "stdout",
            "--gpu-backend",
            &backend,
            "--machine-type-file",
            "/nonexistent",
        ],
        &[("GFD_CONFIG_FILE", &cfg)],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for line in [
        "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3-SHARED\n",
        "nvidia.com/gpu.replicas=5\n",
        "nvidia.com/gpu.sharing-strategy=time-slicing\n",
        "nvidia.com/gpu.count=1\n",
        "nvidia.com/gpu.memory=81559\n",
        "nvidia.com/gpu.machine=unknown\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(!text.contains("gfd.timestamp"));
}

/// Whether the dynamic loader can find `libcuda.so.1` here (`LD_LIBRARY_PATH` or its cache).
fn has_libcuda() -> bool {
    let in_path = std::env::var("LD_LIBRARY_PATH").is_ok_and(|p| {
        p.split(':')
            .any(|d| !d.is_empty() && Path::new(d).join("libcuda.so.1").exists())
    });
    let cached = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|c| Command::new(c).arg("-p").output().ok())
        .is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so.1"));
    in_path || cached
}

/// The cuda step on a fake GPU: NVML's prerequisites pass, then CUDA itself must work. Without
/// `libcuda.so.1` (CI) it exits 1 naming the library, without a panic message; with
/// `WITH_WORKLOAD=false` it creates no CUDA context, as upstream then runs no workload pod.
#[test]
fn the_cuda_step_needs_libcuda_unless_the_workload_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = dir.path().join("gpus.yaml");
    std::fs::write(&fixture, FIXTURE).unwrap();
    let backend = format!("fake:{}", fixture.display());
    let args = [
        "validator",
        "--gpu-backend",
        &backend,
        "--retries",
        "2",
        "--sleep-interval-seconds",
        "0",
        "cuda",
    ];
    let root = [("KILN_VALIDATOR_ROOT", dir.path())];
    let out = kiln(&args, &root);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    if !has_libcuda() {
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(
                "cuda: not ready after 2 attempts over 0s: CUDA is not usable: libcuda.so.1 \
                 cannot be loaded (nor any of the "
            ) && err.contains(
                " other names tried): this step needs the driver step to have found the NVIDIA \
                 driver and the toolkit step"
            ),
            "{err}"
        );
        assert!(
            !dir.path()
                .join("run/nvidia/validations/cuda-ready")
                .exists()
        );
    }

    let mut off = Command::new(KILN);
    off.args(args)
        .env_remove("NODE_NAME")
        .env("KILN_LOG", "warn")
        .env("KILN_VALIDATOR_ROOT", dir.path())
        .env("WITH_WORKLOAD", "false");
    let out = off.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "cuda 12.4 ok on 1 GPU(s)\n"
    );
    assert!(
        dir.path()
            .join("run/nvidia/validations/cuda-ready")
            .exists()
    );
}
