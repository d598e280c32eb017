//! The chart's site plugin values: `clusterPolicy.plugins` becomes the rendered ClusterPolicy's
//! `kiln.dev/plugins` annotation (read back through kiln's own parser, as the operator reads
//! it), and `operator.pluginRegistry` gives the operator its registry credentials and the
//! registries it may reach over plain HTTP. `helm template`, skipped when `testcluster/bin/helm`
//! is not built.

use kiln_core::State;
use kiln_plugin_host::PluginRef;
use kiln_render::Policy;
use serde_json::{Value, json};

use crate::support::helm::template as helm;
use crate::support::repo;

const VALUES: &str = r#"
clusterPolicy:
  plugins:
    device-plugin:
      pin: AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA
      then:
        - name: oci://ghcr.io/acme/site-tolerations@sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
          settings: {tolerations: [{key: pool, operator: Exists}]}
        - name: node-placement
          sha256: cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc
          settings:
            nodeSelector: {pool: gpu-a}
    dcgm:
      then: [{name: site-x}]
operator:
  pluginRegistry:
    authSecret: regcred
    insecure: ["registry.local:5000", "10.0.0.1"]
"#;

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects.iter().find(|o| o["kind"] == kind).unwrap()
}

fn operator_container(d: &Value) -> &Value {
    &d["spec"]["template"]["spec"]["containers"][0]
}

fn env<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| &e["value"])
}

#[test]
fn plugin_values_write_the_policy_annotation_and_the_registry_settings() {
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, VALUES).unwrap();
    let Some(objects) = helm(&["-f", values.to_str().unwrap()]) else {
        return;
    };
    let objects = objects.unwrap_or_else(|e| panic!("{e}"));
    let policy = Policy::from_object(find(&objects, "ClusterPolicy")).unwrap();
    let oci = "oci://ghcr.io/acme/site-tolerations@sha256:".to_string() + &"b".repeat(64);
    assert_eq!(
        policy.plugins.chain(State::DevicePlugin),
        [
            PluginRef {
                name: "device-plugin".into(),
                sha256: Some("A".repeat(64)),
                settings: None,
            },
            PluginRef {
                name: oci,
                sha256: None,
                settings: Some(r#"{"tolerations":[{"key":"pool","operator":"Exists"}]}"#.into()),
            },
            PluginRef {
                name: "node-placement".into(),
                sha256: Some("c".repeat(64)),
                settings: Some(r#"{"nodeSelector":{"pool":"gpu-a"}}"#.into()),
            },
        ]
    );
    assert_eq!(
        policy.plugins.chain(State::Dcgm),
        [PluginRef::named("dcgm"), PluginRef::named("site-x")]
    );
    assert_eq!(
        policy.plugins.chain(State::Driver),
        [PluginRef::named("driver")]
    );

    let d = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "kiln-operator")
        .unwrap();
    let c = operator_container(d);
    assert_eq!(
        env(c, "KILN_INSECURE_REGISTRIES"),
        Some(&json!("registry.local:5000,10.0.0.1"))
    );
    let auth = env(c, "KILN_REGISTRY_AUTH").unwrap().as_str().unwrap();
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "registry-auth")
        .unwrap();
    assert_eq!(mount["readOnly"], true);
    assert_eq!(
        format!("{}/config.json", mount["mountPath"].as_str().unwrap()),
        auth
    );
    let volume = d["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "registry-auth")
        .unwrap();
    assert_eq!(
        volume["secret"],
        json!({"secretName": "regcred", "items": [{"key": ".dockerconfigjson", "path": "config.json"}]})
    );

    // Without plugin values: no annotation, no registry settings.
    let plain = helm(&[]).unwrap().unwrap();
    let cp = find(&plain, "ClusterPolicy");
    assert!(
        cp["metadata"]["annotations"]["kiln.dev/plugins"].is_null(),
        "{cp}"
    );
    let d = plain
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "kiln-operator")
        .unwrap();
    let c = operator_container(d);
    assert!(env(c, "KILN_INSECURE_REGISTRIES").is_none() && env(c, "KILN_REGISTRY_AUTH").is_none());
}

/// The schema names the states a chain may be given for: exactly kiln's states, each a property
/// of `clusterPolicy.plugins` (one shared definition), so that an unknown key (a state's typo,
/// or a field kiln does not know) is refused by `helm template` itself, with its path.
/// (With the states as `propertyNames`, helm 3.22's validator reported a typo at an unrelated
/// path, `/nodeStatusExporter/enabled`.)
#[test]
fn the_schema_takes_exactly_the_states_and_known_fields() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/helm/kiln/values.schema.json")).unwrap(),
    )
    .unwrap();
    let plugins = &schema["properties"]["clusterPolicy"]["properties"]["plugins"];
    assert_eq!(plugins["additionalProperties"], json!(false));
    let mut states: Vec<&str> = plugins["properties"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(state, s)| {
            assert_eq!(s, &json!({"$ref": "#/definitions/statePlugins"}), "{state}");
            state.as_str()
        })
        .collect();
    let mut names: Vec<&str> = State::ALL.iter().map(|s| s.name()).collect();
    states.sort_unstable();
    names.sort_unstable();
    assert_eq!(states, names);
    for (bad, want) in [
        (
            "clusterPolicy.plugins.deviceplugin.then[0].name=x",
            "at '/clusterPolicy/plugins': additional properties 'deviceplugin' not allowed",
        ),
        (
            "clusterPolicy.plugins.dcgm.then[0].config=x",
            "at '/clusterPolicy/plugins/dcgm/then/0': additional properties 'config' not allowed",
        ),
        (
            "clusterPolicy.plugins.dcgm.pin=abc",
            "at '/clusterPolicy/plugins/dcgm/pin': 'abc' does not match pattern",
        ),
        (
            "operator.pluginRegistry.insecure[0]=http://x",
            "at '/operator/pluginRegistry/insecure/0'",
        ),
        // A registry plugin by tag: pins are digests.
        (
            "clusterPolicy.plugins.dcgm.then[0].name=oci://r.example/a/x:v1",
            "at '/clusterPolicy/plugins/dcgm/then/0/name': 'oci://r.example/a/x:v1' does not match pattern",
        ),
    ] {
        let Some(out) = helm(&["--set", bad]) else {
            return;
        };
        let err = out.err().unwrap_or_else(|| panic!("{bad} was accepted"));
        assert!(err.contains(want), "{bad}: {err}");
        // Every location helm names is under the value set.
        let under = format!(
            "at '/{}",
            bad.split('.').take(2).collect::<Vec<_>>().join("/")
        );
        for line in err.lines().filter(|l| l.contains("at '")) {
            assert!(line.contains(&under), "{bad}: {line:?} in {err}");
        }
    }
}
