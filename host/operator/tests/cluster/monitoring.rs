//! The monitoring contract against a live operator (in-process, on `kiln-testcluster`), after a
//! reconcile of the sample policy with `psa.enabled`:
//! - `/metrics` says it writes OpenMetrics and does (`# EOF`); a request head over 16 KiB is
//!   answered 431 (the operator serves with `kiln_httpd`);
//! - every series named by every expression of every shipped PrometheusRule (the operator's
//!   OpenShift rule in `assets/state-operator-metrics`, the chart's `kiln-operator`) and of the
//!   operator's Grafana dashboard exists in the scrape (selectors read with `promql-parser`);
//! - NVIDIA's `gpu_operator_*` series carry kiln's values (status 1, GPU node count);
//! - the readiness timeline: a GPU node added after the start is measured at every stage and
//!   gets one `GPUNodeReady` Event; the GPU gauges show a node whose GFD count label says more
//!   GPUs than it has allocatable;
//! - the operator namespace is labelled for Pod Security Admission.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::events::v1::Event;
use kiln_core::spec::ClusterPolicy;
use kiln_testcluster::{Options, TestCluster};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use promql_parser::parser::{self, Expr};
use promql_parser::util::{ExprVisitor, walk_expr};
use serde::Deserialize as _;
use serde_json::{Value, json};

use crate::support::cluster::{install_crd, policy_crd, start_operator, wait_state};
use crate::support::fixtures::sample_policy;
use crate::support::helm::helm_command;
use crate::support::repo;

const NS: &str = "gpu-operator";
const TIMEOUT: Duration = Duration::from_secs(150);

/// Metric names of every vector and matrix selector of a PromQL expression.
fn selector_names(expr: &str) -> Result<BTreeSet<String>, String> {
    struct Names(BTreeSet<String>);
    impl ExprVisitor for Names {
        type Error = String;
        fn pre_visit(&mut self, e: &Expr) -> Result<bool, String> {
            let vs = match e {
                Expr::VectorSelector(vs) => Some(vs),
                Expr::MatrixSelector(ms) => Some(&ms.vs),
                _ => None,
            };
            if let Some(vs) = vs {
                let name = vs.name.clone().ok_or("a selector without a metric name")?;
                self.0.insert(name);
            }
            Ok(true)
        }
    }
    let ast = parser::parse(expr)?;
    let mut names = Names(BTreeSet::new());
    walk_expr(&mut names, &ast)?;
    Ok(names.0)
}

/// `(alert, expr)` of every rule of a PrometheusRule object.
fn rule_exprs(rule: &Value) -> Vec<(String, String)> {
    rule["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .map(|r| {
            let name = r["alert"].as_str().or(r["record"].as_str()).unwrap_or("");
            (
                name.to_string(),
                r["expr"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// The PrometheusRules kiln ships: the operator's (OpenShift asset) and the chart's.
fn shipped_rules() -> anyhow::Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    for asset in kiln_render::assets::load_state(kiln_core::State::OperatorMetrics, true)? {
        if asset.object["kind"] == "PrometheusRule" {
            out.push(("assets/state-operator-metrics".into(), asset.object.clone()));
        }
    }
    let home = tempfile::tempdir()?;
    let rendered = helm_command(
        None,
        home.path(),
        &[
            "template",
            "kiln",
            "deploy/helm/kiln",
            "--namespace",
            NS,
            "--api-versions",
            "monitoring.coreos.com/v1/PrometheusRule",
        ],
    )?
    .output()?;
    anyhow::ensure!(
        rendered.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    for doc in serde_yaml_ng::Deserializer::from_str(std::str::from_utf8(&rendered.stdout)?) {
        if let Some(obj) = Option::<Value>::deserialize(doc)?
            && obj["kind"] == "PrometheusRule"
        {
            out.push(("deploy/helm/kiln".into(), obj));
        }
    }
    Ok(out)
}

/// Every target expression of the operator dashboard, with Grafana's `$__range` made a duration.
fn dashboard_exprs() -> anyhow::Result<Vec<(String, String)>> {
    let path = repo().join("deploy/grafana/kiln-operator-dashboard.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut out = Vec::new();
    for p in d["panels"].as_array().into_iter().flatten() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or("").replace("$__range", "1h");
            out.push((p["title"].as_str().unwrap_or("").to_string(), expr));
        }
    }
    Ok(out)
}

/// `GET /metrics` over plain HTTP/1.0: (Content-Type, body).
async fn scrape(addr: &str) -> anyhow::Result<(String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        b"GET /metrics HTTP/1.0\r\nHost: kiln\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\r\n",
    )
    .await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    anyhow::ensure!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    let ctype = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    Ok((ctype, body.to_string()))
}

/// Sample names of an exposition (a sample line's first token, up to `{` or a space) and the
/// families it declares (`# TYPE <name> …`): a family served with no series at the moment, such
/// as `kiln_node_stuck` while no node is stuck, is served all the same.
fn sample_names(text: &str) -> BTreeSet<String> {
    let declared = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next());
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .chain(declared)
        .map(str::to_string)
        .collect()
}

/// The value of the sample line that starts with `series` (name and labels as written).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.split(' ').next()?.parse().ok())
}

#[test]
fn shipped_rules_and_dashboard_parse() -> anyhow::Result<()> {
    if !repo().join("testcluster/bin/helm").exists() {
        eprintln!("testcluster/bin/helm not built; skipping");
        return Ok(());
    }
    let rules = shipped_rules()?;
    assert_eq!(rules.len(), 2, "the OpenShift asset and the chart's rule");
    let mut alerts = Vec::new();
    for (from, rule) in &rules {
        for (alert, expr) in rule_exprs(rule) {
            let names =
                selector_names(&expr).map_err(|e| anyhow::anyhow!("{from} {alert}: {e}"))?;
            assert!(!names.is_empty(), "{from} {alert}: {expr}");
            alerts.push(alert);
        }
    }
    assert!(
        alerts.iter().any(|a| a == "GPUAllocatableBelowHardware"),
        "{alerts:?}"
    );
    for (panel, expr) in dashboard_exprs()? {
        selector_names(&expr).map_err(|e| anyhow::anyhow!("dashboard {panel}: {e}"))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitoring_contract_against_a_live_operator() -> anyhow::Result<()> {
    let turn = crate::support::cluster::start(Options::default()).await?;
    let cluster = turn.cluster();
    cluster.with_logs(scenario(cluster).await)
}

async fn scenario(cluster: &TestCluster) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    install_crd(cluster, &client, &policy_crd()?, TIMEOUT).await?;
    let nss: Api<Namespace> = Api::all(client.clone());
    if nss.get_opt(NS).await?.is_none() {
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
        )
        .await?;
    }
    // GFD would say: gpu-node-1 has 2 GPUs (1 allocatable), gpu-node-2 has 1.
    cluster.label_node("gpu-node-1", &[("nvidia.com/gpu.count", Some("2"))])?;
    cluster.label_node("gpu-node-2", &[("nvidia.com/gpu.count", Some("1"))])?;

    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let config = kiln_operator::Config {
        namespace: NS.into(),
        metrics_addr: addr.clone(),
        metrics_auth: kiln_operator::metrics::MetricsAuth::None,
        ..kiln_operator::Config::default()
    };
    let (operator, _) = start_operator(client.clone(), Default::default(), config)?;

    let mut doc = sample_policy();
    doc["metadata"] = json!({"name": "cluster-policy"});
    doc["spec"]["psa"] = json!({"enabled": true});
    Api::<DynamicObject>::all_with(client.clone(), &ApiResource::erase::<ClusterPolicy>(&()))
        .create(&PostParams::default(), &serde_json::from_value(doc)?)
        .await?;
    let policies: Api<ClusterPolicy> = Api::all(client.clone());
    wait_state(cluster, &policies, "cluster-policy", "ready", TIMEOUT).await?;

    // A node joining now is measured at every stage and announced once.
    cluster.add_node("gpu-node-9", 1)?;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let ready_events = || async {
        let list = events.list(&ListParams::default()).await?;
        anyhow::Ok(
            list.items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(kiln_operator::timeline::READY_REASON))
                .filter(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("gpu-node-9")
                })
                .collect::<Vec<_>>(),
        )
    };
    let note = cluster
        .wait_for("GPUNodeReady event for gpu-node-9", TIMEOUT, || async {
            let evs = ready_events().await?;
            Ok(match evs.first() {
                Some(e) => Ok(e.note.clone().unwrap_or_default()),
                None => Err("no event yet".to_string()),
            })
        })
        .await?;
    assert!(
        note.starts_with("node gpu-node-9 is ready for GPU workloads")
            && note.contains("validated"),
        "{note}"
    );

    // The new node's operands settle; the verdict that wrote `ready` set the status gauge.
    // The policy was ready before the node joined, so wait for a reconcile that counted it
    // too (the GPUNodeReady event above comes from the node's own timeline, which can run
    // before that reconcile).
    cluster
        .wait_for("ClusterPolicy ready with gpu-node-9", TIMEOUT, || async {
            let p = policies.get("cluster-policy").await?;
            let state = serde_json::to_value(p.status.unwrap_or_default().state)?;
            let (_, text) = scrape(&addr).await?;
            let status = sample(&text, "gpu_operator_reconciliation_status");
            let nodes = sample(&text, "gpu_operator_gpu_nodes_total");
            Ok(
                if state == "ready" && status == Some(1.0) && nodes == Some(6.0) {
                    Ok(())
                } else {
                    Err(format!("{state}, gauge {status:?}, GPU nodes {nodes:?}"))
                },
            )
        })
        .await?;
    let (ctype, text) = scrape(&addr).await?;
    assert_eq!(ctype, kiln_operator::metrics::OPENMETRICS_CONTENT_TYPE);
    assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
    // The operator serves with kiln_httpd's limits: a head over 16 KiB is answered 431.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&addr).await?;
        let head = format!(
            "GET /healthz HTTP/1.1\r\nHost: kiln\r\nX-Pad: {}\r\nConnection: close\r\n\r\n",
            "p".repeat(17 * 1024)
        );
        let _ = s.write_all(head.as_bytes()).await;
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    }
    let names = sample_names(&text);

    // Every series a shipped rule or the dashboard names exists.
    let mut checked = 0;
    let mut missing = Vec::new();
    let mut exprs: Vec<(String, String)> = Vec::new();
    for (from, rule) in shipped_rules()? {
        for (alert, expr) in rule_exprs(&rule) {
            exprs.push((format!("{from} {alert}"), expr));
        }
    }
    for (panel, expr) in dashboard_exprs()? {
        exprs.push((format!("dashboard {panel}"), expr));
    }
    for (what, expr) in &exprs {
        for name in selector_names(expr).map_err(|e| anyhow::anyhow!("{what}: {e}"))? {
            checked += 1;
            if !names.contains(&name) {
                missing.push(format!("{what}: {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "series not in the scrape: {missing:?}\n{text}"
    );
    assert!(checked >= 15, "only {checked} selectors checked");

    // NVIDIA's series with kiln's values.
    assert_eq!(
        sample(&text, "gpu_operator_reconciliation_status"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "gpu_operator_gpu_nodes_total"),
        Some(6.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "gpu_operator_reconciliation_has_nfd_labels"),
        Some(1.0)
    );
    assert!(sample(&text, "gpu_operator_reconciliation_total").unwrap_or(0.0) >= 1.0);
    assert!(
        sample(&text, "gpu_operator_reconciliation_last_success_ts_seconds").unwrap_or(0.0) > 1.7e9
    );
    // The timeline: gpu-node-9 reached every stage after the operator started.
    for stage in kiln_operator::timeline::Stage::ALL {
        let count = sample(
            &text,
            &format!(
                "kiln_node_ready_seconds_count{{stage=\"{}\"}}",
                stage.name()
            ),
        );
        assert!(
            count.unwrap_or(0.0) >= 1.0,
            "{}: {count:?}\n{text}",
            stage.name()
        );
    }
    // Allocatable below hardware on gpu-node-1 only.
    assert_eq!(
        sample(&text, "kiln_node_gpus_expected{node=\"gpu-node-1\"}"),
        Some(2.0)
    );
    assert_eq!(
        sample(&text, "kiln_node_gpus_allocatable{node=\"gpu-node-1\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "kiln_node_gpus_expected{node=\"gpu-node-2\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "kiln_node_gpus_allocatable{node=\"gpu-node-2\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "kiln_node_gpus_expected{node=\"gpu-node-3\"}"),
        None
    );
    // One Event, however often the node changes afterwards.
    cluster.label_node("gpu-node-9", &[("kiln.dev/poke", Some("1"))])?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(ready_events().await?.len(), 1);

    // psa.enabled: the operator namespace is labelled privileged for every mode.
    let labels = nss.get(NS).await?.metadata.labels.unwrap_or_default();
    for mode in kiln_operator::psa::MODES {
        assert_eq!(
            labels
                .get(&format!("pod-security.kubernetes.io/{mode}"))
                .map(String::as_str),
            Some("privileged"),
            "{labels:?}"
        );
    }
    operator.abort();
    Ok(())
}
