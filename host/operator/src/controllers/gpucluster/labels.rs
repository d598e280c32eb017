//! The node labels a GPUCluster deploys its operands by (NVIDIA v26.7.0's node-labelling
//! controller with a GPUCluster active: `updateGPUStateLabels` → `updateGPUClusterStateLabels`,
//! `removeAllGPUStateLabels`).
//!
//! ```text
//! NFD PCI labels ─► gpu.present ─┬─ not a GPU node ─► remove every deploy label (both stacks)
//!                                └─ GPU node ─► remove the device-plugin stack's own keys,
//!                                               set DEPLOY_LABELS where absent or empty
//! ```
//!
//! A value already set (say `paused-for-driver-upgrade`, which the driver manager writes to
//! drain an operand off a node) is kept; an empty one counts as absent, as upstream's.

use kiln_core::labels::{
    LabelPatch, Labels, apply_patch, is_gpu_node, known_deploy_keys, plan_gpu_present,
};

/// The deploy labels a GPUCluster sets to `"true"` on every GPU node (upstream
/// `gpuClusterStateLabels`): the driver (an NVIDIADriver's DaemonSet selects it), the DRA
/// kubelet plugin, the DRA validator, DCGM and the exporter. The DaemonSets of
/// `assets/state-dra-*` select their node by these.
pub const DEPLOY_LABELS: [&str; 5] = [
    "nvidia.com/gpu.deploy.driver",
    "nvidia.com/gpu.deploy.dra-driver",
    "nvidia.com/gpu.deploy.dra-validator",
    "nvidia.com/gpu.deploy.dcgm-dra",
    "nvidia.com/gpu.deploy.dcgm-exporter-dra",
];

/// The vGPU manager's deploy key: shared by both stacks, so a GPUCluster never sweeps it
/// (upstream `devicePluginOnlyStateLabelKeys`).
const VGPU_MANAGER: &str = "nvidia.com/gpu.deploy.vgpu-manager";

/// The minimal label patch of one node under a GPUCluster (`Some` sets, `None` removes); empty
/// when the node is labelled already:
/// - `nvidia.com/gpu.present` follows the NFD PCI labels ([`plan_gpu_present`]);
/// - a node that is not a GPU node loses every deploy label of either stack;
/// - a GPU node loses the deploy keys only the ClusterPolicy's device-plugin stack uses
///   (every key kiln manages for a ClusterPolicy, less [`DEPLOY_LABELS`] and the vGPU
///   manager's) and gets each of [`DEPLOY_LABELS`] set to `"true"` where absent or empty.
pub fn plan(labels: &Labels) -> LabelPatch {
    let mut patch = plan_gpu_present(labels);
    let after = apply_patch(labels, &patch);
    let gpu = is_gpu_node(&after);
    for key in known_deploy_keys() {
        let ours = DEPLOY_LABELS.contains(&key.as_str()) || key == VGPU_MANAGER;
        if after.contains_key(&key) && (!gpu || !ours) {
            patch.insert(key, None);
        }
    }
    for key in DEPLOY_LABELS {
        if !gpu {
            if after.contains_key(key) {
                patch.insert(key.to_string(), None);
            }
        } else if after.get(key).is_none_or(|v| v.is_empty()) {
            patch.insert(key.to_string(), Some("true".into()));
        }
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const PCI: (&str, &str) = ("feature.node.kubernetes.io/pci-10de.present", "true");

    #[test]
    fn a_new_gpu_node_gets_gpu_present_and_every_dra_deploy_label() {
        let patch = plan(&labels(&[PCI]));
        let mut want: LabelPatch = DEPLOY_LABELS
            .iter()
            .map(|k| (k.to_string(), Some("true".to_string())))
            .collect();
        want.insert("nvidia.com/gpu.present".into(), Some("true".into()));
        assert_eq!(patch, want);
        // Labelled: nothing more to do.
        assert_eq!(
            plan(&apply_patch(&labels(&[PCI]), &patch)),
            LabelPatch::new()
        );
    }

    #[test]
    fn the_device_plugin_stack_keys_go_and_shared_or_paused_ones_stay() {
        let mut node = labels(&[
            PCI,
            ("nvidia.com/gpu.present", "true"),
            ("nvidia.com/gpu.deploy.device-plugin", "true"),
            ("nvidia.com/gpu.deploy.container-toolkit", "true"),
            ("nvidia.com/gpu.deploy.mig-manager", "true"),
            (VGPU_MANAGER, "true"),
            ("nvidia.com/gpu.deploy.driver", "paused-for-driver-upgrade"),
            ("nvidia.com/gpu.deploy.dra-driver", ""),
        ]);
        let patch = plan(&node);
        for gone in [
            "nvidia.com/gpu.deploy.device-plugin",
            "nvidia.com/gpu.deploy.container-toolkit",
            "nvidia.com/gpu.deploy.mig-manager",
        ] {
            assert_eq!(patch.get(gone), Some(&None), "{gone}");
        }
        assert!(!patch.contains_key(VGPU_MANAGER));
        assert!(!patch.contains_key("nvidia.com/gpu.deploy.driver"));
        assert_eq!(
            patch.get("nvidia.com/gpu.deploy.dra-driver"),
            Some(&Some("true".to_string()))
        );
        node = apply_patch(&node, &patch);
        assert_eq!(plan(&node), LabelPatch::new());
    }

    #[test]
    fn a_node_whose_gpu_went_loses_every_deploy_label() {
        let node = labels(&[
            ("nvidia.com/gpu.present", "true"),
            ("nvidia.com/gpu.deploy.dra-driver", "true"),
            ("nvidia.com/gpu.deploy.driver", "true"),
            ("nvidia.com/gpu.deploy.device-plugin", "true"),
        ]);
        let patch = plan(&node);
        assert_eq!(
            patch.get("nvidia.com/gpu.present"),
            Some(&Some("false".to_string()))
        );
        for gone in [
            "nvidia.com/gpu.deploy.dra-driver",
            "nvidia.com/gpu.deploy.driver",
            "nvidia.com/gpu.deploy.device-plugin",
        ] {
            assert_eq!(patch.get(gone), Some(&None), "{gone}");
        }
        assert_eq!(
            plan(&labels(&[("kubernetes.io/os", "linux")])),
            LabelPatch::new()
        );
    }
}
