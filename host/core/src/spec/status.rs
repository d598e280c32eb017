//! ClusterPolicy status.

use serde::{Deserialize, Serialize};

#[cfg(feature = "kube")]
use schemars::JsonSchema;

/// The ClusterPolicy's overall state: `ready`, `notReady`, or `ignored` when another policy is
/// active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
pub enum PolicyState {
    /// Every enabled state is ready.
    #[serde(rename = "ready")]
    Ready,
    /// Some state is not ready or failed.
    #[serde(rename = "notReady")]
    NotReady,
    /// Not the active ClusterPolicy (a newer duplicate).
    #[serde(rename = "ignored")]
    Ignored,
}

/// `status` of a ClusterPolicy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ClusterPolicyStatus {
    /// ready / notReady / ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<PolicyState>,
    /// Operator namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `Ready` and `Error` conditions.
    #[serde(default)]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    /// Driver upgrade progress (kiln; written by the upgrade controller while
    /// `driver.upgradePolicy.autoUpgrade` is on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_upgrade: Option<DriverUpgradeStatus>,
}

/// `status.driverUpgrade`: how many driver nodes are in which upgrade state (the numbers behind
/// upstream's `gpu_operator_nodes_upgrades_*` gauges, plus one count per state label value).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DriverUpgradeStatus {
    /// Nodes running a driver pod (or mid-upgrade).
    #[serde(default)]
    pub total_nodes: u32,
    /// Nodes in `upgrade-required`.
    #[serde(default)]
    pub upgrades_pending: u32,
    /// Nodes past `upgrade-required` and not done (failed included).
    #[serde(default)]
    pub upgrades_in_progress: u32,
    /// Nodes in `upgrade-done`.
    #[serde(default)]
    pub upgrades_done: u32,
    /// Nodes in `upgrade-failed`.
    #[serde(default)]
    pub upgrades_failed: u32,
    /// Upgrade slots free (`maxParallelUpgrades`/`maxUnavailable`).
    #[serde(default)]
    pub upgrades_available: u32,
    /// Nodes per state (`upgrade-done: 6`, `cordon-required: 2`, `unknown` for no label).
    #[serde(default)]
    pub nodes: std::collections::BTreeMap<String, u32>,
}
