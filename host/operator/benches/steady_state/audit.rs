//! Attributing API requests to one client from kube-apiserver's audit log.
//!
//! `apiserver_request_total` has labels verb, resource, code, … but none for the user or the
//! user agent, so it cannot tell the operator's requests from the controller-manager's or
//! kwok's. The audit log can: testcluster writes one JSON line per request at its
//! `RequestReceived` stage (`TestCluster::enable_audit_log`), naming `user.username`,
//! `userAgent`, `verb` and `objectRef`. The operator runs with its own ServiceAccount token, so
//! its requests are exactly those of `system:serviceaccount:<ns>:kiln-operator`.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde::Deserialize;

/// Verbs that change state (`get`, `list`, `watch` do not).
pub const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Line {
    stage: String,
    verb: String,
    user: User,
    #[serde(default)]
    user_agent: String,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
}

#[derive(Debug, Deserialize)]
struct User {
    username: String,
}

#[derive(Debug, Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: Option<String>,
}

/// Requests in one window of the audit log.
#[derive(Debug, Default)]
pub struct Tally {
    /// `(username, userAgent)` → verb → count.
    pub by_client: BTreeMap<(String, String), BTreeMap<String, u64>>,
    /// For `user` only: `verb resource[/subresource]` → count.
    pub user_detail: BTreeMap<String, u64>,
}

impl Tally {
    /// Verb → count for `username` (all its user agents).
    pub fn verbs_of(&self, username: &str) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for ((user, _), verbs) in &self.by_client {
            if user == username {
                for (v, n) in verbs {
                    *out.entry(v.clone()).or_default() += n;
                }
            }
        }
        out
    }

    /// Total write requests (see [`WRITE_VERBS`]) of `username`.
    pub fn writes_of(&self, username: &str) -> u64 {
        self.verbs_of(username)
            .iter()
            .filter(|(v, _)| WRITE_VERBS.contains(&v.as_str()))
            .map(|(_, n)| n)
            .sum()
    }
}

/// The audit log's current size in bytes (0 when it does not exist yet): a window starts here.
pub fn offset(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Tally the `RequestReceived` events written between byte offsets `from` and `to`, with
/// per-resource detail for `user`.
///
/// # Errors
/// When the log cannot be read or a line is not an audit event.
pub fn tally(path: &Path, from: u64, to: u64, user: &str) -> anyhow::Result<Tally> {
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::Start(from))?;
    let mut text = String::new();
    f.take(to.saturating_sub(from)).read_to_string(&mut text)?;
    let mut t = Tally::default();
    // A window ends mid-line only if the apiserver was writing at that instant; the cut line
    // is left out.
    for line in text.lines().filter(|l| l.ends_with('}')) {
        let e: Line = serde_json::from_str(line)
            .map_err(|err| anyhow::anyhow!("audit line {line:.200}: {err}"))?;
        if e.stage != "RequestReceived" {
            continue;
        }
        *t.by_client
            .entry((e.user.username.clone(), e.user_agent))
            .or_default()
            .entry(e.verb.clone())
            .or_default() += 1;
        if e.user.username == user {
            let what = e
                .object_ref
                .map_or_else(String::new, |o| match o.subresource {
                    Some(s) => format!("{}/{s}", o.resource),
                    None => o.resource,
                });
            *t.user_detail
                .entry(format!("{} {what}", e.verb))
                .or_default() += 1;
        }
    }
    Ok(t)
}
