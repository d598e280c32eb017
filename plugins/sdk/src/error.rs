//! The plugin-side error, mirroring the WIT `transform-error` variant.

use std::fmt;

/// Why a transform refused to produce a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransformError {
    /// A ClusterPolicy field is invalid: its path (e.g.
    /// `spec.daemonsets.rollingUpdate.maxUnavailable`) and why.
    InvalidField {
        /// Field path.
        path: String,
        /// Reason.
        message: String,
    },
    /// An input object lacks something the transform needs.
    InvalidObject(String),
    /// Any other failure.
    Failed(String),
}

impl TransformError {
    /// Shorthand for [`TransformError::InvalidField`].
    pub fn field(path: impl Into<String>, message: impl Into<String>) -> Self {
        TransformError::InvalidField {
            path: path.into(),
            message: message.into(),
        }
    }

    /// "container X not found in DaemonSet Y".
    pub fn missing_container(ds: &str, name: &str) -> Self {
        TransformError::InvalidObject(format!("container {name:?} not found in DaemonSet {ds:?}"))
    }
}

impl fmt::Display for TransformError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransformError::InvalidField { path, message } => write!(f, "{path}: {message}"),
            TransformError::InvalidObject(m) | TransformError::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for TransformError {}
