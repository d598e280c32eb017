use super::*;
use crate::context::{OS_ID_LABEL, OS_VERSION_LABEL};
use crate::label_keys::Labels;
use serde_json::json;

fn nvd(v: Value) -> NvidiaDriverSpec {
    serde_json::from_value(v).unwrap()
}

fn node(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn gpu(os: &str, version: &str, extra: &[(&str, &str)]) -> Labels {
    let mut l = node(&[
        (GPU_PRESENT, "true"),
        (OS_ID_LABEL, os),
        (OS_VERSION_LABEL, version),
    ]);
    l.extend(node(extra));
    l
}

#[test]
fn empty_spec_takes_the_crd_defaults() {
    let d = NvidiaDriverSpec::default();
    assert_eq!(d.driver_type, DriverType::Gpu);
    assert_eq!(d.kernel_module_type, Some(KernelModuleType::Auto));
    assert_eq!(d.image, "nvcr.io/nvidia/driver");
    assert_eq!(
        d.effective_selector(),
        BTreeMap::from([(GPU_PRESENT.to_string(), "true".to_string())])
    );
    let err = serde_json::from_value::<NvidiaDriverSpec>(json!({"driverType": "cpu"}));
    assert!(err.is_err());
}

#[test]
fn fields_map_onto_the_policy_driver_spec() {
    let cr = nvd(json!({
        "repository": "nvcr.io/nvidia", "image": "driver", "version": "570.1",
        "kernelModuleType": "open", "imagePullSecrets": ["pull"],
        "env": [{"name": "A", "value": "1"}],
        "repoConfig": {"name": "repo"}, "certConfig": {"name": "certs"},
        "licensingConfig": {"secretName": "lic", "nlsEnabled": true},
        "virtualTopologyConfig": {"name": "topo"}, "kernelModuleConfig": {"name": "kmod"},
        "secretEnv": "senv", "manager": {"image": "k8s-driver-manager", "version": "v0.9"}
    }));
    let base: DriverSpec = serde_json::from_value(json!({
        "rdma": {"enabled": true},
        "upgradePolicy": {"autoUpgrade": true, "maxParallelUpgrades": 2},
        "version": "ignored"
    }))
    .unwrap();
    let d = cr.driver_spec(&base);
    assert_eq!(d.common.enabled, Some(true));
    assert_eq!(
        (
            d.common.repository.as_str(),
            d.common.image.as_str(),
            d.common.version.as_str()
        ),
        ("nvcr.io/nvidia", "driver", "570.1")
    );
    assert_eq!(d.kernel_module_type, Some(KernelModuleType::Open));
    assert_eq!(d.common.image_pull_secrets, ["pull"]);
    assert_eq!(d.common.env[0].name, "A");
    assert_eq!(d.repo_config.config_map_name, "repo");
    assert_eq!(d.cert_config.name, "certs");
    assert_eq!(d.licensing_config.secret_name, "lic");
    assert_eq!(d.licensing_config.nls_enabled, Some(true));
    assert_eq!(d.virtual_topology.config, "topo");
    assert_eq!(d.kernel_module_config.name, "kmod");
    assert_eq!(d.secret_env, "senv");
    assert_eq!(d.manager.version, "v0.9");
    // From the policy: RDMA (the CR has none); the upgrade policy is the CR's own (upstream
    // defaults here, not the policy's `maxParallelUpgrades: 2`).
    assert_eq!(d.rdma.enabled, Some(true));
    assert_eq!(d.upgrade_policy.as_ref().unwrap().max_parallel_upgrades, 1);
    assert!(d.upgrade_policy.as_ref().unwrap().auto_upgrade);
    // Upstream's default startup probe.
    assert_eq!(d.startup_probe, Some(default_startup_probe(false)));
    assert_eq!(
        nvd(json!({"usePrecompiled": true}))
            .driver_spec(&base)
            .startup_probe
            .unwrap()
            .initial_delay_seconds,
        Some(5)
    );
}

#[test]
fn policy_spec_replaces_driver_sidecars_and_pod_settings_only() {
    let cr = nvd(json!({
        "version": "570.1",
        "labels": {"app": "no", "app.kubernetes.io/name": "no", "team": "ml"},
        "annotations": {"a": "b"},
        "tolerations": [{"key": "pool", "operator": "Exists"}],
        "priorityClassName": "high",
        "gds": {"enabled": true, "image": "nvidia-fs", "version": "2.20"}
    }));
    let policy = json!({
        "driver": {"useNvidiaDriverCRD": true, "version": "550"},
        "toolkit": {"enabled": false},
        "gdrcopy": {"enabled": true},
        "daemonsets": {"labels": {"site": "x"}, "updateStrategy": "OnDelete",
            "podSecurityContext": {"runAsUser": 0}}
    });
    let out = cr.policy_spec(&policy).unwrap();
    assert_eq!(
        out["toolkit"],
        json!({"enabled": false}),
        "other fields kept"
    );
    assert_eq!(out["driver"]["version"], "570.1");
    assert!(out["driver"].get("useNvidiaDriverCRD").is_none());
    assert_eq!(out["gds"]["enabled"], true);
    assert_eq!(out["gds"]["version"], "2.20");
    assert_eq!(out["gdrcopy"]["enabled"], false, "the CR has no gdrcopy");
    assert_eq!(out["daemonsets"]["labels"], json!({"team": "ml"}));
    assert_eq!(out["daemonsets"]["annotations"], json!({"a": "b"}));
    // The asset's GPU toleration first, then the CR's (NVIDIA's NVIDIADriver manifests).
    assert_eq!(out["daemonsets"]["tolerations"][0]["key"], "nvidia.com/gpu");
    assert_eq!(out["daemonsets"]["tolerations"][1]["key"], "pool");
    assert_eq!(out["daemonsets"]["priorityClassName"], "high");
    assert_eq!(out["daemonsets"]["updateStrategy"], "OnDelete");
    assert!(out["daemonsets"].get("podSecurityContext").is_none());
    // The result is a valid ClusterPolicy spec.
    let spec = crate::ClusterPolicySpec::from_json(&out).unwrap();
    assert!(crate::State::Driver.enabled(&spec));
    // A bad policy is named.
    let err = cr
        .policy_spec(&json!({"mig": {"strategy": "double"}}))
        .unwrap_err();
    assert_eq!(err.path, "spec.mig.strategy");
}

#[test]
fn pools_group_selected_nodes_by_os_and_kernel() {
    let nodes = [
        gpu("ubuntu", "22.04", &[("pool", "a"), (KERNEL_LABEL, "5.15")]),
        gpu("ubuntu", "22.04", &[("pool", "a"), (KERNEL_LABEL, "6.8")]),
        gpu(
            "rhel",
            "9.4",
            &[
                ("pool", "a"),
                (KERNEL_LABEL, "5.14"),
                (OS_VERSION_MAJOR_LABEL, "9"),
            ],
        ),
        // rhel 9.2 without NFD's major version label: the same pool, by VERSION_ID's major.
        gpu("rhel", "9.2", &[("pool", "a"), (KERNEL_LABEL, "5.14")]),
        gpu("ubuntu", "24.04", &[("pool", "b")]),
        // No NFD labels: skipped.
        node(&[(GPU_PRESENT, "true"), ("pool", "a")]),
        // Not a GPU node.
        node(&[
            (GPU_PRESENT, "false"),
            ("pool", "a"),
            (OS_ID_LABEL, "debian"),
            (OS_VERSION_LABEL, "12"),
        ]),
    ];
    let cr = nvd(json!({"nodeSelector": {"pool": "a"}}));
    let pools = node_pools(&cr, &nodes);
    let names: Vec<_> = pools.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["rhel9", "ubuntu22.04"],
        "rhel's tag keeps the major only"
    );
    assert_eq!(
        pools[0]
            .node_selector
            .get(OS_VERSION_MAJOR_LABEL)
            .map(String::as_str),
        Some("9"),
        "rhel pools select the major version"
    );
    assert!(!pools[0].node_selector.contains_key(OS_VERSION_LABEL));
    assert_eq!(
        pools[1].node_selector,
        BTreeMap::from([
            (GPU_PRESENT.to_string(), "true".to_string()),
            (OS_ID_LABEL.to_string(), "ubuntu".to_string()),
            (OS_VERSION_LABEL.to_string(), "22.04".to_string()),
            ("pool".to_string(), "a".to_string()),
        ])
    );
    let pre = nvd(json!({"nodeSelector": {"pool": "a"}, "usePrecompiled": true}));
    let kernels: Vec<_> = node_pools(&pre, &nodes)
        .into_iter()
        .map(|p| (p.name, p.kernel.unwrap()))
        .collect();
    assert_eq!(
        kernels,
        [
            ("rhel9".to_string(), "5.14".to_string()),
            ("ubuntu22.04".to_string(), "5.15".to_string()),
            ("ubuntu22.04".to_string(), "6.8".to_string())
        ]
    );
    // nil selector: every GPU node.
    assert_eq!(node_pools(&NvidiaDriverSpec::default(), &nodes).len(), 3);
}

#[test]
fn openshift_pools_are_per_rhcos_version_unless_precompiled() {
    let rhcos = |v: &str| {
        gpu(
            "rhcos",
            "4.13",
            &[(OSTREE_VERSION_LABEL, v), (KERNEL_LABEL, "5.14")],
        )
    };
    let nodes = [
        rhcos("413.92.1"),
        rhcos("413.92.1"),
        rhcos("413.92.2"),
        // No OSTREE_VERSION label: skipped on OpenShift.
        gpu("rhcos", "4.13", &[]),
    ];
    let spec = NvidiaDriverSpec::default();
    let pools = node_pools_for(&spec, &nodes, true);
    let versions: Vec<_> = pools
        .iter()
        .map(|p| p.rhcos_version.clone().unwrap())
        .collect();
    assert_eq!(versions, ["413.92.1", "413.92.2"]);
    assert_eq!(pools[0].name, "rhcos4.13");
    assert_eq!(
        pools[0]
            .node_selector
            .get(OSTREE_VERSION_LABEL)
            .map(String::as_str),
        Some("413.92.1")
    );
    // Upstream's getDriverAppName: the RHCOS version is hashed with the UID.
    let a = daemonset_name(DriverType::Gpu, &pools[0], "uid-1");
    let b = daemonset_name(DriverType::Gpu, &pools[1], "uid-1");
    assert!(a.starts_with("nvidia-gpu-driver-rhcos4.13-") && a != b);
    assert_eq!(
        node_pools_for(&spec, &nodes, false).len(),
        1,
        "not OpenShift"
    );
    let pre = nvd(json!({"usePrecompiled": true}));
    let pools = node_pools_for(&pre, &nodes, true);
    assert_eq!(
        pools.len(),
        1,
        "precompiled: per kernel, not per RHCOS version"
    );
    assert_eq!(pools[0].rhcos_version, None);
}

/// NVIDIA's TestGetDriverAppNameRHCOS: UID, pool and the name its rule gives.
#[test]
fn rhcos_daemonset_name_matches_upstream() {
    let pool = NodePool {
        os: NodeOs {
            id: "rhcos".into(),
            version_id: "4.14".into(),
        },
        name: "rhcos4.14".into(),
        kernel: None,
        rhcos_version: Some("414.92.202309282257".into()),
        node_selector: BTreeMap::new(),
    };
    assert_eq!(
        daemonset_name(
            DriverType::Gpu,
            &pool,
            "d5b3a1f2-38a9-4b72-bff1-21fd569fd305"
        ),
        "nvidia-gpu-driver-rhcos4.14-6f4fc4fc6"
    );
}

#[test]
fn daemonset_names_follow_upstream_and_fit_a_label() {
    let pool = |name: &str, kernel: Option<&str>| NodePool {
        os: NodeOs {
            id: "ubuntu".into(),
            version_id: "22.04".into(),
        },
        name: name.into(),
        kernel: kernel.map(str::to_string),
        rhcos_version: None,
        node_selector: BTreeMap::new(),
    };
    // FNV-1a("uid-1") = 0x50c45a43 = 1355045443, each digit safe-encoded.
    assert_eq!(fnv1a32(b"uid-1"), 0x50c4_5a43);
    assert_eq!(safe_encode("1355045443"), "5799489887");
    let n = daemonset_name(DriverType::Gpu, &pool("ubuntu22.04", None), "uid-1");
    assert_eq!(n, "nvidia-gpu-driver-ubuntu22.04-5799489887");
    let k = daemonset_name(DriverType::Gpu, &pool("ubuntu22.04", Some("6.8")), "uid-1");
    assert_ne!(k, n, "the kernel is part of the hash");
    let long = daemonset_name(DriverType::Vgpu, &pool(&"x".repeat(80), None), "uid-1");
    assert_eq!(long.len(), APP_NAME_MAX);
    assert!(long.starts_with("nvidia-vgpu-driver-xxx") && long.ends_with("-5799489887"));
}

#[test]
fn finishing_renames_reselects_and_narrows_the_daemonset() {
    let mut ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "nvidia-driver-daemonset", "labels": {"app": "nvidia-driver-daemonset"}},
        "spec": {"selector": {"matchLabels": {"app": "nvidia-driver-daemonset"}},
            "template": {"metadata": {"labels": {"app": "nvidia-driver-daemonset"}},
                "spec": {"nodeSelector": {"nvidia.com/gpu.deploy.driver": "true"},
                    "affinity": {"podAntiAffinity": {}}}}}});
    let pool = NodePool {
        os: NodeOs {
            id: "ubuntu".into(),
            version_id: "22.04".into(),
        },
        name: "ubuntu22.04".into(),
        kernel: None,
        rhcos_version: None,
        node_selector: BTreeMap::from([("pool".to_string(), "a".to_string())]),
    };
    let aff: NodeAffinity = serde_json::from_value(json!({
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]}
    }))
    .unwrap();
    finish_daemonset(
        &mut ds,
        "nvidia-gpu-driver-ubuntu22.04-x",
        "pool-a",
        &pool,
        Some(&aff),
    );
    assert_eq!(ds["metadata"]["name"], "nvidia-gpu-driver-ubuntu22.04-x");
    assert_eq!(
        ds["metadata"]["labels"],
        json!({"app": "nvidia-gpu-driver-ubuntu22.04-x", NVIDIADRIVER_LABEL: "pool-a",
            OS_VERSION_POOL_LABEL: "ubuntu22.04"})
    );
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"]["app"],
        "nvidia-gpu-driver-ubuntu22.04-x"
    );
    let pod = &ds["spec"]["template"];
    assert_eq!(
        pod["metadata"]["labels"]["app"],
        "nvidia-gpu-driver-ubuntu22.04-x"
    );
    assert_eq!(
        pod["spec"]["nodeSelector"],
        json!({"nvidia.com/gpu.deploy.driver": "true", "pool": "a"})
    );
    assert_eq!(
        pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["key"],
        "zone"
    );
    assert!(pod["spec"]["affinity"]["podAntiAffinity"].is_object());
}

#[test]
fn overlapping_selectors_name_each_other_only_on_shared_nodes() {
    let all = nvd(json!({}));
    let a = nvd(json!({"nodeSelector": {"pool": "a"}}));
    let b = nvd(json!({"nodeSelector": {"pool": "b"}}));
    let zone = nvd(json!({"nodeSelector": {"zone": "z9"}}));
    let nodes = [
        node(&[(GPU_PRESENT, "true"), ("pool", "a")]),
        node(&[(GPU_PRESENT, "true"), ("pool", "b")]),
    ];
    let drivers = [("a".to_string(), &a), ("b".to_string(), &b)];
    assert!(overlaps(&drivers, &nodes).is_empty(), "disjoint pools");
    let drivers = [
        ("a".to_string(), &a),
        ("b".to_string(), &b),
        ("all".to_string(), &all),
        ("zone".to_string(), &zone),
    ];
    let o = overlaps(&drivers, &nodes);
    let names = |n: &str| o[n].iter().cloned().collect::<Vec<_>>();
    assert_eq!(names("all"), ["a", "b"]);
    assert_eq!(names("a"), ["all"]);
    assert_eq!(names("b"), ["all"]);
    assert!(!o.contains_key("zone"), "matches no node, no conflict");
}

#[test]
fn pool_object_names_follow_upstream_get_driver_name() {
    let pool = NodePool {
        os: NodeOs {
            id: "ubuntu".into(),
            version_id: "22.04".into(),
        },
        name: "ubuntu22.04".into(),
        kernel: None,
        rhcos_version: None,
        node_selector: BTreeMap::new(),
    };
    assert_eq!(
        driver_name(DriverType::Gpu, "default", &pool),
        "nvidia-gpu-driver-default-ubuntu22.04"
    );
    assert_eq!(
        driver_name(DriverType::Vgpu, "pool-a", &pool),
        "nvidia-vgpu-driver-pool-a-ubuntu22.04"
    );
    assert_eq!(
        driver_name(DriverType::VgpuHostManager, "hosts", &pool),
        "nvidia-vgpu-manager-hosts-ubuntu22.04"
    );
    assert_eq!(
        driver_name(DriverType::Gpu, &"c".repeat(300), &pool).len(),
        OBJECT_NAME_MAX
    );
}

#[test]
fn upgrade_policy_is_the_crs_own_with_upstream_defaults() {
    // No upgradePolicy: auto upgrade on, every step at its CRD defaults.
    let p = NvidiaDriverSpec::default().upgrade_policy();
    assert!(p.auto_upgrade);
    assert_eq!(p.max_parallel_upgrades, 1);
    assert_eq!(p.pod_deletion, Some(PodDeletionSpec::default()));
    assert_eq!(p.drain, Some(DrainSpec::default()));
    assert_eq!(
        p.wait_for_completion,
        Some(WaitForCompletionSpec::default())
    );
    // `upgradePolicy: {}`: autoUpgrade defaults to true here (false in the ClusterPolicy).
    let spec = nvd(json!({"upgradePolicy": {}}));
    assert!(spec.upgrade_policy.as_ref().unwrap().auto_upgrade);
    let spec = nvd(
        json!({"upgradePolicy": {"autoUpgrade": false, "maxParallelUpgrades": 3,
        "drain": {"enable": true}}}),
    );
    let p = spec.upgrade_policy();
    assert!(!p.auto_upgrade);
    assert_eq!(p.max_parallel_upgrades, 3);
    assert!(p.drain.unwrap().enable);
    // The derived ClusterPolicy driver block carries the CR's policy, not the base's.
    let base = DriverSpec {
        upgrade_policy: Some(DriverUpgradePolicySpec {
            max_parallel_upgrades: 9,
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        spec.driver_spec(&base)
            .upgrade_policy
            .unwrap()
            .max_parallel_upgrades,
        3
    );
}

#[test]
fn kernels_are_sanitized_as_upstream_does() {
    for (k, want) in [
        ("5.14.0-427.37.1.el9_4.aarch64_64k", "5.14.0-427.37.1.el9.4"),
        ("5.14.0-427.37.1.el9_4.aarch64", "5.14.0-427.37.1.el9.4"),
        ("5.14.0-427.37.1.el9_4.x86_64_64k", "5.14.0-427.37.1.el9.4"),
        ("5.14.0-427.37.1.el9_4.x86_64", "5.14.0-427.37.1.el9.4"),
        ("5.4.0-150-generic", "5.4.0-150-generic"),
    ] {
        assert_eq!(sanitized_kernel(k), want, "{k}");
    }
}

#[test]
fn vgpu_host_manager_form_selects_its_nodes_and_mounts_cgroup_and_vfio() {
    let mut ds = json!({"kind": "DaemonSet",
        "metadata": {"labels": {"app.kubernetes.io/component": "nvidia-driver"}},
        "spec": {"template": {"metadata": {"labels": {"app.kubernetes.io/component": "nvidia-driver"}},
            "spec": {"nodeSelector": {"nvidia.com/gpu.deploy.driver": "true", "pool": "a"},
                "containers": [{"name": "nvidia-driver-ctr", "startupProbe": {}, "lifecycle": {},
                    "volumeMounts": [{"name": "host-os-release", "mountPath": "/host-etc/os-release"},
                        {"name": "x", "mountPath": "/x"}]}],
                "volumes": [{"name": "host-os-release"}, {"name": "x"}]}}}});
    finish_vgpu_host_manager(&mut ds);
    assert_eq!(
        ds["metadata"]["labels"]["app.kubernetes.io/component"],
        VGPU_HOST_MANAGER_COMPONENT
    );
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod["nodeSelector"],
        json!({VGPU_MANAGER_DEPLOY_LABEL: "true", "pool": "a"})
    );
    assert_eq!(pod["terminationGracePeriodSeconds"], 120);
    let names = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(&pod["volumes"]),
        ["host-os-release", "cgroup", "vfio", "x"]
    );
    let ctr = &pod["containers"][0];
    assert_eq!(
        names(&ctr["volumeMounts"]),
        ["host-os-release", "cgroup", "vfio", "x"]
    );
    assert!(ctr.get("startupProbe").is_none() && ctr.get("lifecycle").is_none());
}

#[test]
fn finishing_adds_the_pool_labels_void_devices_and_keeps_init() {
    let mut ds = json!({"kind": "DaemonSet", "metadata": {"labels": {}},
        "spec": {"template": {"metadata": {"labels": {}}, "spec": {
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchExpressions": [{"key": "app.kubernetes.io/component",
                    "operator": "In", "values": ["nvidia-driver"]}]}}]}},
            "containers": [
                {"name": "nvidia-driver-ctr", "command": ["nvidia-driver"], "args": ["--foo"],
                 "env": [{"name": "NODE_NAME"}]},
                {"name": "nvidia-peermem-ctr"},
                {"name": "nvidia-fs-ctr"}]}}}});
    let pool = NodePool {
        os: NodeOs {
            id: "ubuntu".into(),
            version_id: "22.04".into(),
        },
        name: "ubuntu22.04".into(),
        kernel: Some("5.15.0-1.x86_64".into()),
        rhcos_version: None,
        node_selector: BTreeMap::new(),
    };
    finish_daemonset(&mut ds, "n", "cr", &pool, None);
    for labels in [
        &ds["metadata"]["labels"],
        &ds["spec"]["template"]["metadata"]["labels"],
    ] {
        assert_eq!(labels[OS_VERSION_POOL_LABEL], "ubuntu22.04");
        assert_eq!(labels[PRECOMPILED_KERNEL_LABEL], "5.15.0-1");
    }
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]
            ["matchExpressions"][0]["values"],
        json!(["nvidia-driver", "nvidia-vgpu-manager"])
    );
    let ctrs = &pod["containers"];
    assert_eq!(ctrs[0]["args"], json!(["init", "--foo"]));
    assert_eq!(
        ctrs[0]["env"][0],
        json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"})
    );
    assert_eq!(ctrs[1]["env"][0]["name"], "NVIDIA_VISIBLE_DEVICES");
    assert!(ctrs[2].get("env").is_none(), "other containers untouched");
}

#[test]
fn a_bad_max_unavailable_is_named_on_the_crs_own_field() {
    let cr = nvd(json!({"upgradePolicy": {"maxUnavailable": "150%"}}));
    let err = cr.policy_spec(&json!({})).unwrap_err();
    assert_eq!(err.path, "spec.upgradePolicy.maxUnavailable");
    assert!(err.message.contains("150%"), "{}", err.message);
    let ok = nvd(json!({"upgradePolicy": {"maxUnavailable": "30%"}}));
    assert!(ok.policy_spec(&json!({})).is_ok());
}
