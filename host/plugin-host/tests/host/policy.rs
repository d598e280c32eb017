//! The output policy (`wit/README.md`, "Output policy"): what a plugin's result may not do,
//! each refusal its own error naming the plugin, the object and the field.

use kiln_plugin_host::{HostConfig, PluginError, PluginHost, PodPrivileges, Rendered};
use serde_json::{Value, json};

use crate::common::*;

fn cluster_role() -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "nvidia-device-plugin"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]
    })
}

fn cluster_role_binding() -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "nvidia-device-plugin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "nvidia-device-plugin"},
        "subjects": [{"kind": "ServiceAccount", "name": "nvidia-device-plugin", "namespace": "gpu-operator"}]
    })
}

/// The escalation of the review: every verb on everything, bound to every authenticated user.
const ESCALATE_RULES: &str = r#"[{"op":"replace","path":"/rules","value":[{"apiGroups":["*"],"resources":["*"],"verbs":["*"]}]}]"#;
const ESCALATE_SUBJECTS: &str = r#"[{"op":"add","path":"/subjects/-","value":{"apiGroup":"rbac.authorization.k8s.io","kind":"Group","name":"system:authenticated"}}]"#;

/// A host with `patch` installed as the drop-in (site) plugin `site-x`, and as the bundled
/// (standard) plugin `std-x`.
fn hosts(patch: &str, config: impl Fn(&Dirs) -> HostConfig) -> (Dirs, PluginHost) {
    let dirs = Dirs::new();
    dirs.install("site-x", &patcher("site-x", patch));
    dirs.install("good", good_wasm());
    let standard: &'static [u8] = Box::leak(patcher("std-x", patch).into_boxed_slice());
    let host = PluginHost::new(config(&dirs), &[("std-x", standard)]).unwrap();
    (dirs, host)
}

fn run(host: &PluginHost, name: &str, object: Value) -> Result<Value, PluginError> {
    let out = host.transform(name, &[object], &json!({}), &ctx())?;
    match out.rendered.into_iter().next() {
        Some(Rendered::Keep(o)) => Ok(o),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_site_plugin_cannot_escalate_rbac_but_a_standard_plugin_may() {
    let (_d, host) = hosts(ESCALATE_RULES, Dirs::config);
    let err = run(&host, "site-x", cluster_role()).unwrap_err();
    match &err {
        PluginError::RbacChanged {
            plugin,
            index,
            object,
            field,
        } => assert_eq!(
            (plugin.as_str(), *index, object.as_str(), *field),
            ("site-x", 0, "ClusterRole/nvidia-device-plugin", "/rules")
        ),
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string().starts_with(
            "plugin \"site-x\": object 0 (ClusterRole/nvidia-device-plugin): /rules changed"
        ),
        "{err}"
    );
    // The bundled plugin is trusted with what upstream's transforms do.
    let out = run(&host, "std-x", cluster_role()).unwrap();
    assert_eq!(out["rules"][0]["verbs"], json!(["*"]));
    assert_good_works(&host);

    let (_d, host) = hosts(ESCALATE_SUBJECTS, Dirs::config);
    let err = run(&host, "site-x", cluster_role_binding()).unwrap_err();
    assert!(
        matches!(
            &err,
            PluginError::RbacChanged {
                field: "/subjects",
                ..
            }
        ),
        "{err:?}"
    );
    let out = run(&host, "std-x", cluster_role_binding()).unwrap();
    assert_eq!(out["subjects"][1]["name"], "system:authenticated");

    let (_d, host) = hosts(
        r#"[{"op":"replace","path":"/roleRef/name","value":"cluster-admin"}]"#,
        Dirs::config,
    );
    let err = run(&host, "site-x", cluster_role_binding()).unwrap_err();
    assert!(
        matches!(
            &err,
            PluginError::RbacChanged {
                field: "/roleRef",
                ..
            }
        ),
        "{err:?}"
    );
    let (_d, host) = hosts(
        r#"[{"op":"add","path":"/aggregationRule","value":{"clusterRoleSelectors":[{"matchLabels":{"a":"b"}}]}}]"#,
        Dirs::config,
    );
    let err = run(&host, "site-x", cluster_role()).unwrap_err();
    assert!(
        matches!(
            &err,
            PluginError::RbacChanged {
                field: "/aggregationRule",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_site_plugin_may_label_an_rbac_object() {
    let (_d, host) = hosts(
        r#"[{"op":"add","path":"/metadata/labels","value":{"site":"x"}}]"#,
        Dirs::config,
    );
    let out = run(&host, "site-x", cluster_role_binding()).unwrap();
    assert_eq!(out["metadata"]["labels"]["site"], "x");
    assert_eq!(out["subjects"], cluster_role_binding()["subjects"]);
}

#[test]
fn no_plugin_may_rename_renamespace_or_rekind() {
    for (patch, field, before, after) in [
        (
            r#"[{"op":"replace","path":"/metadata/name","value":"other"}]"#,
            "/metadata/name",
            r#""ds""#,
            r#""other""#,
        ),
        (
            r#"[{"op":"replace","path":"/metadata/namespace","value":"kube-system"}]"#,
            "/metadata/namespace",
            r#""gpu-operator""#,
            r#""kube-system""#,
        ),
        (
            r#"[{"op":"replace","path":"/kind","value":"Deployment"}]"#,
            "/kind",
            r#""DaemonSet""#,
            r#""Deployment""#,
        ),
        (
            r#"[{"op":"remove","path":"/metadata/namespace"}]"#,
            "/metadata/namespace",
            r#""gpu-operator""#,
            "nothing",
        ),
    ] {
        let (_d, host) = hosts(patch, Dirs::config);
        for plugin in ["site-x", "std-x"] {
            let err = run(&host, plugin, daemonset("ds")).unwrap_err();
            match &err {
                PluginError::IdentityChanged {
                    plugin: p,
                    object,
                    field: f,
                    before: b,
                    after: a,
                    ..
                } => assert_eq!(
                    (p.as_str(), object.as_str(), *f, b.as_str(), a.as_str()),
                    (plugin, "DaemonSet/ds", field, before, after),
                    "{patch}"
                ),
                other => panic!("{patch}: {other:?}"),
            }
        }
    }
}

#[test]
fn no_plugin_may_return_an_object_over_1_mib() {
    let pad = 2 << 20;
    let dirs = Dirs::new();
    let big = patcher_with(
        "big",
        r#"[{"op":"add","path":"/x-pad","value":""#,
        pad,
        r#""}]"#,
        "(func $before)",
    );
    dirs.install("big", &big);
    let host = host_with_good(&dirs, dirs.config());
    let err = run(&host, "big", config_map("cm")).unwrap_err();
    match &err {
        PluginError::ObjectTooLarge {
            plugin,
            object,
            limit_bytes,
            actual_bytes,
            ..
        } => {
            assert_eq!((plugin.as_str(), object.as_str()), ("big", "ConfigMap/cm"));
            assert_eq!(*limit_bytes, 1 << 20);
            assert!(*actual_bytes > 1 << 20, "{actual_bytes}");
        }
        other => panic!("{other:?}"),
    }
    // Just under the bound is fine.
    let dirs = Dirs::new();
    let fits = patcher_with(
        "fits",
        r#"[{"op":"add","path":"/x-pad","value":""#,
        (1 << 20) - 200,
        r#""}]"#,
        "(func $before)",
    );
    dirs.install("fits", &fits);
    let host = host_with_good(&dirs, dirs.config());
    let out = run(&host, "fits", config_map("cm")).unwrap();
    assert_eq!(out["x-pad"].as_str().unwrap().len(), (1 << 20) - 200);
}

#[test]
fn no_plugin_may_blow_an_object_up_with_copies() {
    // Each copy of the root doubles the object: 40 of them in under 2 KiB of patch.
    let ops: Vec<String> = (0..40)
        .map(|i| format!(r#"{{"op":"copy","from":"","path":"/c{i}"}}"#))
        .collect();
    let dirs = Dirs::new();
    dirs.install("bomb", &patcher("bomb", &format!("[{}]", ops.join(","))));
    let host = host_with_good(&dirs, dirs.config());
    let err = run(&host, "bomb", config_map("cm")).unwrap_err();
    match &err {
        PluginError::ObjectTooLarge {
            plugin,
            object,
            limit_bytes,
            actual_bytes,
            ..
        } => {
            assert_eq!((plugin.as_str(), object.as_str()), ("bomb", "ConfigMap/cm"));
            assert_eq!(*limit_bytes, 1 << 20);
            assert!(*actual_bytes > 1 << 20, "{actual_bytes}");
        }
        other => panic!("{other:?}"),
    }
}

/// A DaemonSet whose pod already has `hostNetwork`, a privileged container `old` with
/// `SYS_ADMIN`, and a hostPath volume of `/run`.
fn privileged_daemonset() -> Value {
    let mut ds = daemonset("ds");
    let spec = &mut ds["spec"]["template"]["spec"];
    spec["hostNetwork"] = json!(true);
    spec["containers"] = json!([
        {"name": "old", "image": "x", "securityContext": {"privileged": true, "capabilities": {"add": ["SYS_ADMIN"]}}},
        {"name": "plain", "image": "x"}
    ]);
    spec["volumes"] = json!([{"name": "run", "hostPath": {"path": "/run"}}]);
    ds
}

#[test]
fn a_site_plugin_may_not_widen_pod_privileges_by_default() {
    let p = "/spec/template/spec";
    for (patch, field) in [
        (
            format!(r#"[{{"op":"add","path":"{p}/hostPID","value":true}}]"#),
            format!("{p}/hostPID"),
        ),
        (
            format!(r#"[{{"op":"add","path":"{p}/hostIPC","value":true}}]"#),
            format!("{p}/hostIPC"),
        ),
        (
            format!(
                r#"[{{"op":"add","path":"{p}/containers/1/securityContext","value":{{"privileged":true}}}}]"#
            ),
            format!("{p}/containers[name=plain]/securityContext/privileged"),
        ),
        (
            format!(
                r#"[{{"op":"add","path":"{p}/containers/0/securityContext/capabilities/add/-","value":"NET_ADMIN"}}]"#
            ),
            format!("{p}/containers[name=old]/securityContext/capabilities/add/NET_ADMIN"),
        ),
        (
            format!(r#"[{{"op":"replace","path":"{p}/volumes/0/hostPath/path","value":"/"}}]"#),
            format!(r#"{p}/volumes[name=run]/hostPath/path="/""#),
        ),
        (
            format!(
                r#"[{{"op":"add","path":"{p}/initContainers","value":[{{"name":"i","image":"x","securityContext":{{"privileged":true}}}}]}}]"#
            ),
            format!("{p}/initContainers[name=i]/securityContext/privileged"),
        ),
        // Renaming the privileged container is a new privileged container.
        (
            format!(r#"[{{"op":"replace","path":"{p}/containers/0/name","value":"new"}}]"#),
            format!("{p}/containers[name=new]/securityContext/capabilities/add/SYS_ADMIN"),
        ),
    ] {
        let (_d, host) = hosts(&patch, Dirs::config);
        let err = run(&host, "site-x", privileged_daemonset()).unwrap_err();
        match &err {
            PluginError::PodPrivilegeWidened {
                plugin,
                object,
                field: f,
                ..
            } => assert_eq!(
                (plugin.as_str(), object.as_str(), f.as_str()),
                ("site-x", "DaemonSet/ds", field.as_str()),
                "{patch}"
            ),
            other => panic!("{patch}: {other:?}"),
        }
        // Standard plugins, and site plugins on a host that allows it, may.
        run(&host, "std-x", privileged_daemonset()).unwrap();
        let (_d, host) = hosts(&patch, |d| HostConfig {
            site_pod_privileges: PodPrivileges::Allow,
            ..d.config()
        });
        run(&host, "site-x", privileged_daemonset()).unwrap();
    }
}

#[test]
fn a_site_plugin_may_keep_or_drop_pod_privileges() {
    let p = "/spec/template/spec";
    for patch in [
        format!(
            r#"[{{"op":"add","path":"{p}/containers/1/env","value":[{{"name":"A","value":"b"}}]}}]"#
        ),
        format!(
            r#"[{{"op":"remove","path":"{p}/hostNetwork"}},{{"op":"remove","path":"{p}/volumes"}}]"#
        ),
        format!(
            r#"[{{"op":"replace","path":"{p}/containers/0/securityContext","value":{{"privileged":true}}}}]"#
        ),
    ] {
        let (_d, host) = hosts(&patch, Dirs::config);
        run(&host, "site-x", privileged_daemonset()).unwrap_or_else(|e| panic!("{patch}: {e}"));
    }
}
