//! Which states a ClusterPolicy enables (upstream GPU Operator v26.7, `isStateEnabled`).

use crate::spec::{ClusterPolicySpec, SandboxMode};
use crate::state::State;

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> ClusterPolicySpec {
        ClusterPolicySpec::from_json(&v).unwrap()
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
