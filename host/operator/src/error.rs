//! The operator's error type: what went wrong, with what was being done.

/// What can go wrong talking to the API server or serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API request failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done (`apply DaemonSet gpu-operator/nvidia-dcgm-exporter`).
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// An object could not be converted between typed and JSON forms.
    #[error("{action}: {source}")]
    Json {
        /// What was being converted.
        action: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// A rendered object lacks `apiVersion`, `kind` or `metadata.name`.
    #[error("rendered object without apiVersion/kind/name: {0}")]
    BadObject(String),
    /// The metrics/health server could not start.
    #[error("metrics server on {addr}: {source}")]
    Serve {
        /// Listen address.
        addr: String,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The kube client could not be built.
    #[error("kube client: {0}")]
    Client(#[source] kube::Error),
    /// Another replica took the Lease; this one must stop.
    #[error("leadership lost")]
    LeadershipLost,
    /// The kubeconfig could not be read.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// Something waited for did not happen in time (what is still there).
    #[error("timed out: {0}")]
    Timeout(String),
}

impl Error {
    /// Wrap a kube error with what was being done.
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source,
        }
    }

    /// A short label for metrics (`kube`, `json`, …).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Json { .. } => "json",
            Error::BadObject(_) => "bad_object",
            Error::Serve { .. } => "serve",
            Error::Client(_) | Error::Kubeconfig(_) => "client",
            Error::LeadershipLost => "leadership",
            Error::Timeout(_) => "timeout",
        }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whether a kube error is a 404.
pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}
