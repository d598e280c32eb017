use super::*;

fn entry(
    manager: &str,
    operation: &str,
    subresource: Option<&str>,
    set: Value,
) -> ManagedFieldsEntry {
    ManagedFieldsEntry {
        api_version: Some("apps/v1".into()),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(set)),
        manager: Some(manager.into()),
        operation: Some(operation.into()),
        subresource: subresource.map(str::to_string),
        time: None,
    }
}

/// kiln's apply of a DaemonSet with one container `main` (one env var, one port) and a label.
fn kiln() -> ManagedFieldsEntry {
    entry(
        "kiln",
        "Apply",
        None,
        json!({
            "f:metadata": {"f:labels": {"f:app": {}, "f:kiln.dev/state": {}}},
            "f:spec": {"f:selector": {}, "f:template": {
                "f:metadata": {"f:labels": {"f:app": {}}},
                "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {
                    ".": {}, "f:name": {}, "f:image": {},
                    "f:env": {"k:{\"name\":\"A\"}": {".": {}, "f:name": {}, "f:value": {}}},
                    "f:ports": {"k:{\"containerPort\":9400,\"protocol\":\"TCP\"}": {
                        ".": {}, "f:containerPort": {}}}
                }}}
            }}
        }),
    )
}

/// The live DaemonSet: kiln's fields, the server's defaults, and what `intruder` added.
fn live() -> Value {
    json!({
        "metadata": {"name": "ds", "resourceVersion": "42",
            "labels": {"app": "x", "kiln.dev/state": "dcgm", "team": "ml"},
            "annotations": {"deprecated.daemonset.template.generation": "3"}},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "revisionHistoryLimit": 10,
            "template": {
                "metadata": {"labels": {"app": "x"},
                    "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"}},
                "spec": {"containers": [
                    {"name": "main", "image": "i", "terminationMessagePath": "/dev/termination-log",
                        "env": [{"name": "A", "value": "1"}, {"name": "EXTRA", "value": "2"}],
                        "ports": [{"containerPort": 9400, "protocol": "TCP"}],
                        "securityContext": {"privileged": true}},
                    {"name": "sidecar", "image": "evil", "securityContext": {"privileged": true}}
                ]}
            }},
        "status": {"numberReady": 2}
    })
}

fn intruder() -> ManagedFieldsEntry {
    entry(
        "intruder",
        "Apply",
        None,
        json!({
            "f:metadata": {"f:labels": {"f:team": {}}},
            "f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"main\"}": {
                    ".": {}, "f:name": {},
                    "f:env": {"k:{\"name\":\"EXTRA\"}": {".": {}, "f:name": {}, "f:value": {}}},
                    "f:securityContext": {"f:privileged": {}}
                },
                "k:{\"name\":\"sidecar\"}": {".": {}, "f:name": {}, "f:image": {},
                    "f:securityContext": {"f:privileged": {}}}
            }}}}
        }),
    )
}

/// Apply the `remove` operations of a JSON patch to `obj` (after checking its `test`).
fn apply(obj: &mut Value, patch: &Value) {
    for op in patch.as_array().unwrap() {
        let path = op["path"].as_str().unwrap();
        if op["op"] == "test" {
            assert_eq!(obj.pointer(path), Some(&op["value"]));
            continue;
        }
        let (parent, last) = path.rsplit_once('/').unwrap();
        let last = last.replace("~1", "/").replace("~0", "~");
        match obj.pointer_mut(parent).unwrap() {
            Value::Object(m) => assert!(m.remove(&last).is_some(), "{path}"),
            Value::Array(a) => {
                a.remove(last.parse::<usize>().unwrap());
            }
            other => panic!("{path}: {other}"),
        }
    }
}

fn paths(r: &[Removal]) -> Vec<&str> {
    r.iter().map(|r| r.pointer.as_str()).collect()
}

#[test]
fn fields_only_another_manager_owns_are_drift_and_shared_ones_are_not() {
    let status = entry(
        "kube-controller-manager",
        "Update",
        Some("status"),
        json!({"f:status": {"f:numberReady": {}}}),
    );
    let f = foreign(&[kiln(), intruder(), status], "kiln");
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].manager.as_deref(), Some("intruder"));
    assert!(f[0].time.is_none());
    // What kiln owns too (the container `main` itself, its name) is not drift.
    assert_eq!(
        f[0].fields_v1.as_ref().unwrap().0,
        json!({
            "f:metadata": {"f:labels": {"f:team": {}}},
            "f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"main\"}": {
                    "f:env": {"k:{\"name\":\"EXTRA\"}": {".": {}, "f:name": {}, "f:value": {}}},
                    "f:securityContext": {"f:privileged": {}}
                },
                "k:{\"name\":\"sidecar\"}": {".": {}, "f:name": {}, "f:image": {},
                    "f:securityContext": {"f:privileged": {}}}
            }}}}
        })
    );
    // The reduction is its own fixed point (a cache may keep it instead of the record).
    assert_eq!(foreign(&f, "kiln"), f);
    // Nobody else: no drift.
    assert!(foreign(&[kiln()], "kiln").is_empty());
}

#[test]
fn removals_are_the_topmost_foreign_fields_in_patch_order() {
    let r = removals(&live(), &foreign(&[kiln(), intruder()], "kiln"));
    assert_eq!(
        paths(&r),
        [
            "/spec/template/spec/containers/1",
            "/spec/template/spec/containers/0/securityContext/privileged",
            "/spec/template/spec/containers/0/env/1",
            "/metadata/labels/team",
        ]
    );
    let shown: Vec<&str> = r.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        shown,
        [
            "spec.template.spec.containers[name=sidecar]",
            "spec.template.spec.containers[name=main].securityContext.privileged",
            "spec.template.spec.containers[name=main].env[name=EXTRA]",
            "metadata.labels.team",
        ]
    );
    assert_eq!(r[0].value["image"], "evil");
    assert_eq!(
        describe(&r[2..]),
        "set by intruder: spec.template.spec.containers[name=main].env[name=EXTRA], metadata.labels.team"
    );
    // Applied, the patch leaves exactly kiln's fields and the server's defaults.
    let mut obj = live();
    apply(&mut obj, &json_patch("42", &r));
    assert_eq!(
        obj["metadata"]["labels"],
        json!({"app": "x", "kiln.dev/state": "dcgm"})
    );
    assert_eq!(
        obj["spec"]["template"]["spec"]["containers"],
        json!([{"name": "main", "image": "i", "terminationMessagePath": "/dev/termination-log",
            "env": [{"name": "A", "value": "1"}],
            "ports": [{"containerPort": 9400, "protocol": "TCP"}],
            "securityContext": {}}])
    );
}

#[test]
fn the_patch_tests_the_resource_version_first() {
    let r = removals(&live(), &foreign(&[kiln(), intruder()], "kiln"));
    let p = json_patch("42", &r);
    assert_eq!(
        p[0],
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": "42"})
    );
    assert_eq!(p.as_array().unwrap().len(), r.len() + 1);
    assert_eq!(
        p[1],
        json!({"op": "remove", "path": "/spec/template/spec/containers/1"})
    );
}

#[test]
fn status_restarts_and_the_template_generation_are_tolerated() {
    let rollout = entry(
        "kubectl-rollout",
        "Update",
        None,
        json!({
            "f:metadata": {"f:annotations": {"f:deprecated.daemonset.template.generation": {}}},
            "f:spec": {"f:template": {"f:metadata": {"f:annotations": {
                ".": {}, "f:kubectl.kubernetes.io/restartedAt": {}}}}},
            "f:status": {"f:numberReady": {}}
        }),
    );
    assert!(foreign(&[kiln(), rollout.clone()], "kiln").is_empty());
    // Another annotation next to the restart goes alone; the map and the restart stay.
    let mut obj = live();
    obj["spec"]["template"]["metadata"]["annotations"]["note"] = json!("hi");
    let mut noted = rollout;
    noted.fields_v1.as_mut().unwrap().0["f:spec"]["f:template"]["f:metadata"]["f:annotations"]["f:note"] =
        json!({});
    let r = removals(&obj, &foreign(&[kiln(), noted], "kiln"));
    assert_eq!(paths(&r), ["/spec/template/metadata/annotations/note"]);
}

#[test]
fn list_keys_values_and_indices_resolve_and_missing_fields_are_skipped() {
    let obj = json!({"metadata": {"finalizers": ["a", "b/c"], "labels": {"x/y": "1"}},
        "spec": {"ports": [{"port": 80, "protocol": "TCP"}, {"port": 81, "protocol": "UDP"}],
            "args": ["p", "q"]}});
    let f = vec![entry(
        "m",
        "Update",
        None,
        json!({
            "f:metadata": {"f:finalizers": {"v:\"b/c\"": {}}, "f:labels": {"f:x/y": {}, "f:gone": {}}},
            "f:spec": {"f:ports": {"k:{\"port\":81,\"protocol\":\"UDP\"}": {".": {}},
                "k:{\"port\":99,\"protocol\":\"TCP\"}": {".": {}}},
                "f:args": {"i:1": {}}}
        }),
    )];
    let r = removals(&obj, &f);
    assert_eq!(
        paths(&r),
        [
            "/spec/ports/1",
            "/spec/args/1",
            "/metadata/labels/x~1y",
            "/metadata/finalizers/1"
        ]
    );
    let shown: Vec<&str> = r.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        shown,
        [
            "spec.ports[port=81,protocol=UDP]",
            "spec.args[1]",
            "metadata.labels.x/y",
            "metadata.finalizers[b/c]"
        ]
    );
}

#[test]
fn a_field_two_managers_added_is_removed_once_and_ids_follow_the_value() {
    let twice = foreign(
        &[kiln(), intruder(), {
            let mut e = intruder();
            e.manager = Some("other".into());
            e
        }],
        "kiln",
    );
    assert_eq!(twice.len(), 2);
    let r = removals(&live(), &twice);
    assert_eq!(r.len(), 4, "{:?}", paths(&r));
    let mut changed = live();
    changed["metadata"]["labels"]["team"] = json!("infra");
    let r2 = removals(&changed, &twice);
    let id = |r: &[Removal], p: &str| r.iter().find(|x| x.path == p).unwrap().id();
    assert_ne!(
        id(&r, "metadata.labels.team"),
        id(&r2, "metadata.labels.team")
    );
    assert_eq!(
        id(&r, "spec.template.spec.containers[name=sidecar]"),
        id(&r2, "spec.template.spec.containers[name=sidecar]")
    );
}

#[test]
fn a_node_kiln_owns_fields_under_is_not_drift_even_when_a_creator_owns_it_whole() {
    // NVIDIA's operator created the object (an Update owns every node it sent, maps and list
    // items included); kiln's apply owns the labels and containers it renders.
    let creator = entry(
        "gpu-operator",
        "Update",
        None,
        json!({
            "f:metadata": {"f:labels": {".": {}, "f:app": {}, "f:team": {}},
                "f:annotations": {".": {}, "f:nvidia.com/last-applied-hash": {}}},
            "f:spec": {"f:template": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}}
        }),
    );
    let f = foreign(&[kiln(), creator], "kiln");
    assert_eq!(
        f[0].fields_v1.as_ref().unwrap().0,
        // The annotations map stays (it holds the server's template-generation annotation).
        json!({"f:metadata": {"f:labels": {"f:team": {}},
            "f:annotations": {"f:nvidia.com/last-applied-hash": {}}}})
    );
}
