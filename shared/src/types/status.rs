//! The observed state of an etcd cluster: what this controller writes, and what it reads back.
//!
//! Reading is lenient so that every status CoreOS' operator wrote reads too: `phase: ""` (its
//! "no phase yet") and unknown phases read as none, `Failed` is a phase, empty strings read as
//! absent, and conditions in CoreOS' own shape (no `observedGeneration`, `lastTransitionTime`
//! and `message` optional, an extra `lastUpdateTime`) read as [`Condition`]s. Writing always
//! uses this operator's shape.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use super::lenient::{is_unknown_time, unknown_time};
use super::phase::ClusterPhase;
use super::{lenient, schema};

/// The observed state of an etcd cluster, written by the controller.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterStatus {
    /// Lifecycle phase: Creating, Running, Scaling, Upgrading, Recovering, Degraded,
    /// QuorumLost or Paused. Failed appears only on a status CoreOS' operator wrote; "" (CoreOS'
    /// "no phase yet") reads as no phase.
    #[serde(
        default,
        deserialize_with = "lenient::phase",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "schema::phase")]
    pub phase: Option<ClusterPhase>,

    /// Why the cluster is failing, in a word: set with the phases QuorumLost and Degraded
    /// (QuorumLost, AllMembersLost, MembersUnhealthy, UpgradeNotSupported) and while an invalid
    /// spec is not acted on (InvalidSpec); absent otherwise. CoreOS' operator wrote a sentence
    /// here with the phase Failed.
    #[serde(
        default,
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub reason: Option<String>,

    /// True while spec.paused is set: the operator makes no change to the cluster.
    #[serde(
        default,
        deserialize_with = "lenient::flag",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub control_paused: bool,

    /// Conditions of the cluster: Available, Progressing, Degraded and Paused. Entries CoreOS'
    /// operator wrote (Available, Scaling, Recovering, Upgrading, with lastUpdateTime and no
    /// observedGeneration) are accepted too.
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

    /// Number of members in the etcd cluster's member list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i32>,

    /// Number of members that answer their health check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_members: Option<i32>,

    /// The etcd version every member runs; during an upgrade, the version being left.
    #[serde(
        default,
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub current_version: Option<String>,

    /// The version the cluster is upgrading to; absent when no upgrade is in progress.
    #[serde(
        default,
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub target_version: Option<String>,

    /// Members by health.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<MembersStatus>,

    /// Name of the client Service that fronts the cluster.
    #[serde(
        default,
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub service_name: Option<String>,

    /// Port of the client Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_port: Option<i32>,

    /// The next member change the controller will make, in words; empty when none is due.
    #[serde(
        default,
        deserialize_with = "lenient::non_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub next_step: Option<String>,

    /// The snapshot this cluster was restored from, when an EtcdRestore seeded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<RestoredFrom>,

    /// The snapshot written before the latest minor upgrade or scale-down (`spec.safetyBackup`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_safety_backup: Option<super::backup::SafetyBackupRecord>,

    /// What the operator last did to keep the members' databases in shape (an extension of
    /// this operator): the compaction it made to heal a NOSPACE alarm and when it last
    /// defragmented each member. Read back to go on with an interrupted heal and to space
    /// defragmentations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<MaintenanceStatus>,

    /// A recovery from permanent quorum loss in progress (an extension of this operator): where
    /// the data comes from and what of the lost cluster is left to remove. Read back, so a
    /// controller restart goes on from where it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoveryStatus>,

    /// The last recovery from permanent quorum loss (an extension of this operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_recovery: Option<RecoveryRecord>,

    /// The label selector of the cluster's member pods, serialized (`key=value,...`): the scale
    /// subresource's `status.selector`, which autoscalers read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// The node each member's pod runs on, or last ran on (an extension of this operator): a
    /// member whose pod is deleted keeps its entry while it is in the member list, so the
    /// operator can tell whether its process may still run there (a pod deleted while its node
    /// is silent may go on serving).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<MemberPlacement>,

    /// Member pods CoreOS' operator created after this operator took the cluster over (an
    /// extension of this operator): CoreOS' operator still runs and manages the cluster too.
    /// While any is listed this operator changes nothing (two operators would delete each
    /// other's members forever); the list stays until those pods are gone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub another_operator_pods: Vec<String>,

    /// Members whose pods CoreOS' operator made, still to be replaced by this operator's (an
    /// extension of this operator): empty once the cluster runs on its own members alone.
    #[serde(
        default,
        rename = "coreosMembers",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub coreos_members: Vec<String>,

    /// The certificate Secrets the members run with (an extension of this operator): written
    /// once every member uses the ones `spec.TLS` names. A change of `spec.TLS`'s source (or of
    /// its Secrets, or of cert-manager's issuer) is rolled out from these to the new ones, the
    /// members trusting both CAs on the way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsInUse>,
}

/// The certificate Secrets of a TLS cluster: where its certificates come from and the Secrets
/// holding them.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsInUse {
    /// `static`, `operatorManaged` or `certManager`.
    #[schemars(length(max = 32))]
    pub source: String,
    /// cert-manager's issuer as `KIND/NAME` (certManager only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 320))]
    pub issuer: Option<String>,
    /// The members' peer certificate Secret, when peer traffic uses TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub peer_secret: Option<String>,
    /// The members' server certificate Secret, when clients use TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub server_secret: Option<String>,
    /// The operator's client certificate Secret, when clients use TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub operator_secret: Option<String>,
}

/// Where a member's pod runs (or last ran).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberPlacement {
    /// The member (and pod) name.
    pub member: String,
    /// The node its pod is bound to.
    pub node: String,
}

/// A recovery in progress.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryStatus {
    /// When it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<Time>,
    /// The surviving member the snapshot was taken from, when one survived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_member: Option<String>,
    /// Its client URL, where the new first member fetches the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_endpoint: Option<String>,
    /// The backup snapshot it restores, when no member survived (a restore seed: storage type
    /// and source, as in an EtcdRestore).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_backup: Option<super::restore::RestoreSeed>,
    /// SHA-256 of the snapshot's database, hex, as verified before anything was changed.
    #[serde(default)]
    pub sha256: String,
    /// etcd revision of the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// How many of the voting members the cluster had when its quorum was lost had lost their
    /// data (a member already replaced while quorum held is not counted).
    #[serde(default)]
    pub members_lost: i32,
    /// The member pods and claims of the lost cluster (member names), removed once the new
    /// first member runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaced: Vec<String>,
    /// The new first member, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<String>,
}

/// A finished recovery.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryRecord {
    /// When it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<Time>,
    /// When the recovered cluster's first member ran and the lost one was removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<Time>,
    /// Where the data came from: `member NAME` or the backup's path.
    #[serde(default)]
    pub source: String,
    /// etcd revision of the snapshot it was seeded from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// SHA-256 of that snapshot's database, hex.
    #[serde(default)]
    pub sha256: String,
    /// How many of the voting members the cluster had when its quorum was lost had lost their
    /// data (a member already replaced while quorum held is not counted).
    #[serde(default)]
    pub members_lost: i32,
}

/// The operator's database maintenance of a cluster: compaction and defragmentations.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceStatus {
    /// The last compaction the operator made (to heal a NOSPACE alarm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionRecord>,
    /// When the operator last defragmented each member, by member name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub defragmentations: Vec<DefragmentationRecord>,
}

/// A compaction made by the operator.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompactionRecord {
    /// The revision the key-value history was compacted to.
    pub revision: i64,
    /// When.
    pub time: Time,
}

/// A defragmentation of one member made by the operator.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DefragmentationRecord {
    /// The member.
    pub member: String,
    /// When it was defragmented.
    pub time: Time,
}

/// The snapshot a restored cluster was seeded from.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoredFrom {
    /// The EtcdRestore that seeded it.
    #[serde(default)]
    pub restore: String,
    /// BUCKET/KEY of the snapshot.
    #[serde(default)]
    pub path: String,
    /// etcd revision the snapshot holds (at least), when its metadata says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// SHA-256 of the snapshot's database, hex, as checked before the restore.
    #[serde(default)]
    pub sha256: String,
    /// etcd version that took the snapshot, when its metadata says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_version: Option<String>,
}

/// Member names by health.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MembersStatus {
    /// Members that are healthy.
    #[serde(
        default,
        deserialize_with = "lenient::names",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ready: Vec<String>,
    /// Members that are not healthy, or expected but missing.
    #[serde(
        default,
        deserialize_with = "lenient::names",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub unready: Vec<String>,
    /// Members that are learners, not yet promoted to voters (not in CoreOS' status).
    #[serde(
        default,
        deserialize_with = "lenient::names",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub learners: Vec<String>,
}

#[cfg(test)]
mod tests;
