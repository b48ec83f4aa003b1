//! The `EtcdBackup` custom resource: CoreOS' backup API (`etcd.database.coreos.com/v1beta2`),
//! served by this operator's controller.
//!
//! Every CoreOS field is kept under its JSON name, so CoreOS' manifests and Go clients work
//! unchanged; what this operator adds (conditions, the snapshot's size, hash and object path)
//! is only in the status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::storage::StorageSource;
use super::{lenient, schema};

/// A backup of an etcd cluster to object storage: once, every `backupIntervalInSecond`, or on a
/// cron `schedule`.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "etcd.database.coreos.com",
    version = "v1beta2",
    kind = "EtcdBackup",
    plural = "etcdbackups",
    namespaced,
    doc = "A snapshot of an etcd cluster of this namespace, taken once or periodically and written to object storage.",
    status = "EtcdBackupStatus",
    printcolumn = r#"{"name":"Storage","type":"string","jsonPath":".spec.storageType","description":"Where snapshots go"}"#,
    printcolumn = r#"{"name":"Succeeded","type":"boolean","jsonPath":".status.succeeded","description":"Whether the last backup succeeded"}"#,
    printcolumn = r#"{"name":"Revision","type":"integer","jsonPath":".status.etcdRevision","description":"etcd revision of the last snapshot"}"#,
    printcolumn = r#"{"name":"Last Success","type":"date","jsonPath":".status.lastSuccessDate","description":"When the last snapshot was written"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackupSpec {
    /// Client URLs of the cluster to back up, such as `http://example-client:2379`. They must
    /// name one EtcdCluster of this namespace (its client Service or its members); the
    /// snapshot is taken from the member with the highest revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 2048)))]
    pub etcd_endpoints: Vec<String>,

    /// Where snapshots go: S3, ABS or GCS (CoreOS' OSS is not supported yet), or `PVC`, this
    /// operator's extension: a file in a PersistentVolumeClaim of the namespace, written by a
    /// short-lived pod that mounts it. The matching source (`s3`, `abs`, `gcs` or `pvc`) must
    /// be set.
    #[schemars(extend("enum" = ["S3", "ABS", "GCS", "OSS", "PVC"]))]
    pub storage_type: String,

    /// When and how long: one-shot without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_policy: Option<BackupPolicy>,

    /// An operator extension (not in CoreOS' API): when periodic backups are taken, a cron
    /// expression of five fields (minute, hour, day of month, month, day of week, as in a
    /// CronJob), such as `0 3 * * *` for 03:00 every day or `*/15 * * * *`; `@hourly`,
    /// `@daily`, `@weekly` and `@monthly` too. Instead of `backupPolicy.backupIntervalInSecond`
    /// (set one or the other). The first backup is taken at the first time after the
    /// EtcdBackup is created; times missed while the operator was down are made up with one
    /// backup on its return, never one per missed time. `backupPolicy.timeoutInSecond` and
    /// `maxBackups` apply as to interval backups.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 256))]
    pub schedule: String,

    /// An operator extension: the IANA time zone `schedule` is read in, such as
    /// `Europe/Berlin`; blank means UTC. Daylight saving changes are followed: a time that
    /// falls in the skipped hour runs at the first minute after it, a time in the repeated
    /// hour runs once. Also the zone of `retention`'s hours, days, weeks and months.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 64))]
    pub time_zone: String,

    /// An operator extension: which periodic snapshots are kept, grandfather-father-son; the
    /// others are deleted after each backup. Instead of `backupPolicy.maxBackups` (set one or
    /// the other). A snapshot kept by any rule is kept, the one just written always.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,

    /// The storage location, inline: `s3`, `abs`, `gcs`, `oss` or (extension) `pvc`.
    #[serde(flatten)]
    pub source: StorageSource,

    /// Secret with a client certificate for a cluster with client TLS (keys etcd-client.crt,
    /// etcd-client.key, etcd-client-ca.crt). Blank: the cluster's operator secret is used.
    #[serde(
        default,
        rename = "clientTLSSecret",
        skip_serializing_if = "String::is_empty"
    )]
    #[schemars(length(max = 253))]
    pub client_tls_secret: String,

    /// An operator extension: client-side encryption of the snapshots with age. Each snapshot
    /// is encrypted to the recipients of `recipientsSecret` in the controller, as it streams,
    /// before a byte reaches the store; a restore then needs a matching identity (EtcdRestore
    /// `spec.encryption.identitySecret`). Changing the recipients affects new snapshots only.
    /// Object stores only (S3, ABS, GCS), not `PVC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<BackupEncryption>,

    /// An operator extension: verification of the snapshots once written. Every `every`th
    /// successful backup is read back from the store and checked (etcd's snapshot hash and
    /// the SHA-256 recorded at upload), then restored into a scratch member (a short-lived
    /// pod `NAME-scratch`) whose `HashKV` and key count at the snapshot's revision must equal
    /// the source member's, asked right after the snapshot. `status.lastVerification` and the
    /// `Verified` condition say how it went. Absent: no verification. Object stores only
    /// (S3, ABS, GCS), not `PVC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<BackupVerify>,

    /// An operator extension: continuous backup, for restores to a point in time (EtcdRestore
    /// `spec.toRevision`). Between the periodic snapshots, the controller watches every key of
    /// the cluster from the newest snapshot's revision on and writes what changed to the
    /// store every `segmentSeconds`, in segments (objects `KEY_segments/FIRST-LAST`, revisions
    /// 20 digits). Needs periodic snapshots (`backupPolicy.backupIntervalInSecond` or
    /// `schedule`): they are the bases the segments are replayed onto, and segments older than
    /// the oldest snapshot kept are deleted with it. Object stores only (S3, ABS, GCS), and
    /// not with `encryption` yet (segments are not encrypted). Leases are not kept: a
    /// replayed key has no lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuous: Option<ContinuousBackup>,
}

/// Continuous backup between snapshots (an operator extension).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContinuousBackup {
    /// Seconds between two segments (1 to 60; 0 or unset means 5): the longest an
    /// acknowledged write waits to be in the store while the store answers promptly (each
    /// segment is cut half a second early, for its upload), so about the recovery point
    /// objective. A segment is written sooner when it reaches 8 MiB; no segment is written
    /// for an interval without writes.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    #[schemars(range(min = 0, max = 60))]
    pub segment_seconds: u32,
}

/// Seconds between two segments when `segmentSeconds` is unset.
pub const DEFAULT_SEGMENT_SECONDS: u32 = 5;

impl ContinuousBackup {
    /// `segmentSeconds`, with its default.
    pub fn segment_seconds(&self) -> u32 {
        if self.segment_seconds == 0 {
            DEFAULT_SEGMENT_SECONDS
        } else {
            self.segment_seconds
        }
    }
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// Where the continuous backup of an EtcdBackup stands (`spec.continuous`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContinuousStatus {
    /// The first revision of the current chain of segments: the revision after the snapshot
    /// it continues. A new chain starts when the watch could not go on from where the last
    /// one ended (that history was compacted): revisions between two chains can only be
    /// restored to where a snapshot covers them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain_start_revision: Option<i64>,
    /// The last revision in the store (the last segment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_revision: Option<i64>,
    /// When the last segment was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_segment_time: Option<Time>,
    /// Segments written by this controller since it started streaming this backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments: Option<i64>,
    /// Why streaming stopped or waits (blank while it runs).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// Which backups are verified (an operator extension).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupVerify {
    /// Verify every Nth successful backup: 1 verifies each one, 24 one a day of hourly
    /// backups. At least 1.
    #[schemars(range(min = 1, max = 10000))]
    pub every: i64,
}

/// How a backup's snapshots are encrypted (an operator extension).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupEncryption {
    /// Secret of this namespace whose key `recipients` holds the age X25519 recipients (public
    /// keys, `age1...`), one a line; blank lines and `#` comments are ignored. Every snapshot
    /// is encrypted to all of them: any one matching identity decrypts it. Read at each
    /// backup, so a change (a rotation) applies from the next snapshot on; snapshots already
    /// written keep their recipients.
    #[schemars(length(min = 1, max = 253))]
    pub recipients_secret: String,

    /// Secret of this namespace whose key `identity` holds an age identity
    /// (`AGE-SECRET-KEY-1...`) that decrypts these snapshots: optional, used only when the
    /// cluster recovers from quorum loss on its own from these backups. Without it such a
    /// recovery skips the encrypted snapshots, and says so.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 253))]
    pub identity_secret: String,
}

/// When backups are taken and how many are kept (CoreOS' `BackupPolicy`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupPolicy {
    /// Longest a whole backup may take, seconds; 0 means the default of 60.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 86400))]
    pub timeout_in_second: i64,

    /// Seconds between two backups; 0 means one backup only.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 31536000))]
    pub backup_interval_in_second: i64,

    /// Periodic backups to keep, the oldest deleted first; 0 keeps all. The newest good
    /// snapshot is never deleted.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 10000))]
    pub max_backups: i64,
}

/// Grandfather-father-son retention of periodic snapshots (as restic's `--keep-*`): each
/// count keeps the newest snapshot of that many distinct hours, days, weeks or months, newest
/// first, in the backup's `timeZone`; 0 (or unset) means that rule keeps none.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    /// The newest snapshots kept, whatever their times.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 10000))]
    pub keep_last: i64,

    /// Hours, newest first, whose newest snapshot is kept.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 10000))]
    pub keep_hourly: i64,

    /// Days, newest first, whose newest snapshot is kept.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 10000))]
    pub keep_daily: i64,

    /// Weeks (ISO weeks, from Monday), newest first, whose newest snapshot is kept.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 10000))]
    pub keep_weekly: i64,

    /// Months, newest first, whose newest snapshot is kept.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 10000))]
    pub keep_monthly: i64,
}

impl Retention {
    /// Whether no rule keeps anything.
    pub fn is_empty(&self) -> bool {
        [
            self.keep_last,
            self.keep_hourly,
            self.keep_daily,
            self.keep_weekly,
            self.keep_monthly,
        ]
        .iter()
        .all(|n| *n <= 0)
    }
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// The outcome of the latest backup (CoreOS' `BackupStatus`, plus conditions and the
/// snapshot's object).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackupStatus {
    /// Whether the latest backup succeeded.
    #[serde(default, deserialize_with = "lenient::flag")]
    pub succeeded: bool,

    /// Why the latest backup failed; blank when it succeeded. (CoreOS' JSON name, with a
    /// capital R.)
    #[serde(
        default,
        rename = "Reason",
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub reason: Option<String>,

    /// etcd version of the member the latest snapshot was taken from.
    #[serde(
        default,
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub etcd_version: Option<String>,

    /// etcd revision of the latest snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_revision: Option<i64>,

    /// When the latest snapshot was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_date: Option<Time>,

    /// BUCKET/KEY of the latest snapshot.
    #[serde(
        default,
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_backup_path: Option<String>,

    /// Size of the latest snapshot, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup_size: Option<i64>,

    /// SHA-256 of the latest snapshot's bytes, hex (also in the object's metadata).
    #[serde(
        default,
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_backup_sha256: Option<String>,

    /// For a `schedule`: the scheduled time the latest backup was taken for (a backup made
    /// up after the operator was down is for the latest time missed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,

    /// For a `schedule`: the next time a backup is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Time>,

    /// Conditions: Succeeded (the latest backup), Scheduled (a periodic backup is due).
    #[serde(
        default,
        deserialize_with = "lenient::conditions",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,

    /// The metadata.generation the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Successful backups taken since this EtcdBackup was created (what `spec.verify.every`
    /// counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_count: Option<i64>,

    /// The latest verification of a snapshot (`spec.verify`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_verification: Option<VerificationRecord>,

    /// The continuous backup (`spec.continuous`): what is in the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuous: Option<ContinuousStatus>,
}

/// One verification of a snapshot: what the source member said at backup time, and what
/// reading the snapshot back found.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerificationRecord {
    /// BUCKET/KEY of the snapshot verified.
    #[serde(default)]
    pub path: String,
    /// The snapshot's revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// etcd's `HashKV` of the source member at that revision, when it could be asked (not
    /// when the revision was compacted already).
    #[serde(default, rename = "hashKV", skip_serializing_if = "Option::is_none")]
    pub hash_kv: Option<i64>,
    /// Keys of the source member at that revision (same condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<i64>,
    /// `Verified` or `Failed`.
    #[serde(default)]
    pub result: String,
    /// Why it failed, or what was checked.
    #[serde(default)]
    pub reason: String,
    /// When it was verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// The value of the annotation `etcd.database.coreos.com/verify` this verification
    /// answered (a verification of the latest snapshot on request); blank for one that
    /// followed a backup.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request: String,
}

/// Annotation on an EtcdBackup with `spec.verify`: a new value asks the controller to verify
/// the latest snapshot again (as it is in the store now); `status.lastVerification.request`
/// then holds the value.
pub const ANNOTATION_VERIFY: &str = "etcd.database.coreos.com/verify";

/// An operator extension (not in CoreOS' API): where the controller writes a snapshot of the
/// cluster before each minor upgrade and before each scale-down; the change waits until the
/// snapshot is written, and the cluster's status records it (`lastSafetyBackup`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SafetyBackup {
    /// Where snapshots go: S3 (the only type supported). The matching source (`s3`) must be
    /// set; each snapshot's key is the path's key followed by
    /// `_before-<change>_v<revision>_<time>`.
    #[schemars(extend("enum" = ["S3"]))]
    pub storage_type: String,

    /// The storage location, inline: `s3`.
    #[serde(flatten)]
    pub source: StorageSource,

    /// Longest the snapshot may take, seconds; 0 means 60. On failure the change does not
    /// happen: the cluster reports it and retries.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 86400))]
    pub timeout_in_second: i64,
}

/// The snapshot written before the latest risky change of a cluster.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SafetyBackupRecord {
    /// The change it was taken for, e.g. `upgrade to 3.7` or `scale down to 3 (generation 4)`.
    #[serde(default)]
    pub before: String,
    /// BUCKET/KEY of the snapshot.
    #[serde(default)]
    pub path: String,
    /// Revision the snapshot holds at least.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// SHA-256 of the snapshot's database, hex.
    #[serde(default)]
    pub sha256: String,
    /// When it was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}
