//! What a reconcile does, decided without IO:
//! - which states a ClusterPolicy enables (upstream GPU Operator v26.7, `isStateEnabled`);
//! - per state, which objects to apply (each labelled [`STATE_LABEL`]`=<state>` and owned by the
//!   policy, whatever the plugin chain produced) and which live objects to delete ([`plan`]).
//!
//! ```text
//! rendered objects per state ─┐
//! live objects labelled ──────┼─► plan ─► per state: apply (labelled, owned) + delete
//!   kiln.dev/state (cluster)  │           + orphans (labelled with a state kiln does not know)
//! GPU node count ─────────────┘
//! ```
//!
//! Ownership lives in the cluster: what kiln applied is found again after a restart by the
//! label, so an object a site plugin once added and no longer produces is deleted then too.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::spec::{ClusterPolicySpec, SandboxMode};
use crate::state::State;

/// The label kiln puts on every object it applies, naming the state that produced it
/// (`kiln.dev/state=dcgm-exporter`). Set after the plugin chain, so a plugin can neither drop it
/// nor name another state; deletion of stale and disabled objects is decided from it.
pub const STATE_LABEL: &str = "kiln.dev/state";

/// Identity of one object: `apiVersion`, `kind`, namespace (`None` for cluster-scoped) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// `apiVersion`, e.g. `apps/v1`.
    pub api_version: String,
    /// `kind`, e.g. `DaemonSet`.
    pub kind: String,
    /// `metadata.namespace` (`None` for cluster-scoped objects).
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: String,
}

impl ObjectKey {
    /// The key of a JSON object; `None` when `apiVersion`, `kind` or `metadata.name` is missing.
    pub fn of(obj: &Value) -> Option<Self> {
        let s = |p: &str| obj.pointer(p).and_then(Value::as_str).map(str::to_string);
        Some(ObjectKey {
            api_version: s("/apiVersion")?,
            kind: s("/kind")?,
            namespace: s("/metadata/namespace"),
            name: s("/metadata/name")?,
        })
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// A live object carrying [`STATE_LABEL`], as a cache of the cluster holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveObject {
    /// Its identity.
    pub key: ObjectKey,
    /// The value of its [`STATE_LABEL`].
    pub state: String,
    /// Whether a ClusterPolicy (`nvidia.com/v1`) is among its owner references; objects not
    /// owned by a policy are never deleted, whatever their label says.
    pub owned: bool,
}

/// What one state's render produced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Render<'a> {
    /// The state is disabled: its objects are deleted.
    Disabled,
    /// The state is off because NVIDIADriver CRs run it now ([`hands_off`]): its DaemonSets
    /// are deleted with `propagationPolicy: Orphan` ([`StatePlan::orphan`]), so the driver pods
    /// keep running until the NVIDIADriver DaemonSets replace them; its other objects (service
    /// account, RBAC, the startup-probe ConfigMap, which those DaemonSets use) stay.
    HandedOff,
    /// The chain failed: nothing of the state is applied or deleted (its last objects stay).
    Failed,
    /// The chain's output, in apply order.
    Objects(&'a [Value]),
}

/// One state's share of a [`Plan`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatePlan {
    /// Objects to server-side apply, in order, labelled and owned ([`desired_object`]).
    /// DaemonSets are left out while the cluster has no GPU node (upstream), but are not deleted.
    pub apply: Vec<Value>,
    /// Live objects of the state to delete: the state is disabled, or its render no longer
    /// produces them (and no other state does).
    pub delete: Vec<ObjectKey>,
    /// Live DaemonSets of a [`Render::HandedOff`] state: deleted with
    /// `propagationPolicy: Orphan` (their pods are not deleted).
    pub orphan: Vec<ObjectKey>,
}

/// Whether `state` is handed to NVIDIADriver CRs under `spec` (upstream: with
/// `driver.useNvidiaDriverCRD` the `state-driver` and `state-vgpu-manager` are not run and their
/// DaemonSets are deleted with Orphan propagation). Such a state renders as
/// [`Render::HandedOff`].
pub fn hands_off(state: State, spec: &ClusterPolicySpec) -> bool {
    matches!(state, State::Driver | State::VgpuManager)
        && spec.driver.use_nvidia_driver_crd.unwrap_or(false)
}

/// What one reconcile applies and deletes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Per state, in the order given to [`plan`].
    pub states: Vec<(State, StatePlan)>,
    /// Owned live objects labelled with a name that is no state of kiln's; deleted.
    pub orphans: Vec<ObjectKey>,
}

/// `obj` as kiln applies it for `state`: [`STATE_LABEL`]`=<state>` set (replacing whatever the
/// chain put there) and `metadata.ownerReferences` replaced by `[owner]` (the policy's
/// controller reference, as JSON).
pub fn desired_object(obj: &Value, state: State, owner: &Value) -> Value {
    let mut desired = obj.clone();
    if !desired["metadata"].is_object() {
        desired["metadata"] = Value::Object(serde_json::Map::new());
    }
    let meta = &mut desired["metadata"];
    if !meta["labels"].is_object() {
        meta["labels"] = Value::Object(serde_json::Map::new());
    }
    meta["labels"][STATE_LABEL] = Value::String(state.name().to_string());
    meta["ownerReferences"] = Value::Array(vec![owner.clone()]);
    desired
}

/// Decide a reconcile: for each state its objects to apply and the live objects to delete;
/// `renders` names every state (a known state left out keeps its objects); `live` is every
/// object carrying [`STATE_LABEL`] the cluster holds (kinds the assets use).
///
/// Rules: a live object is kept when any state renders its key (an object moving between
/// states is re-labelled by the apply, never deleted and recreated), when it is not owned by a
/// ClusterPolicy, or when its state's chain failed; otherwise it is deleted when its state is
/// disabled or rendered without it, and as an orphan when its label names no state. Objects
/// the chain produced without an identity are skipped (the operator reports them). With
/// `gpu_nodes == 0` DaemonSets are not applied.
pub fn plan(
    renders: &[(State, Render<'_>)],
    live: &[LiveObject],
    owner: &Value,
    gpu_nodes: usize,
) -> Plan {
    let rendered: BTreeSet<ObjectKey> = renders
        .iter()
        .filter_map(|(_, r)| match r {
            Render::Objects(objs) => Some(objs.iter().filter_map(ObjectKey::of)),
            _ => None,
        })
        .flatten()
        .collect();
    let mut by_state: BTreeMap<&str, Vec<&LiveObject>> = BTreeMap::new();
    for l in live
        .iter()
        .filter(|l| l.owned && !rendered.contains(&l.key))
    {
        by_state.entry(l.state.as_str()).or_default().push(l);
    }
    let mut out = Plan::default();
    for (state, render) in renders {
        let mut sp = StatePlan::default();
        if let Render::Objects(objs) = render {
            sp.apply = objs
                .iter()
                .filter(|o| gpu_nodes > 0 || o["kind"] != "DaemonSet")
                .map(|o| desired_object(o, *state, owner))
                .collect();
        }
        let stale = by_state.remove(state.name()).unwrap_or_default();
        match render {
            Render::Failed => {}
            Render::HandedOff => {
                sp.orphan = stale
                    .into_iter()
                    .filter(|l| l.key.kind == "DaemonSet")
                    .map(|l| l.key.clone())
                    .collect();
                sp.orphan.sort();
            }
            Render::Disabled | Render::Objects(_) => {
                sp.delete = stale.into_iter().map(|l| l.key.clone()).collect();
                sp.delete.sort();
            }
        }
        out.states.push((*state, sp));
    }
    out.orphans = by_state
        .into_iter()
        .filter(|(name, _)| name.parse::<State>().is_err())
        .flat_map(|(_, ls)| ls.into_iter().map(|l| l.key.clone()))
        .collect();
    out.orphans.sort();
    out
}

impl State {
    /// Whether `spec` enables this state. Rules (nil = the CRD/code default):
    /// - `pre-requisites`: unless `cdi.nriPluginEnabled`;
    /// - `operator-metrics`, `operator-validation`: always;
    /// - `driver`: `driver.enabled` (nil = true) and not `driver.useNvidiaDriverCRD`;
    /// - `container-toolkit`, `device-plugin`, `mps-control-daemon`, `dcgm`, `dcgm-exporter`,
    ///   `gpu-feature-discovery`, `mig-manager`: their `enabled` (nil = true; MPS follows the
    ///   device plugin);
    /// - `node-status-exporter`: `enabled` (nil = false);
    /// - sandbox family: `sandboxWorkloads.enabled` and the component's `enabled` (nil = false),
    ///   the sandbox device plugin only in `kubevirt` mode, kata device plugin and CC manager only
    ///   in `kata` mode, sandbox validation whenever sandbox is on;
    /// - `kata-manager`: never (deprecated upstream).
    pub fn enabled(self, spec: &ClusterPolicySpec) -> bool {
        let sandbox = spec.sandbox_enabled();
        let mode = spec.sandbox_workloads.mode.unwrap_or(SandboxMode::Kubevirt);
        match self {
            State::PreRequisites => !spec.cdi.nri_plugin_enabled(),
            State::OperatorMetrics | State::OperatorValidation => true,
            State::Driver => {
                spec.driver.common.enabled_or(true)
                    && !spec.driver.use_nvidia_driver_crd.unwrap_or(false)
            }
            State::ContainerToolkit => spec.toolkit.common.enabled_or(true),
            State::DevicePlugin | State::MpsControlDaemon => {
                spec.device_plugin.common.enabled_or(true)
            }
            State::Dcgm => spec.dcgm.common.enabled_or(true),
            State::DcgmExporter => spec.dcgm_exporter.common.enabled_or(true),
            State::GpuFeatureDiscovery => spec.gfd.enabled_or(true),
            State::MigManager => spec.mig_manager.common.enabled_or(true),
            State::NodeStatusExporter => spec.node_status_exporter.enabled_or(false),
            State::VgpuManager => {
                sandbox
                    && spec.vgpu_manager.common.enabled_or(false)
                    && !spec.driver.use_nvidia_driver_crd.unwrap_or(false)
            }
            State::VgpuDeviceManager => {
                sandbox && spec.vgpu_device_manager.common.enabled_or(false)
            }
            State::SandboxValidation => sandbox,
            State::VfioManager => sandbox && spec.vfio_manager.common.enabled_or(false),
            State::SandboxDevicePlugin => {
                sandbox
                    && spec.sandbox_device_plugin.enabled_or(false)
                    && mode == SandboxMode::Kubevirt
            }
            State::KataDevicePlugin => {
                sandbox
                    && spec.kata_sandbox_device_plugin.enabled_or(false)
                    && mode == SandboxMode::Kata
            }
            State::KataManager => false,
            State::CcManager => {
                sandbox && spec.cc_manager.common.enabled_or(false) && mode == SandboxMode::Kata
            }
        }
    }
}

/// The enabled states of `spec`, in apply order.
pub fn enabled_states(spec: &ClusterPolicySpec) -> Vec<State> {
    State::ALL.into_iter().filter(|s| s.enabled(spec)).collect()
}

/// Whether the DaemonSet `ds` covers every node its pod template's `nodeSelector` matches now:
/// `None` when it does, else `(matching nodes, status.desiredNumberScheduled)`. `nodes` are the
/// labels of every node. A DaemonSet controller that has not yet seen a new or relabelled
/// node reports fewer desired pods than there are matching nodes, and upstream's
/// `isDaemonSetReady` then says ready; kiln does not. Only `nodeSelector` is read (kiln's
/// assets select nodes by it); affinity and taints are not, so a node the DaemonSet cannot
/// tolerate keeps the state not ready.
pub fn uncovered_nodes<L: crate::labels::LabelLookup>(
    ds: &k8s_openapi::api::apps::v1::DaemonSet,
    nodes: impl IntoIterator<Item = L>,
) -> Option<(usize, i32)> {
    let empty = BTreeMap::new();
    let selector = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.node_selector.as_ref())
        .unwrap_or(&empty);
    let matching = nodes
        .into_iter()
        .filter(|l| selector.iter().all(|(k, v)| l.label(k) == Some(v.as_str())))
        .count();
    let desired = ds.status.as_ref().map_or(0, |s| s.desired_number_scheduled);
    (usize::try_from(desired).unwrap_or(0) < matching).then_some((matching, desired))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> ClusterPolicySpec {
        ClusterPolicySpec::from_json(&v).unwrap()
    }

    fn obj(kind: &str, name: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": kind,
            "metadata": {"name": name, "namespace": "gpu-operator",
                "labels": {STATE_LABEL: "forged", "app": "x"}}})
    }

    fn live(kind: &str, name: &str, state: &str, owned: bool) -> LiveObject {
        LiveObject {
            key: ObjectKey::of(&obj(kind, name)).unwrap(),
            state: state.into(),
            owned,
        }
    }

    fn names(keys: &[ObjectKey]) -> Vec<String> {
        keys.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn applied_objects_carry_the_state_label_and_the_owner_only() {
        let owner = json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "p"});
        let mut forged = obj("ConfigMap", "a");
        forged["metadata"]["ownerReferences"] = json!([{"kind": "Other"}]);
        let d = desired_object(&forged, State::Dcgm, &owner);
        assert_eq!(
            d["metadata"]["labels"],
            json!({STATE_LABEL: "dcgm", "app": "x"})
        );
        assert_eq!(d["metadata"]["ownerReferences"], json!([owner]));
        let bare = desired_object(&json!({"kind": "X"}), State::Driver, &owner);
        assert_eq!(bare["metadata"]["labels"][STATE_LABEL], "driver");
    }

    #[test]
    fn plan_deletes_stale_disabled_and_orphaned_objects_only() {
        let owner = json!({});
        let dcgm = [obj("ConfigMap", "kept"), obj("DaemonSet", "ds")];
        let moved = [obj("ConfigMap", "moved")];
        let renders = [
            (State::Dcgm, Render::Objects(&dcgm)),
            (State::DcgmExporter, Render::Disabled),
            (State::Driver, Render::Failed),
            (State::DevicePlugin, Render::Objects(&moved)),
        ];
        let live = [
            live("ConfigMap", "kept", "dcgm", true),
            live("ConfigMap", "site-extra", "dcgm", true),
            live("ConfigMap", "not-ours", "dcgm", false),
            live("Service", "exporter", "dcgm-exporter", true),
            live("ConfigMap", "driver-old", "driver", true),
            live("ConfigMap", "moved", "dcgm", true),
            live("ConfigMap", "gone-state", "no-such-state", true),
        ];
        let p = plan(&renders, &live, &owner, 0);
        let by = |s: State| &p.states.iter().find(|(st, _)| *st == s).unwrap().1;
        assert_eq!(
            names(&by(State::Dcgm).delete),
            ["ConfigMap gpu-operator/site-extra"]
        );
        // No GPU node: the DaemonSet is not applied, but not deleted either.
        assert_eq!(by(State::Dcgm).apply.len(), 1);
        assert_eq!(
            names(&by(State::DcgmExporter).delete),
            ["Service gpu-operator/exporter"]
        );
        assert!(
            by(State::Driver).delete.is_empty(),
            "a failed chain keeps its objects"
        );
        assert!(by(State::Driver).apply.is_empty());
        assert!(by(State::DevicePlugin).delete.is_empty());
        assert_eq!(
            by(State::DevicePlugin).apply[0]["metadata"]["labels"][STATE_LABEL],
            "device-plugin",
            "an object moving between states is re-labelled, not deleted"
        );
        assert_eq!(names(&p.orphans), ["ConfigMap gpu-operator/gone-state"]);
        assert_eq!(plan(&renders, &live, &owner, 1).states[0].1.apply.len(), 2);
    }

    #[test]
    fn a_handed_off_state_orphans_its_daemonsets_and_keeps_the_rest() {
        let owner = json!({});
        let renders = [(State::Driver, Render::HandedOff)];
        let live = [
            live("DaemonSet", "nvidia-driver-daemonset", "driver", true),
            live("ServiceAccount", "nvidia-driver", "driver", true),
            live("DaemonSet", "someone-elses", "driver", false),
        ];
        let p = plan(&renders, &live, &owner, 3);
        let sp = &p.states[0].1;
        assert_eq!(
            names(&sp.orphan),
            ["DaemonSet gpu-operator/nvidia-driver-daemonset"]
        );
        assert!(sp.delete.is_empty(), "{:?}", sp.delete);
        assert!(sp.apply.is_empty());
        let on = spec(json!({"driver": {"useNvidiaDriverCRD": true}}));
        assert!(hands_off(State::Driver, &on));
        assert!(hands_off(State::VgpuManager, &on));
        assert!(!hands_off(State::ContainerToolkit, &on));
        assert!(!hands_off(State::Driver, &spec(json!({}))));
    }

    #[test]
    fn a_daemonset_short_of_its_matching_nodes_is_uncovered() {
        let ds = |desired: i32| -> k8s_openapi::api::apps::v1::DaemonSet {
            serde_json::from_value(json!({
                "metadata": {"name": "tk"},
                "spec": {"selector": {}, "template": {"spec": {"containers": [],
                    "nodeSelector": {"nvidia.com/gpu.deploy.container-toolkit": "true"}}}},
                "status": {"desiredNumberScheduled": desired, "currentNumberScheduled": 0,
                    "numberMisscheduled": 0, "numberReady": 0}
            }))
            .unwrap()
        };
        let on: BTreeMap<String, String> = [(
            "nvidia.com/gpu.deploy.container-toolkit".to_string(),
            "true".to_string(),
        )]
        .into();
        let off: BTreeMap<String, String> = [(
            "nvidia.com/gpu.deploy.container-toolkit".to_string(),
            "false".to_string(),
        )]
        .into();
        let nodes = [&on, &on, &on, &off];
        assert_eq!(uncovered_nodes(&ds(2), nodes), Some((3, 2)));
        assert_eq!(uncovered_nodes(&ds(3), nodes), None);
        assert_eq!(uncovered_nodes(&ds(0), [&off]), None);
    }

    #[test]
    fn empty_spec_enables_the_upstream_defaults() {
        let names: Vec<_> = enabled_states(&spec(json!({})))
            .iter()
            .map(|s| s.name())
            .collect();
        assert_eq!(
            names,
            [
                "pre-requisites",
                "operator-metrics",
                "driver",
                "container-toolkit",
                "operator-validation",
                "device-plugin",
                "mps-control-daemon",
                "dcgm",
                "dcgm-exporter",
                "gpu-feature-discovery",
                "mig-manager"
            ]
        );
    }

    #[test]
    fn nri_drops_prerequisites_and_driver_crd_drops_driver() {
        let s = spec(
            json!({"cdi": {"nriPluginEnabled": true}, "driver": {"useNvidiaDriverCRD": true}}),
        );
        assert!(!State::PreRequisites.enabled(&s));
        assert!(!State::Driver.enabled(&s));
        assert!(State::ContainerToolkit.enabled(&s));
    }

    #[test]
    fn sandbox_family_follows_mode() {
        let s = spec(json!({
            "sandboxWorkloads": {"enabled": true, "mode": "kata"},
            "sandboxDevicePlugin": {"enabled": true},
            "kataSandboxDevicePlugin": {"enabled": true},
            "ccManager": {"enabled": true},
            "vfioManager": {"enabled": true},
            "kataManager": {"enabled": true}
        }));
        assert!(!State::SandboxDevicePlugin.enabled(&s));
        assert!(State::KataDevicePlugin.enabled(&s));
        assert!(State::CcManager.enabled(&s));
        assert!(State::VfioManager.enabled(&s));
        assert!(State::SandboxValidation.enabled(&s));
        assert!(!State::KataManager.enabled(&s));
        assert!(!State::VgpuManager.enabled(&s));
    }
}
