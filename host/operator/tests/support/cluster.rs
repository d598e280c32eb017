//! Control planes for the cluster tests, one at a time: each test starts its own
//! `kiln-testcluster` ([`start`]) and holds it for its whole run, so no test sees another's
//! CRDs, policies or node labels; the next test's cluster starts once the previous one is
//! stopped (the 2-core CI runs one control plane at a time, as it did when each cluster test
//! was its own binary). Also the helpers the cluster tests share: the CRD installed and
//! Established, the operator started in-process, a ClusterPolicy's state.

use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kiln_core::spec::ClusterPolicy;
use kiln_testcluster::{Options, TestCluster};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::Value;
use tokio::sync::{Semaphore, SemaphorePermit};

/// How many control planes this test binary runs at once.
static TURNS: Semaphore = Semaphore::const_new(1);

/// The cluster of the test running now, for the panic hook.
static CURRENT: Mutex<Option<&'static TestCluster>> = Mutex::new(None);

/// One test's control plane: started by [`start`], stopped (and its directory removed unless
/// `KILN_TESTCLUSTER_KEEP` is set) when this is dropped, which lets the next test's start.
pub struct Turn {
    cluster: &'static TestCluster,
    _permit: SemaphorePermit<'static>,
}

impl Turn {
    /// The cluster, for as long as the test runs (`'static` so spawned tasks can hold it; it
    /// is stopped when the [`Turn`] drops).
    pub fn cluster(&self) -> &'static TestCluster {
        self.cluster
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = None;
        operator_log::close();
        let _ = self.cluster.stop();
        if std::env::var_os("KILN_TESTCLUSTER_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(self.cluster.dir());
        }
    }
}

/// Waits for this binary's turn, then starts a cluster with `options` (blocking the thread
/// while it comes up). The first call installs a panic hook that prints the running
/// cluster's component logs after a failed assertion's message.
pub async fn start(options: Options) -> anyhow::Result<Turn> {
    let permit = TURNS.acquire().await?;
    operator_log::install();
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            if let Some(cluster) = *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) {
                eprintln!("{}", cluster.log_tails(40));
            }
        }));
    });
    // Leaked (a few hundred bytes a test) so that tasks a test spawns may borrow it; the
    // processes and directory go when the `Turn` drops.
    let cluster: &'static TestCluster = Box::leak(Box::new(TestCluster::start(options)?));
    *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = Some(cluster);
    operator_log::to(&cluster.dir().join("logs").join("operator.log"));
    Ok(Turn {
        cluster,
        _permit: permit,
    })
}

/// Applies `crd` (server-side, manager `kiln-test`) and waits until it is Established.
pub async fn install_crd(
    cluster: &TestCluster,
    client: &Client,
    crd: &Value,
    timeout: Duration,
) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd["metadata"]["name"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("the CRD has no metadata.name"))?
        .to_string();
    crds.patch(
        &name,
        &PatchParams::apply("kiln-test").force(),
        &Patch::Apply(crd),
    )
    .await?;
    cluster
        .wait_for(format!("CRD {name} established"), timeout, || {
            let crds = crds.clone();
            let name = name.clone();
            async move {
                let c = crds.get(&name).await?;
                let ok = c
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok(if ok {
                    Ok(())
                } else {
                    Err("not established".into())
                })
            }
        })
        .await
}

/// kiln's ClusterPolicy CRD ([`kiln_operator::crd::crd`]) as JSON.
pub fn policy_crd() -> anyhow::Result<Value> {
    Ok(serde_json::to_value(kiln_operator::crd::crd())?)
}

/// Starts kiln's operator in this process with `config` and a plugin host over the bundled
/// plugins built with `host` (the operator's resident-bytes setting applied); returns its task
/// and the plugin host (to look at which plugins it keeps loaded).
pub fn start_operator(
    client: Client,
    host: kiln_plugin_host::HostConfig,
    config: kiln_operator::Config,
) -> anyhow::Result<(
    tokio::task::JoinHandle<()>,
    Arc<kiln_plugin_host::PluginHost>,
)> {
    let host = Arc::new(kiln_plugin_host::PluginHost::new(
        kiln_plugin_host::HostConfig {
            keep_resident_bytes: kiln_operator::PLUGIN_KEEP_RESIDENT_BYTES,
            ..host
        },
        kiln_bundled_plugins::BUNDLED,
    )?);
    let renderer = kiln_render::Renderer::new(host.clone());
    let task = tokio::spawn(async move {
        if let Err(e) = kiln_operator::run(client, renderer, config).await {
            eprintln!("operator stopped: {e}");
        }
    });
    Ok((task, host))
}

/// The policy's `status.state` and its conditions on one line
/// (`type=status reason: message | …`).
pub async fn policy_state(
    api: &Api<ClusterPolicy>,
    name: &str,
) -> anyhow::Result<(String, String)> {
    let p = api.get(name).await?;
    let s = p.status.unwrap_or_default();
    let state = serde_json::to_value(s.state)?
        .as_str()
        .unwrap_or_default()
        .to_string();
    let msg = s
        .conditions
        .iter()
        .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
        .collect::<Vec<_>>()
        .join(" | ");
    Ok((state, msg))
}

/// Waits until the policy's state is `want`; returns its conditions' line.
pub async fn wait_state(
    cluster: &TestCluster,
    api: &Api<ClusterPolicy>,
    name: &str,
    want: &str,
    timeout: Duration,
) -> anyhow::Result<String> {
    cluster
        .wait_for(format!("ClusterPolicy {name} {want}"), timeout, || async {
            let (state, msg) = policy_state(api, name).await?;
            Ok(if state == want {
                Ok(msg)
            } else {
                Err(format!("{state}: {msg}"))
            })
        })
        .await
}

/// What the operators a cluster test runs in this process log, written to the running
/// cluster's `logs/operator.log`, which the cluster's log tails
/// ([`TestCluster::log_tails`]) show first when a test fails: one subscriber for the whole
/// binary (tests run one cluster at a time), filtered by `KILN_TEST_LOG` (an `EnvFilter`;
/// default `warn,kiln_operator=debug`), and also printed to stderr when `KILN_TEST_LOG` is set.
mod operator_log {
    use std::fs::File;
    use std::io::Write;
    use std::path::Path;
    use std::sync::{Mutex, Once};

    /// The running cluster's operator log; `None` between clusters (lines are dropped).
    static FILE: Mutex<Option<File>> = Mutex::new(None);

    /// Installs the subscriber once (a no-op when another is already installed).
    pub fn install() {
        static INIT: Once = Once::new();
        INIT.call_once(|| {
            let (filter, echo) = match std::env::var("KILN_TEST_LOG") {
                Ok(f) => (f, true),
                Err(_) => ("warn,kiln_operator=debug".to_string(), false),
            };
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_ansi(false)
                .with_writer(move || Sink { echo })
                .try_init();
        });
    }

    /// Sends the lines from now on to `path` (created; truncated if there).
    pub fn to(path: &Path) {
        *FILE.lock().unwrap_or_else(|e| e.into_inner()) = File::create(path).ok();
    }

    /// Stops writing to the cluster's log (its directory is about to go).
    pub fn close() {
        *FILE.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// One formatted event's writer: the current file, and stderr when echoing.
    struct Sink {
        echo: bool,
    }

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Some(f) = FILE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                let _ = f.write_all(buf);
            }
            if self.echo {
                let _ = std::io::stderr().write_all(buf);
            }
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
