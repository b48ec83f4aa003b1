//! The `EtcdCluster` custom resource (`etcd.database.coreos.com/v1beta2`).
//!
//! The spec keeps every field of the original CoreOS etcd-operator's `v1beta2` API, under its
//! name, so that existing manifests and CoreOS' Go clients keep working (`size`, `version`,
//! `repository`, `paused`, `pod`, `TLS`; CoreOS-only fields such as `busyboxImage` and
//! `DNSTimeoutInSecond` are accepted and ignored), and adds what a modern operator needs where
//! it fits (storage medium, priority class, topology spread). The status ([`status`]) reads
//! every status CoreOS' operator wrote as well as the one this controller writes.

pub mod backup;
mod lenient;
mod phase;
pub mod restore;
mod schema;
pub mod status;
pub mod storage;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, PersistentVolumeClaimSpec, PodSecurityContext,
    ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use backup::{
    BackupEncryption, BackupPolicy, BackupVerify, ContinuousBackup, ContinuousStatus,
    DEFAULT_SEGMENT_SECONDS, EtcdBackup, EtcdBackupSpec, EtcdBackupStatus, Retention, SafetyBackup,
    SafetyBackupRecord, VerificationRecord,
};
pub use phase::ClusterPhase;
pub use restore::{
    ClusterTemplate, EtcdClusterRef, EtcdRestore, EtcdRestoreSpec, EtcdRestoreStatus,
    RestoreEncryption, RestoreSeed,
};
pub use status::{
    CompactionRecord, DefragmentationRecord, EtcdClusterStatus, MaintenanceStatus, MemberPlacement,
    MembersStatus, RecoveryRecord, RecoveryStatus, RestoredFrom, TlsInUse,
};
pub use storage::{PvcSource, S3Source, StorageSource};

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
    // `kubectl scale etcdcluster/NAME --replicas=N` (and autoscalers, GitOps tools) act on
    // spec.size; status.size is the members the cluster has, status.selector its member pods.
    scale(
        spec_replicas_path = ".spec.size",
        status_replicas_path = ".status.size",
        label_selector_path = ".status.selector"
    ),
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".spec.size","description":"Desired number of members"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.currentVersion","description":"etcd version the members run"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyMembers","description":"Members that are healthy"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","description":"Lifecycle phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterSpec {
    /// Number of etcd members, 1 to 7. An odd number is recommended: an even size tolerates no
    /// more failures than the odd size below it. Defaulted to 3 when omitted. 0 is refused: it
    /// is what CoreOS' Go client sends when its Size is left unset, so set the size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 7))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self != 0",
        "message": "size 0 is refused: set spec.size to the number of members, 1 to 7 (CoreOS' Go client sends 0 when Size is left unset)"
    }]))]
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

    /// TLS for peer and client traffic: from Secrets you provide (`static`, CoreOS' API), from
    /// the operator's own CA (`operatorManaged`) or from cert-manager (`certManager`). Without
    /// it, members talk plain HTTP. Cannot be turned on or off on a running cluster.
    #[serde(default, rename = "TLS", skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsPolicy>,

    /// An extension of this operator (not in CoreOS' API): a bucket the controller writes a
    /// snapshot to before each minor upgrade and each scale-down; the change waits for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety_backup: Option<SafetyBackup>,

    /// An extension of this operator (not in CoreOS' API): what the controller does when the
    /// cluster lost quorum for good (the data of a majority of its voting members is gone:
    /// emptyDir members whose pods are gone, members whose claims are gone). A temporary loss
    /// (members down with their data on their claims) is always waited for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoverySpec>,

    /// An extension of this operator (not in CoreOS' API): who may reach the members. By
    /// default the operator keeps a NetworkPolicy that admits the peer port only from the
    /// cluster's own members, the client port from `clientSelectors` (any pod when unset, as
    /// CoreOS' clusters were) and from the operator, and the metrics port from anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
}

/// Network access to a cluster's members.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSpec {
    /// `Default` (when unset): the operator keeps the cluster's NetworkPolicy (NAME-members).
    /// `None`: it keeps none (and deletes none a person made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["Default", "None"]))]
    pub policy: Option<String>,

    /// Who may reach the client port (2379), as NetworkPolicy peers (podSelector,
    /// namespaceSelector, ipBlock). Unset or empty: any pod. The operator's own pods are
    /// always admitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_selectors: Vec<NetworkPolicyPeer>,
}

/// `spec.network.policy` values.
pub mod network_policy {
    /// The operator keeps the cluster's NetworkPolicy (the default).
    pub const DEFAULT: &str = "Default";
    /// No NetworkPolicy.
    pub const NONE: &str = "None";
}

/// What the controller does when the cluster lost quorum for good.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverySpec {
    /// Manual (the default): the status says the loss is permanent and which member (or
    /// backup) the cluster would be recovered from; the recovery starts once the EtcdCluster is
    /// annotated `etcd.database.coreos.com/recover=now` (the annotation is removed once acted
    /// on). Automatic: the recovery starts at once. A recovery takes a snapshot of the surviving
    /// member with the most data (or, when none survives, the newest snapshot of the cluster's
    /// EtcdBackups and safety backups that checks), verifies it, then replaces the cluster with
    /// one seeded from it, grown back to spec.size.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("enum" = ["Manual", "Automatic"]))]
    pub policy: String,
}

/// `spec.recovery.policy` values.
pub mod recovery_policy {
    /// Recover once a human approves (the default).
    pub const MANUAL: &str = "Manual";
    /// Recover without a human.
    pub const AUTOMATIC: &str = "Automatic";
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

    /// Secrets in the cluster's namespace with the credentials to pull the member pods' images
    /// from a private registry: the etcd image and, for the first member of a restored
    /// cluster, the operator's image its restore steps run (that pod also gets the
    /// controller's `--restore-image-pull-secret`s). Pods created after a change carry the new
    /// list; running members keep theirs until they are replaced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// CPU and memory requests and limits of the etcd container. Requests may not exceed limits.
    /// `{}` (what CoreOS' Go client sends when none are set) sets none.
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

    /// Deprecated CoreOS field, accepted and ignored: CoreOS' members waited in a busybox init
    /// container until their DNS name resolved; this operator's members need no such container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busybox_image: Option<String>,

    /// Deprecated CoreOS field, accepted and ignored: CoreOS' busybox init container gave up
    /// its reverse DNS lookup of the member's IP after this many seconds (0: never). This
    /// operator's members need no DNS init container, so there is nothing to time out.
    #[serde(
        default,
        rename = "DNSTimeoutInSecond",
        skip_serializing_if = "Option::is_none"
    )]
    pub dns_timeout_in_second: Option<i64>,

    /// Cluster domain appended to the member DNS names (MEMBER.NAME.NAMESPACE.svc.DOMAIN), such
    /// as cluster.local. A leading dot, as CoreOS documented it (.cluster.local), is accepted.
    /// Unset or "" (what CoreOS' Go client sends when none is set): no domain is appended and
    /// the names resolve through the pods' DNS search path. Cannot change on a running cluster;
    /// unset, "", cluster.local and .cluster.local count as the same domain.
    #[serde(
        default,
        rename = "ClusterDomain",
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_domain: Option<String>,
}

/// TLS settings of a cluster: exactly one source of certificates.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsPolicy {
    /// Certificates provided as Secrets that the user manages.
    #[serde(default, rename = "static", skip_serializing_if = "Option::is_none")]
    pub static_tls: Option<StaticTls>,

    /// An extension of this operator (not in CoreOS' API): the operator keeps a CA for this
    /// cluster (Secret NAME-ca) and issues, renews and rotates the peer, server and operator
    /// certificates itself (Secrets NAME-peer-tls, NAME-server-tls and NAME-operator-tls, in
    /// the layout of `static`). Peer and client traffic both use mutual TLS. `{}` takes the
    /// defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_managed: Option<OperatorManagedTls>,

    /// An extension of this operator (not in CoreOS' API): cert-manager issues the peer,
    /// server and operator certificates (Certificates NAME-peer-tls, NAME-server-tls and
    /// NAME-operator-tls) from the Issuer or ClusterIssuer named here. Peer and client traffic
    /// both use mutual TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_manager: Option<CertManagerTls>,
}

/// Certificates from the operator's own CA.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperatorManagedTls {
    /// How long each peer, server and client certificate is valid, as a Go duration (such as
    /// 2160h). Default 2160h (90 days); at least 5m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,

    /// How long before it expires a certificate is renewed, as a Go duration. Default a third
    /// of `duration`; less than `duration`, at least 1m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,

    /// How long the cluster's CA is valid, as a Go duration. Default 87600h (10 years); at
    /// least three times `duration`. A third of it before it expires, a new CA takes over:
    /// members trust both while their certificates move to the new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_duration: Option<String>,
}

/// Certificates from cert-manager.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertManagerTls {
    /// The Issuer (in the cluster's namespace) or ClusterIssuer that signs the certificates.
    pub issuer_ref: IssuerRef,

    /// How long each certificate is valid, as a Go duration (cert-manager's default, 2160h,
    /// when unset; cert-manager refuses less than 1h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,

    /// How long before it expires cert-manager renews a certificate, as a Go duration
    /// (cert-manager's default, a third of `duration`, when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
}

/// A reference to a cert-manager issuer.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuerRef {
    /// The issuer's name.
    pub name: String,

    /// `Issuer` (default) or `ClusterIssuer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,

    /// The issuer's API group; default `cert-manager.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
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
