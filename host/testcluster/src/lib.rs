//! Test support for kiln: a real Kubernetes control plane for end-to-end tests.
//!
//! [`TestCluster`] drives the `testcluster` binary (built from upstream Go modules by
//! `testcluster/build.sh`): etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler, each in its own process on loopback ports, plus kwok-simulated nodes
//! whose pods become Running and Ready. GPU nodes carry Node Feature Discovery labels
//! (`feature.node.kubernetes.io/pci-10de.present=true`) and `nvidia.com/gpu` capacity.
//!
//! Most test binaries should share one cluster through [`shared`] and isolate tests with
//! [`namespace`]; tests that disrupt the cluster (restarting the apiserver) take
//! [`exclusive`] while the others hold [`shared_access`].
//!
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! let cluster = kiln_testcluster::shared()?;
//! let _guard = kiln_testcluster::shared_access().await;
//! let client = cluster.client().await?;
//! let ns = kiln_testcluster::namespace(&client, "my-test").await?;
//! # let _ = ns; Ok(()) }
//! ```

use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Environment variable naming the `testcluster` binary, overriding the default
/// `<repo>/testcluster/bin/testcluster`.
pub const BIN_ENV: &str = "KILN_TESTCLUSTER_BIN";

/// Environment variable that, when set, keeps the cluster directory (logs, etcd data)
/// after the cluster stops.
pub const KEEP_ENV: &str = "KILN_TESTCLUSTER_KEEP";

/// Label key Node Feature Discovery sets on nodes with an NVIDIA (PCI vendor 10de) device.
pub const NFD_NVIDIA_LABEL: &str = "feature.node.kubernetes.io/pci-10de.present";

/// Default time the helpers wait for a condition.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Size (MiB) at which kube-apiserver would rotate the audit log
/// ([`TestCluster::enable_audit_log`]): far above what a run writes, so it never rotates.
pub const AUDIT_LOG_MAX_MIB: u32 = 64 * 1024;

/// What the audit log leaves out, as `(resource group, resource)`: the control plane's own
/// lease renewals and node status heartbeats ([`TestCluster::enable_audit_log`]).
pub const AUDIT_LEFT_OUT: [(&str, &str); 2] =
    [("coordination.k8s.io", "leases"), ("", "nodes/status")];

/// The audit policy of [`TestCluster::enable_audit_log`]: level `None` for [`AUDIT_LEFT_OUT`]
/// requests by the control plane's identities, `Metadata` for everything else.
pub fn audit_policy() -> serde_json::Value {
    let resources: Vec<serde_json::Value> = AUDIT_LEFT_OUT
        .iter()
        .map(|(group, resource)| serde_json::json!({"group": group, "resources": [resource]}))
        .collect();
    serde_json::json!({
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["ResponseStarted", "ResponseComplete", "Panic"],
        "rules": [
            {"level": "None", "userGroups": ["system:masters", "system:nodes"],
             "resources": resources},
            {"level": "None", "users": ["system:kube-controller-manager",
                "system:kube-scheduler", "system:apiserver"],
             "resources": resources},
            {"level": "Metadata"},
        ],
    })
}

/// How to start a [`TestCluster`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Total number of simulated nodes.
    pub nodes: u32,
    /// How many of those carry an NVIDIA GPU (NFD labels and `nvidia.com/gpu` capacity).
    pub gpu_nodes: u32,
    /// `nvidia.com/gpu` capacity of each GPU node.
    pub gpus_per_node: u32,
    /// Cluster directory; a fresh one under the system temp dir when `None`.
    pub dir: Option<PathBuf>,
    /// How long `testcluster up` waits (`--timeout`), once for the apiserver to be ready and
    /// again for the nodes to be created and Ready. Default [`UP_TIMEOUT`]; a 5,000-node cluster
    /// on 2 cores took 160 s to over 180 s.
    pub up_timeout: Duration,
}

/// The default [`Options::up_timeout`]: 180 s (the Go binary's own default).
pub const UP_TIMEOUT: Duration = Duration::from_secs(180);

impl Default for Options {
    fn default() -> Self {
        Self {
            nodes: 8,
            gpu_nodes: 5,
            gpus_per_node: 1,
            dir: None,
            up_timeout: UP_TIMEOUT,
        }
    }
}

/// A running test cluster. Dropping it stops every component (`testcluster down`) and
/// removes its directory unless `KILN_TESTCLUSTER_KEEP` is set.
#[derive(Debug)]
pub struct TestCluster {
    bin: PathBuf,
    dir: PathBuf,
    options: Options,
}

/// Path of the `testcluster` binary: `$KILN_TESTCLUSTER_BIN`, else
/// `<repo>/testcluster/bin/testcluster`.
pub fn binary_path() -> PathBuf {
    if let Some(p) = std::env::var_os(BIN_ENV) {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testcluster/bin/testcluster")
}

fn unique_dir() -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "kiln-testcluster-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

impl TestCluster {
    /// Starts a cluster and waits until the apiserver is ready and every node is Ready.
    ///
    /// Blocks the calling thread (start-up takes a few seconds; minutes at thousands of nodes,
    /// see [`Options::up_timeout`]). Fails with a message
    /// naming `testcluster/build.sh` when the binary has not been built, and with the
    /// component logs' tails when start-up fails.
    pub fn start(options: Options) -> anyhow::Result<Self> {
        let bin = binary_path();
        if !bin.is_file() {
            bail!(
                "testcluster binary not found at {}: build it with `testcluster/build.sh` \
                 (or point ${BIN_ENV} at one)",
                bin.display()
            );
        }
        let bin = bin.canonicalize().unwrap_or(bin);
        let dir = options.dir.clone().unwrap_or_else(unique_dir);
        let cluster = Self { bin, dir, options };
        let started = Instant::now();
        let out = Command::new(&cluster.bin)
            .arg("up")
            .arg("--dir")
            .arg(&cluster.dir)
            .arg(format!("--nodes={}", cluster.options.nodes))
            .arg(format!("--gpu-nodes={}", cluster.options.gpu_nodes))
            .arg(format!("--gpus-per-node={}", cluster.options.gpus_per_node))
            .arg(format!(
                "--timeout={}s",
                cluster.options.up_timeout.as_secs()
            ))
            // The cluster goes away with this process even if Drop never runs
            // (a panic in a static initializer, a killed test binary).
            .arg(format!("--watch-pid={}", std::process::id()))
            .output()
            .with_context(|| format!("running {} up", cluster.bin.display()))?;
        if !out.status.success() {
            // `up` already stopped what it started and printed the logs' tails.
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = err.lines().rev().take(200).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "testcluster up failed ({}):\n{}",
                out.status,
                tail.join("\n")
            );
        }
        eprintln!(
            "kiln-testcluster: cluster up in {:.1}s, KUBECONFIG={}",
            started.elapsed().as_secs_f64(),
            cluster.kubeconfig_path().display()
        );
        Ok(cluster)
    }

    /// The cluster directory (kubeconfig, logs/, pids/, etcd data).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The options the cluster was started with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Path of the admin kubeconfig (`DIR/kubeconfig`).
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// A new admin client. Make one per test (per Tokio runtime): a client's connection
    /// pool belongs to the runtime that created it.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig_path())?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<()> {
        let (cmd, rest) = args.split_first().expect("a subcommand");
        let out = Command::new(&self.bin)
            .arg(cmd)
            .arg("--dir")
            .arg(&self.dir)
            .args(rest)
            .output()
            .with_context(|| format!("running testcluster {cmd}"))?;
        if !out.status.success() {
            bail!(
                "testcluster {} failed ({}):\n{}\n{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr),
                self.log_tails(40)
            );
        }
        Ok(())
    }

    /// Adds a simulated node and waits until it is Ready. With `gpus > 0` it is a GPU
    /// node (NFD labels, `nvidia.com/gpu: gpus`).
    pub fn add_node(&self, name: &str, gpus: u32) -> anyhow::Result<()> {
        if gpus > 0 {
            self.run(&["add-node", "--gpu", &format!("--gpus={gpus}"), name])
        } else {
            self.run(&["add-node", name])
        }
    }

    /// Deletes a node.
    pub fn delete_node(&self, name: &str) -> anyhow::Result<()> {
        self.run(&["delete-node", name])
    }

    /// Sets labels on a node: `("key", Some("value"))` sets, `("key", None)` removes.
    pub fn label_node(&self, name: &str, labels: &[(&str, Option<&str>)]) -> anyhow::Result<()> {
        let mut args = vec!["label-node".to_string(), name.to_string()];
        for (k, v) in labels {
            args.push(match v {
                Some(v) => format!("{k}={v}"),
                None => format!("{k}-"),
            });
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run(&refs)
    }

    /// Kills kube-apiserver and starts it again on the same port and etcd data, waiting
    /// for `/readyz`. Clients made before should be replaced by new ones.
    pub fn restart_apiserver(&self) -> anyhow::Result<()> {
        self.run(&["restart-apiserver"])
    }

    /// The last `lines` lines of each component's log, for failure messages: first
    /// `logs/operator.log` when a test wrote one there (what the operator it runs in-process
    /// logged), then the control plane's (etcd without its per-request timing warnings).
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for c in [
            "operator",
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
            "reaper",
        ] {
            let path = self.dir.join("logs").join(format!("{c}.log"));
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            // etcd's per-request timing warnings crowd out everything else.
            let all: Vec<&str> = text
                .lines()
                .filter(|l| !l.contains("\"msg\":\"request stats\""))
                .collect();
            let from = all.len().saturating_sub(lines);
            let _ = writeln!(
                out,
                "----- {c} (last {} lines of {}) -----",
                all.len() - from,
                path.display()
            );
            for l in &all[from..] {
                let _ = writeln!(out, "{l}");
            }
        }
        out
    }

    /// Polls `check` every 500 ms until it returns `Ok(Some(value))`, for at most
    /// `timeout`. On timeout the error names `what`, the last observation (`Ok(None)`
    /// results are reported through `describe`, errors as they are) and the component
    /// logs' tails.
    pub async fn wait_for<T, F, Fut>(
        &self,
        what: impl Into<String>,
        timeout: Duration,
        mut check: F,
    ) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<Result<T, String>>>,
    {
        let what = what.into();
        let deadline = Instant::now() + timeout;
        loop {
            let last = match check().await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(state)) => state,
                Err(e) => format!("error: {e:#}"),
            };
            if Instant::now() >= deadline {
                return Err(anyhow!(
                    "timed out after {timeout:?} waiting for {what}; last seen: {last}\n{}",
                    self.log_tails(40)
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Passes `result` through, adding the component logs' tails to an error, so a
    /// failing test shows what the control plane was doing.
    pub fn with_logs<T>(&self, result: anyhow::Result<T>) -> anyhow::Result<T> {
        result.map_err(|e| {
            let text = format!("{e:?}");
            if text.contains("----- kube-apiserver (last") {
                e // already carries them (from wait_for or a subcommand)
            } else {
                anyhow!("{text}\n{}", self.log_tails(40))
            }
        })
    }

    /// Writes `DIR/sa-<namespace>-<name>.kubeconfig`: the admin kubeconfig's cluster (server,
    /// CA data) with a bearer token of ServiceAccount `namespace/name` from the TokenRequest
    /// API (valid `ttl`, at least 10 minutes), and returns its path. A client built from it
    /// has exactly the RBAC rights granted to that ServiceAccount, and the apiserver (audit
    /// log, `user.username`) sees it as `system:serviceaccount:<namespace>:<name>`.
    ///
    /// # Errors
    /// When the ServiceAccount does not exist, the TokenRequest is refused, or the file cannot
    /// be written.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        ttl: Duration,
    ) -> anyhow::Result<PathBuf> {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        use k8s_openapi::api::core::v1::ServiceAccount;
        let client = self.client().await?;
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(i64::try_from(ttl.as_secs().max(600))?),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let token = Api::<ServiceAccount>::namespaced(client, namespace)
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .with_context(|| format!("TokenRequest for ServiceAccount {namespace}/{name}"))?
            .status
            .map(|s| s.token)
            .ok_or_else(|| anyhow!("TokenRequest for {namespace}/{name} returned no token"))?;
        let admin = Kubeconfig::read_from(self.kubeconfig_path())?;
        let user = format!("system:serviceaccount:{namespace}:{name}");
        let mut config = serde_json::to_value(&admin)?;
        config["users"] = serde_json::json!([{"name": user, "user": {"token": token}}]);
        if let Some(contexts) = config["contexts"].as_array_mut() {
            for c in contexts {
                c["context"]["user"] = serde_json::Value::String(user.clone());
            }
        }
        let path = self.dir.join(format!("sa-{namespace}-{name}.kubeconfig"));
        // JSON is YAML: kubectl, helm and `Kubeconfig::read_from` all read it.
        std::fs::write(&path, serde_json::to_vec_pretty(&config)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// A client authenticated as ServiceAccount `namespace/name` (see
    /// [`TestCluster::service_account_kubeconfig`]; the token is valid for an hour).
    pub async fn service_account_client(
        &self,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<kube::Client> {
        let path = self
            .service_account_kubeconfig(namespace, name, Duration::from_secs(3600))
            .await?;
        let kubeconfig = Kubeconfig::read_from(&path)?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Turns on kube-apiserver's audit log and returns its path (`DIR/audit.log`): one JSON
    /// line per request, at its `RequestReceived` stage, level `Metadata` (verb, `user`,
    /// `userAgent`, `objectRef`, `requestReceivedTimestamp`; no bodies). This is how tests and
    /// benchmarks attribute requests to one client: `apiserver_request_total` carries no user
    /// or user-agent label.
    ///
    /// The log is never rotated during a run ([`AUDIT_LOG_MAX_MIB`]; the apiserver's default
    /// rotates at 100 MiB, and counts over a window that spans a rotation go wrong), and it is
    /// kept small: requests of the control plane's own identities (`system:masters` group:
    /// kwok's node heartbeats and leases; `system:kube-*` users; node identities) on Leases and
    /// on `nodes/status` are left out ([`AUDIT_LEFT_OUT`]) — at thousands of simulated nodes they
    /// are nearly all the traffic, and no client under test makes them as those users.
    ///
    /// Adds `--audit-policy-file`, `--audit-log-path`, `--audit-log-format=json` and
    /// `--audit-log-maxsize` to the apiserver's recorded arguments
    /// (`DIR/args/kube-apiserver.json`, which `restart-apiserver` starts it with) and restarts
    /// it, so clients made before should be replaced. Calling it again only returns the path.
    pub fn enable_audit_log(&self) -> anyhow::Result<PathBuf> {
        let log = self.dir.join("audit.log");
        let policy = self.dir.join("audit-policy.json");
        let args_path = self.dir.join("args").join("kube-apiserver.json");
        let mut args: Vec<String> = serde_json::from_slice(
            &std::fs::read(&args_path).with_context(|| format!("{}", args_path.display()))?,
        )
        .with_context(|| format!("{}: not a JSON list of strings", args_path.display()))?;
        if args.iter().any(|a| a.starts_with("--audit-log-path=")) {
            return Ok(log);
        }
        std::fs::write(&policy, serde_json::to_vec_pretty(&audit_policy())?)?;
        args.push(format!("--audit-policy-file={}", policy.display()));
        args.push(format!("--audit-log-path={}", log.display()));
        args.push("--audit-log-format=json".into());
        args.push(format!("--audit-log-maxsize={AUDIT_LOG_MAX_MIB}"));
        args.push("--audit-log-maxbackup=1".into());
        std::fs::write(&args_path, serde_json::to_vec(&args)?)?;
        self.restart_apiserver()?;
        Ok(log)
    }

    /// Stops every component now (also done on drop).
    pub fn stop(&self) -> anyhow::Result<()> {
        self.run(&["down"])
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = Command::new(&self.bin)
            .arg("down")
            .arg("--dir")
            .arg(&self.dir)
            .output();
        if std::env::var_os(KEEP_ENV).is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

static SHARED: OnceLock<Result<TestCluster, String>> = OnceLock::new();
static DISRUPTION: RwLock<()> = RwLock::const_new(());

/// The cluster shared by every test of this test binary, started on first use with
/// [`Options::default`] (8 nodes, 5 with one GPU). It is stopped, and its directory
/// removed, when the test binary exits.
///
/// The first call also installs a panic hook that prints the component logs' tails
/// when a test panics (a failed assertion), after the default panic message.
pub fn shared() -> anyhow::Result<&'static TestCluster> {
    SHARED
        .get_or_init(|| {
            let cluster = TestCluster::start(Options::default()).map_err(|e| format!("{e:#}"))?;
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                previous(info);
                if let Some(Ok(cluster)) = SHARED.get() {
                    eprintln!("{}", cluster.log_tails(40));
                }
            }));
            Ok(cluster)
        })
        .as_ref()
        .map_err(|e| anyhow!("the shared test cluster did not start: {e}"))
}

/// Held by tests that only read and write objects: many may hold it at once.
pub async fn shared_access() -> RwLockReadGuard<'static, ()> {
    DISRUPTION.read().await
}

/// Held by a test that disrupts the shared cluster (restarting the apiserver): waits
/// until no other test holds [`shared_access`] or [`exclusive`].
pub async fn exclusive() -> RwLockWriteGuard<'static, ()> {
    DISRUPTION.write().await
}

/// Creates a namespace named `<prefix>-<unique suffix>` for one test and returns its
/// name.
pub async fn namespace(client: &kube::Client, prefix: &str) -> anyhow::Result<String> {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!(
        "{prefix}-{}-{:x}",
        N.fetch_add(1, Ordering::Relaxed),
        nanos % 0xfffff
    );
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": { "name": name, "labels": { "kiln.dev/test": prefix } }
    }))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(name)
}
