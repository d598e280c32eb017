//! The closed list of states, in reconcile order.
//!
//! A *state* is one operand's bundle of objects: the folder `assets/state-<name>/` and the
//! standard plugin `plugins/<name>/` that transforms it. The order is upstream's registration
//! order (NVIDIA GPU Operator v26.7 `init()`), which is also the apply order.

use std::fmt;
use std::str::FromStr;

/// One state, in upstream order. `State::ALL` lists them in apply order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// RuntimeClasses `nvidia`, `nvidia-legacy`, `nvidia-cdi` (upstream folder `pre-requisites`).
    PreRequisites,
    /// The operator's own metrics Service and ServiceMonitor.
    OperatorMetrics,
    /// The NVIDIA driver DaemonSet.
    Driver,
    /// The NVIDIA container toolkit DaemonSet.
    ContainerToolkit,
    /// The operator validator DaemonSet (readiness chain).
    OperatorValidation,
    /// The kubelet device plugin DaemonSet.
    DevicePlugin,
    /// The MPS control daemon DaemonSet.
    MpsControlDaemon,
    /// The standalone DCGM host engine.
    Dcgm,
    /// The metrics exporter.
    DcgmExporter,
    /// GPU Feature Discovery.
    GpuFeatureDiscovery,
    /// The MIG manager.
    MigManager,
    /// The node status exporter.
    NodeStatusExporter,
    /// vGPU manager (sandbox workloads).
    VgpuManager,
    /// vGPU device manager (sandbox workloads).
    VgpuDeviceManager,
    /// Sandbox validator (sandbox workloads).
    SandboxValidation,
    /// VFIO manager (sandbox workloads).
    VfioManager,
    /// KubeVirt sandbox device plugin.
    SandboxDevicePlugin,
    /// Kata sandbox device plugin.
    KataDevicePlugin,
    /// Kata manager (deprecated upstream; never enabled).
    KataManager,
    /// Confidential-computing manager.
    CcManager,
}

impl State {
    /// Every state in apply order.
    pub const ALL: [State; 20] = [
        State::PreRequisites,
        State::OperatorMetrics,
        State::Driver,
        State::ContainerToolkit,
        State::OperatorValidation,
        State::DevicePlugin,
        State::MpsControlDaemon,
        State::Dcgm,
        State::DcgmExporter,
        State::GpuFeatureDiscovery,
        State::MigManager,
        State::NodeStatusExporter,
        State::VgpuManager,
        State::VgpuDeviceManager,
        State::SandboxValidation,
        State::VfioManager,
        State::SandboxDevicePlugin,
        State::KataDevicePlugin,
        State::KataManager,
        State::CcManager,
    ];

    /// The state's name: its assets folder is `assets/state-<name>`, its standard plugin is
    /// named `<name>`.
    pub const fn name(self) -> &'static str {
        match self {
            State::PreRequisites => "pre-requisites",
            State::OperatorMetrics => "operator-metrics",
            State::Driver => "driver",
            State::ContainerToolkit => "container-toolkit",
            State::OperatorValidation => "operator-validation",
            State::DevicePlugin => "device-plugin",
            State::MpsControlDaemon => "mps-control-daemon",
            State::Dcgm => "dcgm",
            State::DcgmExporter => "dcgm-exporter",
            State::GpuFeatureDiscovery => "gpu-feature-discovery",
            State::MigManager => "mig-manager",
            State::NodeStatusExporter => "node-status-exporter",
            State::VgpuManager => "vgpu-manager",
            State::VgpuDeviceManager => "vgpu-device-manager",
            State::SandboxValidation => "sandbox-validation",
            State::VfioManager => "vfio-manager",
            State::SandboxDevicePlugin => "sandbox-device-plugin",
            State::KataDevicePlugin => "kata-device-plugin",
            State::KataManager => "kata-manager",
            State::CcManager => "cc-manager",
        }
    }

    /// The assets folder name, `state-<name>`.
    pub fn folder(self) -> String {
        format!("state-{}", self.name())
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A state name that is not one of [`State::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for State {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.strip_prefix("state-").unwrap_or(s);
        State::ALL
            .into_iter()
            .find(|st| st.name() == s)
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_order() {
        for st in State::ALL {
            assert_eq!(st.name().parse::<State>(), Ok(st));
            assert_eq!(st.folder().parse::<State>(), Ok(st));
        }
        assert_eq!(State::ALL[0], State::PreRequisites);
        assert_eq!(State::ALL[19], State::CcManager);
        assert!("state-bogus".parse::<State>().is_err());
    }
}
