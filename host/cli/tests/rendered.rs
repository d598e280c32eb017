//! What `kiln render` produces runs with the agents: for a few policies, every container of a
//! rendered DaemonSet that runs `kiln …` is checked against the CLI with the container's own
//! command and env (`KILN_CHECK_ARGS=1`: clap parses flags and env as the pod would, then
//! reports the env vars the subcommand reads). A rendered env var that no agent reads fails,
//! unless it is listed in [`NOT_FOR_THE_AGENT`] with the reason; config files named by env
//! must lie on one of the container's mounts; a config-manager sidecar that signals must find
//! its process in the same pod. The rendered GFD container also runs for real (fake GPU,
//! oneshot, stdout) with its rendered env.

use std::{collections::BTreeSet, path::Path, process::Command};

use serde_json::{Value, json};

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

/// Env vars rendered on `kiln` containers that the agent does not read, by design:
/// (subcommand path prefix, env var, why). `*` matches every command.
const NOT_FOR_THE_AGENT: &[(&str, &str, &str)] = &[
    (
        "*",
        "NVIDIA_VISIBLE_DEVICES",
        "read by the NVIDIA container runtime",
    ),
    (
        "*",
        "NVIDIA_DRIVER_CAPABILITIES",
        "read by the NVIDIA container runtime",
    ),
    (
        "*",
        "NVIDIA_MIG_MONITOR_DEVICES",
        "read by the NVIDIA container runtime",
    ),
    (
        "device-plugin",
        "CDI_ENABLED",
        "operator marker; the plugin takes CDI from DEVICE_LIST_STRATEGY",
    ),
    (
        "exporter",
        "DCGM_REMOTE_HOSTENGINE_INFO",
        "kiln exporter reads NVML, not a DCGM host engine",
    ),
    (
        "exporter",
        "NODE_NAME",
        "upstream's name; kiln exporter reads KILN_EXPORTER_NODE_NAME, rendered next to it",
    ),
    (
        "validator",
        "NODE_NAME",
        "set on every step as upstream; the plugin and cc-manager steps read it",
    ),
    (
        "validator",
        "OPERATOR_NAMESPACE",
        "workload pods upstream; kiln's cuda/plugin steps check in-process",
    ),
    (
        "validator",
        "VALIDATOR_IMAGE",
        "workload pods upstream; kiln's cuda/plugin steps check in-process",
    ),
    (
        "validator",
        "VALIDATOR_IMAGE_PULL_POLICY",
        "workload pods upstream; kiln's cuda/plugin steps check in-process",
    ),
    (
        "validator",
        "VALIDATOR_RUNTIME_CLASS",
        "workload pods upstream; kiln's cuda/plugin steps check in-process",
    ),
    (
        "validator",
        "WITH_WORKLOAD",
        "upstream's main container (kiln validator hold) carries it too; kiln's cuda and plugin steps read it",
    ),
    (
        "validator",
        "WITH_WAIT",
        "NVIDIA's validator image reads it (pod templates equal NVIDIA's); kiln's steps wait by subcommand",
    ),
    (
        "validator",
        "COMPONENT",
        "NVIDIA's validator image reads it (pod templates equal NVIDIA's); kiln names the step as a subcommand",
    ),
    (
        "validator",
        "DEFAULT_GPU_WORKLOAD_CONFIG",
        "NVIDIA's sandbox validator reads it to pick the node's checks; kiln runs one subcommand per check (vfio-pci, vgpu-manager, vgpu-devices)",
    ),
];

/// Env vars whose value is a file or directory the agent opens in its own container.
const PATH_ENV: &[&str] = &[
    "CONFIG_FILE",
    "GFD_CONFIG_FILE",
    "CONFIG_FILE_DST",
    "CONFIG_FILE_SRCDIR",
    "KILN_EXPORTER_COLLECTORS",
];

fn sample() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/samples/clusterpolicy.yaml");
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The sample with a per-node device-plugin config (time-slicing), MIG mixed, CDI off, a
/// custom metrics list, dcgm-exporter env in upstream's names and validator plugin env.
fn configured() -> Value {
    let mut p = sample();
    let s = &mut p["spec"];
    s["devicePlugin"]["config"] = json!({"name": "time-slicing-config", "default": "any"});
    s["mig"]["strategy"] = json!("mixed");
    s["cdi"] = json!({"enabled": false});
    s["validator"]["plugin"] = json!({"env": [{"name": "WITH_WORKLOAD", "value": "false"}]});
    s["dcgmExporter"]["config"] = json!({"name": "custom-metrics"});
    s["dcgmExporter"]["env"] = json!([
        {"name": "DCGM_EXPORTER_INTERVAL", "value": "15000"},
        {"name": "KUBERNETES_VIRTUAL_GPUS", "value": "true"}
    ]);
    p
}

/// The sample with MIG `none`, a config without a default key (config-manager falls back to
/// the empty config) and the device plugin's own env.
fn no_default_key() -> Value {
    let mut p = sample();
    let s = &mut p["spec"];
    s["mig"]["strategy"] = json!("none");
    s["devicePlugin"]["config"] = json!({"name": "dp-configs", "default": ""});
    s["devicePlugin"]["env"] = json!([{"name": "DEVICE_ID_STRATEGY", "value": "index"}]);
    p
}

/// `kiln render … -o json` of `policy`: the objects.
fn render(policy: &Value, extra: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, serde_yaml_ng::to_string(policy).unwrap()).unwrap();
    let out = Command::new(KILN)
        .args(["render", "--policy"])
        .arg(&file)
        .args(["-o", "json"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "render: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    list["items"].as_array().unwrap().clone()
}

/// A container of a DaemonSet.
struct Ctr<'a> {
    ds: &'a str,
    pod: &'a Value,
    c: &'a Value,
}

fn kiln_containers(objects: &[Value]) -> Vec<Ctr<'_>> {
    let mut out = Vec::new();
    for o in objects.iter().filter(|o| o["kind"] == "DaemonSet") {
        let pod = &o["spec"]["template"]["spec"];
        for list in ["initContainers", "containers"] {
            for c in pod[list].as_array().into_iter().flatten() {
                if c["command"][0] == "kiln" {
                    out.push(Ctr {
                        ds: o["metadata"]["name"].as_str().unwrap(),
                        pod,
                        c,
                    });
                }
            }
        }
    }
    out
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// The container's env as the pod would see it (downward API fields get stand-in values).
fn env_of(c: &Value) -> Vec<(String, String)> {
    c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let value = match (&e["value"], &e["valueFrom"]["fieldRef"]["fieldPath"]) {
                (Value::String(v), _) => v.clone(),
                (_, Value::String(f)) if f == "spec.nodeName" => "node-1".into(),
                (_, Value::String(f)) if f == "metadata.namespace" => "gpu-operator".into(),
                (_, Value::String(f)) if f == "metadata.name" => "pod-1".into(),
                (Value::Null, Value::Null) => String::new(),
                other => panic!("unexpected env source {other:?}"),
            };
            (e["name"].as_str().unwrap().to_owned(), value)
        })
        .collect()
}

/// Runs the container's `kiln` command in check mode; returns (subcommand path, env read).
fn check(ctr: &Ctr<'_>) -> (Vec<String>, BTreeSet<String>) {
    let mut argv = strings(&ctr.c["command"]);
    argv.extend(strings(&ctr.c["args"]));
    let mut cmd = Command::new(KILN);
    cmd.args(&argv[1..]).env_clear().env("KILN_CHECK_ARGS", "1");
    for (k, v) in env_of(ctr.c) {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let name = &ctr.c["name"];
    assert!(
        out.status.success(),
        "{} / {name}: {argv:?} with its env is refused: {}",
        ctr.ds,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        strings(&report["command"]),
        strings(&report["env"]).into_iter().collect(),
    )
}

fn exempt(path: &[String], env: &str) -> bool {
    NOT_FOR_THE_AGENT
        .iter()
        .any(|(p, e, _)| *e == env && (*p == "*" || path.first().is_some_and(|c| c == p)))
}

fn under_a_mount(c: &Value, path: &str) -> bool {
    c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["mountPath"].as_str())
        .any(|m| Path::new(path).starts_with(m))
}

/// Every check on one rendered policy (all problems reported together); returns the
/// subcommand paths seen.
fn check_policy(objects: &[Value]) -> BTreeSet<Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    let ctrs = kiln_containers(objects);
    assert!(!ctrs.is_empty());
    for ctr in &ctrs {
        let (path, reads) = check(ctr);
        let name = ctr.c["name"].as_str().unwrap();
        for (env, value) in env_of(ctr.c) {
            if !reads.contains(&env) && !exempt(&path, &env) {
                problems.push(format!(
                    "{} / {name}: `kiln {}` does not read {env}={value} (it reads {reads:?})",
                    ctr.ds,
                    path.join(" ")
                ));
            }
            if PATH_ENV.contains(&env.as_str()) && !under_a_mount(ctr.c, &value) {
                problems.push(format!(
                    "{} / {name}: {env}={value} is on no mount of the container",
                    ctr.ds
                ));
            }
        }
        let env: std::collections::BTreeMap<_, _> = env_of(ctr.c).into_iter().collect();
        if env.get("SEND_SIGNAL").map(String::as_str) == Some("true") {
            check_signal_target(ctr, &env["PROCESS_TO_SIGNAL"]);
        }
        seen.insert(path);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    seen
}

/// The sidecar's signal reaches a container of its pod: the pod shares one process namespace
/// and a container's command line matches `target` as config-manager matches it.
fn check_signal_target(ctr: &Ctr<'_>, target: &str) {
    let shared = ctr.pod["shareProcessNamespace"] == true || ctr.pod["hostPID"] == true;
    assert!(
        shared,
        "{}: config-manager cannot see the other containers",
        ctr.ds
    );
    let found = ctr.pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] != ctr.c["name"])
        .any(|c| {
            let mut argv = strings(&c["command"]);
            argv.extend(strings(&c["args"]));
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            kiln_device_plugin::config_manager::matches_process(&argv, target)
        });
    assert!(
        found,
        "{}: no container matches PROCESS_TO_SIGNAL={target}",
        ctr.ds
    );
}

fn path(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

fn find<'a>(objects: &'a [Value], ds: &str, ctr: &str) -> &'a Value {
    kiln_containers(objects)
        .into_iter()
        .find(|c| c.ds == ds && c.c["name"] == ctr)
        .unwrap_or_else(|| panic!("no kiln container {ds}/{ctr}"))
        .c
}

#[test]
fn the_sample_policy_runs_with_the_agents_and_defaults_without_a_config() {
    let objects = render(&sample(), &[]);
    let seen = check_policy(&objects);
    for p in [
        &["device-plugin"][..],
        &["gfd"],
        &["exporter"],
        &["validator", "driver"],
        &["validator", "plugin"],
        &["validator", "wait"],
        &["validator", "hold"],
    ] {
        assert!(seen.contains(&path(p)), "{p:?} not rendered: {seen:?}");
    }
    // No config: no config-manager, and the plugin and GFD run on their defaults.
    assert!(!seen.contains(&path(&["device-plugin", "config-manager"])));
    for (ds, c) in [
        ("nvidia-device-plugin-daemonset", "nvidia-device-plugin"),
        ("gpu-feature-discovery", "gpu-feature-discovery"),
    ] {
        let env = env_of(find(&objects, ds, c));
        assert!(
            !env.iter().any(|(k, _)| k == "CONFIG_FILE"),
            "{ds}: {env:?}"
        );
    }
    // The plugin takes its driver roots from the validator's driver-ready file.
    let dp = find(
        &objects,
        "nvidia-device-plugin-daemonset",
        "nvidia-device-plugin",
    );
    for p in [
        "/run/nvidia/validations/driver-ready",
        "/host/usr",
        "/run/nvidia/driver/usr",
    ] {
        assert!(
            under_a_mount(dp, p),
            "{p} is not mounted in the device plugin"
        );
    }
    let exporter = env_of(find(
        &objects,
        "nvidia-dcgm-exporter",
        "nvidia-dcgm-exporter",
    ));
    assert!(exporter.contains(&("KILN_EXPORTER_KUBERNETES".into(), "true".into())));
    assert!(
        !exporter
            .iter()
            .any(|(k, _)| k == "KILN_EXPORTER_COLLECTORS")
    );
}

#[test]
fn a_time_sliced_mixed_mig_policy_runs_with_the_agents() {
    let objects = render(
        &configured(),
        &[
            "--config-map",
            "time-slicing-config=any,ts5",
            "--config-map",
            "custom-metrics=dcgm-metrics.csv",
        ],
    );
    let seen = check_policy(&objects);
    assert!(seen.contains(&path(&["device-plugin", "config-manager"])));
    for (ds, c) in [
        ("nvidia-device-plugin-daemonset", "nvidia-device-plugin"),
        ("gpu-feature-discovery", "gpu-feature-discovery"),
    ] {
        let env = env_of(find(&objects, ds, c));
        for kv in [
            ("CONFIG_FILE", "/config/config.yaml"),
            ("MIG_STRATEGY", "mixed"),
        ] {
            assert!(env.contains(&(kv.0.into(), kv.1.into())), "{ds}: {env:?}");
        }
    }
    let dp = env_of(find(
        &objects,
        "nvidia-device-plugin-daemonset",
        "nvidia-device-plugin",
    ));
    assert!(dp.contains(&("DEVICE_LIST_STRATEGY".into(), "envvar".into())));
    let exporter = env_of(find(
        &objects,
        "nvidia-dcgm-exporter",
        "nvidia-dcgm-exporter",
    ));
    for kv in [
        (
            "KILN_EXPORTER_COLLECTORS",
            "/etc/dcgm-exporter/dcgm-metrics.csv",
        ),
        ("KILN_EXPORTER_INTERVAL", "15000"),
        ("KILN_EXPORTER_KUBERNETES_VIRTUAL_GPUS", "true"),
    ] {
        assert!(
            exporter.contains(&(kv.0.into(), kv.1.into())),
            "{exporter:?}"
        );
    }
}

const FIXTURE: &str = r#"
driver_version: "550.144.03"
cuda_version: "12.4"
gpus:
  - {uuid: GPU-11111111-2222-3333-4444-555555555555, name: Tesla T4, memory_total_mib: 15360, compute_capability: "7.5"}
"#;

#[test]
fn the_rendered_gfd_container_labels_a_time_sliced_mixed_node() {
    let objects = render(
        &configured(),
        &[
            "--config-map",
            "time-slicing-config=any,ts5",
            "--config-map",
            "custom-metrics=dcgm-metrics.csv",
        ],
    );
    let gfd = find(&objects, "gpu-feature-discovery", "gpu-feature-discovery");
    let dir = tempfile::tempdir().unwrap();
    let (cfg, fixture) = (dir.path().join("config.yaml"), dir.path().join("gpus.yaml"));
    std::fs::write(
        &cfg,
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 5}\n",
    )
    .unwrap();
    std::fs::write(&fixture, FIXTURE).unwrap();
    let mut argv = strings(&gfd["command"]);
    argv.extend(strings(&gfd["args"]));
    let mut cmd = Command::new(KILN);
    cmd.args(&argv[1..]).env_clear();
    for (k, v) in env_of(gfd) {
        // The pod's /config/config.yaml is this test's file; everything else as rendered.
        let v = if k == "CONFIG_FILE" {
            cfg.display().to_string()
        } else {
            v
        };
        cmd.env(k, v);
    }
    let backend = format!("fake:{}", fixture.display());
    cmd.envs([
        ("KILN_GFD_GPU_BACKEND", backend.as_str()),
        ("GFD_OUTPUT", "stdout"),
        ("GFD_ONESHOT", "true"),
        ("GFD_NO_TIMESTAMP", "true"),
        ("GFD_MACHINE_TYPE_FILE", "/nonexistent"),
    ]);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for line in [
        "nvidia.com/gpu.product=Tesla-T4-SHARED\n",
        "nvidia.com/gpu.replicas=5\n",
        "nvidia.com/gpu.sharing-strategy=time-slicing\n",
        "nvidia.com/mig.strategy=mixed\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

#[test]
fn a_config_without_default_key_and_plugin_env_runs_with_the_agents() {
    let objects = render(&no_default_key(), &["--config-map", "dp-configs=a,b"]);
    let seen = check_policy(&objects);
    assert!(seen.contains(&path(&["device-plugin", "config-manager"])));
    let cm = env_of(find(
        &objects,
        "nvidia-device-plugin-daemonset",
        "config-manager-init",
    ));
    assert!(cm.contains(&("FALLBACK_STRATEGIES".into(), "empty".into())));
}

/// NVIDIA's golden variants kept in the repository (`host/render/tests/data/nvidia-v26.7.0`):
/// (name, policy, `kiln render` flags: the variant's runtime and its cluster facts).
fn golden_variants() -> Vec<(String, Value, Vec<String>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../render/tests/data/nvidia-v26.7.0");
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("variants.json")).unwrap()).unwrap();
    index
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, v)| {
            let policy = dir.join(v["policy"].as_str().unwrap());
            let policy =
                serde_yaml_ng::from_str(&std::fs::read_to_string(policy).unwrap()).unwrap();
            let mut flags = vec![
                "--runtime".to_owned(),
                v["runtime"].as_str().unwrap().into(),
            ];
            flags.extend(strings(&v["kiln_render_flags"]));
            (name.clone(), policy, flags)
        })
        .collect()
}

/// Sandbox policies beyond the golden variants: workloads in KubeVirt mode (VFIO and vGPU
/// managers, sandbox device plugin and validation) with the node status exporter, and in Kata
/// mode (Kata device plugin, CC manager), which no golden variant enables.
fn sandbox_policies() -> Vec<(String, Value, Vec<String>)> {
    let mut kubevirt = sample();
    let s = &mut kubevirt["spec"];
    s["sandboxWorkloads"] =
        json!({"enabled": true, "defaultWorkload": "vm-passthrough", "mode": "kubevirt"});
    s["vfioManager"] = json!({"enabled": true});
    s["vgpuManager"] = json!({"enabled": true, "repository": "registry.example/nvidia", "image": "vgpu-manager", "version": "595.91.07"});
    s["vgpuDeviceManager"] = json!({"enabled": true});
    s["sandboxDevicePlugin"] = json!({"enabled": true});
    s["nodeStatusExporter"] = json!({"enabled": true});
    let mut kata = sample();
    let s = &mut kata["spec"];
    s["sandboxWorkloads"] =
        json!({"enabled": true, "defaultWorkload": "vm-passthrough", "mode": "kata"});
    s["vgpuManager"] = kubevirt["spec"]["vgpuManager"].clone();
    s["kataSandboxDevicePlugin"] = json!({"enabled": true});
    s["ccManager"] = json!({"enabled": true});
    vec![
        ("sandbox-kubevirt".into(), kubevirt, vec![]),
        ("sandbox-kata".into(), kata, vec![]),
    ]
}

/// Every pod template's containers (DaemonSets, Deployments, Jobs): (owner name, pod, container).
fn all_containers(objects: &[Value]) -> Vec<Ctr<'_>> {
    let mut out = Vec::new();
    for o in objects {
        let pod = match o["kind"].as_str() {
            Some("DaemonSet" | "Deployment" | "StatefulSet" | "Job") => {
                &o["spec"]["template"]["spec"]
            }
            Some("Pod") => &o["spec"],
            _ => continue,
        };
        for list in ["initContainers", "containers"] {
            for c in pod[list].as_array().into_iter().flatten() {
                out.push(Ctr {
                    ds: o["metadata"]["name"].as_str().unwrap(),
                    pod,
                    c,
                });
            }
        }
    }
    out
}

/// kiln's image holds one program, `kiln` (its entrypoint): in every golden variant and every
/// state, a container on kiln's image runs a `kiln` subcommand that the CLI accepts with the
/// container's env (and reads every env var it is given, as [`check_policy`] checks), and a
/// `kiln …` command runs on no other image. The MPS control daemon and the node status
/// exporter, which kiln does not implement, run NVIDIA's device plugin and validator images.
#[test]
fn every_command_on_kilns_image_is_a_kiln_subcommand_in_every_variant_and_state() {
    use kiln_render::defaults::{KILN_IMAGE, NVIDIA_DEVICE_PLUGIN_IMAGE, NVIDIA_VALIDATOR_IMAGE};
    let mut problems = Vec::new();
    let mut paths = BTreeSet::new();
    let mut on_kiln = BTreeSet::new();
    let cases: Vec<_> = golden_variants()
        .into_iter()
        .chain(sandbox_policies())
        .collect();
    // 15 golden variants (three of them sandbox / node status exporter) and 2 sandbox policies.
    assert_eq!(cases.len(), 17);
    for (variant, policy, flags) in &cases {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let objects = render(policy, &flags);
        for ctr in all_containers(&objects) {
            let image = ctr.c["image"].as_str().unwrap_or_default();
            let command = strings(&ctr.c["command"]);
            let name = ctr.c["name"].as_str().unwrap();
            let what = format!("{variant}: {} / {name}", ctr.ds);
            let runs_kiln = command.first().is_some_and(|c| c == "kiln");
            if image == KILN_IMAGE {
                if !(command.is_empty() || runs_kiln) {
                    problems.push(format!(
                        "{what}: runs {command:?} on kiln's image, which has only `kiln`"
                    ));
                    continue;
                }
                on_kiln.insert(ctr.ds.to_owned());
                // No command: the image's entrypoint, `kiln`, with the container's args.
                let with_entrypoint;
                let ctr = if command.is_empty() {
                    let mut c = ctr.c.clone();
                    c["command"] = json!(["kiln"]);
                    with_entrypoint = c;
                    Ctr {
                        c: &with_entrypoint,
                        ..ctr
                    }
                } else {
                    ctr
                };
                let (path, _) = check(&ctr);
                if path.is_empty() {
                    problems.push(format!("{what}: bare `kiln` (no subcommand)"));
                }
                paths.insert(path);
            } else if runs_kiln {
                problems.push(format!(
                    "{what}: runs `kiln` on {image}, which is not kiln's image"
                ));
            }
            // kiln implements neither: they run NVIDIA's images.
            if name.starts_with("mps-control-daemon") {
                assert_eq!(image, NVIDIA_DEVICE_PLUGIN_IMAGE, "{what}");
            }
            if name == "nvidia-node-status-exporter" {
                assert_eq!(image, NVIDIA_VALIDATOR_IMAGE, "{what}");
            }
        }
        // The env each kiln container is given is read by the agent (all problems at once);
        // ix-nvidia-images has no kiln container.
        if variant != "ix-nvidia-images" {
            check_policy(&objects);
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    for p in [
        &["device-plugin"][..],
        &["device-plugin", "config-manager"],
        &["gfd"],
        &["exporter"],
        &["validator", "driver"],
        &["validator", "toolkit"],
        &["validator", "cuda"],
        &["validator", "plugin"],
        &["validator", "wait"],
        &["validator", "hold"],
        &["validator", "vfio-pci"],
    ] {
        assert!(
            paths.contains(&path(p)),
            "{p:?} not rendered on kiln's image: {paths:?}"
        );
    }
    for ds in [
        "nvidia-operator-validator",
        "nvidia-device-plugin-daemonset",
        "gpu-feature-discovery",
        "nvidia-dcgm-exporter",
        "nvidia-sandbox-validator",
    ] {
        assert!(
            on_kiln.contains(ds),
            "{ds} has no container on kiln's image: {on_kiln:?}"
        );
    }
}

/// The chart's own DaemonSet that runs `kiln` (`kiln-node-discovery`, `nfd.enabled`; the image's
/// entrypoint is `kiln`, so it sets only args): its args and env parse as `kiln discover`, and
/// every env var it sets is one the command reads (or `KILN_LOG`, the log filter every `kiln`
/// command reads in `main`).
#[test]
fn the_charts_discovery_daemonset_runs_kiln_discover() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let helm = root.join("testcluster/bin/helm");
    if !helm.is_file() {
        eprintln!("testcluster/bin/helm not built; skipping");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(&helm)
        .args([
            "template",
            "kiln",
            "deploy/helm/kiln",
            "--namespace",
            "gpu-operator",
        ])
        .args(["--show-only", "templates/discovery.yaml"])
        .current_dir(&root)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let objects: Vec<Value> = text
        .split("\n---\n")
        .filter_map(|doc| serde_yaml_ng::from_str::<Option<Value>>(doc).unwrap())
        .collect();
    let ds = objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("the discovery DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let mut c = pod["containers"][0].clone();
    assert!(c["command"].is_null(), "the image's entrypoint runs kiln");
    c["command"] = json!(["kiln"]);
    let ctr = Ctr {
        ds: "kiln-node-discovery",
        pod,
        c: &c,
    };
    let (path, read) = check(&ctr);
    assert_eq!(path, ["discover"]);
    for (name, _) in env_of(&c) {
        assert!(
            read.contains(&name) || name == "KILN_LOG",
            "{name} is set but `kiln discover` does not read it"
        );
    }
}
