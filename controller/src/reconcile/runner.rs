//! The wiring: the kube-runtime Controller over the EtcdCluster watch (read leniently, see
//! [`StoredCluster`]) and the caches' watches as its triggers, readiness from those watches,
//! the retry policy, and what is kept per cluster (backoff, etcd connections, metric series,
//! reported undecodable objects) and dropped when the cluster is gone. Each reconcile is
//! [`super::pipeline::reconcile`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::FutureExt;
use kube::runtime::controller::{Action, Config as ControllerRuntimeConfig, Controller};
use kube::runtime::events::Recorder;
use kube::runtime::watcher;
use kube::{Api, Resource};
use tracing::{info, warn};

use etcd_shared::names;

use super::pipeline::reconcile;
use crate::admin::Readiness;
use crate::backoff::{Backoff, RetryGate};
use crate::cache::{CachedClaim, CachedPdb, CachedPod, CachedService, Caches, StoredCluster};
use crate::context::Context;
use crate::controller_loop::{self, Reconciled, object_key as key, scoped_api};
use crate::error::Error;
use crate::etcd::EtcdPool;
use crate::events::Events;

/// How long after an error of a watch `/readyz` stays failing. A watch that keeps failing
/// retries with kube-runtime's default backoff (at most 30 s apart, with jitter), so readiness
/// stays off while it fails and comes back within this long once it works again.
pub const WATCH_ERROR_HOLD: Duration = Duration::from_secs(45);

/// How soon a cluster whose reconcile came before the caches synced is looked at again.
const CACHE_SYNC_RETRY: Duration = Duration::from_millis(500);

/// How often readiness is re-evaluated once the watches have synced.
const READINESS_TICK: Duration = Duration::from_secs(1);

/// When a watch of the controller last failed.
#[derive(Default)]
struct WatchHealth(Mutex<Option<Instant>>);

impl WatchHealth {
    fn failed(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// No watch failed within [`WATCH_ERROR_HOLD`].
    fn healthy(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none_or(|at| at.elapsed() >= WATCH_ERROR_HOLD)
    }
}

/// Runs the controller until `shutdown` resolves. `ready` turns true once every watch (the
/// EtcdClusters' and the derived objects') has listed its objects, and false again while a
/// watch fails (for [`WATCH_ERROR_HOLD`] after its latest error).
pub async fn run_controller(
    ctx: Arc<Context>,
    namespace: Option<String>,
    concurrency: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    ready: Readiness,
) {
    let client = ctx.client.clone();
    // Read leniently: one stored object our types reject must not fail the list of all.
    let clusters: Api<StoredCluster> = scoped_api(&client, namespace.as_deref());
    let pods: Api<CachedPod> = scoped_api(&client, namespace.as_deref());
    let services: Api<CachedService> = scoped_api(&client, namespace.as_deref());
    let claims: Api<CachedClaim> = scoped_api(&client, namespace.as_deref());
    let pdbs: Api<CachedPdb> = scoped_api(&client, namespace.as_deref());
    // One watch per derived kind: it fills the cache the reconciles read and is the
    // Controller's trigger for that kind.
    let (caches, triggers) = Caches::new(
        pods,
        claims,
        services,
        pdbs,
        &watcher::Config::default().labels(&format!(
            "{}={}",
            names::LABEL_MANAGED_BY,
            names::MANAGED_BY
        )),
        // And the pods CoreOS' operator left running (adopted): CoreOS' label, not ours.
        &watcher::Config::default().labels(&format!(
            "{}=etcd,!{}",
            names::LEGACY_LABEL_APP,
            names::LABEL_MANAGED_BY
        )),
    );
    let controller = Controller::new(clusters, watcher::Config::default())
        .owns_stream(triggers.pods)
        .owns_stream(triggers.coreos_pods)
        .owns_stream(triggers.services)
        .owns_stream(triggers.claims)
        .owns_stream(triggers.pdbs)
        .with_config(ControllerRuntimeConfig::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown);
    let health = Arc::new(WatchHealth::default());
    let ready_flag = ready.clone();
    let ready_caches = caches.clone();
    let main_store = controller.store();
    let ready_health = health.clone();
    let readiness_task = tokio::spawn(async move {
        // The caches first; the Controller's store is polled on each tick (a waiter on it
        // registered before `run` starts is not woken by kube-runtime 5).
        if !ready_caches.wait_until_ready().await {
            return;
        }
        let mut tick = tokio::time::interval(READINESS_TICK);
        let mut synced = false;
        loop {
            tick.tick().await;
            if !synced {
                synced = main_store
                    .wait_until_ready()
                    .now_or_never()
                    .is_some_and(|r| r.is_ok());
                if synced {
                    tracing::info!("watches synced");
                }
            }
            let healthy = synced && ready_health.healthy();
            if healthy != ready_flag.get() {
                tracing::info!(ready = healthy, "readiness");
            }
            ready_flag.set(healthy);
        }
    });
    let reconciler = Arc::new(Reconciler {
        recorder: Recorder::new(ctx.client.clone(), ctx.reporter.clone()),
        ctx,
        caches,
        pool: Arc::default(),
        backoff: Backoff::default(),
        safety_retries: RetryGate::default(),
        reported: Mutex::default(),
        health,
    });
    controller_loop::run_controller(controller, reconciler).await;
    readiness_task.abort();
    ready.set(false);
}

/// The context of the running controller: the shared context, the caches, the event recorder
/// (one for the controller: it keeps the event series) and the retry backoff.
struct Reconciler {
    ctx: Arc<Context>,
    caches: Caches,
    recorder: Recorder,
    /// Connections to the members, reused across reconciles.
    pool: Arc<EtcdPool>,
    backoff: Backoff,
    /// When a failed safety backup may be tried again, per cluster.
    safety_retries: RetryGate,
    /// Undecodable clusters already reported, with the resourceVersion reported.
    reported: Mutex<HashMap<crate::object_key::ObjectKey, String>>,
    /// Whether the watches have failed lately (readiness).
    health: Arc<WatchHealth>,
}

impl Reconciled for Reconciler {
    type Object = StoredCluster;
    type Error = Error;
    const KIND: &'static str = "EtcdCluster";

    fn reconcile(
        self: Arc<Self>,
        cluster: Arc<StoredCluster>,
    ) -> impl Future<Output = Result<Action, Error>> + Send + 'static {
        reconcile_stored(cluster, self)
    }

    fn retry(&self, cluster: &StoredCluster, error: &Error) -> Action {
        self.ctx.metrics.reconcile_error(error.metric_label());
        if error.is_etcd_not_ready() {
            let delay = self.ctx.config.busy_requeue;
            info!(cluster = %key(cluster), %error, retry_in = ?delay, "etcd refused the change for now; retrying");
            return Action::requeue(delay);
        }
        let delay = self.backoff.failed(&key(cluster));
        warn!(cluster = %key(cluster), %error, retry_in = ?delay, "reconcile error; retrying");
        Action::requeue(delay)
    }

    fn forget(&self, namespace: &str, name: &str) {
        Reconciler::forget(self, namespace, name);
    }

    fn watch_failed(&self) {
        self.health.failed();
    }
}

impl Reconciler {
    /// Drops everything kept for a cluster that is gone: its metric series and its backoff.
    fn forget(&self, namespace: &str, name: &str) {
        self.ctx.metrics.forget_cluster(namespace, name);
        let key = crate::object_key::ObjectKey::new(namespace, name);
        self.backoff.succeeded(&key);
        self.safety_retries.succeeded(&key);
        self.pool.forget(&key);
        self.reported().remove(&key);
    }

    fn reported(&self) -> std::sync::MutexGuard<'_, HashMap<crate::object_key::ObjectKey, String>> {
        self.reported.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this version of an undecodable cluster is not reported yet (and is now).
    fn first_report(&self, key: crate::object_key::ObjectKey, version: Option<&str>) -> bool {
        let version = version.unwrap_or_default();
        self.reported().insert(key, version.to_string()).as_deref() != Some(version)
    }
}

/// Reconciles a stored cluster that decodes; reports one that does not (a Warning Event
/// `Undecodable` naming the field and a log line, once per resourceVersion, and
/// `undecodable_clusters`) and makes no change for it. It is looked at again every idle
/// period, so its delete is seen (and forgotten) like any cluster's.
async fn reconcile_stored(stored: Arc<StoredCluster>, r: Arc<Reconciler>) -> Result<Action, Error> {
    let namespace = stored.meta().namespace.clone().unwrap_or_default();
    let name = stored.meta().name.clone().unwrap_or_default();
    let cluster = match stored.decoded() {
        Ok(cluster) => cluster,
        Err(bad) => {
            r.ctx.metrics.undecodable(&namespace, &name);
            let version = stored.meta().resource_version.as_deref();
            if !r.first_report(key(stored.as_ref()), version) {
                return Ok(Action::requeue(r.ctx.config.idle_requeue));
            }
            warn!(
                cluster = %format!("{namespace}/{name}"),
                field = %bad.field,
                reason = %bad.reason,
                "the stored EtcdCluster does not decode; skipped until it changes"
            );
            let note = format!(
                "{bad}: the operator cannot read this EtcdCluster and leaves it alone until it is fixed"
            );
            let events = Events::of(&r.recorder, stored.as_ref());
            events.warning("Undecodable", note).await;
            return Ok(Action::requeue(r.ctx.config.idle_requeue));
        }
    };
    r.ctx.metrics.decodable(&namespace, &name);
    r.reported().remove(&key(cluster));
    if !r.caches.is_ready() {
        // Until every store the planner reads has listed its objects, a missing pod or claim
        // means nothing: a durable member would look lost (its member removed, its claim
        // deleted) and the status would say so. Nothing is decided or written before.
        tracing::debug!(cluster = %key(cluster), "waiting for the caches to sync");
        return Ok(Action::requeue(CACHE_SYNC_RETRY));
    }
    let timer = r.ctx.metrics.reconcile_timer();
    let run = super::pipeline::Run {
        ctx: &r.ctx,
        caches: &r.caches,
        recorder: &r.recorder,
        pool: &r.pool,
        safety_retries: &r.safety_retries,
    };
    let result = reconcile(cluster, &run).await;
    timer.observe();
    if result.is_ok() {
        r.ctx.metrics.reconcile_ok();
        r.backoff.succeeded(&key(cluster));
    }
    result
}
