//! The reconcile pipeline and the kube-runtime Controller that drives it:
//! validate -> apply Services and PDB -> observe -> plan one step -> carry it out -> status.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
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
use crate::builders::{self, ClusterView, MemberPlan};
use crate::cache::{self, Caches};
use crate::context::Context;
use crate::error::{Error, FIELD_MANAGER};
use crate::observe::{Observation, observe};
use crate::planner::{self, Blocked, RemovalReason, Step};
use crate::status;
use kube::runtime::reflector::Store;

/// Runs the controller until `shutdown` resolves. `ready` turns true once the first
/// reconcile results arrive (the watches have synced).
pub async fn run_controller(
    ctx: Arc<Context>,
    namespace: Option<String>,
    concurrency: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    ready: Readiness,
) {
    let client = ctx.client.clone();
    let clusters: Api<EtcdCluster> = scoped_api(&client, namespace.as_deref());
    let pods: Api<Pod> = scoped_api(&client, namespace.as_deref());
    let services: Api<Service> = scoped_api(&client, namespace.as_deref());
    let claims: Api<PersistentVolumeClaim> = scoped_api(&client, namespace.as_deref());
    let pdbs: Api<PodDisruptionBudget> = scoped_api(&client, namespace.as_deref());
    let owned = watcher::Config::default().labels(&format!(
        "{}={}",
        names::LABEL_MANAGED_BY,
        names::MANAGED_BY
    ));
    let (caches, cache_driver) = Caches::new(
        pods.clone(),
        claims.clone(),
        services.clone(),
        pdbs.clone(),
        owned.clone(),
    );
    let cache_task = tokio::spawn(cache_driver);
    let controller = Controller::new(clusters, watcher::Config::default())
        .owns(pods, owned.clone())
        .owns(services, owned.clone())
        .owns(claims, owned.clone())
        .owns(pdbs, owned)
        .with_config(ControllerRuntimeConfig::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown);
    // Ready once the watches have listed everything.
    let ready_flag = ready.clone();
    let ready_caches = caches.clone();
    let readiness_task = tokio::spawn(async move {
        // (The Controller's own store reader does not report readiness before `run` owns
        // it, so readiness follows the caches of the derived objects.)
        if ready_caches.wait_until_ready().await {
            tracing::info!("watches synced: ready");
            ready_flag.set(true);
        }
    });
    let reconciler = Arc::new(Reconciler {
        ctx,
        caches,
        backoff: Backoff::default(),
    });
    let forgetting = reconciler.clone();
    controller
        .run(reconcile_with_backoff, error_policy, reconciler)
        .for_each(|result| {
            let r = forgetting.clone();
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
                    // Reconcile errors are logged (and retried) by error_policy.
                    Err(e) => tracing::debug!(error = %e, "controller stream error"),
                }
            }
        })
        .await;
    readiness_task.abort();
    cache_task.abort();
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

/// The context of the running controller: the shared context and the retry backoff.
struct Reconciler {
    ctx: Arc<Context>,
    caches: Caches,
    backoff: Backoff,
}

impl Reconciler {
    /// Drops everything kept for a cluster that is gone: its metric series and its backoff.
    fn forget(&self, namespace: &str, name: &str) {
        self.ctx.metrics.forget_cluster(namespace, name);
        self.backoff.succeeded(&format!("{namespace}/{name}"));
    }
}

fn key(cluster: &EtcdCluster) -> String {
    format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    )
}

async fn reconcile_with_backoff(
    cluster: Arc<EtcdCluster>,
    r: Arc<Reconciler>,
) -> Result<Action, Error> {
    let result = reconcile(cluster.clone(), r.ctx.clone(), r.caches.clone()).await;
    if result.is_ok() {
        r.backoff.succeeded(&key(&cluster));
    }
    result
}

fn error_policy(cluster: Arc<EtcdCluster>, error: &Error, r: Arc<Reconciler>) -> Action {
    r.ctx.metrics.reconcile_error(error.metric_label());
    if error.is_etcd_not_ready() {
        let delay = r.ctx.config.busy_requeue;
        info!(cluster = %key(&cluster), %error, retry_in = ?delay, "etcd refused the change for now; retrying");
        return Action::requeue(delay);
    }
    let delay = r.backoff.failed(&key(&cluster));
    warn!(cluster = %key(&cluster), %error, retry_in = ?delay, "reconcile error; retrying");
    Action::requeue(delay)
}

/// One reconcile of one cluster.
pub async fn reconcile(
    cluster: Arc<EtcdCluster>,
    ctx: Arc<Context>,
    caches: Caches,
) -> Result<Action, Error> {
    let timer = ctx.metrics.reconcile_timer();
    let result = reconcile_inner(&cluster, &ctx, &caches).await;
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
) -> Result<Action, Error> {
    let name = cluster.name_any();
    let namespace = cluster.namespace().unwrap_or_default();
    if cluster.metadata.deletion_timestamp.is_some() {
        // Owner references garbage-collect pods, claims, Services and the budget.
        ctx.metrics.forget_cluster(&namespace, &name);
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
                ctx,
                cluster,
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
    )
    .await?;
    for (member, why) in &obs.health_failures {
        ctx.metrics.health_check_failed(&namespace, &name);
        tracing::debug!(%name, %member, %why, "member health check failed");
    }
    let step = planner::plan(&view, &obs.model, &ctx.config.timeouts);
    let outcome = execute(ctx, cluster, &view, &obs, &step).await;

    let new = status::compute(&view, &obs.model, &step, previous, Timestamp::now());
    let phase = new.phase.unwrap_or(ClusterPhase::Creating);
    ctx.metrics.observe_cluster(
        &namespace,
        &name,
        phase.as_str(),
        i64::from(new.ready_members.unwrap_or(0)),
    );
    if let Some(prev) = previous {
        announce_transitions(ctx, cluster, &new, prev).await;
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
    ctx: &Context,
    cluster: &EtcdCluster,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    let reference: ObjectReference = cluster.object_ref(&());
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        warn!(error = %e, reason, "could not publish event");
    }
}

/// Events for condition changes that matter to a person: quorum lost or regained, degraded.
async fn announce_transitions(
    ctx: &Context,
    cluster: &EtcdCluster,
    new: &etcd_shared::EtcdClusterStatus,
    old: &etcd_shared::EtcdClusterStatus,
) {
    for c in &new.conditions {
        let before = old.conditions.iter().find(|o| o.type_ == c.type_);
        if before.is_some_and(|b| b.status == c.status && b.reason == c.reason) {
            continue;
        }
        let warning = (c.type_ == status::AVAILABLE && c.status == "False")
            || (c.type_ == status::DEGRADED && c.status == "True");
        if warning {
            publish(
                ctx,
                cluster,
                EventType::Warning,
                &c.reason,
                c.message.clone(),
            )
            .await;
        } else if c.type_ == status::AVAILABLE && c.status == "True" {
            publish(
                ctx,
                cluster,
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
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &view.namespace);
    match pods
        .create(&PostParams::default(), &builders::member_pod(view, plan))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("create pod {}", plan.name))(e)),
    }
}

/// Carries out one step, and records it as an event and a metric.
async fn execute(
    ctx: &Context,
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
    publish(ctx, cluster, EventType::Normal, reason, note).await;
    Ok(())
}
