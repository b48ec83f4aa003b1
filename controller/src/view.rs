//! The domain type: an `EtcdCluster` as the planner, the status, the observation and the
//! builders see it: validated, defaulted, with every derived value (token, domain, URLs)
//! computed once. It depends on none of them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;

use etcd_shared::EtcdCluster;
use etcd_shared::admission::{AdmissionPolicy, Refusal};
use etcd_shared::names::{self, CLIENT_PORT, PEER_PORT};
use etcd_shared::types::{PodPolicy, RestoreSeed, SafetyBackup};
use etcd_shared::version::{EtcdVersion, LineCapabilities};

/// Why a cluster cannot be reconciled as it stands.
#[derive(Debug, thiserror::Error)]
pub enum InvalidCluster {
    /// The object lacks its name, namespace or uid (not yet persisted?).
    #[error("the EtcdCluster has no {0}")]
    MissingMetadata(&'static str),
    /// The spec breaks the admission rules (the webhook was bypassed or is not installed).
    #[error("{0}")]
    Spec(#[from] Refusal),
}

/// Which traffic is encrypted, and with which secrets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsMode {
    /// Secret with peer.crt, peer.key and peer-ca.crt, when peer traffic uses TLS.
    pub peer_secret: Option<String>,
    /// Secret with server.crt, server.key and server-ca.crt, when clients use TLS.
    pub server_secret: Option<String>,
    /// Secret with the operator's client certificate, when clients use TLS.
    pub operator_secret: Option<String>,
    /// The lifetimes of the certificates the operator issues itself
    /// (`spec.TLS.operatorManaged`); the three Secrets above are then the operator's own.
    pub issuing: Option<etcd_shared::tls::IssuingSettings>,
    /// `spec.TLS.certManager`: cert-manager issues the three Secrets above (Certificates of
    /// the same names).
    pub cert_manager: Option<etcd_shared::types::CertManagerTls>,
    /// How the three Secrets name their keys.
    pub layout: etcd_shared::tls::SecretLayout,
}

/// A validated, defaulted `EtcdCluster`.
#[derive(Debug, Clone)]
pub struct ClusterView {
    /// Cluster name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// The object's uid; part of the initial cluster token.
    pub uid: String,
    /// metadata.generation.
    pub generation: Option<i64>,
    /// Desired member count.
    pub size: usize,
    /// Desired etcd version.
    pub version: EtcdVersion,
    /// What the operator knows of the desired version's line.
    pub capabilities: &'static LineCapabilities,
    /// Image repository.
    pub repository: String,
    /// `spec.paused`.
    pub paused: bool,
    /// The pod policy (empty when the spec has none).
    pub pod: PodPolicy,
    /// TLS secrets.
    pub tls: TlsMode,
    /// The cluster DNS domain member names end in, when the spec names one
    /// (`MEMBER.NAME.NS.svc` without it, as CoreOS' operator did).
    pub domain: Option<String>,
    /// Owner reference that makes every derived object garbage-collected with the cluster.
    pub owner: OwnerReference,
    /// The snapshot the first member is seeded from, for a cluster an EtcdRestore created
    /// (annotation [`names::ANNOTATION_RESTORE_SEED`]).
    pub seed: Option<RestoreSeed>,
    /// Where a snapshot goes before each minor upgrade and scale-down (`spec.safetyBackup`).
    pub safety_backup: Option<SafetyBackup>,
    /// `spec.recovery.policy` is `Automatic`: a permanent quorum loss is recovered without a
    /// human.
    pub recover_automatically: bool,
    /// The cluster carries the approval annotation (`etcd.database.coreos.com/recover=now`).
    pub recover_now: bool,
    /// No member is let into the client Service ([`names::ANNOTATION_HOLD_CLIENTS`]: a
    /// point-in-time restore replays its changes).
    pub clients_held: bool,
    /// `spec.network` (empty when the spec has none).
    pub network: etcd_shared::types::NetworkSpec,
}

impl ClusterView {
    /// Validates and defaults a cluster with the same rules the webhook applies.
    pub fn new(cluster: &EtcdCluster, policy: &AdmissionPolicy) -> Result<Self, InvalidCluster> {
        let cluster = policy.defaulted(cluster);
        policy.validate(&cluster, None)?;
        let meta = &cluster.metadata;
        let name = meta
            .name
            .clone()
            .ok_or(InvalidCluster::MissingMetadata("name"))?;
        let namespace = meta
            .namespace
            .clone()
            .ok_or(InvalidCluster::MissingMetadata("namespace"))?;
        let uid = meta
            .uid
            .clone()
            .ok_or(InvalidCluster::MissingMetadata("uid"))?;
        let owner = cluster
            .controller_owner_ref(&())
            .ok_or(InvalidCluster::MissingMetadata("name or uid"))?;
        let spec = &cluster.spec;
        // Defaulting filled these and validation checked them; fall back to the policy's
        // defaults rather than panic should that ever change.
        let size = usize::try_from(spec.size.unwrap_or(policy.defaults.size)).unwrap_or(1);
        let (version, capabilities) = version_of(&cluster, policy)?;
        let pod = spec.pod.clone().unwrap_or_default();
        let domain = names::cluster_domain(pod.cluster_domain.as_deref()).map(str::to_string);
        let tls = tls_mode(&name, spec.tls.as_ref())?;
        let seed = restore_seed(meta)?;
        Ok(ClusterView {
            name,
            namespace,
            uid,
            generation: meta.generation,
            size,
            version,
            capabilities,
            repository: spec
                .repository
                .clone()
                .unwrap_or_else(|| policy.defaults.repository.clone()),
            paused: spec.paused,
            pod,
            tls,
            domain,
            owner,
            seed,
            safety_backup: spec.safety_backup.clone(),
            recover_automatically: spec
                .recovery
                .as_ref()
                .is_some_and(|r| r.policy == etcd_shared::types::recovery_policy::AUTOMATIC),
            recover_now: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(names::ANNOTATION_RECOVER))
                .is_some_and(|v| v == names::RECOVER_NOW),
            clients_held: meta
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(names::ANNOTATION_HOLD_CLIENTS)),
            network: spec.network.clone().unwrap_or_default(),
        })
    }

    /// The initial cluster token: unique per object, so a stale volume of an earlier cluster
    /// of the same name can never join this one.
    pub fn token(&self) -> String {
        format!("{}-{}", self.name, self.uid)
    }

    /// The image of a member running `version`.
    pub fn image(&self, version: &EtcdVersion) -> String {
        etcd_shared::version::image_for(&self.repository, version)
    }

    /// DNS name of a member.
    pub fn member_host(&self, member: &str) -> String {
        names::member_dns_name(member, &self.name, &self.namespace, self.domain.as_deref())
    }

    /// The name the operator verifies a member's serving certificate against: a name under
    /// `*.NAME.NAMESPACE.svc`, which CoreOS-layout server certificates cover. Members are
    /// dialled by pod IP, so one name stands for all of them.
    pub fn tls_server_name(&self) -> String {
        names::member_dns_name("member", &self.name, &self.namespace, None)
    }

    /// Peer URL a member of the cluster's target transport registers with (a member added
    /// during a switch to TLS may register another: [`transport::MemberTransport`]).
    pub fn peer_url(&self, member: &str) -> String {
        let scheme = if self.tls.peer_secret.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}:{PEER_PORT}", self.member_host(member))
    }

    /// Client URL a member advertises.
    pub fn client_url(&self, member: &str) -> String {
        format!(
            "{}://{}:{CLIENT_PORT}",
            self.client_scheme(),
            self.member_host(member)
        )
    }

    /// `http` or `https` for client traffic.
    pub fn client_scheme(&self) -> &'static str {
        if self.tls.server_secret.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The member name a peer URL belongs to, if it is one of this cluster's: `MEMBER.NAME.NS.svc`
    /// with or without a domain after it, so members that joined before the cluster domain
    /// changed, or under an earlier operator's address layout, are still recognised. `MEMBER` is
    /// any DNS label: this operator's `NAME-<index>` or CoreOS' `NAME-<10 random characters>`
    /// (whose members are adopted), also for a member that never started (etcd knows only its
    /// peer URL then).
    pub fn member_of_peer_url(&self, url: &str) -> Option<String> {
        let host = url.split("://").nth(1)?.split([':', '/']).next()?;
        let (member, rest) = host.split_once('.')?;
        let service = format!(
            "{}.{}.svc",
            names::peer_service_name(&self.name),
            self.namespace
        );
        let ours = rest
            .strip_prefix(service.as_str())
            .is_some_and(|domain| domain.is_empty() || domain.starts_with('.'));
        (ours && !member.is_empty()).then(|| member.to_string())
    }

    /// The key of the cluster's per-cluster state (connections, retry gates).
    pub fn key(&self) -> crate::object_key::ObjectKey {
        crate::object_key::ObjectKey::new(self.namespace.clone(), self.name.clone())
    }

    /// Number of voters that make a majority of `voters`.
    pub fn quorum(voters: usize) -> usize {
        voters / 2 + 1
    }
}

/// The TLS secrets of a cluster: the user's (`static`), the operator's own Secrets of
/// `operatorManaged` (NAME-peer-tls, NAME-server-tls, NAME-operator-tls, in CoreOS' layout), or
/// cert-manager's of `certManager` (the same names, `kubernetes.io/tls` layout).
fn tls_mode(
    name: &str,
    policy: Option<&etcd_shared::types::TlsPolicy>,
) -> Result<TlsMode, InvalidCluster> {
    use etcd_shared::tls::{CertKind, TlsSource};
    let refused = |rule: &'static str, field: &str, message: String| {
        InvalidCluster::Spec(Refusal(vec![etcd_shared::admission::Violation::new(
            rule, field, message,
        )]))
    };
    match policy.and_then(|p| p.source()) {
        None => Ok(TlsMode::default()),
        Some(TlsSource::Static(st)) => Ok(TlsMode {
            peer_secret: st.member.as_ref().and_then(|m| m.peer_secret.clone()),
            server_secret: st.member.as_ref().and_then(|m| m.server_secret.clone()),
            operator_secret: st.operator_secret.clone(),
            ..TlsMode::default()
        }),
        Some(TlsSource::OperatorManaged(om)) => {
            let issuing = om
                .settings()
                .map_err(|e| refused("tls-duration", "spec.TLS.operatorManaged", e.to_string()))?;
            Ok(TlsMode {
                peer_secret: Some(CertKind::Peer.secret_name(name)),
                server_secret: Some(CertKind::Server.secret_name(name)),
                operator_secret: Some(CertKind::Operator.secret_name(name)),
                issuing: Some(issuing),
                ..TlsMode::default()
            })
        }
        Some(TlsSource::CertManager(cm)) => Ok(TlsMode {
            peer_secret: Some(CertKind::Peer.secret_name(name)),
            server_secret: Some(CertKind::Server.secret_name(name)),
            operator_secret: Some(CertKind::Operator.secret_name(name)),
            cert_manager: Some(cm.clone()),
            layout: etcd_shared::tls::SecretLayout::KubernetesTls,
            ..TlsMode::default()
        }),
    }
}

/// Test fixtures: clusters written as YAML specs, as a user would.
/// The spec's etcd version (defaulted) and what its line can do; a refusal when it does not
/// parse or is not supported.
fn version_of(
    cluster: &EtcdCluster,
    policy: &AdmissionPolicy,
) -> Result<(EtcdVersion, &'static LineCapabilities), InvalidCluster> {
    let version: EtcdVersion = policy.defaults.version_of(cluster).parse().map_err(
        |e: etcd_shared::version::ParseVersionError| {
            InvalidCluster::Spec(Refusal(vec![etcd_shared::admission::Violation::new(
                "version-syntax",
                "spec.version",
                e.to_string(),
            )]))
        },
    )?;
    let capabilities = version.capabilities().ok_or_else(|| {
        InvalidCluster::Spec(Refusal(vec![etcd_shared::admission::Violation::new(
            "version-unsupported",
            "spec.version",
            format!("{version} is not supported"),
        )]))
    })?;
    Ok((version, capabilities))
}

/// The snapshot a restored cluster's first member is seeded from (its annotation, put there
/// by the EtcdRestore controller); a refusal when the annotation does not parse.
fn restore_seed(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Result<Option<RestoreSeed>, InvalidCluster> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(names::ANNOTATION_RESTORE_SEED))
        .map(|value| {
            RestoreSeed::parse(value).map_err(|e| {
                InvalidCluster::Spec(Refusal(vec![etcd_shared::admission::Violation::new(
                    "restore-seed",
                    format!("metadata.annotations[{}]", names::ANNOTATION_RESTORE_SEED),
                    format!("is not a restore seed: {e}"),
                )]))
            })
        })
        .transpose()
}

#[cfg(test)]
pub(crate) mod fixtures;
pub mod transport;

#[cfg(test)]
mod tests {
    use super::fixtures::view_of;

    /// Member addresses follow CoreOS' layout: `.svc` unless a cluster domain is named; `""`
    /// (what CoreOS' Go client always sends) is unset, and CoreOS' leading dot is accepted.
    #[test]
    fn member_addresses_follow_the_coreos_layout() {
        for (pod, peer_url) in [
            ("", "http://demo-1.demo.ns1.svc:2380"),
            (
                "pod:\n  ClusterDomain: \"\"",
                "http://demo-1.demo.ns1.svc:2380",
            ),
            (
                "pod:\n  ClusterDomain: .cluster.local",
                "http://demo-1.demo.ns1.svc.cluster.local:2380",
            ),
            (
                "pod:\n  ClusterDomain: corp.example",
                "http://demo-1.demo.ns1.svc.corp.example:2380",
            ),
        ] {
            let view = view_of(&format!("size: 3\n{pod}"));
            assert_eq!(view.peer_url("demo-1"), peer_url, "{pod:?}");
            assert_eq!(view.tls_server_name(), "member.demo.ns1.svc");
        }
    }

    #[test]
    fn peer_urls_of_either_layout_name_their_member() {
        let view = view_of("size: 3");
        for (url, member) in [
            ("http://demo-1.demo.ns1.svc:2380", Some("demo-1")),
            (
                "https://demo-2.demo.ns1.svc.cluster.local:2380",
                Some("demo-2"),
            ),
            ("http://demo-1.demo.ns1.svcx:2380", None),
            ("http://demo-1.other.ns1.svc:2380", None),
            // CoreOS' member names: NAME- and 10 random characters.
            (
                "http://demo-x7k2m9q4bz.demo.ns1.svc:2380",
                Some("demo-x7k2m9q4bz"),
            ),
            ("http://10.0.0.1:2380", None),
        ] {
            assert_eq!(view.member_of_peer_url(url).as_deref(), member, "{url}");
        }
    }
}
