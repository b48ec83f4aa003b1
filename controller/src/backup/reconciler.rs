//! The `EtcdBackup` reconciler: when a backup is due ([`schedule::next`]), it finds the cluster
//! the endpoints name (in the backup's namespace only), asks every running member its revision,
//! streams a snapshot from the member with the highest one into the bucket
//! ([`transfer::upload`]: completed only when etcd's hash checks), deletes periodic snapshots
//! beyond `maxBackups`, and reports the outcome in the status, an Event and the metrics.
//!
//! A backup of storage type PVC goes through a pod instead ([`super::claim_backup`]): the
//! same cluster, member, naming, status, Event and metrics, with the snapshot streamed and
//! checked by a pod that mounts the claim.
//!
//! Errors in the spec (endpoints naming no cluster, a bad path, a storage type without
//! support) are reported and wait for a spec change; everything else is retried with backoff.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use object_store::{ObjectStore, ObjectStoreExt as _};
use tracing::{info, warn};

use etcd_shared::types::EtcdBackup;
use etcd_shared::types::storage::PVC_STORAGE_TYPE;

use super::claim_backup::{self, Progress};
use super::config::BackupConfig;
use super::error::BackupError;
use super::schedule::{self, Next};
use super::{continuous, scratch, verify};
use crate::backoff::Backoff;
use crate::controller_loop::{Reconciled, object_key as key};
use crate::events::Events;
use crate::metrics::backup::BackupMetrics;
use crate::snapshot::cluster::{
    SnapshotSettings, Success, credentials, identities, recipients, snapshot_cluster, target,
};
use crate::snapshot::error::SnapshotError;
use crate::snapshot::keys;
use crate::snapshot::store::{self, StoreLocation};
use crate::snapshot::transfer::{self, TransferError};
use crate::status_writer::write_status;

/// What every backup reconcile shares.
pub struct BackupReconciler {
    pub(crate) client: kube::Client,
    metrics: BackupMetrics,
    recorder: Recorder,
    pub(crate) config: BackupConfig,
    backoff: Backoff,
    /// The continuous backups' tasks (`spec.continuous`).
    streams: continuous::Streams,
}

impl BackupReconciler {
    /// A reconciler publishing events as `reporter`.
    pub fn new(
        client: kube::Client,
        metrics: BackupMetrics,
        reporter: Reporter,
        config: BackupConfig,
    ) -> Self {
        BackupReconciler {
            recorder: Recorder::new(client.clone(), reporter),
            backoff: Backoff::new(config.base_backoff, config.max_backoff),
            client,
            metrics,
            config,
            streams: continuous::Streams::default(),
        }
    }
}

impl Reconciled for BackupReconciler {
    type Object = EtcdBackup;
    type Error = BackupError;
    const KIND: &'static str = "EtcdBackup";

    fn reconcile(
        self: Arc<Self>,
        backup: Arc<EtcdBackup>,
    ) -> impl std::future::Future<Output = Result<Action, BackupError>> + Send + 'static {
        reconcile(backup, self)
    }

    fn retry(&self, backup: &EtcdBackup, error: &BackupError) -> Action {
        let delay = self.backoff.failed(&key(backup));
        warn!(backup = %key(backup), %error, retry_in = ?delay, "backup failed; retrying");
        match schedule::period(&backup.spec, Timestamp::now()) {
            // A periodic backup never waits longer than its interval or its next time.
            Some(every) => Action::requeue(delay.min(every)),
            None => Action::requeue(delay),
        }
    }

    fn forget(&self, namespace: &str, name: &str) {
        self.streams
            .stop(&crate::object_key::ObjectKey::new(namespace, name));
        self.metrics.forget(namespace, name);
        self.backoff
            .succeeded(&crate::object_key::ObjectKey::new(namespace, name));
    }
}

async fn reconcile(
    backup: Arc<EtcdBackup>,
    r: Arc<BackupReconciler>,
) -> Result<Action, BackupError> {
    let generation = backup.metadata.generation;
    r.streams.ensure(&backup, &r.client, &r.config, &r.metrics);
    if let Some(request) = verify::requested(&backup) {
        return verify_on_request(&backup, &r, request).await;
    }
    let now = Timestamp::now();
    let created = backup.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let scheduled = match schedule::next(
        &backup.spec,
        backup.status.as_ref(),
        generation,
        created,
        now,
    ) {
        Next::Done => return Ok(Action::await_change()),
        Next::WaitFor(wait) => return Ok(Action::requeue(wait)),
        Next::BadSchedule(message) => {
            let status = schedule::failed(
                backup.status.as_ref(),
                "InvalidSchedule",
                &message,
                generation,
                now,
            );
            if backup.status.as_ref() != Some(&status) {
                write_status(&r.client, &*backup, &status).await?;
            }
            return Ok(Action::await_change());
        }
        Next::TakeNow => None,
        Next::TakeScheduled(due) => Some(due),
    };
    let limit = schedule::timeout(&backup.spec);
    let started = Instant::now();
    let outcome = if backup.spec.storage_type == PVC_STORAGE_TYPE {
        if backup.spec.encryption.is_some() {
            Err(BackupError::EncryptedPvc)
        } else {
            match claim_backup::step(&backup, &r.client, &r.config, now).await {
                Ok(Progress::Waiting) => return Ok(Action::requeue(claim_backup::POLL)),
                Ok(Progress::Finished(outcome)) => outcome.map(|success| (success, None)),
                Err(e) => Err(e),
            }
        }
    } else {
        match tokio::time::timeout(limit, take(&backup, &r, now)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(SnapshotError::Timeout(limit).into()),
        }
    };
    let events = Events::of(&r.recorder, &*backup);
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    match outcome {
        Ok((success, bucket)) => {
            let done = Timestamp::now();
            let mut status =
                schedule::succeeded(backup.status.as_ref(), &success, generation, done);
            if let (Some(due), Some(Ok(cron))) = (scheduled, schedule::cron(&backup.spec)) {
                status = schedule::with_schedule_times(status, &cron, due, done);
            }
            let count = status.backup_count.unwrap_or(0);
            if let (true, Some(bucket)) = (verify::due(&backup.spec, count), bucket) {
                let record = verify_snapshot(&backup, &r, &bucket, &success).await;
                let passed = record.result == verify::PASSED;
                r.metrics
                    .verified(&namespace, &name, passed, Timestamp::now());
                let note = format!("{}: {}", record.path, record.reason);
                if passed {
                    events.normal("SnapshotVerified", note).await;
                } else {
                    events.warning("VerificationFailed", note).await;
                }
                status = verify::with_record(status, record, generation, Timestamp::now());
            }
            write_status(&r.client, &*backup, &status).await?;
            r.metrics.succeeded(
                &namespace,
                &name,
                success.took,
                success.size,
                status.last_success_date.as_ref().map(|t| t.0),
            );
            r.backoff.succeeded(&key(&*backup));
            let note = status.conditions.first().map(|c| c.message.clone());
            events
                .normal("BackupSucceeded", note.unwrap_or_default())
                .await;
            info!(backup = %key(&*backup), path = %success.path, revision = success.revision, size = success.size, took = ?started.elapsed(), "backup written");
            Ok(match schedule::period(&backup.spec, Timestamp::now()) {
                Some(every) => Action::requeue(every),
                None => Action::await_change(),
            })
        }
        Err(error) => {
            let reason = error.reason();
            let message = error.to_string();
            let status = schedule::failed(
                backup.status.as_ref(),
                reason,
                &message,
                generation,
                Timestamp::now(),
            );
            r.metrics.failed(reason);
            events.warning(reason, message).await;
            if let Err(e) = write_status(&r.client, &*backup, &status).await {
                warn!(backup = %key(&*backup), error = %e, "could not write the backup's status");
            }
            error.into_action()
        }
    }
}

/// Takes one snapshot: the cluster, its most advanced member, the bucket, the upload, then
/// retention.
async fn take(
    backup: &EtcdBackup,
    r: &BackupReconciler,
    now: Timestamp,
) -> Result<(Success, Option<Arc<dyn ObjectStore>>), BackupError> {
    let namespace = backup.namespace().unwrap_or_default();
    let spec = &backup.spec;
    let location = StoreLocation::from_source(&spec.storage_type, &spec.source)?;
    let (view, tls_secret) = target(&r.client, &r.config.policy, backup).await?;
    let periodic = keys::is_periodic(spec);
    // Read at each backup: a rotation of the recipients applies from the next snapshot on.
    let recipients = match &spec.encryption {
        Some(e) => Some(recipients(&r.client, &namespace, &e.recipients_secret).await?),
        None => None,
    };
    let (success, bucket) = snapshot_cluster(
        &r.client,
        &view,
        tls_secret.as_deref(),
        &location,
        &SnapshotSettings {
            etcd_timeout: r.config.etcd_timeout,
            limit: schedule::timeout(spec),
            store: r.config.store,
        },
        recipients.as_ref(),
        |revision| keys::snapshot_key(&location.key, periodic, revision, now),
    )
    .await?;
    if periodic {
        let prefix = &location.key;
        let key = success.path.split_once('/').map_or("", |(_, k)| k);
        let pruned = match keys::Pruning::of(spec) {
            Ok(rule) => retain(&bucket, prefix, &rule, key).await,
            // The webhook refuses an unknown zone; past it, nothing is pruned.
            Err(e) => {
                warn!(backup = %namespace, error = %e, "spec.timeZone: old snapshots kept");
                Ok(())
            }
        };
        if let Err(e) = pruned {
            // The snapshot is written; old ones are tried again after the next one.
            warn!(backup = %namespace, error = %e, "deleting old snapshots failed");
        }
        if continuous::wanted(spec) {
            base_marker(r, &view, tls_secret.as_deref(), &bucket, prefix, &success).await;
            match continuous::prune(&bucket, prefix).await {
                Ok(0) => {}
                Ok(n) => {
                    info!(backup = %namespace, deleted = n, "segments older than the oldest snapshot deleted")
                }
                Err(e) => warn!(backup = %namespace, error = %e, "deleting old segments failed"),
            }
        }
    }
    Ok((success, Some(bucket)))
}

/// Writes the continuous-backup marker of the snapshot `success` wrote: the cluster's revision
/// now, which the snapshot holds at most. Without it the snapshot is not a base of restores to
/// a revision (a warning; the snapshot itself is good).
async fn base_marker(
    r: &BackupReconciler,
    view: &crate::view::ClusterView,
    tls_secret: Option<&str>,
    bucket: &Arc<dyn ObjectStore>,
    prefix: &str,
    success: &Success,
) {
    let outcome = async {
        let access = crate::snapshot::cluster::member_access(
            &r.client,
            view,
            tls_secret,
            r.config.etcd_timeout,
        )
        .await
        .map_err(|e| e.to_string())?;
        let (_, _, status) =
            crate::snapshot::cluster::most_advanced_member(&r.client, view, &access)
                .await
                .map_err(|e| e.to_string())?;
        continuous::write_marker(bucket, prefix, success.revision, status.revision)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<i64, String>(status.revision)
    }
    .await;
    match outcome {
        Ok(upper) => {
            info!(path = %success.path, revision = success.revision, upper, "continuous-backup marker written")
        }
        Err(e) => {
            warn!(path = %success.path, error = %e, "no continuous-backup marker: this snapshot is not a base of restores to a revision")
        }
    }
}

/// Verifies the latest snapshot again, as the verify annotation's new value `request` asks,
/// and records it; the next reconcile goes on as usual.
async fn verify_on_request(
    backup: &EtcdBackup,
    r: &BackupReconciler,
    request: String,
) -> Result<Action, BackupError> {
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    let Some(success) = backup.status.as_ref().and_then(verify::latest) else {
        return Ok(Action::await_change());
    };
    let spec = &backup.spec;
    let location = StoreLocation::from_source(&spec.storage_type, &spec.source)?;
    let credentials = credentials(&r.client, &namespace, &location).await?;
    let bucket =
        store::open(&location, &credentials, r.config.store).map_err(SnapshotError::from)?;
    let mut record = verify_snapshot(backup, r, &bucket, &success).await;
    record.request = request;
    let passed = record.result == verify::PASSED;
    r.metrics
        .verified(&namespace, &name, passed, Timestamp::now());
    let note = format!("{} (on request): {}", record.path, record.reason);
    let events = Events::of(&r.recorder, backup);
    if passed {
        events.normal("SnapshotVerified", note).await;
    } else {
        events.warning("VerificationFailed", note).await;
    }
    let old = backup.status.clone().unwrap_or_default();
    let status = verify::with_record(old, record, backup.metadata.generation, Timestamp::now());
    write_status(&r.client, backup, &status).await?;
    Ok(Action::requeue(std::time::Duration::from_secs(1)))
}

/// Time a scratch member gets beyond the backup's timeout to be scheduled and started.
const SCRATCH_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// Verifies the snapshot `success` wrote to `bucket` (its own time limit: the backup's
/// timeout), decrypting it with `spec.encryption.identitySecret` when encrypted.
async fn verify_snapshot(
    backup: &EtcdBackup,
    r: &BackupReconciler,
    bucket: &Arc<dyn ObjectStore>,
    success: &Success,
) -> etcd_shared::types::VerificationRecord {
    let namespace = backup.namespace().unwrap_or_default();
    let key = success.path.split_once('/').map_or("", |(_, k)| k);
    let limit = schedule::timeout(&backup.spec);
    let outcome = async {
        let identities = match &backup.spec.encryption {
            Some(e) if !e.identity_secret.is_empty() => Some(
                identities(&r.client, &namespace, &e.identity_secret)
                    .await
                    .map_err(|e| e.to_string())?,
            ),
            Some(_) => return Err("encrypted, and spec.encryption.identitySecret is blank".into()),
            None => None,
        };
        let read = match tokio::time::timeout(
            limit,
            verify::check(bucket, key, success, identities.as_ref()),
        )
        .await
        {
            Ok(checked) => checked?,
            Err(_) => return Err(format!("reading the snapshot back took over {limit:?}")),
        };
        let (view, _) = target(&r.client, &r.config.policy, backup)
            .await
            .map_err(|e| e.to_string())?;
        let limit = limit + SCRATCH_GRACE;
        let image = r.config.image.as_ref();
        let restored =
            scratch::fingerprint(&r.client, backup, &view, image, success, limit).await?;
        let compared = verify::compare(success.source.as_ref(), &restored)?;
        Ok(format!("{read}; {compared}"))
    }
    .await;
    verify::record(success, &outcome, Timestamp::now())
}

/// Deletes the periodic snapshots of `prefix` that `rule` does not keep, keeping `keep`.
async fn retain(
    bucket: &Arc<dyn ObjectStore>,
    prefix: &str,
    rule: &keys::Pruning,
    keep: &str,
) -> Result<(), TransferError> {
    if rule.keeps_all() {
        return Ok(());
    }
    let keys = store::keys_beside(bucket.as_ref(), prefix).await?;
    for doomed in rule.expired(prefix, &keys, keep) {
        bucket.delete(&transfer::object_path(&doomed)?).await?;
        info!(key = %doomed, "old snapshot deleted ({})", rule.field());
    }
    Ok(())
}
