//! The `EtcdRestore` custom resource: CoreOS' restore API (`etcd.database.coreos.com/v1beta2`),
//! served by this operator's controller.
//!
//! CoreOS' restore operator deleted the named cluster first and then seeded a new one from
//! the snapshot, so a wrong path lost the live cluster. This operator downloads and checks the
//! snapshot (its hash, and that its etcd line is not newer than the cluster's) before anything
//! of the cluster is touched, and says in the status which snapshot and revision the restored
//! cluster came from.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use super::storage::StorageSource;
use super::{EtcdClusterSpec, lenient, schema};

/// A restore of an etcd cluster of this namespace from a snapshot in object storage.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "etcd.database.coreos.com",
    version = "v1beta2",
    kind = "EtcdRestore",
    plural = "etcdrestores",
    namespaced,
    doc = "Replaces an etcd cluster of this namespace by one seeded from a snapshot (a roll back), or creates a new cluster from it under `spec.restoreInto` (a clone): the cluster's spec is the template, the snapshot is checked before any cluster is touched.",
    status = "EtcdRestoreStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.etcdCluster.name","description":"The cluster restored"}"#,
    printcolumn = r#"{"name":"Into","type":"string","jsonPath":".status.restoredCluster","description":"The cluster created from the snapshot"}"#,
    printcolumn = r#"{"name":"Succeeded","type":"boolean","jsonPath":".status.succeeded","description":"Whether the restore succeeded"}"#,
    printcolumn = r#"{"name":"Revision","type":"integer","jsonPath":".status.snapshotRevision","description":"etcd revision of the snapshot"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EtcdRestoreSpec {
    /// Where the snapshot is: S3, ABS or GCS (CoreOS' OSS is not supported yet), or `PVC`,
    /// this operator's extension: a file in a PersistentVolumeClaim of the namespace, checked
    /// by a short-lived pod that mounts it read-only before the cluster is touched. The
    /// matching source (`s3`, `abs`, `gcs` or `pvc`) must be set.
    #[schemars(extend("enum" = ["S3", "ABS", "GCS", "OSS", "PVC"]))]
    pub backup_storage_type: String,

    /// The snapshot's location, inline: `s3`, `abs`, `gcs`, `oss` or (extension) `pvc`.
    #[serde(flatten)]
    pub source: StorageSource,

    /// The EtcdCluster of this namespace to restore: its spec is the template of the restored
    /// cluster, which keeps its name (a roll back: the cluster is replaced), unless
    /// `restoreInto` names a new cluster (a clone: this one is left untouched).
    pub etcd_cluster: EtcdClusterRef,

    /// An operator extension: clone instead of roll back. The name of a NEW EtcdCluster of this
    /// namespace to create from the snapshot, with the labels, annotations and spec of
    /// `etcdCluster.name` as its template; that cluster is left untouched and running. A
    /// DNS-1035 label (as an EtcdCluster name), other than `etcdCluster.name` (leave this out
    /// to roll that cluster back in place). A cluster of that name that exists already is
    /// never overwritten: the restore fails instead. The clone's revisions are bumped past the
    /// snapshot's (with `--mark-compacted`) where the line's tool has it, as a roll back's are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_into: Option<String>,

    /// An operator extension: the identity that decrypts a snapshot encrypted with age (an
    /// EtcdBackup with `spec.encryption`). A snapshot that is encrypted cannot be restored
    /// without it, nor with another key: the restore fails before the cluster is touched.
    /// Unencrypted snapshots restore with or without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<RestoreEncryption>,

    /// An operator extension: restore to a point in time, this etcd revision of the backed-up
    /// cluster. The path then names the EtcdBackup's `KEY` (with `spec.continuous` and periodic
    /// snapshots), not one snapshot: the newest snapshot at or before the revision is restored,
    /// then the changes its continuous segments recorded up to and including the revision are
    /// written again, one transaction per original revision, before the restore is
    /// `Restored`. Refused (the cluster untouched) when no snapshot is that old or the
    /// segments do not reach the revision without a gap. Object stores only, unencrypted
    /// backups only. The restored cluster's revisions are new ones (bumped past the
    /// snapshot's); keys come back without their leases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub to_revision: Option<i64>,

    /// An operator extension: restore to a point in time given as a time (RFC 3339, such as
    /// `2026-12-07T05:10:00Z`) instead of `toRevision` (set one or the other): the revision
    /// restored to is the last one the continuous backup received at or before that time
    /// (`status.targetRevision`). The precision is the watch's delivery to the controller,
    /// not etcd's commit (usually within milliseconds). A time after the last change streamed
    /// is refused until a later change is (the store cannot tell "nothing changed since" from
    /// "not streamed yet"); ask for `toRevision` then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub to_time: Option<String>,
}

impl EtcdRestoreSpec {
    /// Whether this restore is to a point in time (`toRevision` or `toTime`).
    pub fn is_point_in_time(&self) -> bool {
        self.to_revision.is_some() || self.to_time.is_some()
    }
}

impl EtcdRestoreSpec {
    /// Whether this restore creates a new cluster (`restoreInto` set) rather than replacing
    /// the named one.
    pub fn is_clone(&self) -> bool {
        self.restore_into.is_some()
    }

    /// The name of the cluster the snapshot is restored into: `restoreInto` for a clone, else
    /// `etcdCluster.name`.
    pub fn target(&self) -> &str {
        self.restore_into
            .as_deref()
            .unwrap_or(self.etcd_cluster.name.as_str())
    }
}

/// How an encrypted snapshot is decrypted (an operator extension).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreEncryption {
    /// Secret of this namespace whose key `identity` holds the age identities (private keys,
    /// `AGE-SECRET-KEY-1...`), one a line, `#` comments allowed: an `age-keygen` output file
    /// as it is. It is read by the controller (to check the snapshot) and mounted into the
    /// restored cluster's first member (to decrypt it again there).
    #[schemars(length(min = 1, max = 253))]
    pub identity_secret: String,
}

/// A reference to an EtcdCluster of the same namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct EtcdClusterRef {
    /// Name of the EtcdCluster.
    #[serde(default)]
    #[schemars(length(max = 63))]
    pub name: String,
}

/// The outcome of a restore (CoreOS' `RestoreStatus`, plus conditions and the snapshot's
/// identity).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdRestoreStatus {
    /// Whether the cluster was restored.
    #[serde(default, deserialize_with = "lenient::flag")]
    pub succeeded: bool,

    /// Why the restore failed or waits; blank when it succeeded.
    #[serde(
        default,
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub reason: Option<String>,

    /// BUCKET/KEY of the snapshot the cluster was restored from.
    #[serde(
        default,
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub snapshot_path: Option<String>,

    /// etcd revision of the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_revision: Option<i64>,

    /// The EtcdCluster the snapshot is restored into: `spec.etcdCluster.name` (a roll back) or
    /// `spec.restoreInto` (a clone); recorded once the snapshot is checked. The restore
    /// succeeded when that cluster is Running with every member.
    #[serde(
        default,
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub restored_cluster: Option<String>,

    /// etcd version that took the snapshot.
    #[serde(
        default,
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub snapshot_etcd_version: Option<String>,

    /// SHA-256 of the snapshot's bytes, hex, as checked before the restore.
    #[serde(
        default,
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub snapshot_sha256: Option<String>,

    /// Conditions: Verified (the snapshot was downloaded and checked), Restored.
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

    /// UID of the cluster that was replaced, recorded before it is deleted.
    #[serde(
        default,
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub replaced_cluster_uid: Option<String>,

    /// The replaced cluster's labels, annotations and spec, recorded before it is deleted:
    /// the template of the restored cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<ClusterTemplate>,

    /// For `spec.toRevision` or `spec.toTime`: the revision restored to (`toRevision`, or the
    /// one `toTime` maps to), found when the snapshot was checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_revision: Option<i64>,

    /// For `spec.toRevision` or `spec.toTime`: the revision the restored cluster holds the
    /// changes of (the target once every segment is written again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed_revision: Option<i64>,

    /// For `spec.toRevision`: how many continuous segments are replayed onto the snapshot
    /// (found when the snapshot was checked; read again from the store at the replay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments: Option<i64>,
}

/// What the restored cluster takes from the one it replaces.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ClusterTemplate {
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations (but the operator's own restore annotation).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The spec.
    pub spec: EtcdClusterSpec,
}

/// The snapshot a new cluster's first member is seeded from: the value (JSON) of the
/// annotation [`crate::names::ANNOTATION_RESTORE_SEED`] the restore controller puts on the
/// cluster it creates. The seed member's init containers download it (checking
/// [`Self::sha256`]) and restore it with etcd's own tool before etcd starts.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreSeed {
    /// The EtcdRestore that asked for it.
    pub restore: String,
    /// Where the snapshot is: exactly one source (`s3`, `abs`, `gcs` or `pvc`), inline as in the
    /// restore's spec.
    #[serde(flatten)]
    pub source: StorageSource,
    /// SHA-256 of the snapshot's database, hex, as the restore controller checked it.
    pub sha256: String,
    /// etcd revision of the snapshot, when its metadata says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// etcd version that took it, when its metadata says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_version: Option<String>,
    /// Secret (key `identity`) that decrypts the snapshot, when it is encrypted.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity_secret: String,
}

impl RestoreSeed {
    /// Reads the annotation's value.
    pub fn parse(value: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(value)
    }

    /// The annotation's value.
    pub fn to_annotation(&self) -> String {
        // Serializing plain strings and numbers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}
