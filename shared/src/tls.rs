//! The certificate sources of `spec.TLS` and their resolved settings: one reading of the spec
//! for the webhook's rules and the controller's issuing.

use std::time::Duration;

use crate::duration::{ParseDurationError, parse_duration};
use crate::types::{CertManagerTls, OperatorManagedTls, TlsInUse, TlsPolicy};

/// Default lifetime of an operator-issued leaf certificate (90 days).
pub const DEFAULT_LEAF_DURATION: Duration = Duration::from_secs(90 * 24 * 3600);
/// Default lifetime of an operator-managed CA (10 years).
pub const DEFAULT_CA_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// The shortest leaf lifetime the operator issues.
pub const MIN_LEAF_DURATION: Duration = Duration::from_secs(5 * 60);
/// The shortest renewal margin.
pub const MIN_RENEW_BEFORE: Duration = Duration::from_secs(60);
/// cert-manager's shortest certificate lifetime.
pub const CERT_MANAGER_MIN_DURATION: Duration = Duration::from_secs(3600);

/// Where a cluster's certificates come from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TlsSource<'a> {
    /// Secrets the user made (`spec.TLS.static`, CoreOS' API).
    Static(&'a crate::types::StaticTls),
    /// The operator's own CA (`spec.TLS.operatorManaged`).
    OperatorManaged(&'a OperatorManagedTls),
    /// cert-manager (`spec.TLS.certManager`).
    CertManager(&'a CertManagerTls),
}

impl TlsPolicy {
    /// Every source the policy names, in the order static, operatorManaged, certManager
    /// (valid policies name exactly one).
    pub fn sources(&self) -> Vec<TlsSource<'_>> {
        let mut out = Vec::new();
        if let Some(s) = &self.static_tls {
            out.push(TlsSource::Static(s));
        }
        if let Some(o) = &self.operator_managed {
            out.push(TlsSource::OperatorManaged(o));
        }
        if let Some(c) = &self.cert_manager {
            out.push(TlsSource::CertManager(c));
        }
        out
    }

    /// The one source of a valid policy.
    pub fn source(&self) -> Option<TlsSource<'_>> {
        self.sources().into_iter().next()
    }

    /// The Secrets the members of cluster `name` use with this policy, and where they come
    /// from: the user's (`static`), or the operator's or cert-manager's, of fixed names.
    pub fn in_use(&self, name: &str) -> Option<TlsInUse> {
        let managed = |source: &str, issuer: Option<String>| TlsInUse {
            source: source.to_string(),
            issuer,
            peer_secret: Some(CertKind::Peer.secret_name(name)),
            server_secret: Some(CertKind::Server.secret_name(name)),
            operator_secret: Some(CertKind::Operator.secret_name(name)),
        };
        Some(match self.source()? {
            TlsSource::Static(st) => {
                let member = st.member.as_ref();
                TlsInUse {
                    source: "static".to_string(),
                    issuer: None,
                    peer_secret: member.and_then(|m| m.peer_secret.clone()),
                    server_secret: member.and_then(|m| m.server_secret.clone()),
                    operator_secret: st.operator_secret.clone(),
                }
            }
            TlsSource::OperatorManaged(_) => managed("operatorManaged", None),
            TlsSource::CertManager(cm) => {
                let issuer = &cm.issuer_ref;
                let kind = issuer.kind.as_deref().unwrap_or("Issuer");
                let group = issuer.group.as_deref().unwrap_or(CERT_MANAGER_GROUP);
                managed(
                    "certManager",
                    Some(format!("{kind}.{group}/{}", issuer.name)),
                )
            }
        })
    }
}

impl TlsInUse {
    /// How its Secrets name their keys.
    pub fn layout(&self) -> SecretLayout {
        if self.source == "certManager" {
            SecretLayout::KubernetesTls
        } else {
            SecretLayout::CoreOs
        }
    }

    /// Which traffic uses TLS: (peer, client).
    pub fn modes(&self) -> (bool, bool) {
        (self.peer_secret.is_some(), self.server_secret.is_some())
    }
}

/// Why a certificate setting is refused; the field (relative to the source) comes with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsSettingsError {
    /// A duration that does not parse.
    #[error("{field}: {source}")]
    Syntax {
        /// The field, such as `duration`.
        field: &'static str,
        /// Why.
        #[source]
        source: ParseDurationError,
    },
    /// A duration out of its range.
    #[error("{field}: {message}")]
    Range {
        /// The field.
        field: &'static str,
        /// Why, in words.
        message: String,
    },
}

/// The lifetimes of an operator-managed cluster's certificates, defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IssuingSettings {
    /// Lifetime of each leaf certificate.
    pub duration: Duration,
    /// A leaf is renewed when less than this is left.
    pub renew_before: Duration,
    /// Lifetime of the CA.
    pub ca_duration: Duration,
}

impl IssuingSettings {
    /// A CA is replaced when less than this is left (a third of its life: time for every
    /// leaf to move to the new CA, a leaf lifetime at least, before the old one expires).
    pub fn ca_renew_before(&self) -> Duration {
        self.ca_duration / 3
    }
}

fn parse(field: &'static str, value: Option<&str>) -> Result<Option<Duration>, TlsSettingsError> {
    value
        .map(|v| parse_duration(v).map_err(|source| TlsSettingsError::Syntax { field, source }))
        .transpose()
}

fn range(field: &'static str, message: String) -> TlsSettingsError {
    TlsSettingsError::Range { field, message }
}

/// Shows a duration as a Go duration (`1h30m0s` style, whole seconds).
pub fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

impl OperatorManagedTls {
    /// The settings with defaults filled in, or the first setting that is refused.
    pub fn settings(&self) -> Result<IssuingSettings, TlsSettingsError> {
        let duration =
            parse("duration", self.duration.as_deref())?.unwrap_or(DEFAULT_LEAF_DURATION);
        if duration < MIN_LEAF_DURATION {
            return Err(range(
                "duration",
                format!(
                    "{} is too short: at least {}",
                    go_duration(duration),
                    go_duration(MIN_LEAF_DURATION)
                ),
            ));
        }
        let renew_before =
            parse("renewBefore", self.renew_before.as_deref())?.unwrap_or(duration / 3);
        if renew_before >= duration || renew_before < MIN_RENEW_BEFORE {
            return Err(range(
                "renewBefore",
                format!(
                    "{} must be at least {} and less than duration ({})",
                    go_duration(renew_before),
                    go_duration(MIN_RENEW_BEFORE),
                    go_duration(duration)
                ),
            ));
        }
        let ca_duration = parse("caDuration", self.ca_duration.as_deref())?
            .unwrap_or(DEFAULT_CA_DURATION.max(duration * 3));
        if ca_duration < duration * 3 {
            return Err(range(
                "caDuration",
                format!(
                    "{} is too short: at least three times duration ({}), so that every certificate can move to a new CA before the old one expires",
                    go_duration(ca_duration),
                    go_duration(duration * 3)
                ),
            ));
        }
        Ok(IssuingSettings {
            duration,
            renew_before,
            ca_duration,
        })
    }
}

/// The kinds of cert-manager issuers a Certificate may name.
pub const ISSUER_KINDS: [&str; 2] = ["Issuer", "ClusterIssuer"];
/// cert-manager's API group, the default of `issuerRef.group`.
pub const CERT_MANAGER_GROUP: &str = "cert-manager.io";

impl CertManagerTls {
    /// Checks the durations cert-manager is given (cert-manager would refuse the Certificate
    /// later, where only its status shows why).
    pub fn check(&self) -> Result<(), TlsSettingsError> {
        let duration = parse("duration", self.duration.as_deref())?;
        if let Some(d) = duration
            && d < CERT_MANAGER_MIN_DURATION
        {
            return Err(range(
                "duration",
                format!(
                    "{} is too short: cert-manager issues for at least {}",
                    go_duration(d),
                    go_duration(CERT_MANAGER_MIN_DURATION)
                ),
            ));
        }
        let renew_before = parse("renewBefore", self.renew_before.as_deref())?;
        if let Some(r) = renew_before
            && r >= duration.unwrap_or(DEFAULT_LEAF_DURATION)
        {
            return Err(range(
                "renewBefore",
                format!(
                    "{} must be less than duration ({})",
                    go_duration(r),
                    go_duration(duration.unwrap_or(DEFAULT_LEAF_DURATION))
                ),
            ));
        }
        Ok(())
    }
}

/// How a certificate Secret names its keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SecretLayout {
    /// CoreOS' (`static`, `operatorManaged`): `peer.crt`, `server.key`, `etcd-client-ca.crt`...
    #[default]
    CoreOs,
    /// `kubernetes.io/tls` as cert-manager writes it: `tls.crt`, `tls.key`, `ca.crt`.
    KubernetesTls,
    /// The operator's switch Secret ([`crate::names::tls_switch_secret_name`]): the three
    /// kinds in one Secret, in CoreOS' key names; each mount takes its own kind's keys.
    Switch,
}

/// The keys of a `kubernetes.io/tls` Secret: certificate, key, CA.
pub const KUBERNETES_TLS_KEYS: [&str; 3] = ["tls.crt", "tls.key", "ca.crt"];

impl SecretLayout {
    /// The keys (certificate, key, CA bundle) of a Secret of `kind` in this layout.
    pub fn keys(self, kind: CertKind) -> [&'static str; 3] {
        match self {
            SecretLayout::CoreOs | SecretLayout::Switch => kind.coreos_keys(),
            SecretLayout::KubernetesTls => KUBERNETES_TLS_KEYS,
        }
    }
}

/// The certificates a TLS cluster needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CertKind {
    /// The members' peer certificate (server and client of peer traffic).
    Peer,
    /// The members' client-facing server certificate.
    Server,
    /// The operator's client certificate.
    Operator,
}

impl CertKind {
    /// Every kind, in the order they are issued.
    pub const ALL: [CertKind; 3] = [CertKind::Peer, CertKind::Server, CertKind::Operator];

    /// A word for labels, Events and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            CertKind::Peer => "peer",
            CertKind::Server => "server",
            CertKind::Operator => "operator",
        }
    }

    /// The Secret (and cert-manager Certificate) holding it.
    pub fn secret_name(self, cluster: &str) -> String {
        match self {
            CertKind::Peer => crate::names::peer_tls_secret_name(cluster),
            CertKind::Server => crate::names::server_tls_secret_name(cluster),
            CertKind::Operator => crate::names::operator_tls_secret_name(cluster),
        }
    }

    /// The keys of its Secret in CoreOS' layout (certificate, key, CA bundle), which the
    /// members' mounts and the operator's client read.
    pub fn coreos_keys(self) -> [&'static str; 3] {
        match self {
            CertKind::Peer => ["peer.crt", "peer.key", "peer-ca.crt"],
            CertKind::Server => ["server.crt", "server.key", "server-ca.crt"],
            CertKind::Operator => ["etcd-client.crt", "etcd-client.key", "etcd-client-ca.crt"],
        }
    }

    /// The subject common name: the cluster's name for the members' certificates (X.509 caps
    /// a common name at 64 bytes, and cert-manager refuses longer ones: `NAME.NAMESPACE.svc`
    /// does not always fit; clients check the DNS names anyway), `etcd-operator` for the
    /// operator's.
    pub fn common_name(self, cluster: &str, _namespace: &str) -> String {
        match self {
            CertKind::Operator => "etcd-operator".to_string(),
            _ => {
                let mut end = cluster.len().min(64);
                while !cluster.is_char_boundary(end) {
                    end -= 1;
                }
                cluster[..end].to_string()
            }
        }
    }

    /// The DNS names a certificate of this kind must carry for `cluster` in `namespace` (with
    /// the cluster domain when the spec sets one): members are dialled as
    /// `MEMBER.CLUSTER.NAMESPACE.svc[.DOMAIN]` (a wildcard covers every member, present and
    /// future), clients through the client Service by its short and long names, and members'
    /// own tools on localhost. The operator's certificate is a client certificate and names
    /// nothing.
    pub fn dns_names(self, cluster: &str, namespace: &str, domain: Option<&str>) -> Vec<String> {
        let peer = crate::names::peer_service_name(cluster);
        let client = crate::names::client_service_name(cluster);
        let with_domain = |name: String| -> Vec<String> {
            match domain {
                Some(d) => vec![name.clone(), format!("{name}.{d}")],
                None => vec![name],
            }
        };
        match self {
            CertKind::Peer => with_domain(format!("*.{peer}.{namespace}.svc")),
            CertKind::Server => {
                let mut names = with_domain(format!("*.{peer}.{namespace}.svc"));
                names.extend(with_domain(format!("{client}.{namespace}.svc")));
                names.extend([
                    client.clone(),
                    format!("{client}.{namespace}"),
                    "localhost".to_string(),
                ]);
                names
            }
            CertKind::Operator => Vec::new(),
        }
    }

    /// The IP addresses it must carry (`127.0.0.1` on the server certificate, for tools in the
    /// member's pod).
    pub fn ip_addresses(self) -> Vec<std::net::IpAddr> {
        match self {
            CertKind::Server => vec![std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)],
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn om(d: Option<&str>, r: Option<&str>, ca: Option<&str>) -> OperatorManagedTls {
        OperatorManagedTls {
            duration: d.map(str::to_string),
            renew_before: r.map(str::to_string),
            ca_duration: ca.map(str::to_string),
        }
    }

    #[test]
    fn defaults_are_ninety_days_a_third_and_ten_years() {
        let s = om(None, None, None).settings().expect("defaults");
        assert_eq!(s.duration, DEFAULT_LEAF_DURATION);
        assert_eq!(s.renew_before, DEFAULT_LEAF_DURATION / 3);
        assert_eq!(s.ca_duration, DEFAULT_CA_DURATION);
    }

    #[test]
    fn short_lifetimes_for_tests_are_allowed_with_their_ca_scaled() {
        let s = om(Some("6m"), Some("2m"), None).settings().expect("short");
        assert_eq!(s.duration, Duration::from_secs(360));
        assert_eq!(s.renew_before, Duration::from_secs(120));
        assert_eq!(s.ca_duration, DEFAULT_CA_DURATION);
        let s = om(Some("6m"), None, Some("18m"))
            .settings()
            .expect("short ca");
        assert_eq!(s.ca_renew_before(), Duration::from_secs(360));
    }

    #[test]
    fn refusals_name_the_field() {
        let e = om(Some("4m"), None, None).settings().unwrap_err();
        assert_eq!(e.to_string(), "duration: 4m0s is too short: at least 5m0s");
        let e = om(Some("1h"), Some("1h"), None).settings().unwrap_err();
        assert!(
            e.to_string().starts_with("renewBefore: 1h0m0s must be"),
            "{e}"
        );
        let e = om(Some("1h"), None, Some("2h")).settings().unwrap_err();
        assert!(
            e.to_string().starts_with("caDuration: 2h0m0s is too short"),
            "{e}"
        );
        let e = om(Some("90 days"), None, None).settings().unwrap_err();
        assert!(e.to_string().starts_with("duration: "), "{e}");
    }

    #[test]
    fn names_cover_every_member_and_the_client_service() {
        assert_eq!(
            CertKind::Peer.dns_names("example", "prod", None),
            ["*.example.prod.svc"]
        );
        assert_eq!(
            CertKind::Server.dns_names("example", "prod", Some("cluster.local")),
            [
                "*.example.prod.svc",
                "*.example.prod.svc.cluster.local",
                "example-client.prod.svc",
                "example-client.prod.svc.cluster.local",
                "example-client",
                "example-client.prod",
                "localhost"
            ]
        );
        assert!(CertKind::Operator.dns_names("e", "n", None).is_empty());
        assert_eq!(
            CertKind::Server.secret_name("example"),
            "example-server-tls"
        );
    }

    #[test]
    fn cert_manager_minimum_is_an_hour() {
        let c = |d: &str| CertManagerTls {
            duration: Some(d.into()),
            ..CertManagerTls::default()
        };
        assert!(c("1h").check().is_ok());
        assert!(c("59m").check().is_err());
    }
}
