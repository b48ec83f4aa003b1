//! The `EtcdRestore` reconciler. CoreOS' restore operator deleted the named cluster and then
//! created it anew from the snapshot, so a typo in the path lost the live cluster. Here the
//! snapshot is downloaded and checked first (etcd's hash, and that its etcd line can be
//! restored by the cluster's), and only then is anything of the cluster touched:
//!
//! 1. **Verify**: read the whole snapshot through, check it, record the cluster's labels,
//!    annotations and spec (the template) and its UID in the restore's status;
//! 2. **Replace**: delete that cluster (only that UID: a precondition) and wait until it is
//!    gone with everything it owned;
//! 3. **Seed**: create the cluster again from the template with the restore-seed annotation:
//!    its first member restores the snapshot before etcd starts ([`crate::builders::seed_member`]),
//!    then the cluster grows to its size as usual;
//! 4. **Done** when it is Available with every member: status `succeeded`, the snapshot's
//!    path, revision and hash in both statuses.
//!
//! A clone (`spec.restoreInto`) takes the same steps without the replace: the named cluster
//! is only read (its spec is the template) and the new cluster is created under the new name,
//! seeded the same way (one seed path for both: `--bump-revision --mark-compacted` where the
//! line's tool has them). A cluster of the new name that this restore did not create is never
//! touched: the restore fails with `ClusterExists`.
//!
//! Each step is chosen from what is observed ([`next_step`], pure), so a restart of the
//! controller at any point resumes where it stopped.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Txn, TxnOp};
use futures::TryStreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, ResourceExt as _};
use object_store::{ObjectStore, ObjectStoreExt as _};
use serde_json::json;
use tracing::{info, warn};

use etcd_shared::names::{ANNOTATION_RECOVER, ANNOTATION_RESTORE_SEED, ANNOTATION_ROTATE_CA};
use etcd_shared::types::storage::PVC_STORAGE_TYPE;
use etcd_shared::types::{
    ClusterPhase, ClusterTemplate, EtcdCluster, EtcdRestore, EtcdRestoreStatus, RestoreSeed,
};

use super::error::BackupError;
use super::{claim_restore, continuous};
use crate::backoff::Backoff;
use crate::builders::OperatorImage;
use crate::conditions::{self, Stamp, bounded_message};
use crate::controller_loop::{Reconciled, object_key as key};
use crate::error::Error;
use crate::events::Events;
use crate::idempotent;
use crate::metrics::backup::BackupMetrics;
use crate::snapshot::cluster::{
    CheckedSource, credentials, identities, lines_fit, member_access, most_advanced_member,
};
use crate::snapshot::segments;
use crate::snapshot::store::{self, StoreLocation, StoreTimeouts};
use crate::snapshot::transfer::{self, TransferError};
use crate::status_writer::write_status;

/// Condition type: the snapshot was downloaded and checked.
pub const VERIFIED: &str = "Verified";
/// Condition type: the cluster runs on the restored data.
pub const RESTORED: &str = "Restored";

/// Timeout of each etcd call of a replay (`spec.toRevision`).
const REPLAY_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a restore in progress looks again (the cluster's own changes do not wake it).
const POLL: Duration = Duration::from_secs(2);

/// Held on an EtcdRestore from the moment it deletes the cluster it replaces until the restored
/// cluster exists: the restore's status is the only copy of the cluster's spec in between, so
/// deleting the EtcdRestore then would lose both. A restore deleted in that window finishes
/// creating the cluster first.
pub const RESTORE_FINALIZER: &str = "etcd.database.coreos.com/restore-in-progress";

/// The next step of a restore, from what is observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreStep {
    /// Finished (succeeded): nothing more, ever. A new restore is a new EtcdRestore.
    Done,
    /// Download and check the snapshot, record the template.
    Verify,
    /// Delete the cluster being replaced (this UID only).
    DeleteOld(String),
    /// The replaced cluster is still terminating.
    WaitGone,
    /// Create the restored cluster.
    CreateNew,
    /// The restored cluster is growing.
    WaitReady,
    /// The restored cluster is Available with every member.
    Finish,
    /// A cluster of that name exists that is neither the replaced one nor this restore's.
    Conflict(String),
    /// The cluster to restore does not exist and nothing was recorded of it.
    NoCluster,
    /// A clone's new name is taken by a cluster this restore did not create.
    Exists(String),
}

/// Whether the restored cluster is Available with all its members.
fn restored_and_ready(cluster: &EtcdCluster) -> bool {
    let Some(status) = cluster.status.as_ref() else {
        return false;
    };
    let size = cluster.spec.size.unwrap_or(0);
    status.phase == Some(ClusterPhase::Running)
        && status.ready_members == Some(size)
        && status
            .conditions
            .iter()
            .any(|c| c.type_ == "Available" && c.status == "True")
}

/// The restore this cluster was seeded by, if any.
fn seeded_by(cluster: &EtcdCluster) -> Option<String> {
    let value = cluster.annotations().get(ANNOTATION_RESTORE_SEED)?;
    RestoreSeed::parse(value).ok().map(|s| s.restore)
}

/// The next step of `restore` given the cluster it restores into (`spec.target()`), if any.
pub fn next_step(restore: &EtcdRestore, cluster: Option<&EtcdCluster>) -> RestoreStep {
    let status = restore.status.as_ref();
    if status.is_some_and(|s| s.succeeded) {
        return RestoreStep::Done;
    }
    if restore.spec.is_clone() {
        return next_clone_step(restore, cluster);
    }
    let replaced = status.and_then(|s| s.replaced_cluster_uid.clone());
    let verified = status.is_some_and(|s| s.template.is_some()) && replaced.is_some();
    let Some(cluster) = cluster else {
        return if verified {
            RestoreStep::CreateNew
        } else {
            RestoreStep::NoCluster
        };
    };
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    if !verified {
        if seeded_by(cluster).as_deref() == Some(restore.name_any().as_str()) {
            // Our own cluster, with our status lost: nothing to verify against any more.
            return RestoreStep::WaitReady;
        }
        return RestoreStep::Verify;
    }
    if Some(&uid) == replaced.as_ref() {
        return if cluster.metadata.deletion_timestamp.is_some() {
            RestoreStep::WaitGone
        } else {
            RestoreStep::DeleteOld(uid)
        };
    }
    if seeded_by(cluster).as_deref() == Some(restore.name_any().as_str()) {
        return if restored_and_ready(cluster) {
            RestoreStep::Finish
        } else {
            RestoreStep::WaitReady
        };
    }
    RestoreStep::Conflict(format!(
        "EtcdCluster {} (uid {uid}) was created by someone else after the restore replaced the old one",
        cluster.name_any()
    ))
}

/// The next step of a clone given the cluster of its new name, if any: nothing is deleted, and
/// a cluster of that name that this restore did not seed is left alone.
fn next_clone_step(restore: &EtcdRestore, cluster: Option<&EtcdCluster>) -> RestoreStep {
    let verified = restore
        .status
        .as_ref()
        .is_some_and(|s| s.template.is_some());
    match cluster {
        Some(cluster) if seeded_by(cluster).as_deref() == Some(restore.name_any().as_str()) => {
            if restored_and_ready(cluster) {
                RestoreStep::Finish
            } else {
                RestoreStep::WaitReady
            }
        }
        Some(cluster) => RestoreStep::Exists(format!(
            "EtcdCluster {} exists already (uid {}): a clone creates a new cluster and never overwrites one; create a new EtcdRestore with another spec.restoreInto",
            cluster.name_any(),
            cluster.metadata.uid.as_deref().unwrap_or_default()
        )),
        None if verified => RestoreStep::CreateNew,
        None => RestoreStep::Verify,
    }
}

/// What every restore reconcile shares.
pub struct RestoreReconciler {
    client: kube::Client,
    metrics: BackupMetrics,
    recorder: Recorder,
    store: StoreTimeouts,
    policy: etcd_shared::admission::AdmissionPolicy,
    backoff: Backoff,
    restore_image: Option<OperatorImage>,
}

impl RestoreReconciler {
    /// A reconciler publishing events as `reporter`, reading cluster specs with `policy`;
    /// `restore_image` is the controller's `--restore-image` (restores are refused without).
    pub fn new(
        client: kube::Client,
        metrics: BackupMetrics,
        reporter: Reporter,
        policy: etcd_shared::admission::AdmissionPolicy,
        restore_image: Option<OperatorImage>,
    ) -> Self {
        RestoreReconciler {
            recorder: Recorder::new(client.clone(), reporter),
            backoff: Backoff::new(Duration::from_secs(5), Duration::from_secs(300)),
            store: StoreTimeouts::default(),
            client,
            metrics,
            policy,
            restore_image,
        }
    }

    /// The Events of `restore`.
    fn events(&self, restore: &EtcdRestore) -> Events<'_> {
        Events::of(&self.recorder, restore)
    }
}

impl Reconciled for RestoreReconciler {
    type Object = EtcdRestore;
    type Error = BackupError;
    const KIND: &'static str = "EtcdRestore";

    fn reconcile(
        self: Arc<Self>,
        restore: Arc<EtcdRestore>,
    ) -> impl std::future::Future<Output = Result<Action, BackupError>> + Send + 'static {
        reconcile(restore, self)
    }

    fn retry(&self, restore: &EtcdRestore, error: &BackupError) -> Action {
        let delay = self.backoff.failed(&key(restore));
        warn!(restore = %key(restore), %error, retry_in = ?delay, "restore step failed; retrying");
        Action::requeue(delay)
    }

    fn forget(&self, namespace: &str, name: &str) {
        self.backoff
            .succeeded(&crate::object_key::ObjectKey::new(namespace, name));
    }
}

async fn reconcile(
    restore: Arc<EtcdRestore>,
    r: Arc<RestoreReconciler>,
) -> Result<Action, BackupError> {
    let namespace = restore.namespace().unwrap_or_default();
    let target = restore.spec.target().to_string();
    let clusters: Api<EtcdCluster> = Api::namespaced(r.client.clone(), &namespace);
    let cluster = clusters
        .get_opt(&target)
        .await
        .map_err(Error::kube(format!("get EtcdCluster {target}")))?;
    let step = next_step(&restore, cluster.as_ref());
    tracing::debug!(restore = %key(&*restore), ?step, "restore step");
    if restore.metadata.deletion_timestamp.is_some() {
        return finish_deleted(&r, &restore, &clusters, &namespace, step).await;
    }
    match step {
        RestoreStep::Done => Ok(Action::await_change()),
        RestoreStep::NoCluster => {
            no_cluster(&r, &restore).await;
            Ok(Action::requeue(Duration::from_secs(30)))
        }
        RestoreStep::Exists(message) => {
            fail(&r, &restore, "ClusterExists", &message, RESTORED).await;
            Ok(Action::await_change())
        }
        RestoreStep::Conflict(message) => {
            fail(&r, &restore, "ClusterReplaced", &message, RESTORED).await;
            Ok(Action::await_change())
        }
        RestoreStep::Verify => {
            // The template: the cluster itself (a roll back), or the one cloned.
            let source = if restore.spec.is_clone() {
                let name = &restore.spec.etcd_cluster.name;
                clusters
                    .get_opt(name)
                    .await
                    .map_err(Error::kube(format!("get EtcdCluster {name}")))?
            } else {
                cluster
            };
            let Some(cluster) = source else {
                no_cluster(&r, &restore).await;
                return Ok(Action::requeue(Duration::from_secs(30)));
            };
            if r.restore_image.is_none() {
                let message = "the controller runs without --restore-image (the chart sets it), so it cannot seed a restored member; the cluster is untouched";
                fail(&r, &restore, "NoRestoreImage", message, VERIFIED).await;
                return Ok(Action::await_change());
            }
            match verify(&r, &restore, &cluster).await {
                Ok(None) => Ok(Action::requeue(claim_restore::POLL)),
                Ok(Some(status)) => {
                    write_status(&r.client, &*restore, &status).await?;
                    let verified = status.conditions.iter().find(|c| c.type_ == VERIFIED);
                    let note = verified.map(|c| c.message.clone()).unwrap_or_default();
                    r.events(&restore).normal("SnapshotVerified", note).await;
                    Ok(Action::requeue(Duration::ZERO))
                }
                Err(error) => {
                    let reason = error.reason();
                    fail(&r, &restore, reason, &error.to_string(), VERIFIED).await;
                    r.metrics.restored(false);
                    error.into_action()
                }
            }
        }
        RestoreStep::DeleteOld(uid) => {
            // From here until the restored cluster exists, this restore's status is the only
            // copy of the cluster's spec.
            set_finalizer(&r.client, &restore, true).await?;
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::foreground()
            };
            match clusters.delete(&target, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(Error::kube(format!("delete EtcdCluster {target}"))(e).into()),
            }
            info!(restore = %key(&*restore), cluster = %target, %uid, "the snapshot checked; the cluster it replaces is being deleted");
            let note = format!(
                "deleting EtcdCluster {target} (uid {uid}) to restore it from the verified snapshot"
            );
            r.events(&restore).normal("ClusterReplaced", note).await;
            Ok(Action::requeue(POLL))
        }
        RestoreStep::WaitGone | RestoreStep::WaitReady => Ok(Action::requeue(POLL)),
        RestoreStep::CreateNew => {
            create_restored(&r, &restore, &clusters, &namespace).await?;
            Ok(Action::requeue(POLL))
        }
        RestoreStep::Finish => {
            let mut status = restore.status.clone().unwrap_or_default();
            let target_revision = status.target_revision.or(restore.spec.to_revision);
            if let (true, Some(target), Some(cluster)) = (
                restore.spec.is_point_in_time(),
                target_revision,
                cluster.as_ref(),
            ) && status.replayed_revision != Some(target)
            {
                let started = std::time::Instant::now();
                match replay(&r, &restore, cluster, target).await {
                    Ok(written) => {
                        status.replayed_revision = Some(target);
                        write_status(&r.client, &*restore, &status).await?;
                        let note = format!(
                            "{written} revisions after the snapshot replayed up to revision {target} in {:.1} s",
                            started.elapsed().as_secs_f64()
                        );
                        info!(restore = %key(&*restore), written, target, "continuous backup replayed");
                        r.events(&restore).normal("Replayed", note).await;
                    }
                    Err(error) => {
                        let reason = error.reason();
                        fail(&r, &restore, reason, &error.to_string(), RESTORED).await;
                        return error.into_action();
                    }
                }
            }
            if let Some(cluster) = cluster.as_ref() {
                release_clients(&clusters, cluster).await?;
            }
            status.succeeded = true;
            status.reason = None;
            let mut message = format!(
                "EtcdCluster {target} is Running on the snapshot {} (revision {})",
                status.snapshot_path.clone().unwrap_or_default(),
                status
                    .snapshot_revision
                    .map_or("unknown".to_string(), |r| r.to_string())
            );
            if let Some(replayed) = status.replayed_revision {
                message.push_str(&format!(
                    " and the continuous backup's changes up to revision {replayed}"
                ));
            }
            let at = Stamp::new(restore.metadata.generation, Timestamp::now());
            let restored = at.condition(RESTORED, true, "Restored", message.clone());
            conditions::replace(&mut status.conditions, vec![restored]);
            write_status(&r.client, &*restore, &status).await?;
            set_finalizer(&r.client, &restore, false).await?;
            r.metrics.restored(true);
            r.backoff.succeeded(&key(&*restore));
            r.events(&restore).normal("Restored", message).await;
            Ok(Action::await_change())
        }
    }
}

/// Records that the cluster named in `spec.etcdCluster.name` is not there to be the template.
async fn no_cluster(r: &RestoreReconciler, restore: &EtcdRestore) {
    let source = &restore.spec.etcd_cluster.name;
    let message = if restore.spec.is_clone() {
        format!(
            "EtcdCluster {source:?} not found in this namespace: a clone takes its spec as the template of the new cluster"
        )
    } else {
        format!(
            "EtcdCluster {source:?} not found in this namespace: a restore replaces an existing cluster, whose spec is the template"
        )
    };
    fail(r, restore, "ClusterNotFound", &message, VERIFIED).await;
}

/// Creates the restored cluster from the recorded template (one that exists already is fine).
async fn create_restored(
    r: &RestoreReconciler,
    restore: &EtcdRestore,
    clusters: &Api<EtcdCluster>,
    namespace: &str,
) -> Result<(), BackupError> {
    let target = restore.spec.target().to_string();
    let mut new = restored_cluster(restore, namespace)?;
    if restore.metadata.deletion_timestamp.is_some()
        && let Some(a) = new.metadata.annotations.as_mut()
    {
        // Deleted during the replacement: nothing will replay, the snapshot is what it serves.
        a.remove(etcd_shared::names::ANNOTATION_HOLD_CLIENTS);
    }
    idempotent::create(clusters, &new, format!("EtcdCluster {target}")).await?;
    let note = format!("EtcdCluster {target} created; its first member restores the snapshot");
    r.events(restore).normal("ClusterCreated", note).await;
    Ok(())
}

/// A restore deleted by its user: nothing new is started (the cluster it was about to replace
/// stays), but a replacement under way is finished first: once the old cluster is deleted the
/// restore's status is the only copy of its spec, so the cluster is created from it before the
/// finalizer lets the EtcdRestore go.
async fn finish_deleted(
    r: &RestoreReconciler,
    restore: &EtcdRestore,
    clusters: &Api<EtcdCluster>,
    namespace: &str,
    step: RestoreStep,
) -> Result<Action, BackupError> {
    let held = restore.finalizers().iter().any(|f| f == RESTORE_FINALIZER);
    if !held {
        return Ok(Action::await_change());
    }
    match step {
        RestoreStep::WaitGone => Ok(Action::requeue(POLL)),
        RestoreStep::CreateNew => {
            create_restored(r, restore, clusters, namespace).await?;
            info!(restore = %key(restore), "deleted during the replacement: the restored cluster is created before it goes");
            set_finalizer(&r.client, restore, false).await?;
            Ok(Action::await_change())
        }
        _ => {
            set_finalizer(&r.client, restore, false).await?;
            Ok(Action::await_change())
        }
    }
}

/// Lets clients into the restored cluster once its replay is done: removes
/// [`etcd_shared::names::ANNOTATION_HOLD_CLIENTS`] (nothing to do without it).
async fn release_clients(
    clusters: &Api<EtcdCluster>,
    cluster: &EtcdCluster,
) -> Result<(), BackupError> {
    if !cluster
        .annotations()
        .contains_key(etcd_shared::names::ANNOTATION_HOLD_CLIENTS)
    {
        return Ok(());
    }
    let name = cluster.name_any();
    let patch = serde_json::json!({
        "metadata": {"annotations": {etcd_shared::names::ANNOTATION_HOLD_CLIENTS: null}}
    });
    clusters
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube(format!("let clients into EtcdCluster {name}")))?;
    Ok(())
}

/// Adds (`hold`) or removes [`RESTORE_FINALIZER`] on the restore, keeping others' finalizers;
/// the write carries the restore's resourceVersion, so a concurrent change is retried.
async fn set_finalizer(
    client: &kube::Client,
    restore: &EtcdRestore,
    hold: bool,
) -> Result<(), BackupError> {
    let mut finalizers: Vec<String> = restore.finalizers().to_vec();
    let held = finalizers.iter().any(|f| f == RESTORE_FINALIZER);
    if held == hold {
        return Ok(());
    }
    if hold {
        finalizers.push(RESTORE_FINALIZER.to_string());
    } else {
        finalizers.retain(|f| f != RESTORE_FINALIZER);
    }
    let api: Api<EtcdRestore> =
        Api::namespaced(client.clone(), &restore.namespace().unwrap_or_default());
    let patch = json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": restore.metadata.resource_version,
        }
    });
    match api
        .patch(
            &restore.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!(
            "set the finalizer of EtcdRestore {}",
            restore.name_any()
        ))(e)
        .into()),
    }
}

/// The bucket of a restore's source.
async fn open_bucket(
    r: &RestoreReconciler,
    restore: &EtcdRestore,
) -> Result<(StoreLocation, Arc<dyn ObjectStore>), BackupError> {
    let namespace = restore.namespace().unwrap_or_default();
    let spec = &restore.spec;
    let location = StoreLocation::from_source(&spec.backup_storage_type, &spec.source)?;
    let credentials = credentials(&r.client, &namespace, &location).await?;
    let bucket = store::open(&location, &credentials, r.store)?;
    Ok((location, bucket))
}

/// What a restore of the continuous backup `prefix` to `target` restores and replays, as the
/// store holds it now.
async fn point_in_time_plan(
    bucket: &Arc<dyn ObjectStore>,
    prefix: &str,
    target: i64,
) -> Result<segments::Plan, BackupError> {
    let (snapshots, segs) = continuous::listing(bucket, prefix)
        .await
        .map_err(TransferError::from)?;
    let markers = continuous::markers(bucket, prefix)
        .await
        .map_err(TransferError::from)?;
    Ok(segments::plan(prefix, &snapshots, &markers, &segs, target)?)
}

/// How far a segment's store time may be behind the controller's clock (a store's and the
/// controller's clocks differ): segments written more than this before `toTime` are not read
/// when looking for it.
const CLOCK_SKEW_MS: i64 = 60_000;

/// The revision `toTime` (`time`) maps to in the continuous backup `prefix`: the last one
/// received at or before it ([`segments::revision_at`]), reading the segments from the last
/// one written before it (by the store's times, less [`CLOCK_SKEW_MS`]) on.
async fn revision_at_time(
    bucket: &Arc<dyn ObjectStore>,
    prefix: &str,
    time: &str,
) -> Result<i64, BackupError> {
    let at = time
        .parse::<Timestamp>()
        .map_err(|_| segments::SegmentError::BadTime(time.to_string()))?;
    let at_ms = at.as_millisecond();
    let dir = segments::segments_dir(prefix);
    let listed: Vec<_> = bucket
        .list(Some(&object_store::path::Path::from(dir.as_str())))
        .try_collect()
        .await
        .map_err(TransferError::from)?;
    let mut found: Vec<((String, i64, i64), i64)> = listed
        .iter()
        .filter_map(|meta| {
            let key = meta.location.to_string();
            let (first, last) = segments::parse_segment(prefix, &key)?;
            Some(((key, first, last), meta.last_modified.timestamp_millis()))
        })
        .collect();
    found.sort_by_key(|((_, first, last), _)| (*first, *last));
    for (segment, written_ms) in &found {
        if *written_ms < at_ms - CLOCK_SKEW_MS {
            continue;
        }
        let records = read_segment(bucket, segment).await?;
        if let Some(revision) = segments::revision_at(&records, at_ms) {
            return Ok(revision);
        }
    }
    Err(segments::SegmentError::TimeNotStreamed(time.to_string()).into())
}

/// The records of one segment of `plan`, read and checked.
async fn read_segment(
    bucket: &Arc<dyn ObjectStore>,
    (key, first, last): &(String, i64, i64),
) -> Result<Vec<segments::Record>, BackupError> {
    let body = bucket
        .get(&transfer::object_path(key)?)
        .await
        .map_err(TransferError::from)?
        .bytes()
        .await
        .map_err(TransferError::from)?;
    segments::decode(&body, *first, *last).map_err(|e| {
        BackupError::PointInTime(segments::SegmentError::Format(format!("{key}: {e}")))
    })
}

/// Reads the snapshot in the object store (S3, ABS or GCS) through and checks it; for a
/// restore to a revision, the snapshot the plan chose, and every segment it replays.
async fn check_object(
    r: &RestoreReconciler,
    restore: &EtcdRestore,
) -> Result<(CheckedSource, Option<segments::Plan>), BackupError> {
    let namespace = restore.namespace().unwrap_or_default();
    let spec = &restore.spec;
    let (location, bucket) = open_bucket(r, restore).await?;
    let identities = match &spec.encryption {
        Some(e) => Some(identities(&r.client, &namespace, &e.identity_secret).await?),
        None => None,
    };
    let target = match (spec.to_revision, &spec.to_time) {
        (Some(revision), _) => Some(revision),
        (None, Some(time)) => Some(revision_at_time(&bucket, &location.key, time).await?),
        (None, None) => None,
    };
    let (key, plan) = match target {
        Some(target) => {
            let plan = point_in_time_plan(&bucket, &location.key, target).await?;
            for segment in &plan.segments {
                read_segment(&bucket, segment).await?;
            }
            (plan.snapshot.clone(), Some(plan))
        }
        None => (location.key.clone(), None),
    };
    let (checked, info) = transfer::verify(&bucket, &key, None, identities.as_ref()).await?;
    Ok((
        CheckedSource {
            path: location.display(&key),
            size: checked.size,
            sha256: checked.sha256,
            revision: info.revision,
            etcd_version: info.etcd_version,
        },
        plan,
    ))
}

/// Writes the changes the continuous backup recorded after the restored snapshot, up to
/// `target`, into the restored `cluster`: one transaction per original revision, in order.
/// Run again from the start after any failure (a put or a delete written twice ends the
/// same). The snapshot must be the one checked and seeded. Returns the revisions written.
async fn replay(
    r: &RestoreReconciler,
    restore: &EtcdRestore,
    cluster: &EtcdCluster,
    target: i64,
) -> Result<usize, BackupError> {
    let (location, bucket) = open_bucket(r, restore).await?;
    let plan = point_in_time_plan(&bucket, &location.key, target).await?;
    let seeded = restore
        .status
        .as_ref()
        .and_then(|s| s.snapshot_path.clone());
    let chosen = location.display(&plan.snapshot);
    if seeded.as_deref() != Some(chosen.as_str()) {
        return Err(BackupError::Replay(format!(
            "the store changed since the check: the cluster was seeded from {}, the plan now starts from {chosen}",
            seeded.unwrap_or_default()
        )));
    }
    let view = crate::builders::ClusterView::new(cluster, &r.policy)
        .map_err(BackupError::invalid(cluster.name_any()))?;
    let access = member_access(
        &r.client,
        &view,
        view.tls.operator_secret.as_deref(),
        REPLAY_TIMEOUT,
    )
    .await?;
    let (endpoint, _, _) = most_advanced_member(&r.client, &view, &access).await?;
    let mut etcd = access.connection(&endpoint).await?;
    let mut written = 0usize;
    for segment in &plan.segments {
        let records = read_segment(&bucket, segment).await?;
        for record in segments::replayed(&plan, &records) {
            let mut ops = Vec::with_capacity(record.ops.len());
            for op in &record.ops {
                let key = op.key()?;
                ops.push(match op.value()? {
                    Some(value) => TxnOp::put(key, value, None),
                    None => TxnOp::delete(key, None),
                });
            }
            etcd.txn(Txn::new().and_then(ops)).await.map_err(|e| {
                BackupError::Replay(format!("revision {} at {endpoint}: {e}", record.rev))
            })?;
            written += 1;
        }
    }
    Ok(written)
}

/// Reads the snapshot through and checks it (S3, ABS, GCS: here; PVC: in a pod that mounts
/// the claim read-only, `None` while it runs); the status to record before anything is
/// touched.
async fn verify(
    r: &RestoreReconciler,
    restore: &EtcdRestore,
    cluster: &EtcdCluster,
) -> Result<Option<EtcdRestoreStatus>, BackupError> {
    let view = crate::builders::ClusterView::new(cluster, &r.policy)
        .map_err(BackupError::invalid(cluster.name_any()))?;
    let mut segments_found = None;
    let checked = if restore.spec.backup_storage_type == PVC_STORAGE_TYPE {
        if restore.spec.encryption.is_some() {
            return Err(BackupError::EncryptedPvc);
        }
        let image = r.restore_image.clone().ok_or(BackupError::NoImage)?;
        match claim_restore::verify_step(&r.client, &image, restore).await? {
            Some(checked) => checked,
            None => return Ok(None),
        }
    } else {
        let (checked, plan) = check_object(r, restore).await?;
        segments_found = plan.map(|p| (p.segments.len(), p.target));
        checked
    };
    let info = &checked;
    lines_fit(info.etcd_version.as_deref(), &view.version)
        .map_err(BackupError::invalid(cluster.name_any()))?;
    let mut annotations = cluster.annotations().clone();
    annotations.remove(ANNOTATION_RESTORE_SEED);
    annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    if restore.spec.is_clone() {
        // Requests to the source cluster, not part of its template.
        annotations.remove(ANNOTATION_RECOVER);
        annotations.remove(ANNOTATION_ROTATE_CA);
    }
    let mut status = restore.status.clone().unwrap_or_default();
    status.succeeded = false;
    status.reason = None;
    status.snapshot_path = Some(checked.path.clone());
    status.snapshot_revision = info.revision;
    status.snapshot_etcd_version = info.etcd_version.clone();
    status.snapshot_sha256 = Some(checked.sha256.clone());
    // A clone replaces nothing: the source is only read.
    status.replaced_cluster_uid = if restore.spec.is_clone() {
        None
    } else {
        cluster.metadata.uid.clone()
    };
    status.restored_cluster = Some(restore.spec.target().to_string());
    status.template = Some(ClusterTemplate {
        labels: cluster.labels().clone(),
        annotations,
        spec: cluster.spec.clone(),
    });
    status.observed_generation = restore.metadata.generation;
    status.segments = segments_found.and_then(|(n, _)| i64::try_from(n).ok());
    status.target_revision = segments_found.map(|(_, target)| target);
    status.replayed_revision = None;
    let mut message = format!(
        "{} checked: {} bytes, sha256 {}, etcd {} at revision {}",
        checked.path,
        checked.size,
        checked.sha256,
        info.etcd_version.as_deref().unwrap_or("(not recorded)"),
        info.revision
            .map_or("(not recorded)".to_string(), |r| r.to_string())
    );
    if let Some((n, target)) = segments_found {
        message.push_str(&format!(
            "; {n} continuous segments read and checked, replayed up to revision {target} once the cluster runs"
        ));
    }
    let at = Stamp::new(restore.metadata.generation, Timestamp::now());
    let verified = at.condition(VERIFIED, true, "SnapshotVerified", message);
    conditions::replace(&mut status.conditions, vec![verified]);
    Ok(Some(status))
}

/// The cluster to create: the template, with the seed annotation.
fn restored_cluster(restore: &EtcdRestore, namespace: &str) -> Result<EtcdCluster, BackupError> {
    let status = restore.status.clone().unwrap_or_default();
    let template = status.template.clone().ok_or(BackupError::NoSource)?;
    let source = restore
        .spec
        .source
        .only(&restore.spec.backup_storage_type)
        .ok_or(BackupError::NoSource)?;
    // A restore to a revision names the backup's prefix: the seed is the snapshot chosen.
    let source = match (restore.spec.is_point_in_time(), &status.snapshot_path) {
        (true, Some(path)) => with_path(source, path),
        (true, None) => return Err(BackupError::NoSource),
        (false, _) => source,
    };
    let seed = RestoreSeed {
        restore: restore.name_any(),
        source,
        sha256: status.snapshot_sha256.clone().unwrap_or_default(),
        revision: status.snapshot_revision,
        etcd_version: status.snapshot_etcd_version.clone(),
        identity_secret: restore
            .spec
            .encryption
            .as_ref()
            .map(|e| e.identity_secret.clone())
            .unwrap_or_default(),
    };
    let mut annotations = template.annotations.clone();
    annotations.insert(ANNOTATION_RESTORE_SEED.into(), seed.to_annotation());
    // A point-in-time restore replays its changes once the cluster runs: no client is let in
    // before (it would read the snapshot's older data, or write what the replay overwrites).
    annotations.remove(etcd_shared::names::ANNOTATION_HOLD_CLIENTS);
    if restore.spec.is_point_in_time() {
        annotations.insert(
            etcd_shared::names::ANNOTATION_HOLD_CLIENTS.into(),
            restore.name_any(),
        );
    }
    let name = restore.spec.target();
    let mut cluster = EtcdCluster::new(name, template.spec.clone());
    cluster.metadata = ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(namespace.to_string()),
        labels: (!template.labels.is_empty()).then(|| template.labels.clone()),
        annotations: Some(annotations),
        ..ObjectMeta::default()
    };
    Ok(cluster)
}

/// `source` (one object store's) with `path` (`BUCKET/KEY`) instead of its own.
fn with_path(
    mut source: etcd_shared::types::StorageSource,
    path: &str,
) -> etcd_shared::types::StorageSource {
    if let Some(s3) = source.s3.as_mut() {
        s3.path = path.to_string();
    }
    if let Some(abs) = source.abs.as_mut() {
        abs.path = path.to_string();
    }
    if let Some(gcs) = source.gcs.as_mut() {
        gcs.path = path.to_string();
    }
    source
}

/// Records a failure (the live cluster untouched when it happens before the replace step).
async fn fail(
    r: &RestoreReconciler,
    restore: &EtcdRestore,
    reason: &str,
    message: &str,
    condition: &str,
) {
    let mut status = restore.status.clone().unwrap_or_default();
    status.succeeded = false;
    // One bounded line: a store's answer can be a multi-line XML document.
    let message = bounded_message(message.to_string());
    status.reason = Some(format!("{reason}: {message}"));
    let at = Stamp::new(restore.metadata.generation, Timestamp::now());
    let failed = at.condition(condition, false, reason, message.clone());
    conditions::replace(&mut status.conditions, vec![failed]);
    if let Err(e) = write_status(&r.client, restore, &status).await {
        warn!(restore = %key(restore), error = %e, "could not write the restore's status");
    }
    r.events(restore).warning(reason, message).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_shared::types::{EtcdClusterStatus, EtcdRestoreSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn restore(status: Option<EtcdRestoreStatus>) -> EtcdRestore {
        let mut r = EtcdRestore::new("r1", EtcdRestoreSpec::default());
        r.metadata.namespace = Some("ns".into());
        r.status = status;
        r
    }

    fn recorded(uid: &str) -> EtcdRestoreStatus {
        EtcdRestoreStatus {
            replaced_cluster_uid: Some(uid.into()),
            template: Some(ClusterTemplate::default()),
            ..EtcdRestoreStatus::default()
        }
    }

    fn cluster(uid: &str, seed_of: Option<&str>, deleting: bool, ready: bool) -> EtcdCluster {
        let mut c = EtcdCluster::new("c", Default::default());
        c.spec.size = Some(3);
        c.metadata.uid = Some(uid.into());
        if deleting {
            c.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        }
        if let Some(restore) = seed_of {
            let seed = RestoreSeed {
                restore: restore.into(),
                ..RestoreSeed::default()
            };
            c.metadata.annotations =
                Some([(ANNOTATION_RESTORE_SEED.to_string(), seed.to_annotation())].into());
        }
        if ready {
            c.status = Some(EtcdClusterStatus {
                phase: Some(ClusterPhase::Running),
                ready_members: Some(3),
                conditions: vec![Condition {
                    type_: "Available".into(),
                    status: "True".into(),
                    reason: "r".into(),
                    message: String::new(),
                    observed_generation: None,
                    last_transition_time: Time(Timestamp::UNIX_EPOCH),
                }],
                ..EtcdClusterStatus::default()
            });
        }
        c
    }

    #[test]
    fn each_step_follows_from_what_is_observed() {
        let done = EtcdRestoreStatus {
            succeeded: true,
            ..recorded("old")
        };
        let cases: Vec<(&str, EtcdRestore, Option<EtcdCluster>, RestoreStep)> = vec![
            (
                "finished",
                restore(Some(done)),
                Some(cluster("new", Some("r1"), false, true)),
                RestoreStep::Done,
            ),
            (
                "no cluster, nothing recorded",
                restore(None),
                None,
                RestoreStep::NoCluster,
            ),
            (
                "live cluster, not yet checked",
                restore(None),
                Some(cluster("old", None, false, true)),
                RestoreStep::Verify,
            ),
            (
                "a failed check is retried",
                restore(Some(EtcdRestoreStatus {
                    reason: Some("x".into()),
                    ..Default::default()
                })),
                Some(cluster("old", None, false, true)),
                RestoreStep::Verify,
            ),
            (
                "checked: delete the old one",
                restore(Some(recorded("old"))),
                Some(cluster("old", None, false, true)),
                RestoreStep::DeleteOld("old".into()),
            ),
            (
                "old one terminating",
                restore(Some(recorded("old"))),
                Some(cluster("old", None, true, true)),
                RestoreStep::WaitGone,
            ),
            (
                "old one gone",
                restore(Some(recorded("old"))),
                None,
                RestoreStep::CreateNew,
            ),
            (
                "ours, growing",
                restore(Some(recorded("old"))),
                Some(cluster("new", Some("r1"), false, false)),
                RestoreStep::WaitReady,
            ),
            (
                "ours, ready",
                restore(Some(recorded("old"))),
                Some(cluster("new", Some("r1"), false, true)),
                RestoreStep::Finish,
            ),
            (
                "ours, status lost",
                restore(None),
                Some(cluster("new", Some("r1"), false, false)),
                RestoreStep::WaitReady,
            ),
        ];
        for (name, r, c, want) in cases {
            assert_eq!(next_step(&r, c.as_ref()), want, "{name}");
        }
        let other = next_step(
            &restore(Some(recorded("old"))),
            Some(&cluster("else", Some("r2"), false, true)),
        );
        assert!(matches!(other, RestoreStep::Conflict(_)), "{other:?}");
        let by_hand = next_step(
            &restore(Some(recorded("old"))),
            Some(&cluster("else", None, false, true)),
        );
        assert!(matches!(by_hand, RestoreStep::Conflict(_)), "{by_hand:?}");
    }

    /// A clone's cluster takes the new name with the template's spec and the seed annotation
    /// naming the restore: the one seed path (bump-revision) of a roll back.
    #[test]
    fn a_clone_is_created_under_its_new_name_with_the_seed() {
        let mut r = restore(Some(EtcdRestoreStatus {
            template: Some(ClusterTemplate {
                labels: [("team".to_string(), "db".to_string())].into(),
                annotations: Default::default(),
                spec: etcd_shared::types::EtcdClusterSpec {
                    size: Some(3),
                    ..Default::default()
                },
            }),
            snapshot_sha256: Some("ab".repeat(32)),
            snapshot_revision: Some(42),
            ..EtcdRestoreStatus::default()
        }));
        r.spec.etcd_cluster.name = "src".into();
        r.spec.restore_into = Some("copy".into());
        r.spec.backup_storage_type = "S3".into();
        r.spec.source.s3 = Some(etcd_shared::types::storage::S3Source {
            path: "b/k".into(),
            aws_secret: "aws".into(),
            ..Default::default()
        });
        let made = restored_cluster(&r, "ns").expect("a cluster");
        assert_eq!(made.name_any(), "copy");
        assert_eq!(made.namespace().as_deref(), Some("ns"));
        assert_eq!(made.spec.size, Some(3));
        assert_eq!(made.labels().get("team").map(String::as_str), Some("db"));
        assert_eq!(seeded_by(&made).as_deref(), Some("r1"));
        let seed = RestoreSeed::parse(&made.annotations()[ANNOTATION_RESTORE_SEED]).expect("seed");
        assert_eq!(seed.revision, Some(42));
        assert_eq!(seed.source.s3.map(|s| s.path).as_deref(), Some("b/k"));
        // Without restoreInto the cluster keeps the name it restores.
        r.spec.restore_into = None;
        assert_eq!(
            restored_cluster(&r, "ns").expect("a cluster").name_any(),
            "src"
        );
    }

    /// A restore to a point in time names the backup's prefix; the cluster is seeded from the
    /// snapshot the check chose (`status.snapshotPath`), and never from the prefix itself.
    #[test]
    fn a_point_in_time_restore_seeds_the_chosen_snapshot() {
        let mut r = restore(Some(EtcdRestoreStatus {
            template: Some(ClusterTemplate::default()),
            snapshot_path: Some("b/k_v42_2026-12-07-05:00:00".into()),
            snapshot_sha256: Some("ab".repeat(32)),
            snapshot_revision: Some(42),
            target_revision: Some(50),
            ..EtcdRestoreStatus::default()
        }));
        r.spec.etcd_cluster.name = "src".into();
        r.spec.backup_storage_type = "S3".into();
        r.spec.to_revision = Some(50);
        r.spec.source.s3 = Some(etcd_shared::types::storage::S3Source {
            path: "b/k".into(),
            aws_secret: "aws".into(),
            ..Default::default()
        });
        let made = restored_cluster(&r, "ns").expect("a cluster");
        let seed = RestoreSeed::parse(&made.annotations()[ANNOTATION_RESTORE_SEED]).expect("seed");
        assert_eq!(
            seed.source.s3.map(|s| s.path).as_deref(),
            Some("b/k_v42_2026-12-07-05:00:00")
        );
        // Not checked yet: no seed from the prefix.
        r.status.as_mut().expect("status").snapshot_path = None;
        assert!(restored_cluster(&r, "ns").is_err());
        // toTime the same.
        r.spec.to_revision = None;
        r.spec.to_time = Some("2026-12-07T05:10:00Z".into());
        assert!(restored_cluster(&r, "ns").is_err());
    }

    /// A clone (`spec.restoreInto`) never deletes: it verifies, creates the new name, waits,
    /// and refuses a name taken by a cluster it did not seed.
    #[test]
    fn a_clone_creates_and_never_replaces() {
        let clone = |status: Option<EtcdRestoreStatus>| {
            let mut r = restore(status);
            r.spec.etcd_cluster.name = "src".into();
            r.spec.restore_into = Some("c".into());
            r
        };
        let checked = EtcdRestoreStatus {
            template: Some(ClusterTemplate::default()),
            ..EtcdRestoreStatus::default()
        };
        let cases: Vec<(&str, EtcdRestore, Option<EtcdCluster>, RestoreStep)> = vec![
            ("new name free", clone(None), None, RestoreStep::Verify),
            (
                "checked",
                clone(Some(checked.clone())),
                None,
                RestoreStep::CreateNew,
            ),
            (
                "ours, growing",
                clone(Some(checked.clone())),
                Some(cluster("new", Some("r1"), false, false)),
                RestoreStep::WaitReady,
            ),
            (
                "ours, ready",
                clone(Some(checked.clone())),
                Some(cluster("new", Some("r1"), false, true)),
                RestoreStep::Finish,
            ),
            (
                "ours, status lost",
                clone(None),
                Some(cluster("new", Some("r1"), false, false)),
                RestoreStep::WaitReady,
            ),
        ];
        for (name, r, c, want) in cases {
            assert_eq!(next_step(&r, c.as_ref()), want, "{name}");
        }
        for (status, other) in [
            (None, cluster("else", None, false, true)),
            (Some(checked.clone()), cluster("else", None, false, true)),
            (Some(checked), cluster("else", Some("r2"), false, true)),
        ] {
            let step = next_step(&clone(status), Some(&other));
            assert!(matches!(step, RestoreStep::Exists(_)), "{step:?}");
        }
    }
}
