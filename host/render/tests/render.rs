//! kiln-render integration tests: one binary (link time matters on 2 cores).
//!
//! - the `State` enum, the assets folders, the plugin crates and the bundled plugins agree;
//! - every transform case file (`plugins/*/cases/*.yaml`) passes through the compiled Wasm
//!   plugin, not only natively;
//! - golden renders of the upstream sample policy and of the Helm-defaults policy;
//! - [`fidelity`]: field by field against what NVIDIA GPU Operator v26.7.0 applies.

#[path = "fidelity/mod.rs"]
mod fidelity;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use kiln_core::State;
use kiln_core::testcase::Case;
use kiln_plugin_host::{GuestError, HostConfig, PluginError, PluginHost, Rendered};
use kiln_render::{Policy, Renderer, defaults, output};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn host() -> Arc<PluginHost> {
    static HOST: OnceLock<Arc<PluginHost>> = OnceLock::new();
    HOST.get_or_init(|| {
        // A disk cache under target/ shares compiled plugins between test binaries and runs.
        let cache =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/kiln-test-plugin-cache");
        let cfg = HostConfig {
            cache_dir: Some(cache),
            ..HostConfig::in_memory()
        };
        Arc::new(PluginHost::new(cfg, kiln_bundled_plugins::BUNDLED).expect("plugin host"))
    })
    .clone()
}

/// NVIDIA GPU Operator v26.7.0's sample ClusterPolicy (the repository's copy of upstream's
/// `clusterpolicy-sample.yaml`, also the `sample` variant of the fidelity data).
fn upstream_sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nvidia-v26.7.0/policies/sample.yaml")
}

/// Bundled plugins that are not a state's standard plugin: configured by settings, named in a
/// `then:` chain.
const BUNDLED_SITE_PLUGINS: &[&str] = &["node-placement"];

/// The standard plugins' crates (`plugins/*` less the SDK, their helpers `std`, the bundle and
/// [`BUNDLED_SITE_PLUGINS`]).
fn plugin_dirs() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(repo().join("plugins"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| {
            !["sdk", "std", "bundle"].contains(&n.as_str())
                && !BUNDLED_SITE_PLUGINS.contains(&n.as_str())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn states_assets_plugins_and_bundle_agree() {
    use kiln_core::spec::gpucluster::DraState;
    // A ClusterPolicy's states and a GPUCluster's DRA states: each has assets and a plugin.
    let mut states: Vec<String> = State::ALL
        .iter()
        .map(|s| s.name())
        .chain(DraState::ALL.iter().map(|s| s.name()))
        .map(str::to_string)
        .collect();
    states.sort();
    let folders: Vec<String> = kiln_render::assets::folders()
        .iter()
        .map(|f| f.trim_start_matches("state-").to_string())
        .collect();
    assert_eq!(folders, states, "assets/state-* folders vs the states");
    assert_eq!(plugin_dirs(), states, "plugins/* crates vs the states");
    let mut bundled: Vec<String> = kiln_bundled_plugins::BUNDLED
        .iter()
        .map(|(n, _)| n.to_string())
        .filter(|n| !BUNDLED_SITE_PLUGINS.contains(&n.as_str()))
        .collect();
    bundled.sort();
    assert_eq!(bundled, states, "bundled plugins vs the states");
    let ctx = defaults::render_context();
    for s in State::ALL {
        let loaded = host()
            .load(s.name(), None)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loaded.name(), s.name());
        // The standard bundle carries every state's plugin: one it lacked would fail.
        assert!(loaded.is_bundle(), "{s}");
        host()
            .transform(s.name(), &[], &serde_json::json!({}), &ctx)
            .unwrap_or_else(|e| panic!("{s}: {e}"));
        assert!(
            !kiln_render::assets::load_state(s, true).unwrap().is_empty(),
            "{s} has no objects"
        );
    }
    for s in DraState::ALL {
        let loaded = host()
            .load(s.name(), None)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(loaded.is_bundle(), "{s}");
        assert!(
            !kiln_render::assets::load_dra_state(s).unwrap().is_empty(),
            "{s} has no objects"
        );
    }
}

/// The state's objects as its chain's first plugin gets them (default namespace and runtime
/// class filled in).
fn state_input(state: State, ctx: &kiln_core::context::TransformContext) -> Vec<Value> {
    kiln_render::assets::load_state(state, false)
        .unwrap()
        .into_iter()
        .map(|a| {
            let mut o = a.object;
            kiln_render::placeholders::fill(&mut o, &ctx.operator_namespace, "nvidia");
            o
        })
        .collect()
}

/// The standard bundle runs the plugin it is loaded as, not the state being rendered: a
/// bundled plugin in another state's chain (`kiln.dev/plugins` … `then:`) edits as itself,
/// because the host hands the bundle the plugin's name (`context.plugin`). Without that, the bundle
/// would run the driver's transform on the DCGM objects here, which have no driver container.
#[test]
fn a_bundled_plugin_in_another_states_chain_runs_as_itself() {
    let doc: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(upstream_sample()).unwrap()).unwrap();
    let policy = Policy::from_object(&doc).unwrap();
    let mut ctx = defaults::render_context();
    ctx.state = "dcgm-exporter".into();
    let objects = state_input(State::DcgmExporter, &ctx);
    let own = host()
        .transform("dcgm-exporter", &objects, &policy.spec_json, &ctx)
        .unwrap();
    assert!(
        own.rendered
            .iter()
            .zip(&objects)
            .any(|(r, o)| *r != Rendered::Keep(o.clone())),
        "the sample's dcgm-exporter edits its objects"
    );
    ctx.state = "driver".into();
    let in_driver_chain = host()
        .transform("dcgm-exporter", &objects, &policy.spec_json, &ctx)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(in_driver_chain.rendered, own.rendered);
}

/// Issue 36: per-pod process values reachable from the ClusterPolicy. With `dcgmExporter.env`
/// `KUBERNETES_VIRTUAL_GPUS=true` (dcgm-exporter's virtual-GPU switch), kiln's image gets
/// `hostPID` and `/var/log/pods` read-only as well, and nothing else; NVIDIA's image gets the env
/// entry only, as NVIDIA's operator renders it (`hostPID` stays `dcgmExporter.hostPID`).
#[test]
fn virtual_gpu_mode_gives_kilns_exporter_host_pid_and_pod_logs_only() {
    let render = |image: Value, virtual_gpus: bool| -> Value {
        let mut doc: Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(upstream_sample()).unwrap()).unwrap();
        let e = doc["spec"]["dcgmExporter"].as_object_mut().unwrap();
        e.extend(image.as_object().unwrap().clone());
        if virtual_gpus {
            e.insert(
                "env".into(),
                serde_json::json!([{"name": "KUBERNETES_VIRTUAL_GPUS", "value": "true"}]),
            );
        }
        let policy = Policy::from_object(&doc).unwrap();
        let mut ctx = defaults::render_context();
        ctx.state = "dcgm-exporter".into();
        let objects = state_input(State::DcgmExporter, &ctx);
        let out = host()
            .transform("dcgm-exporter", &objects, &policy.spec_json, &ctx)
            .unwrap_or_else(|e| panic!("{e}"));
        out.rendered
            .into_iter()
            .find_map(|r| match r {
                Rendered::Keep(o) if o["kind"] == "DaemonSet" => Some(o),
                _ => None,
            })
            .unwrap()
    };
    // `with` less what the switch may add must be `without`.
    let strip = |mut ds: Value, pod_logs: bool| -> Value {
        let pod = &mut ds["spec"]["template"]["spec"];
        let ctr = &mut pod["containers"][0];
        let env = ctr["env"].as_array_mut().unwrap();
        let before = env.len();
        env.retain(|e| {
            !e["name"]
                .as_str()
                .unwrap()
                .ends_with("KUBERNETES_VIRTUAL_GPUS")
        });
        assert_eq!(env.len(), before - 1, "the env entry is there");
        if pod_logs {
            assert_eq!(pod["hostPID"], true);
            pod.as_object_mut().unwrap().remove("hostPID");
            let ctr = &mut pod["containers"][0];
            let mounts = ctr["volumeMounts"].as_array_mut().unwrap();
            let mount = mounts.pop().unwrap();
            assert_eq!(
                mount,
                serde_json::json!({"name": "pod-logs", "mountPath": "/var/log/pods", "readOnly": true})
            );
            let vol = pod["volumes"].as_array_mut().unwrap().pop().unwrap();
            assert_eq!(
                vol,
                serde_json::json!({"name": "pod-logs", "hostPath": {"path": "/var/log/pods"}})
            );
        }
        ds
    };
    let kiln = serde_json::json!({"image": "ghcr.io/kiln-dev/kiln:0.1.0"});
    let off = render(kiln.clone(), false);
    assert!(off["spec"]["template"]["spec"].get("hostPID").is_none());
    assert_eq!(strip(render(kiln, true), true), off);
    let nvidia = serde_json::json!({
        "repository": "nvcr.io/nvidia/k8s",
        "image": "dcgm-exporter",
        "version": "4.6.0-4.8.3-distroless",
    });
    assert_eq!(
        strip(render(nvidia.clone(), true), false),
        render(nvidia, false)
    );
}

/// A standard bundle dropped in under a name it does not carry loads (its `name()` is the
/// bundle's), and each call fails naming the plugin, before any transform runs.
#[test]
fn a_bundle_under_a_name_it_does_not_carry_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("site-extra.wasm"),
        kiln_bundled_plugins::get("driver").unwrap(),
    )
    .unwrap();
    let host = PluginHost::new(
        HostConfig {
            drop_in_dir: Some(dir.path().to_path_buf()),
            ..HostConfig::in_memory()
        },
        &[],
    )
    .unwrap();
    let loaded = host.load("site-extra", None).unwrap();
    assert!(loaded.is_bundle() && !loaded.is_standard());
    let e = host
        .transform(
            "site-extra",
            &[],
            &serde_json::json!({}),
            &defaults::render_context(),
        )
        .unwrap_err();
    // Its `validate-settings` (asked before any transform) already says so.
    let PluginError::InvalidSettings { errors, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(
        (errors[0].path.as_str(), errors[0].message.as_str()),
        (
            "settings",
            r#"the standard bundle carries no plugin "site-extra""#
        ),
        "{e}"
    );
    assert!(e.to_string().contains("site-extra"), "{e}");
}

fn guest_error_parts(e: &PluginError) -> Option<(&'static str, Option<&str>, String)> {
    match e {
        PluginError::Guest { error, .. } => Some(match error {
            GuestError::InvalidField { path, message } => (
                "invalid-field",
                Some(path.as_str()),
                format!("{path}: {message}"),
            ),
            GuestError::InvalidObject(m) => ("invalid-object", None, m.clone()),
            GuestError::Failed(m) => ("failed", None, m.clone()),
        }),
        _ => None,
    }
}

#[test]
fn every_transform_case_passes_through_the_wasm_plugin() {
    let mut ran = 0;
    let mut failures = Vec::new();
    let plugins = plugin_dirs()
        .into_iter()
        .chain(BUNDLED_SITE_PLUGINS.iter().map(|p| p.to_string()));
    for plugin in plugins {
        let dir = repo().join("plugins").join(&plugin).join("cases");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        for f in files {
            let raw: Value =
                serde_yaml_ng::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
            let case = Case::from_value(raw).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let mut ctx = case.context.clone();
            if !BUNDLED_SITE_PLUGINS.contains(&plugin.as_str()) {
                ctx.state = plugin.clone();
            }
            let spec = case.spec.to_string();
            let settings = (!case.settings.is_null()).then(|| case.settings.to_string());
            let meta = kiln_plugin_host::PolicyMeta::default();
            let input = kiln_plugin_host::CallInput {
                spec: &spec,
                settings: settings.as_deref(),
                policy: &meta,
            };
            let loaded = host().plugin(&plugin, None).unwrap();
            let result = match host().call_with(&loaded, &case.objects, &input, &ctx) {
                Ok(out) => {
                    let got: Vec<Option<Value>> = out
                        .rendered
                        .into_iter()
                        .map(|r| match r {
                            Rendered::Keep(v) => Some(v),
                            Rendered::Omit => None,
                        })
                        .collect();
                    case.check(&got)
                }
                Err(PluginError::InvalidSettings { errors, .. }) => case.check_error(
                    "invalid-settings",
                    Some(&errors[0].path),
                    &errors[0].message,
                ),
                Err(e) => match guest_error_parts(&e) {
                    Some((kind, path, msg)) => case.check_error(kind, path, &msg),
                    None => Err(format!("host error: {e}")),
                },
            };
            ran += 1;
            if let Err(m) = result {
                failures.push(format!("{} ({}): {m}", f.display(), case.name));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(ran >= 60, "only {ran} case files found");
}

fn render_file(path: &Path) -> Vec<Value> {
    let doc: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let policy = Policy::from_object(&doc).unwrap();
    let renderer = Renderer::new(host());
    let mut objects = Vec::new();
    for (state, r) in renderer.render(&policy, &defaults::render_context()) {
        let r = r.unwrap_or_else(|e| panic!("{state}: {e}"));
        objects.extend(r.objects);
    }
    objects
}

fn assert_golden(name: &str, objects: &[Value]) {
    let text = output::yaml_stream(objects).unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with KILN_BLESS=1 to create it, then review it)",
            path.display()
        )
    });
    pretty_assertions::assert_eq!(
        want,
        text,
        "{name} drifted; review and re-bless with KILN_BLESS=1"
    );
}

#[test]
fn golden_render_of_the_upstream_sample() {
    let objects = render_file(&upstream_sample());
    let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "DaemonSet").count(),
        9,
        "{kinds:?}"
    );
    assert_golden("upstream-sample.yaml", &objects);
}

#[test]
fn golden_render_of_the_helm_defaults() {
    let objects = render_file(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/helm-defaults-policy.yaml"),
    );
    assert_golden("helm-defaults.yaml", &objects);
}

#[test]
fn the_deploy_sample_renders_every_default_state() {
    let objects = render_file(&repo().join("deploy/samples/clusterpolicy.yaml"));
    let ds: Vec<&str> = objects
        .iter()
        .filter(|o| o["kind"] == "DaemonSet")
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        ds,
        [
            "nvidia-driver-daemonset",
            "nvidia-container-toolkit-daemonset",
            "nvidia-operator-validator",
            "nvidia-device-plugin-daemonset",
            "nvidia-device-plugin-mps-control-daemon",
            "nvidia-dcgm",
            "nvidia-dcgm-exporter",
            "gpu-feature-discovery",
            "nvidia-mig-manager"
        ]
    );
    for o in &objects {
        let text = o.to_string();
        assert!(
            !text.contains("FILLED_BY_OPERATOR"),
            "placeholder left in {}",
            o["metadata"]["name"]
        );
    }
}

#[test]
fn render_returns_each_enabled_state_once_in_apply_order() {
    let path = upstream_sample();
    let doc: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let policy = Policy::from_object(&doc).unwrap();
    let renderer = Renderer::new(host());
    let ctx = defaults::render_context();
    // `render` spreads states over worker threads; its results must still come back in apply
    // order and equal a one-state-at-a-time render.
    let rendered = renderer.render(&policy, &ctx);
    let states: Vec<State> = rendered.iter().map(|(s, _)| *s).collect();
    assert_eq!(states, kiln_core::plan::enabled_states(&policy.spec));
    assert_eq!(states.len(), 11);
    for (state, result) in rendered {
        let one = renderer.render_state(state, &policy, &ctx).unwrap();
        assert_eq!(result.unwrap(), one, "{state}");
    }
}

/// The upstream sample with a `kiln.dev/plugins` annotation.
fn sample_with_plugins(annotation: &str) -> Policy {
    let mut doc: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(upstream_sample()).unwrap()).unwrap();
    doc["metadata"]["annotations"] = serde_json::json!({ "kiln.dev/plugins": annotation });
    Policy::from_object(&doc).unwrap()
}

/// gpu-operator #2626 without a fork: the bundled `node-placement` plugin, configured by
/// settings in the state's chain, places its pods; bad settings fail the state before any
/// transform runs, naming the plugin and the field.
#[test]
fn node_placement_places_a_states_pods_by_settings() {
    let renderer = Renderer::new(host());
    let ctx = defaults::render_context();
    let policy = sample_with_plugins(
        "device-plugin:\n  then:\n    - name: node-placement\n      settings:\n        nodeSelector: {pool: gpu-a}\n        tolerations: [{key: dedicated, operator: Exists, effect: NoSchedule}]\n",
    );
    let rendered = renderer
        .render_state(State::DevicePlugin, &policy, &ctx)
        .unwrap_or_else(|e| panic!("{e}"));
    let ds = rendered
        .objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["pool"], "gpu-a");
    assert_eq!(
        pod["nodeSelector"]["nvidia.com/gpu.deploy.device-plugin"], "true",
        "the standard selector is kept"
    );
    assert!(
        pod["tolerations"].as_array().unwrap().contains(
            &serde_json::json!({"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"})
        ),
        "{pod}"
    );
    // Another state is untouched.
    let dcgm = renderer
        .render_state(State::DcgmExporter, &policy, &ctx)
        .unwrap();
    let ds = dcgm
        .objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .unwrap();
    assert!(ds["spec"]["template"]["spec"]["nodeSelector"]["pool"].is_null());

    let bad = sample_with_plugins(
        "device-plugin:\n  then:\n    - name: node-placement\n      settings: {nodeSelector: {pool: gpu a}}\n",
    );
    let err = renderer
        .render_state(State::DevicePlugin, &bad, &ctx)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "state device-plugin: plugin \"node-placement\": invalid settings: settings.nodeSelector.pool: \
         value \"gpu a\": at most 63 characters, alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
    );
}
