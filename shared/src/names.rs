//! Names, labels and ports of everything the controller derives from an `EtcdCluster`.
//! The webhook uses the same limits, so a name it admits always yields valid object names.

use std::collections::BTreeMap;

/// Port etcd serves clients on.
pub const CLIENT_PORT: i32 = 2379;
/// Port etcd members talk to each other on.
pub const PEER_PORT: i32 = 2380;
/// Plain-HTTP port for etcd's `/metrics` and `/health` (where the line supports it).
pub const METRICS_PORT: i32 = 2381;

/// The key of an encrypted backup's `recipientsSecret` holding its age recipients, one
/// `age1...` per line.
pub const RECIPIENTS_KEY: &str = "recipients";

/// The key of an `identitySecret` holding age identities, one `AGE-SECRET-KEY-1...` per line
/// (an `age-keygen` output file as it is).
pub const IDENTITY_KEY: &str = "identity";

/// The field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "etcd-operator";

/// The API group of the CRD.
pub const API_GROUP: &str = "etcd.database.coreos.com";

/// Suffix of the client Service's name.
pub const CLIENT_SERVICE_SUFFIX: &str = "-client";

/// Member indexes go up to this many decimal digits.
pub const MEMBER_INDEX_DIGITS: usize = 5;

/// Longest cluster name for which every derived name is a valid DNS-1035 label (63
/// characters): the client Service `NAME-client` and the members `NAME-NNNNN`.
pub const MAX_CLUSTER_NAME_LEN: usize = 63 - CLIENT_SERVICE_SUFFIX.len();

/// Label: the application (`etcd`).
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// Label: the cluster an object belongs to.
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
/// Label: what manages the object.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Label: the component (`member`, `peer-service`, ...).
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// Label: the etcd version a member pod runs.
pub const LABEL_VERSION: &str = "app.kubernetes.io/version";
/// Label: the etcd member name a pod or claim belongs to.
pub const LABEL_MEMBER: &str = "etcd.database.coreos.com/member";
/// Annotation of a member pod: the etcd container's restart count when the operator changed
/// its image, so the upgrade waits for the container that runs the new image.
pub const ANNOTATION_RESTARTS_AT_UPGRADE: &str = "etcd.database.coreos.com/restarts-at-upgrade";
/// Annotation of a member pod: the etcd version it was created with. Members created on 3.4
/// or older wrote v2-format entries to the raft log (see [`ANNOTATION_SNAPSHOT_BARRIER`]); a
/// pod without it was made by an earlier operator and counts as such.
pub const ANNOTATION_CREATED_ON: &str = "etcd.database.coreos.com/created-on-version";
/// Annotation of a member pod: a raft index after every v2-format entry of the cluster's log.
/// etcd 3.7 cannot replay v2-format entries, so a member moves to 3.7 only once it has
/// applied a snapshot's worth of entries past this index (it then took a raft snapshot after
/// them and never replays them).
pub const ANNOTATION_SNAPSHOT_BARRIER: &str = "etcd.database.coreos.com/snapshot-barrier-index";
/// Annotation of a member pod, `"true"` when etcd serves its `/metrics` on the pod's plain-HTTP
/// client port only: a line without a metrics listener (3.2) and no client TLS. The chart's
/// PodMonitor scrapes the `metrics` port of every member and the `client` port of pods with
/// this annotation; a 3.2 member with client TLS answers `/metrics` only to a client
/// certificate and is not scraped.
pub const ANNOTATION_METRICS_ON_CLIENT_PORT: &str =
    "etcd.database.coreos.com/metrics-on-client-port";
/// CoreOS' legacy label `etcd_cluster`, kept so existing selectors keep working.
pub const LEGACY_LABEL_CLUSTER: &str = "etcd_cluster";
/// Annotation on an EtcdCluster whose first member is seeded from a snapshot (JSON of
/// [`crate::types::restore::RestoreSeed`]); put there by the EtcdRestore controller.
pub const ANNOTATION_RESTORE_SEED: &str = "etcd.database.coreos.com/restore-seed";
/// Annotation on an EtcdCluster restored to a point in time while its restore replays the
/// continuous backup's changes (the EtcdRestore's name): no member is let into the client
/// Service until the restore removes it, so no client reads the snapshot's older data or
/// writes something the replay would overwrite.
pub const ANNOTATION_HOLD_CLIENTS: &str = "etcd.database.coreos.com/hold-clients";
/// Annotation on an EtcdCluster approving a recovery from permanent quorum loss under
/// `spec.recovery.policy: Manual`; its one value is [`RECOVER_NOW`]. The operator removes it
/// once it acts on it.
pub const ANNOTATION_RECOVER: &str = "etcd.database.coreos.com/recover";

/// Annotation of a member pod of an operator-managed TLS cluster: a fingerprint of the CA
/// certificates its trust files held when it was made. etcd reads its trusted CA files once,
/// at start: a member whose fingerprint is not the current bundle's is replaced (issue 34).
pub const ANNOTATION_TLS_TRUST: &str = "etcd.database.coreos.com/tls-trust";
/// Annotation of a member pod of an operator-managed TLS cluster: a fingerprint of the peer
/// and server certificates it was made with. A line that does not reload its certificate
/// files (3.2) serves those until it restarts: such a member is replaced when they change.
pub const ANNOTATION_TLS_LEAVES: &str = "etcd.database.coreos.com/tls-leaves";
/// Annotation on an EtcdCluster with `spec.TLS.operatorManaged`: a new value (any word)
/// starts a rotation of the cluster's CA now (a compromised key, a policy), as the CA's own
/// renewal time does.
pub const ANNOTATION_ROTATE_CA: &str = "etcd.database.coreos.com/rotate-ca";

/// The readiness gate of a member pod (issue 33): the operator sets this pod condition False
/// before it takes the member down on purpose (a restart, a removal, a defragmentation), so the
/// client Service drops it first, and True once the member serves again.
pub const CONDITION_SERVING: &str = "etcd.database.coreos.com/serving";
/// The value of [`ANNOTATION_RECOVER`].
pub const RECOVER_NOW: &str = "now";
/// CoreOS' legacy label `app=etcd`.
pub const LEGACY_LABEL_APP: &str = "app";
/// The label CoreOS' operator put on its member pods only (`etcd_node=MEMBER`): a pod carrying
/// it was made by CoreOS' operator, never by this one.
pub const COREOS_LABEL_NODE: &str = "etcd_node";
/// The annotation CoreOS' operator put on its member pods: the etcd version the pod runs.
pub const COREOS_ANNOTATION_VERSION: &str = "etcd.version";
/// The value of `app.kubernetes.io/managed-by`.
pub const MANAGED_BY: &str = "etcd-operator";

/// Name of the headless Service that gives each member its DNS name (`MEMBER.NAME.NS.svc`).
pub fn peer_service_name(cluster: &str) -> String {
    cluster.to_string()
}

/// Name of the client Service on port 2379.
pub fn client_service_name(cluster: &str) -> String {
    format!("{cluster}{CLIENT_SERVICE_SUFFIX}")
}

/// Name of the Secret holding the CA of a cluster with operator-managed TLS (ca.crt, ca.key;
/// during a CA rotation also the CA being replaced).
pub fn ca_secret_name(cluster: &str) -> String {
    format!("{cluster}-ca")
}

/// Name of the Secret (and, with cert-manager, the Certificate) of the members' peer
/// certificate when the operator or cert-manager issues it.
pub fn peer_tls_secret_name(cluster: &str) -> String {
    format!("{cluster}-peer-tls")
}

/// Name of the Secret (and Certificate) of the members' client-facing server certificate when
/// the operator or cert-manager issues it.
pub fn server_tls_secret_name(cluster: &str) -> String {
    format!("{cluster}-server-tls")
}

/// Name of the Secret (and Certificate) of the operator's client certificate when the operator
/// or cert-manager issues it.
pub fn operator_tls_secret_name(cluster: &str) -> String {
    format!("{cluster}-operator-tls")
}

/// The member pod's volume of its peer certificate Secret.
pub const PEER_TLS_VOLUME: &str = "peer-tls";
/// The member pod's volume of its server certificate Secret.
pub const SERVER_TLS_VOLUME: &str = "server-tls";

/// Name of the Secret the members and the operator use while the cluster's certificates move
/// from one source to another: the peer, server and operator certificates in CoreOS' key names,
/// with a trust bundle of both sources' CAs.
pub fn tls_switch_secret_name(cluster: &str) -> String {
    format!("{cluster}-tls-switch")
}

/// Name of the NetworkPolicy of a cluster's members.
pub fn network_policy_name(cluster: &str) -> String {
    format!("{cluster}-members")
}

/// Name of the PodDisruptionBudget.
pub fn pdb_name(cluster: &str) -> String {
    cluster.to_string()
}

/// Name of member number `index` (also its pod's name).
pub fn member_name(cluster: &str, index: u32) -> String {
    format!("{cluster}-{index}")
}

/// The index of a member name of this cluster, if it is one.
pub fn member_index(cluster: &str, member: &str) -> Option<u32> {
    let rest = member.strip_prefix(cluster)?.strip_prefix('-')?;
    if rest.is_empty()
        || rest.len() > MEMBER_INDEX_DIGITS
        || !rest.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    rest.parse().ok()
}

/// Name of a member's data claim.
pub fn data_claim_name(member: &str) -> String {
    format!("{member}-data")
}

/// The DNS name a member advertises, as CoreOS' operator wrote it: `MEMBER.NAME.NAMESPACE.svc`,
/// followed by `.DOMAIN` only when `spec.pod.ClusterDomain` names one. Inside a pod the short
/// form resolves through the search path, and it is the name CoreOS-layout certificates cover
/// (`*.NAME.NAMESPACE.svc`).
pub fn member_dns_name(
    member: &str,
    cluster: &str,
    namespace: &str,
    domain: Option<&str>,
) -> String {
    let base = format!("{member}.{}.{namespace}.svc", peer_service_name(cluster));
    match domain {
        Some(domain) => format!("{base}.{domain}"),
        None => base,
    }
}

/// The cluster domain a `spec.pod.ClusterDomain` value names: `None` when unset or empty
/// (CoreOS' Go client always sends `""`), else the domain without CoreOS' documented leading
/// dot (`.cluster.local` and `cluster.local` are the same domain).
pub fn cluster_domain(value: Option<&str>) -> Option<&str> {
    value
        .map(|d| d.strip_prefix('.').unwrap_or(d))
        .filter(|d| !d.is_empty())
}

/// Labels that select every object of one cluster.
pub fn selector_labels(cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_string(), "etcd".to_string()),
        (LABEL_INSTANCE.to_string(), cluster.to_string()),
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
    ])
}

/// CoreOS' selector of a cluster's member pods (`app=etcd, etcd_cluster=NAME`): the selector of
/// the Services CoreOS' operator made. Every member pod carries it, this operator's and CoreOS',
/// and no other pod this operator makes does.
pub fn coreos_selector(cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LEGACY_LABEL_APP.to_string(), "etcd".to_string()),
        (LEGACY_LABEL_CLUSTER.to_string(), cluster.to_string()),
    ])
}

/// Labels of every object the operator makes for a cluster: the selector labels, the
/// component, and CoreOS' `app=etcd` and `etcd_cluster=NAME`, so selectors written for CoreOS'
/// operator (ServiceMonitors, NetworkPolicies, scripts) keep matching.
pub fn object_labels(cluster: &str, component: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(cluster);
    labels.insert(LABEL_COMPONENT.into(), component.into());
    labels.insert(LEGACY_LABEL_APP.into(), "etcd".into());
    labels.insert(LEGACY_LABEL_CLUSTER.into(), cluster.into());
    labels
}

/// Labels of a member pod: [`object_labels`] of component `member`, the member name and its
/// version.
pub fn member_labels(cluster: &str, member: &str, version: &str) -> BTreeMap<String, String> {
    let mut labels = object_labels(cluster, "member");
    labels.insert(LABEL_MEMBER.into(), member.into());
    labels.insert(LABEL_VERSION.into(), version.into());
    labels
}

/// Whether a pod label key is reserved for the operator (CoreOS reserved `app` and `etcd_*`).
pub fn is_reserved_label(key: &str) -> bool {
    key == LEGACY_LABEL_APP
        || key.starts_with("etcd_")
        || key.starts_with("app.kubernetes.io/")
        || key.starts_with("etcd.database.coreos.com/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_fit_a_dns_label_at_the_limit() {
        let name = "a".repeat(MAX_CLUSTER_NAME_LEN);
        assert_eq!(client_service_name(&name).len(), 63);
        assert!(member_name(&name, 99_999).len() <= 63);
    }

    #[test]
    fn member_index_round_trips() {
        assert_eq!(member_index("etcd", &member_name("etcd", 42)), Some(42));
        assert_eq!(member_index("etcd", "etcd-client"), None);
        assert_eq!(member_index("etcd", "etcd-1-x"), None);
        assert_eq!(member_index("etcd", "other-1"), None);
        assert_eq!(member_index("etcd-a", "etcd-1"), None);
    }

    #[test]
    fn reserved_labels() {
        assert!(is_reserved_label("app"));
        assert!(is_reserved_label("etcd_cluster"));
        assert!(is_reserved_label("app.kubernetes.io/name"));
        assert!(!is_reserved_label("team"));
    }
}
