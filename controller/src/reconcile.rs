//! The reconcile pipeline and the kube-runtime Controller that drives it:
//! validate -> apply Services and PDB -> observe -> plan one step -> carry it out -> status.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerRuntimeConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use etcd_shared::EtcdCluster;
use etcd_shared::names;
use etcd_shared::types::ClusterPhase;

use crate::admin::Readiness;
use crate::backoff::Backoff;
use crate::builders;
use crate::cache::{self, Caches, StoredCluster};
use crate::context::Context;
use crate::error::{Error, FIELD_MANAGER};
use crate::etcd::EtcdPool;
use crate::observe::{Observation, observe};
use crate::planner::{self, Blocked, RemovalReason, Step};
use crate::planner::{InitialState, MemberPlan};
use crate::status;
use crate::view::ClusterView;
use kube::runtime::reflector::Store;

/// How long after an error of a watch `/readyz` stays failing. A watch that keeps failing
/// retries with kube-runtime's default backoff (at most 30 s apart, with jitter), so readiness
/// stays off while it fails and comes back within this long once it works again.
pub const WATCH_ERROR_HOLD: Duration = Duration::from_secs(45);

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
    let pods: Api<Pod> = scoped_api(&client, namespace.as_deref());
    let services: Api<Service> = scoped_api(&client, namespace.as_deref());
    let claims: Api<PersistentVolumeClaim> = scoped_api(&client, namespace.as_deref());
    let pdbs: Api<PodDisruptionBudget> = scoped_api(&client, namespace.as_deref());
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
    );
    let controller = Controller::new(clusters, watcher::Config::default())
        .owns_stream(triggers.pods)
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
        reported: Mutex::default(),
    });
    let forgetting = reconciler.clone();
    controller
        .run(reconcile_stored, error_policy, reconciler)
        .for_each(|result| {
            let r = forgetting.clone();
            let health = health.clone();
            async move {
                match result {
                    Ok(_) => {}
                    // A cluster deleted without a finalizer (a background delete) is seen
                    // only as gone from the store: forget what was kept for it.
                    Err(kube::runtime::controller::Error::ObjectNotFound(gone)) => {
                        let namespace = gone.namespace.clone().unwrap_or_default();
                        r.forget(&namespace, &gone.name);
                        tracing::debug!(cluster = %format!("{namespace}/{}", gone.name), "cluster gone: forgotten");
                    }
                    // A watch failed (it retries with backoff): not ready meanwhile.
                    Err(kube::runtime::controller::Error::QueueError(e)) => {
                        health.failed();
                        warn!(error = %e, "a watch failed; retrying");
                    }
                    // Reconcile errors are logged (and retried) by error_policy.
                    Err(e) => tracing::debug!(error = %e, "controller stream error"),
                }
            }
        })
        .await;
    readiness_task.abort();
    ready.set(false);
}

/// An Api for one namespace, or for all.
fn scoped_api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
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
    /// Undecodable clusters already reported, with the resourceVersion reported.
    reported: Mutex<HashMap<String, String>>,
}

impl Reconciler {
    /// Drops everything kept for a cluster that is gone: its metric series and its backoff.
    fn forget(&self, namespace: &str, name: &str) {
        self.ctx.metrics.forget_cluster(namespace, name);
        self.backoff.succeeded(&format!("{namespace}/{name}"));
        self.pool.forget(&format!("{namespace}/{name}"));
        self.reported().remove(&format!("{namespace}/{name}"));
    }

    fn reported(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.reported.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this version of an undecodable cluster is not reported yet (and is now).
    fn first_report(&self, key: String, version: Option<&str>) -> bool {
        let version = version.unwrap_or_default();
        self.reported().insert(key, version.to_string()).as_deref() != Some(version)
    }
}

fn key<K: Resource>(object: &K) -> String {
    format!(
        "{}/{}",
        object.meta().namespace.as_deref().unwrap_or_default(),
        object.meta().name.as_deref().unwrap_or_default()
    )
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
            publish(
                &r.recorder,
                &stored.object_ref(&()),
                EventType::Warning,
                "Undecodable",
                note,
            )
            .await;
            return Ok(Action::requeue(r.ctx.config.idle_requeue));
        }
    };
    r.ctx.metrics.decodable(&namespace, &name);
    r.reported().remove(&key(cluster));
    let result = reconcile(cluster, &r.ctx, &r.caches, &r.recorder, Some(&r.pool)).await;
    if result.is_ok() {
        r.backoff.succeeded(&key(cluster));
    }
    result
}

fn error_policy(cluster: Arc<StoredCluster>, error: &Error, r: Arc<Reconciler>) -> Action {
    r.ctx.metrics.reconcile_error(error.metric_label());
    if error.is_etcd_not_ready() {
        let delay = r.ctx.config.busy_requeue;
        info!(cluster = %key(cluster.as_ref()), %error, retry_in = ?delay, "etcd refused the change for now; retrying");
        return Action::requeue(delay);
    }
    let delay = r.backoff.failed(&key(cluster.as_ref()));
    warn!(cluster = %key(cluster.as_ref()), %error, retry_in = ?delay, "reconcile error; retrying");
    Action::requeue(delay)
}

/// One reconcile of one cluster; events go through `recorder`, etcd calls over `pool`'s
/// connections (new ones for each call without it).
pub async fn reconcile(
    cluster: &EtcdCluster,
    ctx: &Context,
    caches: &Caches,
    recorder: &Recorder,
    pool: Option<&Arc<EtcdPool>>,
) -> Result<Action, Error> {
    let timer = ctx.metrics.reconcile_timer();
    let result = reconcile_inner(cluster, ctx, caches, recorder, pool).await;
    timer.observe();
    if result.is_ok() {
        ctx.metrics.reconcile_ok();
    }
    result
}

async fn reconcile_inner(
    cluster: &EtcdCluster,
    ctx: &Context,
    caches: &Caches,
    recorder: &Recorder,
    pool: Option<&Arc<EtcdPool>>,
) -> Result<Action, Error> {
    let name = cluster.name_any();
    let namespace = cluster.namespace().unwrap_or_default();
    if cluster.metadata.deletion_timestamp.is_some() {
        // Owner references garbage-collect pods, claims, Services and the budget.
        ctx.metrics.forget_cluster(&namespace, &name);
        if let Some(pool) = pool {
            pool.forget(&format!("{namespace}/{name}"));
        }
        return Ok(Action::await_change());
    }
    let api: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let previous = cluster.status.as_ref();
    let view = match ClusterView::new(cluster, &ctx.config.policy()) {
        Ok(v) => v,
        Err(e) => {
            warn!(%name, %namespace, error = %e, "invalid EtcdCluster spec");
            let new = status::invalid(&e, cluster.metadata.generation, previous, Timestamp::now());
            write_status(&api, &name, &new, previous).await?;
            publish(
                recorder,
                &cluster.object_ref(&()),
                EventType::Warning,
                "InvalidSpec",
                e.to_string(),
            )
            .await;
            return Ok(Action::await_change());
        }
    };

    let (peer, client, pdb) = (
        builders::peer_service(&view),
        builders::client_service(&view),
        builders::disruption_budget(&view),
    );
    futures::try_join!(
        apply(ctx, &view, &peer, &caches.services),
        apply(ctx, &view, &client, &caches.services),
        apply(ctx, &view, &pdb, &caches.pdbs)
    )?;

    let bootstrapped = previous.and_then(|s| s.size).is_some_and(|s| s > 0);
    let obs = observe(
        &ctx.client,
        caches,
        &view,
        bootstrapped,
        ctx.config.etcd_timeout,
        pool.cloned(),
    )
    .await?;
    for (member, why) in &obs.health_failures {
        ctx.metrics.health_check_failed(&namespace, &name);
        tracing::debug!(%name, %member, %why, "member health check failed");
    }
    let step = planner::plan(&view, &obs.model, &ctx.config.timeouts);
    let outcome = execute(ctx, recorder, cluster, &view, &obs, &step).await;

    let new = status::compute(&view, &obs.model, &step, previous, Timestamp::now());
    let phase = new.phase.unwrap_or(ClusterPhase::Creating);
    ctx.metrics.observe_cluster(
        &namespace,
        &name,
        phase.as_str(),
        i64::from(new.ready_members.unwrap_or(0)),
    );
    if let Some(prev) = previous {
        announce_transitions(recorder, cluster, &new, prev).await;
    }
    write_status(&api, &name, &new, previous).await?;
    outcome?;
    let requeue = match step {
        Step::Done | Step::Blocked(Blocked::Paused) => ctx.config.idle_requeue,
        // A starting member's pod changes wake the controller through the pod watch.
        Step::Wait(planner::Waiting::MemberStarting(_)) => ctx.config.idle_requeue,
        Step::Blocked(_) | Step::Wait(_) => ctx.config.wait_requeue,
        _ => ctx.config.busy_requeue,
    };
    Ok(Action::requeue(requeue))
}

/// Server-side applies one derived object under the operator's field manager. Applying an
/// unchanged object changes nothing on the server (same resourceVersion).
async fn apply<K>(
    ctx: &Context,
    view: &ClusterView,
    object: &K,
    cache: &Store<K>,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Serialize
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let mut value = serde_json::to_value(object).map_err(|source| Error::Serialize {
        what: "object",
        source,
    })?;
    value["apiVersion"] = K::api_version(&()).into();
    value["kind"] = K::kind(&()).into();
    let hash = cache::content_hash(&value);
    if cache::is_current(cache, &view.namespace, &name, &hash, &value) {
        return Ok(());
    }
    value["metadata"]["annotations"][cache::APPLIED_HASH] = hash.into();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &view.namespace);
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await
    .map_err(Error::kube(format!("apply {} {name}", K::kind(&()))))?;
    ctx.metrics.applied(&K::kind(&()));
    Ok(())
}

async fn write_status(
    api: &Api<EtcdCluster>,
    name: &str,
    new: &etcd_shared::EtcdClusterStatus,
    previous: Option<&etcd_shared::EtcdClusterStatus>,
) -> Result<(), Error> {
    if !status::changed(new, previous) {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": EtcdCluster::api_version(&()),
        "kind": EtcdCluster::kind(&()),
        "status": new,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::kube(format!("write status of {name}")))?;
    // What another writer (CoreOS' operator) left beside our fields: server-side apply keeps
    // it, so clear it explicitly.
    if let Some(stale) = previous.and_then(|p| status::stale_fields(new, p)) {
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&stale))
            .await
            .map_err(Error::kube(format!("clear stale status fields of {name}")))?;
    }
    Ok(())
}

async fn publish(
    recorder: &Recorder,
    reference: &ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, reference).await {
        warn!(error = %e, reason, "could not publish event");
    }
}

/// Events for condition changes that matter to a person: quorum lost or regained, degraded.
async fn announce_transitions(
    recorder: &Recorder,
    cluster: &EtcdCluster,
    new: &etcd_shared::EtcdClusterStatus,
    old: &etcd_shared::EtcdClusterStatus,
) {
    let reference = cluster.object_ref(&());
    for c in &new.conditions {
        let before = old.conditions.iter().find(|o| o.type_ == c.type_);
        if before.is_some_and(|b| b.status == c.status && b.reason == c.reason) {
            continue;
        }
        let warning = (c.type_ == status::AVAILABLE && c.status == "False")
            || (c.type_ == status::DEGRADED && c.status == "True");
        if warning {
            publish(
                recorder,
                &reference,
                EventType::Warning,
                &c.reason,
                c.message.clone(),
            )
            .await;
        } else if c.type_ == status::AVAILABLE && c.status == "True" {
            publish(
                recorder,
                &reference,
                EventType::Normal,
                "Available",
                c.message.clone(),
            )
            .await;
        }
    }
}

async fn create_member_pod(
    ctx: &Context,
    view: &ClusterView,
    plan: &MemberPlan,
) -> Result<(), Error> {
    if let Some(claim) = builders::data_claim(view, &plan.name) {
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(ctx.client.clone(), &view.namespace);
        match claims.create(&PostParams::default(), &claim).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(Error::kube(format!("create claim of {}", plan.name))(e)),
        }
    }
    let mut pod = builders::member_pod(view, plan);
    // The first member of a restored cluster is seeded from the snapshot.
    if plan.state == InitialState::New
        && let Some(seed) = &view.seed
    {
        let image = ctx
            .config
            .restore_image
            .as_deref()
            .ok_or(Error::NoRestoreImage)?;
        builders::seed_member(&mut pod, view, plan, seed, image);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &view.namespace);
    match pods.create(&PostParams::default(), &pod).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("create pod {}", plan.name))(e)),
    }
}

/// Carries out one step, and records it as an event and a metric.
async fn execute(
    ctx: &Context,
    recorder: &Recorder,
    cluster: &EtcdCluster,
    view: &ClusterView,
    obs: &Observation,
    step: &Step,
) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &view.namespace);
    let (reason, kind) = match step {
        Step::Bootstrap(plan) => {
            create_member_pod(ctx, view, plan).await?;
            ("ClusterBootstrapped", "bootstrap")
        }
        Step::AddMember {
            peer_url, learner, ..
        } => {
            obs.access
                .add_member(obs.member_change_endpoint()?, peer_url, *learner)
                .await?;
            ("MemberAdded", "add")
        }
        Step::CreatePod(plan) => {
            create_member_pod(ctx, view, plan).await?;
            ("MemberPodCreated", "start")
        }
        Step::PromoteLearner { id, name } => {
            if !obs
                .access
                .promote_member(obs.member_change_endpoint()?, *id)
                .await?
            {
                info!(member = %name, "learner not caught up yet");
                return Ok(());
            }
            ("MemberPromoted", "promote")
        }
        Step::RemoveMember { id, reason, .. } => {
            obs.access
                .remove_member(obs.member_change_endpoint()?, *id)
                .await?;
            match reason {
                RemovalReason::ScaleDown => ("MemberRemoved", "remove"),
                RemovalReason::Replace => ("MemberReplaced", "replace"),
            }
        }
        Step::DeletePod(name) => {
            match pods.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("delete pod {name}"))(e)),
            }
            ("MemberPodDeleted", "delete_pod")
        }
        Step::DeleteClaim(member) => {
            let claims: Api<PersistentVolumeClaim> =
                Api::namespaced(ctx.client.clone(), &view.namespace);
            let claim = names::data_claim_name(member);
            match claims.delete(&claim, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("delete claim {claim}"))(e)),
            }
            ("MemberClaimDeleted", "delete_claim")
        }
        Step::UpgradeMember {
            name,
            image,
            version,
        } => {
            // The restart count goes with the image, so the planner can tell the new
            // container's readiness from the old one's.
            let restarts = obs.model.pod(name).map_or(0, |p| p.restarts);
            let patch = serde_json::json!({
                "metadata": {
                    "labels": BTreeMap::from([(names::LABEL_VERSION, version.to_string())]),
                    "annotations": BTreeMap::from([(
                        names::ANNOTATION_RESTARTS_AT_UPGRADE,
                        restarts.to_string(),
                    )]),
                },
                "spec": { "containers": [ { "name": "etcd", "image": image } ] },
            });
            pods.patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
                .map_err(Error::kube(format!("upgrade pod {name}")))?;
            ("MemberUpgraded", "upgrade")
        }
        Step::TransferLeadership { from, to_id, .. } => {
            let endpoint = obs
                .endpoint_of(from)
                .ok_or_else(|| Error::NoEndpoint(from.clone()))?;
            obs.access.move_leader(endpoint, *to_id).await?;
            ("LeadershipTransferred", "transfer_leadership")
        }
        Step::RecordSnapshotBarrier { index } => {
            let patch = serde_json::json!({
                "metadata": { "annotations": { names::ANNOTATION_SNAPSHOT_BARRIER: index.to_string() } },
            });
            for pod in &obs.model.pods {
                pods.patch(&pod.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(Error::kube(format!(
                        "record the snapshot barrier on {}",
                        pod.name
                    )))?;
            }
            ("SnapshotBarrierRecorded", "snapshot_barrier")
        }
        Step::Wait(_) | Step::Blocked(_) | Step::Done => return Ok(()),
    };
    let note = status::describe(step);
    info!(cluster = %view.name, namespace = %view.namespace, step = %note, "member change");
    ctx.metrics.member_change(kind);
    publish(
        recorder,
        &cluster.object_ref(&()),
        EventType::Normal,
        reason,
        note,
    )
    .await;
    Ok(())
}
