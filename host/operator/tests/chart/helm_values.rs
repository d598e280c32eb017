//! NVIDIA GPU Operator v26.7.0's Helm values (`deployments/gpu-operator/values.yaml`, a copy in
//! `tests/data/`) work unchanged with kiln's chart (`helm template`, when
//! `testcluster/bin/helm` is built):
//! - the chart's ClusterPolicy, read as kiln reads a stored policy, renders every state it
//!   enables (the validator and node status exporter images get NVIDIA's version, as NVIDIA's
//!   chart tags them with its appVersion; `gpuPodDeletion` becomes `podDeletion`);
//! - `*.config.create` / `*.config.data` create the ConfigMaps NVIDIA's chart creates.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_plugin_host::{HostConfig, PluginHost};
use kiln_render::{Policy, Renderer, defaults};
use serde::Deserialize as _;
use serde_json::{Value, json};

use crate::support::repo;

fn data(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .display()
        .to_string()
}

/// `helm template` of `deploy/helm/kiln` with NVIDIA's values and `extra` value files.
fn template(extra: &[&str]) -> Option<Vec<Value>> {
    let files: Vec<String> = std::iter::once("nvidia-v26.7.0-helm-values.yaml")
        .chain(extra.iter().copied())
        .map(data)
        .collect();
    let args: Vec<&str> = files.iter().flat_map(|f| ["-f", f.as_str()]).collect();
    crate::support::helm::template(&args).map(|r| r.unwrap_or_else(|e| panic!("{e}")))
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

#[test]
fn nvidia_values_render_every_enabled_state() {
    let Some(objects) = template(&[]) else {
        return;
    };
    let cp = of_kind(&objects, "ClusterPolicy");
    assert_eq!(cp.len(), 1);
    let policy = Policy::from_object(cp[0]).unwrap();
    assert_eq!(policy.pruned, Vec::<String>::new(), "fields the CRD prunes");
    let spec = &policy.spec_json;
    assert_eq!(spec["validator"]["version"], "v26.7.0");
    assert_eq!(spec["validator"]["image"], "gpu-operator");
    assert_eq!(spec["nodeStatusExporter"]["version"], "v26.7.0");
    assert_eq!(
        spec["driver"]["upgradePolicy"]["podDeletion"],
        json!({"force": false, "timeoutSeconds": 300, "deleteEmptyDir": false})
    );
    assert_eq!(
        policy
            .spec
            .driver
            .upgrade_policy
            .as_ref()
            .map(|u| u.auto_upgrade),
        Some(true)
    );

    let host = PluginHost::new(
        HostConfig {
            cache_dir: Some(repo().join("target/kiln-test-plugin-cache")),
            ..HostConfig::in_memory()
        },
        kiln_bundled_plugins::BUNDLED,
    )
    .unwrap();
    let rendered = Renderer::new(Arc::new(host)).render(&policy, &defaults::render_context());
    let failed: Vec<String> = rendered
        .iter()
        .filter_map(|(s, r)| r.as_ref().err().map(|e| format!("{s}: {e}")))
        .collect();
    assert_eq!(failed, Vec::<String>::new());
    let states: Vec<&str> = rendered.iter().map(|(s, _)| s.name()).collect();
    assert_eq!(
        states,
        [
            "pre-requisites",
            "operator-metrics",
            "driver",
            "container-toolkit",
            "operator-validation",
            "device-plugin",
            "mps-control-daemon",
            "dcgm-exporter",
            "gpu-feature-discovery",
            "mig-manager",
        ]
    );
    // NVIDIA's validator image, tagged as NVIDIA's chart tags it.
    let validator = rendered
        .iter()
        .find(|(s, _)| s.name() == "operator-validation")
        .and_then(|(_, r)| r.as_ref().ok())
        .unwrap();
    let ds = validator
        .objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .unwrap();
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["image"],
        "nvcr.io/nvidia/gpu-operator:v26.7.0"
    );
    // With `create: false` (NVIDIA's defaults) the chart creates no ConfigMap.
    assert!(of_kind(&objects, "ConfigMap").is_empty());
}

#[test]
fn config_create_and_data_create_nvidias_config_maps() {
    let Some(objects) = template(&["helm-config-maps-values.yaml"]) else {
        return;
    };
    let maps: Vec<(&str, Vec<&str>)> = of_kind(&objects, "ConfigMap")
        .into_iter()
        .map(|m| {
            assert_eq!(m["metadata"]["namespace"], "gpu-operator");
            let keys = m["data"]
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            (m["metadata"]["name"].as_str().unwrap(), keys)
        })
        .collect();
    assert_eq!(
        maps,
        [
            ("device-plugin-config", vec!["any"]),
            ("custom-mig-parted-configs", vec!["config.yaml"]),
            ("custom-dcgm-exporter-metrics", vec!["dcgm-metrics.csv"]),
        ]
    );
    let cm = |name: &str| {
        of_kind(&objects, "ConfigMap")
            .into_iter()
            .find(|m| m["metadata"]["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(
        cm("custom-dcgm-exporter-metrics")["data"]["dcgm-metrics.csv"],
        "# Clocks\nDCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).\n"
    );
    assert!(
        cm("custom-mig-parted-configs")["data"]["config.yaml"]
            .as_str()
            .unwrap()
            .starts_with("version: v1\nmig-configs:\n")
    );
    // The ClusterPolicy points at the same ConfigMaps, without the chart-only keys.
    let cp = of_kind(&objects, "ClusterPolicy")[0];
    assert_eq!(
        cp["spec"]["devicePlugin"]["config"],
        json!({"name": "device-plugin-config", "default": "any"})
    );
    assert_eq!(
        cp["spec"]["migManager"]["config"],
        json!({"name": "custom-mig-parted-configs", "default": "all-disabled"})
    );
    assert_eq!(
        cp["spec"]["dcgmExporter"]["config"],
        json!({"name": "custom-dcgm-exporter-metrics"})
    );
}

/// `helm` with `args` in the repository root (own home); `(success, stdout, stderr)`, `None`
/// when `testcluster/bin/helm` is not built.
fn helm_run(args: &[&str]) -> Option<(bool, String, String)> {
    let helm = repo().join("testcluster/bin/helm");
    if !helm.exists() {
        eprintln!("testcluster/bin/helm not built; skipping");
        return None;
    }
    let home = tempfile::tempdir().unwrap();
    let out = crate::support::helm::helm_command(None, home.path(), args)
        .unwrap()
        .output()
        .unwrap();
    Some((
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    ))
}

/// `helm template` of the chart with kiln's defaults and `args` (`--set …`): the objects, or
/// helm's error text.
fn template_with(args: &[&str]) -> Option<Result<Vec<Value>, String>> {
    let mut all = vec![
        "template",
        "kiln",
        "deploy/helm/kiln",
        "--namespace",
        "gpu-operator",
    ];
    all.extend_from_slice(args);
    let (ok, stdout, stderr) = helm_run(&all)?;
    if !ok {
        return Some(Err(stderr));
    }
    Some(Ok(serde_yaml_ng::Deserializer::from_str(&stdout)
        .filter_map(|d| Option::<Value>::deserialize(d).unwrap())
        .collect()))
}

fn read_yaml(path: &Path) -> Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn values_schema() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/helm/kiln/values.schema.json")).unwrap(),
    )
    .unwrap()
}

/// Key paths of `values` the schema does not describe: a key is described when its object's
/// schema lists it, or when that object is free-form (no `additionalProperties: false`: maps
/// such as labels, resources, NFD's own subchart keys).
fn undescribed(values: &Value, schema: &Value, path: &str, out: &mut Vec<String>) {
    let Some(map) = values.as_object() else {
        return;
    };
    for (k, v) in map {
        let here = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        match schema["properties"].get(k) {
            Some(s) => undescribed(v, s, &here, out),
            None if schema["additionalProperties"] == json!(false) => out.push(here),
            None => {}
        }
    }
}

/// Every key of kiln's values.yaml and of NVIDIA's v26.7.0 values.yaml is in the schema (so the
/// schema's `additionalProperties: false` refuses only unknown keys), and both files pass
/// `helm lint --strict` with the schema.
#[test]
fn every_key_of_both_values_files_is_in_the_schema_and_lint_passes() {
    let schema = values_schema();
    for file in [
        repo().join("deploy/helm/kiln/values.yaml"),
        PathBuf::from(data("nvidia-v26.7.0-helm-values.yaml")),
    ] {
        let mut missing = Vec::new();
        undescribed(&read_yaml(&file), &schema, "", &mut missing);
        assert_eq!(missing, Vec::<String>::new(), "{}", file.display());
    }
    let nvidia = data("nvidia-v26.7.0-helm-values.yaml");
    for extra in [vec![], vec!["-f", nvidia.as_str()]] {
        let mut args = vec!["lint", "--strict", "deploy/helm/kiln"];
        args.extend(extra);
        let Some((ok, stdout, stderr)) = helm_run(&args) else {
            return;
        };
        assert!(ok, "helm {args:?}:\n{stdout}{stderr}");
    }
}

/// An unknown or mistyped key fails `helm template` with the key's path.
#[test]
fn the_schema_refuses_unknown_and_mistyped_keys_by_path() {
    for (set, want) in [
        (
            "driver.enabeld=true",
            "at '/driver': additional properties 'enabeld' not allowed",
        ),
        (
            "driver.enabled=yes",
            "at '/driver/enabled': got string, want boolean",
        ),
        (
            "nfd.enable=true",
            "at '/nfd': additional properties 'enable' not allowed",
        ),
        (
            "operator.replicas=two",
            "at '/operator/replicas': got string, want integer",
        ),
        (
            "toolkitt.enabled=true",
            "additional properties 'toolkitt' not allowed",
        ),
        (
            "node-feature-discovery.worker.config.sources.pci.deviceClassWhitelist={03xx}",
            "at '/node-feature-discovery/worker/config/sources/pci/deviceClassWhitelist/0'",
        ),
    ] {
        let Some(res) = template_with(&["--set", set]) else {
            return;
        };
        let err = res
            .err()
            .unwrap_or_else(|| panic!("--set {set} was accepted"));
        assert!(err.contains(want), "--set {set}: {err}");
    }
}

/// What one top-level key of NVIDIA's values.yaml does in kiln's chart, checked by rendering
/// with `set` (`--set` or `--set-json` pairs).
enum Effect {
    /// The ClusterPolicy's spec at this JSON pointer holds this value.
    Spec(&'static str, Value),
    /// An object of this kind and name is rendered.
    Object(&'static str, &'static str),
    /// No object of this kind and name is rendered.
    NoObject(&'static str, &'static str),
    /// `helm template` fails with this text.
    Refused(&'static str),
    /// The kiln-node-discovery DaemonSet's pod spec at this pointer holds this value.
    Discovery(&'static str, Value),
}

/// One check per top-level key of NVIDIA's v26.7.0 values.yaml (the table fails on a key it
/// lacks and on one NVIDIA's file does not have); a key may have more than one.
fn per_key_checks() -> Vec<(&'static str, Vec<&'static str>, Effect)> {
    use Effect::*;
    let flip = |key: &'static str, to: bool| Spec(key, json!(to));
    vec![
        (
            "platform",
            vec!["--set", "platform.openshift=true"],
            Object("SecurityContextConstraints", "restricted-readonly"),
        ),
        (
            "platform",
            vec![],
            NoObject("SecurityContextConstraints", "restricted-readonly"),
        ),
        ("nfd", vec![], Object("DaemonSet", "kiln-node-discovery")),
        (
            "nfd",
            vec!["--set", "nfd.enabled=false"],
            NoObject("DaemonSet", "kiln-node-discovery"),
        ),
        // Without NFD, GFD writes the features.d file kiln's discovery applies; a value the
        // user sets wins.
        (
            "nfd",
            vec![],
            Spec(
                "/gfd/env",
                json!([{"name": "USE_NODE_FEATURE_API", "value": "false"}]),
            ),
        ),
        (
            "nfd",
            vec!["--set", "nfd.enabled=false"],
            Spec("/gfd/env", Value::Null),
        ),
        (
            "nfd",
            vec![
                "--set-json",
                r#"gfd.env=[{"name":"USE_NODE_FEATURE_API","value":"true"}]"#,
            ],
            Spec(
                "/gfd/env",
                json!([{"name": "USE_NODE_FEATURE_API", "value": "true"}]),
            ),
        ),
        (
            "nfd",
            vec!["--set", "nfd.nodefeaturerules=true"],
            Refused("nfd.nodefeaturerules: NodeFeatureRules need Node Feature Discovery"),
        ),
        (
            "psa",
            vec!["--set", "psa.enabled=true"],
            flip("/psa/enabled", true),
        ),
        (
            "cdi",
            vec!["--set", "cdi.enabled=false"],
            flip("/cdi/enabled", false),
        ),
        (
            "cdi",
            vec![
                "--set",
                "cdi.enabled=false",
                "--set",
                "cdi.nriPluginEnabled=true",
            ],
            Refused("the NRI Plugin cannot be enabled when CDI is disabled"),
        ),
        (
            "cdi",
            vec![
                "--set",
                "cdi.nriPluginEnabled=true",
                "--set",
                "toolkit.enabled=false",
            ],
            Refused("the NRI Plugin cannot be enabled when the Container Toolkit is disabled"),
        ),
        (
            "sandboxWorkloads",
            vec!["--set", "sandboxWorkloads.enabled=true"],
            flip("/sandboxWorkloads/enabled", true),
        ),
        (
            "hostPaths",
            vec!["--set", "hostPaths.rootFS=/host-root"],
            Spec("/hostPaths/rootFS", json!("/host-root")),
        ),
        (
            "daemonsets",
            vec!["--set", "daemonsets.priorityClassName=gpu-critical"],
            Spec("/daemonsets/priorityClassName", json!("gpu-critical")),
        ),
        (
            "validator",
            vec![
                "--set",
                "validator.repository=registry.example/nv",
                "--set",
                "validator.image=validator",
            ],
            Spec("/validator/version", json!("v26.7.0")),
        ),
        (
            "validator",
            vec!["--set", "validator.repository=registry.example/nv"],
            Refused("validator.image is empty while validator.repository is set"),
        ),
        (
            "operator",
            vec!["--set", "operator.runtimeClass=nvidia-x"],
            Spec("/operator/runtimeClass", json!("nvidia-x")),
        ),
        (
            "mig",
            vec!["--set", "mig.strategy=mixed"],
            Spec("/mig/strategy", json!("mixed")),
        ),
        (
            "driver",
            vec!["--set", "driver.version=580.1.2"],
            Spec("/driver/version", json!("580.1.2")),
        ),
        (
            "toolkit",
            vec!["--set", "toolkit.enabled=false"],
            flip("/toolkit/enabled", false),
        ),
        (
            "devicePlugin",
            vec!["--set", "devicePlugin.enabled=false"],
            flip("/devicePlugin/enabled", false),
        ),
        (
            "devicePlugin",
            vec![
                "--set",
                "devicePlugin.config.create=true",
                "--set",
                "devicePlugin.config.name=dp",
            ],
            Refused(
                "devicePlugin.config.data cannot be empty when devicePlugin.config.create is true",
            ),
        ),
        (
            "devicePlugin",
            vec![
                "--set",
                "devicePlugin.config.create=true",
                "--set",
                "devicePlugin.config.data.any=x",
            ],
            Refused(
                "devicePlugin.config.name cannot be empty when devicePlugin.config.create is true",
            ),
        ),
        (
            "dcgm",
            vec!["--set", "dcgm.enabled=true"],
            flip("/dcgm/enabled", true),
        ),
        (
            "dcgmExporter",
            vec!["--set", "dcgmExporter.enabled=false"],
            flip("/dcgmExporter/enabled", false),
        ),
        (
            "gfd",
            vec!["--set", "gfd.enabled=false"],
            flip("/gfd/enabled", false),
        ),
        (
            "migManager",
            vec!["--set", "migManager.enabled=false"],
            flip("/migManager/enabled", false),
        ),
        (
            "nodeStatusExporter",
            vec!["--set", "nodeStatusExporter.enabled=true"],
            flip("/nodeStatusExporter/enabled", true),
        ),
        (
            "gds",
            vec!["--set", "gds.enabled=true"],
            flip("/gds/enabled", true),
        ),
        (
            "gdrcopy",
            vec!["--set", "gdrcopy.enabled=true"],
            flip("/gdrcopy/enabled", true),
        ),
        (
            "vgpuManager",
            vec!["--set", "vgpuManager.enabled=true"],
            flip("/vgpuManager/enabled", true),
        ),
        (
            "vgpuDeviceManager",
            vec!["--set", "vgpuDeviceManager.enabled=false"],
            flip("/vgpuDeviceManager/enabled", false),
        ),
        (
            "vfioManager",
            vec!["--set", "vfioManager.enabled=false"],
            flip("/vfioManager/enabled", false),
        ),
        (
            "kataManager",
            vec!["--set", "kataManager.enabled=true"],
            flip("/kataManager/enabled", true),
        ),
        (
            "sandboxDevicePlugin",
            vec!["--set", "sandboxDevicePlugin.enabled=false"],
            flip("/sandboxDevicePlugin/enabled", false),
        ),
        (
            "kataSandboxDevicePlugin",
            vec!["--set", "kataSandboxDevicePlugin.enabled=false"],
            flip("/kataSandboxDevicePlugin/enabled", false),
        ),
        (
            "ccManager",
            vec!["--set", "ccManager.defaultMode=off"],
            Spec("/ccManager/defaultMode", json!("off")),
        ),
        (
            "clusterPolicy",
            vec!["--set", "clusterPolicy.deployCR=false"],
            NoObject("ClusterPolicy", "cluster-policy"),
        ),
        (
            "gpuCluster",
            vec!["--set", "gpuCluster.deployCR=true"],
            Refused("clusterPolicy.deployCR and gpuCluster.deployCR cannot both be true"),
        ),
        // GPUCluster (DRA) support is issue 38's: until then the driver's values have no
        // effect, and nothing renders a DRA driver.
        (
            "draDriver",
            vec!["--set", "draDriver.version=v0.5.1"],
            NoObject("DaemonSet", "nvidia-dra-driver-gpu-kubelet-plugin"),
        ),
        (
            "extraObjects",
            vec![
                "--set-json",
                r#"extraObjects=[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"extra-{{ .Release.Name }}"}}]"#,
            ],
            Object("ConfigMap", "extra-kiln"),
        ),
        (
            "node-feature-discovery",
            vec![
                "--set",
                "node-feature-discovery.priorityClassName=nfd-critical",
            ],
            Discovery("/priorityClassName", json!("nfd-critical")),
        ),
        (
            "node-feature-discovery",
            vec!["--set", "node-feature-discovery.worker.tolerations=null"],
            Discovery("/tolerations", Value::Null),
        ),
        (
            "node-feature-discovery",
            vec![
                "--set-json",
                r#"node-feature-discovery.worker.config.sources.pci.deviceClassWhitelist=["0302"]"#,
            ],
            Discovery(
                "/containers/0/env/2",
                json!({"name": "KILN_DISCOVER_PCI_CLASSES", "value": "0302"}),
            ),
        ),
        (
            "node-feature-discovery",
            vec![
                "--set-json",
                r#"node-feature-discovery.worker.config.sources.pci.deviceLabelFields=["class","vendor"]"#,
            ],
            Refused("deviceLabelFields must be [vendor]"),
        ),
    ]
}

/// Each top-level key of NVIDIA's v26.7.0 values.yaml is honoured (its effect on the
/// ClusterPolicy or the chart's objects) or refused by name at template time.
#[test]
fn every_top_level_key_of_nvidias_values_is_honoured_or_refused() {
    let checks = per_key_checks();
    let nvidia = read_yaml(Path::new(&data("nvidia-v26.7.0-helm-values.yaml")));
    let keys: std::collections::BTreeSet<&str> = nvidia
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let covered: std::collections::BTreeSet<&str> = checks.iter().map(|(k, _, _)| *k).collect();
    assert_eq!(
        covered, keys,
        "the table must have NVIDIA's keys, and only those"
    );
    let mut failures = Vec::new();
    for (key, set, effect) in &checks {
        let Some(res) = template_with(set) else {
            return;
        };
        let find = |objs: &[Value], kind: &str, name: &str| {
            objs.iter()
                .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
                .cloned()
        };
        let outcome = match (effect, res) {
            (Effect::Refused(want), Err(e)) if e.contains(want) => Ok(()),
            (Effect::Refused(want), other) => Err(format!("want refusal {want:?}, got {other:?}")),
            (_, Err(e)) => Err(e),
            (Effect::Spec(ptr, want), Ok(objs)) => {
                let cp = find(&objs, "ClusterPolicy", "cluster-policy").unwrap_or_default();
                let got = cp["spec"].pointer(ptr).cloned().unwrap_or(Value::Null);
                if &got == want {
                    Ok(())
                } else {
                    Err(format!("spec{ptr} = {got}, want {want}"))
                }
            }
            (Effect::Object(kind, name), Ok(objs)) => find(&objs, kind, name)
                .map(|_| ())
                .ok_or_else(|| format!("no {kind} {name}")),
            (Effect::NoObject(kind, name), Ok(objs)) => match find(&objs, kind, name) {
                None => Ok(()),
                Some(_) => Err(format!("{kind} {name} rendered")),
            },
            (Effect::Discovery(ptr, want), Ok(objs)) => {
                let ds = find(&objs, "DaemonSet", "kiln-node-discovery").unwrap_or_default();
                let got = ds["spec"]["template"]["spec"]
                    .pointer(ptr)
                    .cloned()
                    .unwrap_or(Value::Null);
                if &got == want {
                    Ok(())
                } else {
                    Err(format!("pod spec{ptr} = {got}, want {want}"))
                }
            }
        };
        if let Err(e) = outcome {
            failures.push(format!("{key} {set:?}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
