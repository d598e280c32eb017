//! kiln's ClusterPolicy CRD on a real API server: the API server's side of the policy corpus
//! (`support/policy_corpus.rs`; kiln's side is `chart/crd.rs`).

use std::time::Duration;

use kiln_testcluster::Options;

use crate::support;
use crate::support::policy_corpus::{Verdict, corpus};

const TIMEOUT: Duration = Duration::from_secs(90);

/// The API server (testcluster, kiln's CRD installed) gives each case's recorded verdict on a
/// server-side dry-run create, and names the case's field where it refuses. One small cluster;
/// nothing is stored.
#[tokio::test]
async fn the_api_server_gives_the_recorded_verdicts() -> anyhow::Result<()> {
    use kube::api::{Api, ApiResource, DynamicObject, PostParams};
    let turn = support::cluster::start(Options {
        nodes: 1,
        gpu_nodes: 0,
        ..Options::default()
    })
    .await?;
    let cluster = turn.cluster();
    let client = cluster.client().await?;
    let crd = serde_json::to_value(kiln_operator::crd::crd())?;
    support::cluster::install_crd(cluster, &client, &crd, TIMEOUT).await?;
    let resource = ApiResource {
        group: "nvidia.com".into(),
        version: "v1".into(),
        api_version: "nvidia.com/v1".into(),
        kind: "ClusterPolicy".into(),
        plural: "clusterpolicies".into(),
    };
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut wrong = Vec::new();
    for case in corpus() {
        let obj: DynamicObject = serde_json::from_value(case.object())?;
        match (api.create(&dry_run, &obj).await, case.api) {
            (Ok(_), Verdict::Accept) => {}
            (Err(kube::Error::Api(e)), Verdict::Reject) => {
                let at = case.at.as_deref().unwrap_or_default();
                if !e.message.contains(at) {
                    wrong.push(format!(
                        "{}: refused, but not at {at}: {}",
                        case.name, e.message
                    ));
                }
            }
            (Ok(_), Verdict::Reject) => wrong.push(format!("{}: accepted", case.name)),
            (Err(e), _) => wrong.push(format!("{}: {e}", case.name)),
        }
    }
    cluster.with_logs(if wrong.is_empty() {
        Ok(())
    } else {
        Err(anyhow::anyhow!("{}", wrong.join("\n")))
    })
}
