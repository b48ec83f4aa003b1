//! The `EtcdCluster` custom resource (`etcd.database.coreos.com/v1beta2`).
//!
//! The spec keeps the field names of the original CoreOS etcd-operator so that existing
//! manifests keep working (`size`, `version`, `repository`, `paused`, `pod`, `TLS`), and adds
//! what a modern operator needs where it fits (storage medium, priority class, topology spread).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, PersistentVolumeClaimSpec, PodSecurityContext, ResourceRequirements,
    Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The desired state of an etcd cluster.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "etcd.database.coreos.com",
    version = "v1beta2",
    kind = "EtcdCluster",
    plural = "etcdclusters",
    shortname = "etcd",
    namespaced,
    doc = "An etcd cluster run by the etcd operator: members, Services and disruption budget are derived from the spec.",
    status = "EtcdClusterStatus",
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".spec.size","description":"Desired number of members"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.currentVersion","description":"etcd version the members run"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyMembers","description":"Members that are healthy"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","description":"Lifecycle phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterSpec {
    /// Number of etcd members, 1 to 7. An odd number is recommended: an even size tolerates no
    /// more failures than the odd size below it. Defaulted to 3 when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 7))]
    pub size: Option<i32>,

    /// etcd version of the members, as MAJOR.MINOR.PATCH (for example 3.6.16). A leading "v" is
    /// removed by defaulting. Changing it rolls the members one at a time; a change may move at
    /// most one minor line up, never down. Defaulted to the operator's default version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub version: Option<String>,

    /// Container image repository of the etcd image; the image is REPOSITORY:vVERSION.
    /// Defaulted to quay.io/coreos/etcd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255))]
    pub repository: Option<String>,

    /// When true the operator makes no change to the cluster (no member added, removed,
    /// replaced or upgraded) until it is set back to false. The status still reports health.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,

    /// Policy for the member pods: labels, scheduling, resources, environment and storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodPolicy>,

    /// TLS for peer and client traffic, from Secrets you provide. Without it, members talk
    /// plain HTTP. Cannot be turned on or off on a running cluster.
    #[serde(default, rename = "TLS", skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsPolicy>,
}

/// How the member pods are built.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodPolicy {
    /// Labels added to every member pod. Keys `app`, `etcd_*` and the `app.kubernetes.io/` and
    /// `etcd.database.coreos.com/` prefixes are reserved for the operator.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,

    /// Annotations added to every member pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,

    /// Node labels a node must carry to run a member.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Deprecated CoreOS field: when true, members are spread over distinct nodes (a required
    /// pod anti-affinity on kubernetes.io/hostname). Prefer `affinity`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub anti_affinity: bool,

    /// Scheduling affinity of the member pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// Tolerations of the member pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,

    /// Topology spread constraints of the member pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,

    /// Priority class of the member pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,

    /// CPU and memory requests and limits of the etcd container. Requests may not exceed limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Extra environment of the etcd container, for example ETCD_QUOTA_BACKEND_BYTES. Variables
    /// that set what the operator must control (name, cluster, URLs, data directory, TLS files)
    /// are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub etcd_env: Vec<EnvVar>,

    /// Security context of the member pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<PodSecurityContext>,

    /// Persistent storage for each member's data: a claim of this spec is made per member and
    /// kept across pod restarts, so a member rejoins with its data. Without it the data lives
    /// in an emptyDir and a member whose pod is deleted is replaced by a new, empty member.
    /// The storage class cannot change and the requested size cannot shrink on a running cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_spec: Option<PersistentVolumeClaimSpec>,

    /// Medium of the emptyDir data volume used when no persistentVolumeClaimSpec is given:
    /// "" (node disk, the default) or "Memory" (tmpfs; data is lost when the node restarts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_medium: Option<String>,

    /// Deprecated CoreOS field, ignored: members need no DNS wait container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busybox_image: Option<String>,

    /// Cluster domain used in member DNS names. Defaults to cluster.local when omitted.
    #[serde(
        default,
        rename = "ClusterDomain",
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_domain: Option<String>,
}

/// TLS settings of a cluster.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsPolicy {
    /// Certificates provided as Secrets that the user manages.
    #[serde(default, rename = "static", skip_serializing_if = "Option::is_none")]
    pub static_tls: Option<StaticTls>,
}

/// TLS from static Secrets. The member secrets and the operator secret go together.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaticTls {
    /// Secrets mounted into each member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<MemberSecrets>,

    /// Secret with the client certificate the operator uses to reach the members
    /// (keys etcd-client.crt, etcd-client.key, etcd-client-ca.crt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_secret: Option<String>,
}

/// Secrets mounted into each member.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberSecrets {
    /// Secret with the peer certificate (keys peer.crt, peer.key, peer-ca.crt). Its SANs must
    /// cover *.NAME.NAMESPACE.svc.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_secret: Option<String>,

    /// Secret with the client-facing server certificate (keys server.crt, server.key,
    /// server-ca.crt). Its SANs must cover *.NAME.NAMESPACE.svc and NAME-client.NAMESPACE.svc.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_secret: Option<String>,
}

/// The observed state of an etcd cluster, written by the controller.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterStatus {
    /// Lifecycle phase: Creating, Running, Scaling, Upgrading, Recovering, Degraded,
    /// QuorumLost or Paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClusterPhase>,

    /// Conditions of the cluster: Available, Progressing, Degraded and Paused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,

    /// The version the cluster is moving to (the spec's version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,

    /// Members by health.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<MembersStatus>,

    /// Name of the client Service that fronts the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,

    /// Port of the client Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_port: Option<i32>,

    /// The next member change the controller will make, in words; empty when none is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_step: Option<String>,
}

/// Member names by health.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MembersStatus {
    /// Members that are healthy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ready: Vec<String>,
    /// Members that are not healthy, or expected but missing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unready: Vec<String>,
    /// Members that are learners, not yet promoted to voters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub learners: Vec<String>,
}

/// Lifecycle phase of a cluster.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ClusterPhase {
    /// The first members are being created.
    Creating,
    /// Every member is healthy and the cluster matches its spec.
    Running,
    /// Members are being added or removed.
    Scaling,
    /// Members are being moved to another version.
    Upgrading,
    /// A failed member is being replaced.
    Recovering,
    /// Quorum holds but some members are unhealthy and cannot be replaced now.
    Degraded,
    /// Fewer than a majority of members are healthy: the operator makes no change.
    QuorumLost,
    /// `spec.paused` is set: the operator makes no change.
    Paused,
}

impl ClusterPhase {
    /// Every phase, for metrics that report clusters by phase.
    pub const ALL: [ClusterPhase; 8] = [
        ClusterPhase::Creating,
        ClusterPhase::Running,
        ClusterPhase::Scaling,
        ClusterPhase::Upgrading,
        ClusterPhase::Recovering,
        ClusterPhase::Degraded,
        ClusterPhase::QuorumLost,
        ClusterPhase::Paused,
    ];

    /// The phase as written in the status.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterPhase::Creating => "Creating",
            ClusterPhase::Running => "Running",
            ClusterPhase::Scaling => "Scaling",
            ClusterPhase::Upgrading => "Upgrading",
            ClusterPhase::Recovering => "Recovering",
            ClusterPhase::Degraded => "Degraded",
            ClusterPhase::QuorumLost => "QuorumLost",
            ClusterPhase::Paused => "Paused",
        }
    }
}
