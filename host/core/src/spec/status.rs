//! ClusterPolicy status.

use serde::{Deserialize, Serialize};

#[cfg(feature = "kube")]
use schemars::JsonSchema;

/// `status.state` (CRD enum).
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
}
