//! The ClusterPolicy corpus (`tests/data/policy-corpus.yaml`: policies with the verdict the API
//! server gives each under kiln's CRD, and kiln's where it is stricter), replayed against kiln
//! by `chart/crd.rs` and against a real API server by `cluster/crd.rs`.

use serde_json::{Value, json};

/// A verdict on a ClusterPolicy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Accept,
    Reject,
}

/// One case of `data/policy-corpus.yaml` (its header explains the fields).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: String,
    pub api: Verdict,
    pub kiln: Option<Verdict>,
    pub at: Option<String>,
    pub stage: Option<String>,
    pub why: Option<String>,
    pub spec: Value,
}

impl Case {
    /// The case's spec as a ClusterPolicy named after the case.
    pub fn object(&self) -> Value {
        json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
               "metadata": {"name": self.name}, "spec": self.spec})
    }

    /// kiln's verdict: its own where the case records one, else the API server's.
    pub fn kiln_verdict(&self) -> Verdict {
        self.kiln.unwrap_or(self.api)
    }
}

/// Every case of the corpus, in file order.
pub fn corpus() -> Vec<Case> {
    serde_yaml_ng::from_str(include_str!("../data/policy-corpus.yaml")).expect("the corpus parses")
}
