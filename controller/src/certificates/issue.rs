//! Making certificates: the cluster's CA and the peer, server and operator leaves it signs
//! (rcgen; ECDSA P-256 keys, PKCS#8 PEM, which every etcd line from 3.2 reads).

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::OffsetDateTime;

use etcd_shared::tls::CertKind;

/// Certificates are valid from this long before they are made (clock skew between the
/// operator and the members).
pub const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    /// rcgen refused the parameters, the key or the signature.
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// A name the certificate must carry is not a valid DNS name.
    #[error("certificate name {name:?}: {source}")]
    Name {
        /// The name.
        name: String,
        /// Why.
        #[source]
        source: rcgen::Error,
    },
    /// A lifetime beyond what a certificate can say.
    #[error("certificate lifetime out of range")]
    Lifetime,
}

/// A certificate and its private key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Pem {
    /// The certificate (`CERTIFICATE`).
    pub cert: String,
    /// The private key (PKCS#8 `PRIVATE KEY`).
    pub key: String,
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pem")
            .field("cert", &self.cert)
            .finish_non_exhaustive()
    }
}

/// Who a CA is: the cluster it serves and its generation (1 for the first CA, one more for
/// each that replaced it). The generation is in its name, so certificates of two CAs of one
/// cluster name different issuers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaName {
    /// Cluster name.
    pub cluster: String,
    /// Namespace.
    pub namespace: String,
    /// Generation.
    pub generation: u64,
}

impl CaName {
    /// The subject common name: `etcd-operator CA CLUSTER.NAMESPACE #GENERATION`.
    pub fn common_name(&self) -> String {
        format!(
            "etcd-operator CA {}.{} #{}",
            self.cluster, self.namespace, self.generation
        )
    }

    fn params(&self) -> CertificateParams {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "etcd-operator");
        dn.push(DnType::CommonName, self.common_name());
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        params
    }
}

fn validity(
    params: &mut CertificateParams,
    now: OffsetDateTime,
    lifetime: Duration,
) -> Result<(), IssueError> {
    let lifetime = time::Duration::try_from(lifetime).map_err(|_| IssueError::Lifetime)?;
    let backdate = time::Duration::try_from(BACKDATE).map_err(|_| IssueError::Lifetime)?;
    params.not_before = now - backdate;
    params.not_after = now.checked_add(lifetime).ok_or(IssueError::Lifetime)?;
    Ok(())
}

/// A new self-signed CA valid for `lifetime` from `now`.
pub fn new_ca(name: &CaName, now: OffsetDateTime, lifetime: Duration) -> Result<Pem, IssueError> {
    let mut params = name.params();
    validity(&mut params, now, lifetime)?;
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// A leaf of `kind` for `cluster` in `namespace`, signed by the CA `ca` named `ca_name`,
/// valid for `lifetime` from `now`. Peer and server certificates serve and authenticate as
/// clients (etcd dials peers, and its gateway itself, with them); the operator's authenticates
/// as a client only.
#[allow(clippy::too_many_arguments)]
pub fn issue_leaf(
    kind: CertKind,
    cluster: &str,
    namespace: &str,
    domain: Option<&str>,
    ca_name: &CaName,
    ca: &Pem,
    now: OffsetDateTime,
    lifetime: Duration,
) -> Result<Pem, IssueError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, kind.common_name(cluster, namespace));
    params.distinguished_name = dn;
    for name in kind.dns_names(cluster, namespace, domain) {
        let ia5 = name
            .as_str()
            .try_into()
            .map_err(|source| IssueError::Name {
                name: name.clone(),
                source,
            })?;
        params.subject_alt_names.push(SanType::DnsName(ia5));
    }
    for ip in kind.ip_addresses() {
        params.subject_alt_names.push(SanType::IpAddress(ip));
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = match kind {
        CertKind::Operator => vec![ExtendedKeyUsagePurpose::ClientAuth],
        CertKind::Peer | CertKind::Server => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    };
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, now, lifetime)?;
    let issuer = Issuer::new(ca_name.params(), KeyPair::from_pem(&ca.key)?);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::pem::parse_x509_pem;

    fn name(generation: u64) -> CaName {
        CaName {
            cluster: "example".into(),
            namespace: "prod".into(),
            generation,
        }
    }

    #[test]
    fn a_leaf_chains_to_its_ca_and_carries_the_names() {
        let now = OffsetDateTime::now_utc();
        let ca = new_ca(&name(1), now, Duration::from_secs(86400)).expect("ca");
        let leaf = issue_leaf(
            CertKind::Server,
            "example",
            "prod",
            None,
            &name(1),
            &ca,
            now,
            Duration::from_secs(3600),
        )
        .expect("leaf");
        let (_, ca_pem) = parse_x509_pem(ca.cert.as_bytes()).expect("ca pem");
        let ca_x509 = ca_pem.parse_x509().expect("ca x509");
        let (_, leaf_pem) = parse_x509_pem(leaf.cert.as_bytes()).expect("leaf pem");
        let leaf_x509 = leaf_pem.parse_x509().expect("leaf x509");
        assert_eq!(leaf_x509.issuer(), ca_x509.subject());
        let sans = leaf_x509
            .subject_alternative_name()
            .expect("san ext")
            .expect("sans");
        let text = format!("{:?}", sans.value.general_names);
        assert!(text.contains("*.example.prod.svc"), "{text}");
        assert!(text.contains("example-client.prod.svc"), "{text}");
        let life = leaf_x509.validity().not_after.timestamp() - now.unix_timestamp();
        assert!((3590..=3610).contains(&life), "{life}");
    }

    #[test]
    fn a_second_generation_ca_names_another_issuer() {
        let now = OffsetDateTime::now_utc();
        let a = new_ca(&name(1), now, Duration::from_secs(86400)).expect("ca 1");
        let b = new_ca(&name(2), now, Duration::from_secs(86400)).expect("ca 2");
        let subject = |pem: &Pem| {
            let (_, p) = parse_x509_pem(pem.cert.as_bytes()).expect("pem");
            p.parse_x509().expect("x509").subject().to_string()
        };
        assert_ne!(subject(&a), subject(&b));
        assert!(subject(&b).contains("#2"));
    }
}
