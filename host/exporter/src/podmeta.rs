//! Pod UIDs and pod labels from the API server, for `--kubernetes-enable-pod-uid` and
//! `--kubernetes-enable-pod-labels` (dcgm-exporter's flags, set by the ClusterPolicy's
//! `dcgmExporter.enablePodUID` / `enablePodLabels` / `podLabelAllowlistRegex`).
//!
//! One kube watcher on the pods of this node (`spec.nodeName=<node>`) keeps a map
//! `(namespace, name)` → [`PodMeta`] and publishes it to [`Shared`] whenever it changes, so a
//! scrape never calls the API server. dcgm-exporter's rule, kept here:
//! - a label is kept when its name matches any allowlist pattern (unanchored), or always when
//!   the allowlist is empty;
//! - its name is sanitised to `[a-zA-Z0-9_]` (every other character becomes `_`).

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, watcher},
};
use regex::Regex;
use tokio_stream::StreamExt as _;

use crate::{
    attribution::{PodMeta, PodMetas},
    state::Shared,
};

/// Which pod metadata to attach.
#[derive(Debug, Clone, Default)]
pub struct PodMetaOptions {
    /// Attach `pod_uid`.
    pub uid: bool,
    /// Attach the pod's labels.
    pub labels: bool,
    /// Label-name patterns; empty keeps every label.
    pub allowlist: Vec<Regex>,
}

impl PodMetaOptions {
    /// Compiles the allowlist patterns (empty strings are ignored, as a trailing comma).
    ///
    /// # Errors
    /// The first pattern that is not a valid regular expression, with the regex error.
    pub fn new(
        uid: bool,
        labels: bool,
        patterns: &[String],
    ) -> Result<Self, (String, regex::Error)> {
        let allowlist = patterns
            .iter()
            .map(|p| p.trim())
            .filter(|p| !p.is_empty())
            .map(|p| Regex::new(p).map_err(|e| (p.to_owned(), e)))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            uid,
            labels,
            allowlist,
        })
    }

    /// Whether anything is attached (the watcher runs only then).
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.uid || self.labels
    }

    fn keeps(&self, name: &str) -> bool {
        self.allowlist.is_empty() || self.allowlist.iter().any(|r| r.is_match(name))
    }
}

/// `name` with every character outside `[a-zA-Z0-9_]` replaced by `_` (dcgm-exporter's rule
/// for pod label names).
#[must_use]
pub fn sanitize_label_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// What `opts` attaches for `pod` (pure).
#[must_use]
pub fn pod_meta(pod: &Pod, opts: &PodMetaOptions) -> PodMeta {
    let uid = opts.uid.then(|| pod.metadata.uid.clone()).flatten();
    let mut labels: Vec<(String, String)> = if opts.labels {
        pod.metadata
            .labels
            .iter()
            .flatten()
            .filter(|(k, _)| opts.keeps(k))
            .map(|(k, v)| (sanitize_label_name(k), v.clone()))
            .collect()
    } else {
        Vec::new()
    };
    labels.sort();
    // Two names that sanitise alike (`a.b`, `a-b`): the first in name order is kept.
    labels.dedup_by(|a, b| a.0 == b.0);
    PodMeta { uid, labels }
}

fn key(pod: &Pod) -> Option<(String, String)> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

/// Watches the pods of `node` and publishes their [`PodMeta`] to `shared` after the initial
/// list and on every change; watch errors are logged and retried with kube's default backoff.
/// Runs until the task is aborted.
pub async fn watch_forever(
    client: Client,
    node: String,
    opts: PodMetaOptions,
    shared: Arc<Shared>,
) {
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = std::pin::pin!(watcher(api, cfg).default_backoff());
    let mut pods: PodMetas = BTreeMap::new();
    let mut initial: PodMetas = BTreeMap::new();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Init) => {
                initial.clear();
                continue;
            }
            Ok(watcher::Event::InitApply(p)) => {
                if let Some(k) = key(&p) {
                    initial.insert(k, pod_meta(&p, &opts));
                }
                continue;
            }
            Ok(watcher::Event::InitDone) => pods = std::mem::take(&mut initial),
            Ok(watcher::Event::Apply(p)) => {
                if let Some(k) = key(&p) {
                    let m = pod_meta(&p, &opts);
                    if pods.get(&k) == Some(&m) {
                        continue;
                    }
                    pods.insert(k, m);
                }
            }
            Ok(watcher::Event::Delete(p)) => {
                if key(&p).and_then(|k| pods.remove(&k)).is_none() {
                    continue;
                }
            }
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "watching the pods of node {node}");
                continue;
            }
        }
        shared.set_pod_meta(pods.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(labels: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("p".into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some("0b7c-uid".into());
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        p
    }

    #[test]
    fn labels_are_filtered_by_the_allowlist_and_sanitised() {
        let p = pod(&[
            ("app.kubernetes.io/name", "trainer"),
            ("team", "ml"),
            ("pod-template-hash", "abc"),
        ]);
        let all = PodMetaOptions::new(true, true, &[]).unwrap();
        let m = pod_meta(&p, &all);
        assert_eq!(m.uid.as_deref(), Some("0b7c-uid"));
        assert_eq!(
            m.labels,
            [
                ("app_kubernetes_io_name".to_owned(), "trainer".to_owned()),
                ("pod_template_hash".to_owned(), "abc".to_owned()),
                ("team".to_owned(), "ml".to_owned()),
            ]
        );
        let some =
            PodMetaOptions::new(false, true, &["^app\\.".into(), "".into(), "^team$".into()])
                .unwrap();
        let m = pod_meta(&p, &some);
        assert_eq!(m.uid, None);
        assert_eq!(
            m.labels.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["app_kubernetes_io_name", "team"]
        );
        let uid_only = PodMetaOptions::new(true, false, &["x".into()]).unwrap();
        assert!(pod_meta(&p, &uid_only).labels.is_empty());
        assert!(!PodMetaOptions::default().enabled());
    }

    #[test]
    fn a_bad_pattern_is_named() {
        let (pattern, _) = PodMetaOptions::new(false, true, &["(".into()]).unwrap_err();
        assert_eq!(pattern, "(");
    }
}
