//! The admission rules of `EtcdBackup` and `EtcdRestore`, and of the backup settings of an
//! `EtcdCluster`: its `spec.safetyBackup` and its restore-seed annotation.

use super::Report;
use super::spec_rules::check_cluster_name;
use super::storage_rules::{check_seed_source, check_storage};
use super::syntax::{clipped, is_dns1123_subdomain, quoted};
use crate::EtcdCluster;
use crate::endpoints::cluster_of_endpoints;
use crate::names::ANNOTATION_RESTORE_SEED;
use crate::schedule::{Schedule, ScheduleError, time_zone};
use crate::types::storage::PVC_STORAGE_TYPE;
use crate::types::{EtcdBackup, EtcdRestore, RestoreSeed};

/// Backups more frequent than this many seconds are accepted with a warning.
pub const MIN_QUIET_INTERVAL_SECONDS: i64 = 60;

/// The longest restore-seed annotation read, bytes: a seed holds a path (1 KiB), a secret name,
/// an endpoint (2 KiB), a hash and a few names; anything longer is refused unread.
pub const MAX_SEED_BYTES: usize = 16 * 1024;

/// Every rule on an EtcdBackup's spec, in `namespace`.
pub(crate) fn check_backup(backup: &EtcdBackup, namespace: &str, report: &mut Report) {
    let spec = &backup.spec;
    if let Err(e) = cluster_of_endpoints(&spec.etcd_endpoints, namespace) {
        report.refuse("backup-endpoints", "spec.etcdEndpoints", e.to_string());
    }
    check_storage(
        &spec.storage_type,
        "spec.storageType",
        &spec.source,
        "spec",
        report,
    );
    if !spec.client_tls_secret.is_empty() && !is_dns1123_subdomain(&spec.client_tls_secret) {
        report.refuse(
            "client-tls-secret",
            "spec.clientTLSSecret",
            format!(
                "must be empty (the cluster's own client certificate) or a Secret name (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.'), got {}",
                quoted(&spec.client_tls_secret)
            ),
        );
    }
    check_schedule(backup, report);
    if let Some(encryption) = &spec.encryption {
        check_secret_name(
            &encryption.recipients_secret,
            "spec.encryption.recipientsSecret",
            true,
            "the Secret whose key recipients holds the age recipients (age1...)",
            report,
        );
        check_secret_name(
            &encryption.identity_secret,
            "spec.encryption.identitySecret",
            false,
            "blank (recovery skips encrypted snapshots) or the Secret whose key identity holds an age identity",
            report,
        );
        refuse_encrypted_pvc(&spec.storage_type, report);
    }
    if let Some(verify) = &spec.verify {
        if verify.every < 1 {
            report.refuse(
                "backup-verify-every",
                "spec.verify.every",
                format!(
                    "must be at least 1 (1 verifies every backup), got {}",
                    verify.every
                ),
            );
        }
        if spec
            .encryption
            .as_ref()
            .is_some_and(|e| e.identity_secret.is_empty())
        {
            report.refuse(
                "backup-verify-identity",
                "spec.verify",
                "an encrypted snapshot is read back with spec.encryption.identitySecret: set it, or remove spec.verify",
            );
        }
        if spec.storage_type == PVC_STORAGE_TYPE {
            report.refuse(
                "backup-verify-storage-type",
                "spec.verify",
                "verification is for object stores (S3, ABS, GCS), not PVC",
            );
        }
    }
    check_continuous(backup, report);
    let Some(policy) = &spec.backup_policy else {
        return;
    };
    for (field, value) in [
        ("timeoutInSecond", policy.timeout_in_second),
        ("backupIntervalInSecond", policy.backup_interval_in_second),
        ("maxBackups", policy.max_backups),
    ] {
        if value < 0 {
            report.refuse(
                "backup-policy-range",
                format!("spec.backupPolicy.{field}"),
                format!("must not be negative (0 means the default), got {value}"),
            );
        }
    }
    let interval = policy.backup_interval_in_second;
    if policy.max_backups > 0 && interval <= 0 && spec.schedule.is_empty() {
        report.warn(
            "spec.backupPolicy.maxBackups",
            "applies to periodic backups only: without backupIntervalInSecond or schedule one snapshot is taken and none is deleted",
        );
    }
    if (1..MIN_QUIET_INTERVAL_SECONDS).contains(&interval) {
        report.warn(
            "spec.backupPolicy.backupIntervalInSecond",
            format_args!(
                "a snapshot every {interval} s streams the whole database that often and loads the member it is taken from; {MIN_QUIET_INTERVAL_SECONDS} s or more is recommended"
            ),
        );
    }
}

/// `spec.schedule`, `spec.timeZone` and `spec.retention` (this operator's extensions): a cron
/// expression of five fields instead of `backupIntervalInSecond`, a known time zone, a
/// retention that keeps something instead of `maxBackups` (for every storage type: the PVC
/// pod gets it as `--keep-*` arguments).
fn check_schedule(backup: &EtcdBackup, report: &mut Report) {
    let spec = &backup.spec;
    let policy = spec.backup_policy.as_ref();
    let interval = policy.map_or(0, |p| p.backup_interval_in_second);
    let max_backups = policy.map_or(0, |p| p.max_backups);
    if !spec.time_zone.is_empty()
        && let Err(e) = time_zone(&spec.time_zone)
    {
        report.refuse("backup-time-zone", "spec.timeZone", e.to_string());
    }
    if !spec.schedule.is_empty() {
        if interval > 0 {
            report.refuse(
                "backup-schedule",
                "spec.schedule",
                format!(
                    "and spec.backupPolicy.backupIntervalInSecond ({interval}) are both set: a periodic backup takes one or the other, the cron schedule or CoreOS' interval"
                ),
            );
        }
        match Schedule::parse(&spec.schedule, "") {
            Err(ScheduleError::Expression(e)) => {
                report.refuse("backup-schedule", "spec.schedule", e);
            }
            Err(ScheduleError::TimeZone(_)) | Ok(_) => {}
        }
    } else if !spec.time_zone.is_empty() && spec.retention.is_none() {
        report.warn(
            "spec.timeZone",
            "has no effect without spec.schedule or spec.retention",
        );
    }
    let Some(retention) = &spec.retention else {
        return;
    };
    for (field, value) in [
        ("keepLast", retention.keep_last),
        ("keepHourly", retention.keep_hourly),
        ("keepDaily", retention.keep_daily),
        ("keepWeekly", retention.keep_weekly),
        ("keepMonthly", retention.keep_monthly),
    ] {
        if value < 0 {
            report.refuse(
                "backup-retention",
                format!("spec.retention.{field}"),
                format!("must not be negative (0 keeps none by this rule), got {value}"),
            );
        }
    }
    if retention.is_empty() {
        report.refuse(
            "backup-retention",
            "spec.retention",
            "keeps nothing: set at least one of keepLast, keepHourly, keepDaily, keepWeekly, keepMonthly (or leave retention out to keep every snapshot)",
        );
    }
    if max_backups > 0 {
        report.refuse(
            "backup-retention",
            "spec.retention",
            format!(
                "and spec.backupPolicy.maxBackups ({max_backups}) are both set: old snapshots are deleted by one or the other"
            ),
        );
    }
    if interval <= 0 && spec.schedule.is_empty() {
        report.warn(
            "spec.retention",
            "applies to periodic backups only: without backupIntervalInSecond or schedule one snapshot is taken and none is deleted",
        );
    }
}

/// `spec.continuous` (this operator's extension): segments between periodic snapshots, in an
/// object store, unencrypted (segments are not encrypted yet: refusing is better than writing
/// an encrypted backup's data in the clear).
fn check_continuous(backup: &EtcdBackup, report: &mut Report) {
    let spec = &backup.spec;
    let Some(continuous) = &spec.continuous else {
        return;
    };
    if continuous.segment_seconds > 60 {
        report.refuse(
            "backup-continuous",
            "spec.continuous.segmentSeconds",
            format!(
                "must be 1 to 60 (0 means 5), got {}",
                continuous.segment_seconds
            ),
        );
    }
    if spec.storage_type == PVC_STORAGE_TYPE {
        report.refuse(
            "backup-continuous",
            "spec.continuous",
            format!(
                "is supported for S3, ABS and GCS only, not {PVC_STORAGE_TYPE}: remove it, or back up to an object store"
            ),
        );
    }
    if spec.encryption.is_some() {
        report.refuse(
            "backup-continuous",
            "spec.continuous",
            "is not supported with spec.encryption yet (segments would be written unencrypted): remove one of them",
        );
    }
    let interval = spec
        .backup_policy
        .as_ref()
        .map_or(0, |p| p.backup_interval_in_second);
    if interval <= 0 && spec.schedule.is_empty() {
        report.refuse(
            "backup-continuous",
            "spec.continuous",
            "needs periodic snapshots (spec.backupPolicy.backupIntervalInSecond or spec.schedule): segments are replayed onto them",
        );
    }
}

/// Every rule on an EtcdRestore's spec (a create or a spec change).
pub(crate) fn check_restore(restore: &EtcdRestore, report: &mut Report) {
    let spec = &restore.spec;
    check_storage(
        &spec.backup_storage_type,
        "spec.backupStorageType",
        &spec.source,
        "spec",
        report,
    );
    let name = &spec.etcd_cluster.name;
    if name.is_empty() {
        report.refuse(
            "restore-cluster-name",
            "spec.etcdCluster.name",
            "is required: the name of the EtcdCluster of this namespace to restore",
        );
    } else {
        check_cluster_name(name, "spec.etcdCluster.name", report);
    }
    if let Some(into) = &spec.restore_into {
        check_restore_into(into, name, report);
    }
    if let Some(encryption) = &spec.encryption {
        check_secret_name(
            &encryption.identity_secret,
            "spec.encryption.identitySecret",
            true,
            "the Secret whose key identity holds the age identity (AGE-SECRET-KEY-1...)",
            report,
        );
        refuse_encrypted_pvc(&spec.backup_storage_type, report);
    }
    if let Some(revision) = spec.to_revision {
        check_to_revision(revision, restore, "spec.toRevision", report);
    }
    if let Some(time) = &spec.to_time {
        if spec.to_revision.is_some() {
            report.refuse(
                "restore-to-time",
                "spec.toTime",
                "and spec.toRevision are both set: a restore to a point in time takes one or the other",
            );
        }
        if time.parse::<jiff::Timestamp>().is_err() {
            report.refuse(
                "restore-to-time",
                "spec.toTime",
                format!(
                    "must be an RFC 3339 time with its offset, such as 2026-12-07T05:10:00Z, got {}",
                    quoted(time)
                ),
            );
        }
        check_to_revision(1, restore, "spec.toTime", report);
    }
}

/// `spec.toRevision` or `spec.toTime` (`field`; a restore to a point in time): a revision,
/// from an object store's continuous backup, unencrypted (as `spec.continuous` is).
fn check_to_revision(revision: i64, restore: &EtcdRestore, field: &str, report: &mut Report) {
    let spec = &restore.spec;
    if revision < 1 {
        report.refuse(
            "restore-to-revision",
            field,
            format!("must be an etcd revision (1 or more), got {revision}"),
        );
    }
    if spec.backup_storage_type == PVC_STORAGE_TYPE {
        report.refuse(
            "restore-to-revision",
            field,
            format!(
                "is supported for S3, ABS and GCS only (continuous backups), not {PVC_STORAGE_TYPE}"
            ),
        );
    }
    if spec.encryption.is_some() {
        report.refuse(
            "restore-to-revision",
            field,
            "is not supported with spec.encryption (continuous backups are not encrypted yet)",
        );
    }
}

/// `spec.restoreInto` (a clone): a cluster name, not the source's (that is a roll back). That
/// no cluster of the name exists is the controller's to find: it fails the restore rather than
/// overwrite one.
fn check_restore_into(into: &str, source: &str, report: &mut Report) {
    if into.is_empty() {
        report.refuse(
            "restore-into-name",
            "spec.restoreInto",
            "must name the new EtcdCluster to create from the snapshot (a clone), or be left out to restore spec.etcdCluster.name in place (a roll back)",
        );
    } else if into == source {
        report.refuse(
            "restore-into-same",
            "spec.restoreInto",
            format!(
                "is spec.etcdCluster.name ({}): restoring a cluster into itself is a roll back; leave spec.restoreInto out for that, or name a new cluster to clone into",
                quoted(into)
            ),
        );
    } else {
        check_cluster_name(into, "spec.restoreInto", report);
    }
}

/// A Secret name in `field`: blank only when not `required`, else a DNS-1123 subdomain;
/// `what` says what it must name.
fn check_secret_name(value: &str, field: &str, required: bool, what: &str, report: &mut Report) {
    if value.is_empty() && !required {
        return;
    }
    if value.is_empty() || !is_dns1123_subdomain(value) {
        report.refuse(
            "encryption-secret",
            field,
            format!(
                "must be {what}: a Secret name of this namespace (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.'), got {}",
                quoted(value)
            ),
        );
    }
}

/// `spec.encryption` is for object stores: a PVC's snapshot is written and read by a pod that
/// mounts the claim, which does not encrypt.
fn refuse_encrypted_pvc(storage_type: &str, report: &mut Report) {
    if storage_type == PVC_STORAGE_TYPE {
        report.refuse(
            "encryption-storage-type",
            "spec.encryption",
            format!(
                "is supported for S3, ABS and GCS only, not {PVC_STORAGE_TYPE}: remove it, or back up to an object store"
            ),
        );
    }
}

/// An EtcdRestore's spec may not change: it names one restore, which runs once.
pub(crate) fn check_restore_update(new: &EtcdRestore, old: &EtcdRestore, report: &mut Report) {
    if new.spec != old.spec {
        report.refuse(
            "restore-immutable",
            "spec",
            "is immutable: an EtcdRestore runs once; to restore again or from another snapshot, create a new EtcdRestore",
        );
    }
}

/// `spec.safetyBackup`: the storage rules of a backup, with the type S3.
pub(crate) fn check_safety_backup(cluster: &EtcdCluster, report: &mut Report) {
    let Some(safety) = &cluster.spec.safety_backup else {
        return;
    };
    if safety.storage_type == PVC_STORAGE_TYPE {
        report.refuse(
            "storage-type-unsupported",
            "spec.safetyBackup.storageType",
            format!(
                "{PVC_STORAGE_TYPE} is for EtcdBackups only: the controller takes safety backups itself, without a pod to mount a claim; use S3"
            ),
        );
        return;
    }
    check_storage(
        &safety.storage_type,
        "spec.safetyBackup.storageType",
        &safety.source,
        "spec.safetyBackup",
        report,
    );
    if safety.timeout_in_second < 0 {
        report.refuse(
            "backup-policy-range",
            "spec.safetyBackup.timeoutInSecond",
            format!(
                "must not be negative (0 means the default), got {}",
                safety.timeout_in_second
            ),
        );
    }
}

/// The value of the restore-seed annotation, if the object has one.
pub(crate) fn seed_annotation(cluster: &EtcdCluster) -> Option<&str> {
    cluster
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_RESTORE_SEED)
        .map(String::as_str)
}

/// The restore-seed annotation, when present: JSON of a [`RestoreSeed`] whose one source
/// (`s3`, `abs`, `gcs` or `pvc`) passes the storage rules and whose `sha256` is 64 hexadecimal
/// digits.
pub(crate) fn check_seed(cluster: &EtcdCluster, report: &mut Report) {
    let Some(value) = seed_annotation(cluster) else {
        return;
    };
    let field = format!("metadata.annotations[{ANNOTATION_RESTORE_SEED}]");
    if value.len() > MAX_SEED_BYTES {
        report.refuse(
            "restore-seed",
            field,
            format!(
                "is {} bytes long; a restore seed (written by the EtcdRestore controller) is at most {MAX_SEED_BYTES}",
                value.len()
            ),
        );
        return;
    }
    let seed = match RestoreSeed::parse(value) {
        Ok(seed) => seed,
        Err(e) => {
            report.refuse(
                "restore-seed",
                field,
                format!(
                    "must be the JSON the EtcdRestore controller writes ({{\"restore\": NAME, \"s3\": {{\"path\": BUCKET/KEY, \"awsSecret\": SECRET}}, \"sha256\": HEX}}): {}",
                    clipped(e.to_string(), 300)
                ),
            );
            return;
        }
    };
    check_seed_source(&seed.source, &field, report);
    check_secret_name(
        &seed.identity_secret,
        &format!("{field}.identitySecret"),
        false,
        "blank or the Secret whose key identity decrypts the snapshot",
        report,
    );
    let sha = &seed.sha256;
    if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        report.refuse(
            "restore-seed",
            format!("{field}.sha256"),
            format!(
                "must be the snapshot's SHA-256, 64 hexadecimal digits, got {}",
                quoted(sha)
            ),
        );
    }
}
