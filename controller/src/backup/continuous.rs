//! Continuous backup (EtcdBackup `spec.continuous`): one task per such EtcdBackup watches
//! every key of its cluster from where the store's chain ends (the last segment, or the newest
//! snapshot when that is newer) and writes what changed, every `segmentSeconds` or at
//! [`MAX_SEGMENT_BYTES`], as segments ([`crate::snapshot::segments`]).
//!
//! The tasks are bounded: one per EtcdBackup, started by its reconcile, restarted when its
//! spec changes, aborted when `continuous` is removed or the EtcdBackup is deleted. A task
//! holds no state the store does not: after a restart of the controller (or of the task, after
//! any error) it resumes from what the store holds. What it keeps in memory is bounded by
//! [`MAX_BUFFER_BYTES`]: past it (the store refusing writes), it drops its buffer and starts
//! again from the store, reading the changes from etcd again.
//!
//! When etcd no longer has the history from where the chain ends (compacted), the chain
//! starts again after the newest snapshot, once one is newer than the compaction: the
//! revisions in between can be restored only to a snapshot, and the status says so.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::TryStreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use serde_json::json;
use tracing::{info, warn};

use etcd_shared::types::storage::PVC_STORAGE_TYPE;
use etcd_shared::types::{ContinuousStatus, EtcdBackup, EtcdBackupSpec};

use super::config::BackupConfig;
use crate::etcd::EtcdAccess;
use crate::metrics::backup::BackupMetrics;
use crate::object_key::ObjectKey;
use crate::snapshot::cluster::{credentials, member_access, most_advanced_member, target};
use crate::snapshot::keys;
use crate::snapshot::segments::{self, Op, Record};
use crate::snapshot::store::{self, StoreLocation};
use crate::snapshot::transfer;

/// A segment is written once it holds this much, before its time is up.
pub const MAX_SEGMENT_BYTES: usize = 8 * 1024 * 1024;

/// Most changes held while the store refuses segments; past it the task starts again from the
/// store (etcd still has them, unless compacted meanwhile).
pub const MAX_BUFFER_BYTES: usize = 64 * 1024 * 1024;

/// How soon a task that waits (for a first snapshot, for one newer than a compaction) looks
/// at the store again.
const WAIT_AGAIN: Duration = Duration::from_secs(2);

/// What is kept of each period for writing its segment: segments are cut this much before
/// `segmentSeconds` is up, so that a change is in the store within `segmentSeconds` of its
/// arrival when the store answers within it.
const UPLOAD_ALLOWANCE: Duration = Duration::from_millis(500);

/// How long one watch stream lasts before it is opened again (each request on a connection is
/// bounded; the chain goes on from where it was).
const WATCH_SPAN: Duration = Duration::from_secs(300);

/// Whether `spec` asks for a continuous backup the controller streams: an object store,
/// periodic snapshots, no encryption (the webhook refuses the rest).
pub fn wanted(spec: &EtcdBackupSpec) -> bool {
    spec.continuous.is_some()
        && spec.storage_type != PVC_STORAGE_TYPE
        && spec.encryption.is_none()
        && keys::is_periodic(spec)
}

/// The running tasks, by EtcdBackup.
#[derive(Default)]
pub struct Streams {
    running: Mutex<HashMap<ObjectKey, Running>>,
}

struct Running {
    spec: EtcdBackupSpec,
    task: tokio::task::JoinHandle<()>,
}

impl Streams {
    /// Starts the task of `backup` when it wants one and none runs for its spec; stops it when
    /// it does not want one.
    pub fn ensure(
        &self,
        backup: &EtcdBackup,
        client: &kube::Client,
        config: &BackupConfig,
        metrics: &BackupMetrics,
    ) {
        let key = ObjectKey::of(backup);
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if !wanted(&backup.spec) || backup.metadata.deletion_timestamp.is_some() {
            if let Some(old) = running.remove(&key) {
                old.task.abort();
                info!(backup = %key, "continuous backup stopped");
            }
            return;
        }
        if let Some(old) = running.get(&key) {
            if old.spec == backup.spec && !old.task.is_finished() {
                return;
            }
            old.task.abort();
        }
        let task = tokio::spawn(run(
            client.clone(),
            config.clone(),
            metrics.clone(),
            backup.clone(),
        ));
        info!(backup = %key, "continuous backup started");
        running.insert(
            key,
            Running {
                spec: backup.spec.clone(),
                task,
            },
        );
    }

    /// Stops the task of the EtcdBackup `key` (deleted).
    pub fn stop(&self, key: &ObjectKey) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = running.remove(key) {
            old.task.abort();
        }
    }

    /// Tasks running.
    pub fn len(&self) -> usize {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no task runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        let running = self
            .running
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        for (_, r) in running.drain() {
            r.task.abort();
        }
    }
}

/// Why one streaming run ended.
#[derive(Debug)]
enum Stop {
    /// Nothing to do yet (no snapshot, or the history compacted): wait and look again.
    Wait(String),
    /// A failure: retried with backoff.
    Failed(String),
}

fn failed(e: impl std::fmt::Display) -> Stop {
    Stop::Failed(e.to_string())
}

/// The task of one EtcdBackup: streams, and after any stop looks again.
async fn run(
    client: kube::Client,
    config: BackupConfig,
    metrics: BackupMetrics,
    backup: EtcdBackup,
) {
    let key = ObjectKey::of(&backup);
    let mut progress = Progress::default();
    let mut failures = 0u32;
    loop {
        let outcome = stream(&client, &config, &metrics, &backup, &mut progress).await;
        let wait = match outcome {
            Ok(()) => {
                failures = 0;
                Duration::from_millis(100)
            }
            Err(Stop::Wait(reason)) => {
                failures = 0;
                progress.reason = reason;
                patch_status(&client, &backup, &progress).await;
                WAIT_AGAIN
            }
            Err(Stop::Failed(reason)) => {
                failures = failures.saturating_add(1);
                warn!(backup = %key, %reason, "continuous backup interrupted; resuming from the store");
                progress.reason = reason;
                patch_status(&client, &backup, &progress).await;
                Duration::from_secs(1 << failures.min(6))
            }
        };
        tokio::time::sleep(wait).await;
    }
}

fn segment_period(spec: &EtcdBackupSpec) -> Duration {
    let seconds = spec
        .continuous
        .as_ref()
        .map_or(etcd_shared::types::DEFAULT_SEGMENT_SECONDS, |c| {
            c.segment_seconds()
        });
    let period = Duration::from_secs(seconds.clamp(1, 60).into());
    // 1 s segments are cut every 0.5 s.
    period
        .saturating_sub(UPLOAD_ALLOWANCE)
        .max(UPLOAD_ALLOWANCE)
}

/// What the status says of the stream.
#[derive(Debug, Default, Clone)]
struct Progress {
    chain_start: Option<i64>,
    last: Option<i64>,
    last_time: Option<Timestamp>,
    segments: i64,
    reason: String,
}

/// Records the stream's progress in `status.continuous` (a merge patch of that field only).
async fn patch_status(client: &kube::Client, backup: &EtcdBackup, progress: &Progress) {
    let status = ContinuousStatus {
        chain_start_revision: progress.chain_start,
        last_revision: progress.last,
        last_segment_time: progress.last_time.map(Time),
        segments: Some(progress.segments),
        reason: progress.reason.clone(),
    };
    let api: Api<EtcdBackup> =
        Api::namespaced(client.clone(), &backup.namespace().unwrap_or_default());
    let mut value = serde_json::to_value(&status).unwrap_or_default();
    if progress.reason.is_empty() {
        // A merge patch removes a field only when told so.
        value["reason"] = serde_json::Value::Null;
    }
    let patch = json!({ "status": { "continuous": value } });
    if let Err(e) = api
        .patch_status(
            &backup.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        warn!(backup = %ObjectKey::of(backup), error = %e, "could not record the continuous backup's progress");
    }
}

/// The periodic snapshots `(revision, key)` and the segments `(key, first, last)` of `prefix`.
pub async fn listing(
    bucket: &Arc<dyn ObjectStore>,
    prefix: &str,
) -> Result<(Vec<(i64, String)>, Vec<(String, i64, i64)>), object_store::Error> {
    let keys = store::keys_beside(bucket.as_ref(), prefix).await?;
    let snapshots = keys::periodic_revisions(prefix, &keys);
    let segments = keys
        .iter()
        .filter_map(|k| segments::parse_segment(prefix, k).map(|(f, l)| (k.clone(), f, l)))
        .collect();
    Ok((snapshots, segments))
}

/// The markers of `prefix`: a snapshot's key revision to the revision it holds at most.
pub async fn markers(
    bucket: &Arc<dyn ObjectStore>,
    prefix: &str,
) -> Result<std::collections::BTreeMap<i64, i64>, object_store::Error> {
    let dir = segments::segments_dir(prefix);
    let listed: Vec<_> = bucket
        .list(Some(&object_store::path::Path::from(dir.as_str())))
        .try_collect()
        .await?;
    let mut found = std::collections::BTreeMap::new();
    for meta in listed {
        let key = meta.location.to_string();
        let Some(revision) = segments::parse_base(prefix, &key) else {
            continue;
        };
        let body = bucket.get(&meta.location).await?.bytes().await?;
        if let Some(upper) = segments::parse_base_body(&body) {
            found.insert(revision, upper);
        }
    }
    Ok(found)
}

/// Writes the marker of a snapshot of key revision `revision` that holds `upper` at most.
pub async fn write_marker(
    bucket: &Arc<dyn ObjectStore>,
    prefix: &str,
    revision: i64,
    upper: i64,
) -> Result<(), transfer::TransferError> {
    let path = transfer::object_path(&segments::base_key(prefix, revision))?;
    bucket
        .put(&path, PutPayload::from(segments::base_body(upper)))
        .await?;
    Ok(())
}

/// Deletes the segments and markers that no snapshot kept needs: those at or before the
/// oldest snapshot left (after retention).
pub async fn prune(
    bucket: &Arc<dyn ObjectStore>,
    prefix: &str,
) -> Result<usize, transfer::TransferError> {
    let (snapshots, segs) = listing(bucket, prefix).await?;
    let Some(oldest) = snapshots.iter().map(|(r, _)| *r).min() else {
        return Ok(0);
    };
    let mut doomed = segments::expired_segments(&segs, oldest);
    for (revision, _) in markers(bucket, prefix).await? {
        if revision < oldest {
            doomed.push(segments::base_key(prefix, revision));
        }
    }
    for key in &doomed {
        bucket.delete(&transfer::object_path(key)?).await?;
    }
    Ok(doomed.len())
}

fn now_ms() -> i64 {
    Timestamp::now().as_millisecond()
}

/// One run: from where the store's chain ends, watch and write segments until the watch ends
/// or fails.
async fn stream(
    client: &kube::Client,
    config: &BackupConfig,
    metrics: &BackupMetrics,
    backup: &EtcdBackup,
    progress: &mut Progress,
) -> Result<(), Stop> {
    let spec = &backup.spec;
    let namespace = backup.namespace().unwrap_or_default();
    let every = segment_period(spec);
    let location = StoreLocation::from_source(&spec.storage_type, &spec.source).map_err(failed)?;
    let creds = credentials(client, &namespace, &location)
        .await
        .map_err(failed)?;
    let bucket = store::open(&location, &creds, config.store).map_err(failed)?;
    let prefix = location.key.clone();
    let (snapshots, segs) = listing(&bucket, &prefix).await.map_err(failed)?;
    let newest = snapshots.iter().map(|(r, _)| *r).max();
    let Some(after) = segments::resume_after(&segs, newest) else {
        return Err(Stop::Wait(
            "waiting for the first snapshot: segments continue a snapshot".into(),
        ));
    };
    let streamed = segs.iter().map(|(_, _, l)| *l).max();
    if streamed != Some(after) || progress.chain_start.is_none() {
        // A new chain after the newest snapshot, or the first look at an existing one.
        if streamed != Some(after) {
            progress.chain_start = Some(after + 1);
        } else if progress.chain_start.is_none() {
            progress.chain_start = chain_start(&segs, after);
        }
    }
    progress.last = Some(after);
    let (view, tls_secret) = target(client, &config.policy, backup)
        .await
        .map_err(failed)?;
    let access = member_access(client, &view, tls_secret.as_deref(), config.etcd_timeout)
        .await
        .map_err(failed)?;
    let (endpoint, _, _) = most_advanced_member(client, &view, &access)
        .await
        .map_err(failed)?;
    let long = EtcdAccess {
        timeout: WATCH_SPAN,
        pool: None,
        ..access
    };
    let mut etcd = long.connection(&endpoint).await.map_err(failed)?;
    let options = etcd_client::WatchOptions::new()
        .with_all_keys()
        .with_start_revision(after + 1)
        .with_progress_notify();
    let mut watch = etcd.watch("", Some(options)).await.map_err(failed)?;
    if !progress.reason.is_empty() {
        progress.reason.clear();
        patch_status(client, backup, progress).await;
    }
    let mut buffer: Vec<Record> = Vec::new();
    let mut bytes = 0usize;
    let mut next = after + 1;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let full = bytes >= MAX_SEGMENT_BYTES;
        tokio::select! {
            message = watch.message(), if !full => {
                let message = match message {
                    Ok(Some(m)) => m,
                    Ok(None) => {
                        flush(&bucket, &prefix, &mut buffer, &mut bytes, &mut next, progress).await.ok();
                        return Ok(());
                    }
                    Err(e) => {
                        flush(&bucket, &prefix, &mut buffer, &mut bytes, &mut next, progress).await.ok();
                        return Err(failed(format!("watch of {endpoint}: {e}")));
                    }
                };
                if message.compact_revision() > 0 {
                    flush(&bucket, &prefix, &mut buffer, &mut bytes, &mut next, progress).await.ok();
                    return Err(Stop::Wait(format!(
                        "etcd compacted its history past revision {} (the continuous backup had reached {}): the chain starts again after the next snapshot",
                        message.compact_revision(),
                        next - 1
                    )));
                }
                if message.canceled() {
                    flush(&bucket, &prefix, &mut buffer, &mut bytes, &mut next, progress).await.ok();
                    return Err(failed(format!("watch canceled: {}", message.cancel_reason())));
                }
                let ms = now_ms();
                let mut events = Vec::with_capacity(message.events().len());
                for event in message.events() {
                    let Some(kv) = event.kv() else { continue };
                    bytes += kv.key().len() + kv.value().len() + 64;
                    let op = match event.event_type() {
                        etcd_client::EventType::Put => Op::put(kv.key(), kv.value()),
                        etcd_client::EventType::Delete => Op::delete(kv.key()),
                    };
                    events.push((kv.mod_revision(), op));
                }
                segments::push_events(&mut buffer, events, ms);
                if bytes >= MAX_BUFFER_BYTES {
                    return Err(failed(format!(
                        "{bytes} bytes of changes held and the store does not take them: starting again from the store"
                    )));
                }
            }
            _ = tick.tick() => {
                let written = flush(&bucket, &prefix, &mut buffer, &mut bytes, &mut next, progress)
                    .await
                    .map_err(failed)?;
                if written {
                    patch_status(client, backup, progress).await;
                    metrics.segment_written(&namespace, &backup.name_any(), Timestamp::now());
                }
            }
        }
        if bytes >= MAX_SEGMENT_BYTES {
            flush(
                &bucket,
                &prefix,
                &mut buffer,
                &mut bytes,
                &mut next,
                progress,
            )
            .await
            .map_err(failed)?;
        }
    }
}

/// The first revision of the chain of `segs` that ends at `last`.
fn chain_start(segs: &[(String, i64, i64)], last: i64) -> Option<i64> {
    let mut start = None;
    let mut want = last;
    loop {
        let Some((_, first, _)) = segs.iter().find(|(_, _, l)| *l == want) else {
            return start;
        };
        start = Some(*first);
        want = first - 1;
    }
}

/// Writes what `buffer` holds as one segment (nothing when empty: `false`); on success the
/// buffer is emptied and `next` is the revision after it.
async fn flush(
    bucket: &Arc<dyn ObjectStore>,
    prefix: &str,
    buffer: &mut Vec<Record>,
    bytes: &mut usize,
    next: &mut i64,
    progress: &mut Progress,
) -> Result<bool, String> {
    let (Some(first), Some(last)) = (buffer.first(), buffer.last()) else {
        return Ok(false);
    };
    let (first, last) = (first.rev, last.rev);
    if first != *next {
        // Revisions are dense on a watch of every key: a hole here is etcd's or ours.
        return Err(format!(
            "the watch skipped from revision {} to {first}",
            *next - 1
        ));
    }
    let started = Instant::now();
    let key = segments::segment_key(prefix, first, last);
    let path = transfer::object_path(&key).map_err(|e| e.to_string())?;
    let body = segments::encode(buffer);
    bucket
        .put(&path, PutPayload::from(body))
        .await
        .map_err(|e| format!("writing {key}: {e}"))?;
    tracing::debug!(%key, records = buffer.len(), took = ?started.elapsed(), "segment written");
    buffer.clear();
    *bytes = 0;
    *next = last + 1;
    progress.last = Some(last);
    progress.last_time = Some(Timestamp::now());
    progress.segments += 1;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_shared::types::{BackupPolicy, ContinuousBackup};

    #[test]
    fn only_periodic_unencrypted_object_store_backups_stream() {
        let mut spec = EtcdBackupSpec {
            storage_type: "S3".into(),
            continuous: Some(ContinuousBackup::default()),
            backup_policy: Some(BackupPolicy {
                backup_interval_in_second: 60,
                ..BackupPolicy::default()
            }),
            ..EtcdBackupSpec::default()
        };
        assert!(wanted(&spec));
        assert_eq!(segment_period(&spec), Duration::from_millis(4500));
        spec.storage_type = PVC_STORAGE_TYPE.into();
        assert!(!wanted(&spec));
        spec.storage_type = "S3".into();
        spec.backup_policy = None;
        assert!(!wanted(&spec));
        spec.schedule = "0 * * * *".into();
        assert!(wanted(&spec));
        spec.encryption = Some(Default::default());
        assert!(!wanted(&spec));
    }

    #[test]
    fn the_chain_start_is_followed_back_from_its_end() {
        let seg = |f: i64, l: i64| (segments::segment_key("p", f, l), f, l);
        let segs = vec![seg(11, 20), seg(21, 30), seg(41, 50), seg(51, 60)];
        assert_eq!(chain_start(&segs, 60), Some(41));
        assert_eq!(chain_start(&segs, 30), Some(11));
        assert_eq!(chain_start(&segs, 35), None);
    }
}
