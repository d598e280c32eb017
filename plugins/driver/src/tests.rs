//! Case files and the C20 digest-sensitivity rules (transform-cases.md C20).

use super::*;
use kiln_plugin_std::serde_json::{Value, json};

#[test]
fn cases() {
    kiln_plugin_std::testing::assert_cases::<Driver>(env!("CARGO_MANIFEST_DIR"), 15);
}

fn base_ds() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "nvidia-driver-daemonset", "namespace": "gpu-operator"},
        "spec": {"selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": {
                "initContainers": [{"name": "k8s-driver-manager",
                    "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                            {"name": "ENABLE_AUTO_DRAIN", "value": "false"}]}],
                "containers": [{"name": "nvidia-driver-ctr", "command": ["nvidia-driver"], "args": ["init"],
                    "startupProbe": {"exec": {"command": ["true"]}, "periodSeconds": 10},
                    "volumeMounts": [{"name": "host-root", "mountPath": "/host"}]},
                    {"name": "nvidia-peermem-ctr"}],
                "volumes": [{"name": "host-root", "hostPath": {"path": "/"}},
                            {"name": "cfg", "configMap": {"name": "cfg"}}]}}}})
}

fn base_spec() -> Value {
    json!({"driver": {"repository": "nvcr.io/nvidia", "image": "driver", "version": "570.172.08",
        "manager": {"repository": "nvcr.io/nvidia/cloud-native", "image": "k8s-driver-manager", "version": "v0.8.0"}}})
}

fn ctx() -> TransformContext {
    TransformContext {
        secrets: vec!["env-secret".into()],
        ..Default::default()
    }
}

/// The digests on (k8s-driver-manager, nvidia-driver-ctr) after transforming `ds` with `spec`.
fn digests(ds: &Value, spec: &Value) -> (String, String) {
    let out =
        kiln_plugin_std::apply_native::<Driver>(std::slice::from_ref(ds), spec, &ctx()).unwrap();
    let pod = &out[0].as_ref().unwrap()["spec"]["template"]["spec"];
    let get = |c: &Value| {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == digest::ENV)
            .unwrap()["value"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let driver = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "nvidia-driver-ctr")
        .unwrap();
    (get(&pod["initContainers"][0]), get(driver))
}

fn pod_mut(ds: &mut Value) -> &mut Value {
    &mut ds["spec"]["template"]["spec"]
}

#[test]
fn digest_is_set_identically_on_manager_and_driver() {
    let (m, d) = digests(&base_ds(), &base_spec());
    assert_eq!(m, d);
    // NVIDIA's format: an unsigned 32-bit integer in decimal.
    assert!(m.parse::<u32>().is_ok(), "{m}");
    // Idempotent: transforming an already-transformed object gives the same digest.
    let once = kiln_plugin_std::apply_native::<Driver>(&[base_ds()], &base_spec(), &ctx()).unwrap();
    let again = digests(once[0].as_ref().unwrap(), &base_spec());
    assert_eq!(again.0, m);
}

#[test]
fn digest_ignores_non_install_fields() {
    let base = digests(&base_ds(), &base_spec()).1;
    type Edit = fn(&mut Value, &mut Value);
    let edits: Vec<(&str, Edit)> = vec![
        ("resources", |_, s| {
            s["driver"]["resources"] = json!({"limits": {"cpu": "1"}});
        }),
        ("probes", |_, s| {
            s["driver"]["startupProbe"] = json!({"periodSeconds": 99});
        }),
        ("tolerations", |_, s| {
            s["daemonsets"] = json!({"tolerations": [{"key": "k", "operator": "Exists"}]});
        }),
        ("nodeSelector", |d, _| {
            pod_mut(d)["nodeSelector"] = json!({"a": "b"});
        }),
        ("securityContext", |d, _| {
            pod_mut(d)["containers"][0]["securityContext"] = json!({"privileged": true});
            pod_mut(d)["securityContext"] = json!({"runAsUser": 0});
        }),
        ("imagePullPolicy", |_, s| {
            s["driver"]["imagePullPolicy"] = json!("Always");
        }),
        ("priorityClass", |_, s| {
            s["daemonsets"] = json!({"priorityClassName": "x"});
        }),
        ("serviceAccount and hostPID", |d, _| {
            pod_mut(d)["serviceAccountName"] = json!("sa");
            pod_mut(d)["hostPID"] = json!(true);
        }),
        ("labels and annotations", |_, s| {
            s["daemonsets"] = json!({"labels": {"a": "b"}, "annotations": {"c": "d"}});
        }),
        ("init resources", |d, _| {
            pod_mut(d)["initContainers"][0]["resources"] = json!({"limits": {"cpu": "1"}});
        }),
        ("valueFrom env", |d, _| {
            pod_mut(d)["containers"][0]["env"] =
                json!([{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]);
        }),
        ("unrecognized containers", |d, _| {
            pod_mut(d)["containers"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "other", "image": "x"}));
            pod_mut(d)["initContainers"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "other-init", "image": "y"}));
        }),
    ];
    for (what, edit) in edits {
        let (mut ds, mut spec) = (base_ds(), base_spec());
        edit(&mut ds, &mut spec);
        assert_eq!(digests(&ds, &spec).1, base, "{what} changed the digest");
    }
}

#[test]
fn digest_follows_install_fields() {
    let base = digests(&base_ds(), &base_spec()).1;
    type Edit = fn(&mut Value, &mut Value);
    let edits: Vec<(&str, Edit)> = vec![
        ("driver image", |_, s| {
            s["driver"]["version"] = json!("580.0");
        }),
        ("manager image", |_, s| {
            s["driver"]["manager"]["version"] = json!("v0.9.0");
        }),
        ("driver env", |_, s| {
            s["driver"]["env"] = json!([{"name": "A", "value": "b"}]);
        }),
        ("manager env", |_, s| {
            s["driver"]["manager"]["env"] = json!([{"name": "ENABLE_AUTO_DRAIN", "value": "true"}]);
        }),
        ("driver args", |_, s| {
            s["driver"]["args"] = json!(["--x"]);
        }),
        ("driver command", |d, _| {
            pod_mut(d)["containers"][0]["command"] = json!(["other"]);
        }),
        ("peermem added", |_, s| {
            s["driver"]["rdma"] = json!({"enabled": true});
        }),
        ("nvidia-fs added", |d, s| {
            pod_mut(d)["containers"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "nvidia-fs-ctr"}));
            s["gds"] = json!({"enabled": true, "image": "nvidia-fs:2.20.5"});
        }),
        ("gdrcopy added", |d, s| {
            pod_mut(d)["containers"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "nvidia-gdrcopy-ctr"}));
            s["gdrcopy"] = json!({"enabled": true, "image": "gdrdrv:v2.5"});
        }),
        ("volume added", |d, _| {
            pod_mut(d)["volumes"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "x", "emptyDir": {}}));
        }),
        ("volume source ConfigMap to Secret", |d, _| {
            pod_mut(d)["volumes"][1] = json!({"name": "cfg", "secret": {"secretName": "cfg"}});
        }),
        ("driver mount added", |d, _| {
            pod_mut(d)["containers"][0]["volumeMounts"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "cfg", "mountPath": "/cfg"}));
        }),
        ("host-root path", |_, s| {
            s["hostPaths"] = json!({"rootFS": "/custom"});
        }),
        ("secretEnv", |_, s| {
            s["driver"]["secretEnv"] = json!("env-secret");
        }),
    ];
    for (what, edit) in edits {
        let (mut ds, mut spec) = (base_ds(), base_spec());
        edit(&mut ds, &mut spec);
        assert_ne!(
            digests(&ds, &spec).1,
            base,
            "{what} did not change the digest"
        );
    }
}

#[test]
fn digest_sorts_env_by_name() {
    let mut a = base_spec();
    a["driver"]["env"] = json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]);
    let mut b = base_spec();
    b["driver"]["env"] = json!([{"name": "B", "value": "2"}, {"name": "A", "value": "1"}]);
    assert_eq!(digests(&base_ds(), &a), digests(&base_ds(), &b));
}
