//! The process: logging, the Kubernetes client, the CRD check, the admin servers, then the
//! controller, directly or under leader election, until the shutdown signal.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use etcd_shared::EtcdCluster;
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::Reporter;
use kube::{Api, Client, Config};
use tokio_util::sync::CancellationToken;

use crate::admin::{AdminConfig, AdminServers, Readiness};
use crate::args::Args;
use crate::context::{Context, ControllerConfig};
use crate::controllers;
use crate::leader::{self, LeaderElectionParams, LeaderElector};
use crate::metrics::Metrics;
use etcd_process::{logging, signals};

/// The `controller` of the events the operator publishes.
pub const EVENT_CONTROLLER: &str = "etcd-operator";

/// What to run after an API server call showed the CRD missing.
pub const CRD_HINT: &str =
    "is the EtcdCluster CRD installed? kubectl apply -f charts/etcd-operator/crds/";

/// How long the admin servers get after the controller has stopped.
const ADMIN_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the controller until SIGTERM or SIGINT. Errors: bad arguments, no cluster config, no
/// CRD, a port in use, or the controller stopping on its own.
pub async fn run(args: Args) -> anyhow::Result<()> {
    args.validate()?;
    logging::init(args.log_format, args.log_level.as_deref())?;
    let signalled = signals::Shutdown::new();
    signals::install(&signalled).context("installing the signal handlers")?;
    let shutdown = signalled.token();
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        namespace = args.watch_namespace().as_deref().unwrap_or("(all)"),
        leader_elect = args.leader_elect,
        "etcd-controller starting"
    );

    let client = build_client(args.kubeconfig.as_deref()).await?;
    check_crd(&client, args.watch_namespace().as_deref()).await?;

    let metrics = Arc::new(Metrics::new().context("creating the metrics")?);
    let readiness = Readiness::new();
    let admin = AdminServers::start(
        AdminConfig {
            health_probe_addr: args.health_probe_bind_address.clone(),
            metrics_addr: args.metrics_bind_address.clone(),
            readiness: readiness.clone(),
            metrics: metrics.clone(),
        },
        shutdown.clone(),
    )?;
    // Readiness says plainly when the installed CRDs are not this operator's (CoreOS').
    let crd_watch = tokio::spawn(crate::installed_crds::watch(
        client.clone(),
        readiness.clone(),
        shutdown.clone(),
    ));
    let admin_stop = shutdown.clone();
    let admin_task = tokio::spawn(async move {
        let result = admin.wait().await;
        if result.is_err() {
            // An admin server that died takes the process down with it.
            admin_stop.cancel();
        }
        result
    });

    let identity = leader::default_identity();
    let failpoints = armed_failpoints()?;
    let ctx = Arc::new(Context {
        client: client.clone(),
        metrics: metrics.clone(),
        reporter: Reporter {
            controller: EVENT_CONTROLLER.into(),
            instance: Some(identity.clone()),
        },
        config: ControllerConfig {
            default_version: args.default_version.clone(),
            default_repository: args.default_repository.clone(),
            restore_image: args.operator_image(),
            planner: args.planner_settings(),
            failpoints,
            broken: broken_on_purpose()?,
            network: args.network_access(),
            ..ControllerConfig::default()
        },
    });

    let workload = Workload {
        ctx,
        namespace: args.watch_namespace(),
        concurrency: args.concurrent_reconciles,
        readiness: readiness.clone(),
        grace: args.graceful_shutdown_timeout,
    };
    let controller_result = if args.leader_elect {
        let params = args.leader_election_params(identity);
        run_elected(client, params, metrics, workload, shutdown.clone()).await
    } else {
        workload.run(shutdown.clone()).await;
        Ok(())
    };
    let by_signal = shutdown.is_cancelled();
    readiness.set(false);
    shutdown.cancel();
    crd_watch.abort();

    let admin_result = match tokio::time::timeout(ADMIN_STOP_TIMEOUT, admin_task).await {
        Ok(joined) => joined.context("the admin server task")?,
        Err(_) => return Err(anyhow!("the admin servers did not stop")),
    };
    admin_result?;
    controller_result?;
    if !by_signal {
        return Err(anyhow!("the controller stopped on its own"));
    }
    tracing::info!("etcd-controller stopped");
    Ok(())
}

/// What runs the controller: everything `run_controller` takes but the shutdown signal.
struct Workload {
    ctx: Arc<Context>,
    namespace: Option<String>,
    concurrency: u16,
    readiness: Readiness,
    /// How long the controller gets to stop once `stop` is cancelled.
    grace: Duration,
}

impl Workload {
    /// Runs the controller until `stop` is cancelled, then gives it `grace` to finish its
    /// running reconciles before dropping it. (kube-runtime's graceful shutdown can wait
    /// forever when it is triggered before the watches' first sync.)
    async fn run(&self, stop: CancellationToken) {
        // Nothing is reconciled under CRDs that are not this operator's: with CoreOS' (no
        // status subresource) every status write fails, and the records the status keeps (a
        // recovery in progress, a safety backup) would be lost.
        if !crate::installed_crds::until_ours(&self.ctx.client, &stop).await {
            return;
        }
        let controller = controllers::run_all(
            self.ctx.clone(),
            self.namespace.clone(),
            self.concurrency,
            stop.clone().cancelled_owned(),
            self.readiness.clone(),
        );
        let mut controller = std::pin::pin!(controller);
        tokio::select! {
            () = &mut controller => return,
            () = stop.cancelled() => {}
        }
        if tokio::time::timeout(self.grace, controller).await.is_err() {
            tracing::warn!(
                grace = ?self.grace,
                "the controller did not stop within the graceful shutdown timeout; stopping it anyway"
            );
        }
    }
}

/// Campaigns for the Lease and runs the controller while leading. A standby is Ready (see
/// [`crate::admin`]); the leader is Ready once its watches have synced.
async fn run_elected(
    client: Client,
    params: LeaderElectionParams,
    metrics: Arc<Metrics>,
    workload: Workload,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let elector = LeaderElector::new(client, params).with_metrics(metrics);
    workload.readiness.set(true);
    let workload = &workload;
    elector
        .run(shutdown, |stop| async move {
            workload.readiness.set(false);
            workload.run(stop).await;
            workload.readiness.set(true);
        })
        .await?;
    Ok(())
}

/// A client from `--kubeconfig` when given, else in-cluster, `$KUBECONFIG` or
/// `~/.kube/config` (kube's `Config::infer`).
pub async fn build_client(kubeconfig: Option<&Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading the kubeconfig {}", path.display()))?
        }
        None => Config::infer().await.context(
            "no Kubernetes configuration: not in a cluster, and no --kubeconfig, $KUBECONFIG or ~/.kube/config",
        )?,
    };
    tracing::info!(server = %config.cluster_url, "Kubernetes API server");
    Client::try_from(config).context("building the Kubernetes client")
}

/// Lists at most one `EtcdCluster`, to fail early with a clear message when the CRD is not
/// installed or the service account may not list clusters.
pub async fn check_crd(client: &Client, namespace: Option<&str>) -> anyhow::Result<()> {
    let api: Api<EtcdCluster> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        // A missing resource type answers a bare "404 page not found", without a Status.
        Err(kube::Error::Api(status)) if status.code == 404 || status.is_not_found() => {
            Err(anyhow!(
                "the API server does not serve etcdclusters.{}: {CRD_HINT}",
                etcd_shared::names::API_GROUP
            ))
        }
        Err(kube::Error::Api(status)) if status.code == 403 || status.is_forbidden() => {
            Err(anyhow!(
                "not allowed to list EtcdClusters ({}): check the controller's RBAC",
                status.message
            ))
        }
        Err(e) => Err(e).context("listing EtcdClusters (checking that the CRD is installed)"),
    }
}

/// The error and its causes on one line, each only once (kube's errors repeat their source in
/// their own message, so `{:#}` would print it twice).
pub fn error_chain(error: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// The failpoints the environment arms ([`crate::failpoints::FAILPOINTS_ENV`], set by the proof
/// suite only): hitting one ends the process at once, as a crash would.
fn armed_failpoints() -> anyhow::Result<crate::failpoints::Failpoints> {
    let Ok(list) = std::env::var(crate::failpoints::FAILPOINTS_ENV) else {
        return Ok(crate::failpoints::Failpoints::default());
    };
    let points = crate::failpoints::Failpoints::parse(
        &list,
        Arc::new(|point| {
            eprintln!("etcd-controller: killed at failpoint {point}");
            std::process::exit(137);
        }),
    )
    .context("ETCD_OPERATOR_FAILPOINTS")?;
    tracing::warn!(failpoints = %list, "failpoints armed: the controller exits when it reaches one");
    Ok(points)
}

/// The rule the environment breaks on purpose ([`crate::failpoints::BROKEN_ENV`], set by the
/// proof suite's control experiment only).
fn broken_on_purpose() -> anyhow::Result<Option<crate::failpoints::Broken>> {
    let Ok(name) = std::env::var(crate::failpoints::BROKEN_ENV) else {
        return Ok(None);
    };
    let broken = name.parse().context("ETCD_OPERATOR_TEST_BROKEN")?;
    tracing::error!(rule = %name, "this operator is broken on purpose (a test's control experiment): do not run it on data you keep");
    Ok(Some(broken))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_chain_skips_repeated_causes() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        #[derive(Debug, thiserror::Error)]
        #[error("cannot read the file: {0}")]
        struct Repeats(#[source] std::io::Error);
        let e = anyhow::Error::new(Repeats(io)).context("loading the config");
        assert_eq!(
            error_chain(&e),
            "loading the config: cannot read the file: no such file"
        );
        let plain = anyhow!("inner").context("outer");
        assert_eq!(error_chain(&plain), "outer: inner");
    }
}
