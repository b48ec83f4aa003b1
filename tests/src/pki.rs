//! Certificates for the local control plane, made in Rust with rcgen: a CA, serving
//! certificates (for the apiserver, and for webhook servers under test), client certificates
//! and the service-account signing key pair. All keys are ECDSA P-256 (fast to generate,
//! accepted by every component).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

/// Errors while making or writing certificates.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused the parameters or failed to sign.
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// A subject alternative name is neither an IP address nor a valid DNS name.
    #[error("invalid subject alternative name {name:?}: {source}")]
    InvalidSan {
        /// The rejected name.
        name: String,
        /// Why rcgen rejected it.
        source: rcgen::Error,
    },
    /// Writing a PEM file failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file being written.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// How long issued certificates are valid (they are backdated by an hour for clock skew).
const VALIDITY: Duration = Duration::days(365);

/// A certificate with its private key, both PEM- and DER-encoded.
#[derive(Debug, Clone)]
pub struct IssuedCert {
    /// The certificate, PEM (`CERTIFICATE`).
    pub cert_pem: String,
    /// The private key, PKCS#8 PEM (`PRIVATE KEY`).
    pub key_pem: String,
    /// The certificate, DER (for rustls' `CertificateDer`).
    pub cert_der: Vec<u8>,
    /// The private key, PKCS#8 DER (for rustls' `PrivatePkcs8KeyDer`).
    pub key_der: Vec<u8>,
}

impl IssuedCert {
    /// Writes `NAME.crt` and `NAME.key` into `dir`, returning their paths.
    pub fn write_to(&self, dir: &Path, name: &str) -> Result<(PathBuf, PathBuf), PkiError> {
        let cert = write_file(dir, &format!("{name}.crt"), &self.cert_pem)?;
        let key = write_file(dir, &format!("{name}.key"), &self.key_pem)?;
        Ok((cert, key))
    }
}

fn write_file(dir: &Path, name: &str, contents: &str) -> Result<PathBuf, PkiError> {
    let path = dir.join(name);
    std::fs::write(&path, contents).map_err(|source| PkiError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

fn base_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + VALIDITY;
    params.use_authority_key_identifier_extension = true;
    params
}

/// A self-signed certificate authority that signs serving and client certificates.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert: IssuedCert,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// Makes a new CA with the given common name.
    pub fn new(common_name: &str) -> Result<Self, PkiError> {
        let mut params = base_params(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        params.use_authority_key_identifier_extension = false;
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let issued = IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
            key_der: key.serialize_der(),
        };
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert: issued,
        })
    }

    /// The CA certificate, PEM (what goes in a kubeconfig or a webhook's `caBundle`).
    pub fn cert_pem(&self) -> &str {
        &self.cert.cert_pem
    }

    /// The CA certificate and its private key.
    pub fn cert(&self) -> &IssuedCert {
        &self.cert
    }

    fn sign(&self, params: &CertificateParams) -> Result<IssuedCert, PkiError> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
            key_der: key.serialize_der(),
        })
    }

    /// Issues a TLS serving certificate for `sans` (IP addresses become IP SANs, anything else a
    /// DNS SAN; Go ignores the CN, so every name a client dials must be listed). The first SAN is
    /// also the common name.
    pub fn issue_serving_cert<S: AsRef<str>>(&self, sans: &[S]) -> Result<IssuedCert, PkiError> {
        self.issue_for_names(sans, vec![ExtendedKeyUsagePurpose::ServerAuth])
    }

    /// Issues a certificate for `sans` valid for both ends of a TLS connection, as etcd's
    /// peer certificates are (and its server certificate, which its gRPC gateway also
    /// presents as a client).
    pub fn issue_peer_cert<S: AsRef<str>>(&self, sans: &[S]) -> Result<IssuedCert, PkiError> {
        self.issue_for_names(
            sans,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    fn issue_for_names<S: AsRef<str>>(
        &self,
        sans: &[S],
        usages: Vec<ExtendedKeyUsagePurpose>,
    ) -> Result<IssuedCert, PkiError> {
        let common_name = sans.first().map(AsRef::as_ref).unwrap_or("localhost");
        let mut params = base_params(common_name);
        params.subject_alt_names = sans
            .iter()
            .map(|name| san(name.as_ref()))
            .collect::<Result<_, _>>()?;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = usages;
        self.sign(&params)
    }

    /// Issues a client certificate; Kubernetes reads the user from the CN and the groups from
    /// the organizations (e.g. `("admin", &["system:masters"])`).
    pub fn issue_client_cert(
        &self,
        common_name: &str,
        organizations: &[&str],
    ) -> Result<IssuedCert, PkiError> {
        let mut params = base_params(common_name);
        for org in organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *org);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(&params)
    }
}

fn san(name: &str) -> Result<SanType, PkiError> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    name.try_into()
        .map(SanType::DnsName)
        .map_err(|source| PkiError::InvalidSan {
            name: name.to_owned(),
            source,
        })
}

/// The key pair that signs and verifies service-account tokens (ECDSA P-256, PEM).
#[derive(Debug, Clone)]
pub struct ServiceAccountKeyPair {
    /// PKCS#8 private key (`--service-account-signing-key-file`,
    /// `--service-account-private-key-file`).
    pub private_key_pem: String,
    /// SubjectPublicKeyInfo public key (`--service-account-key-file`).
    pub public_key_pem: String,
}

impl ServiceAccountKeyPair {
    /// Generates a new key pair.
    pub fn generate() -> Result<Self, PkiError> {
        let key = KeyPair::generate()?;
        Ok(Self {
            private_key_pem: key.serialize_pem(),
            public_key_pem: key.public_key_pem(),
        })
    }
}

/// The SANs of the apiserver serving certificate.
pub const APISERVER_SANS: &[&str] = &[
    "127.0.0.1",
    "localhost",
    "10.0.0.1",
    // The `kubernetes` Service's ClusterIP (first of --service-cluster-ip-range): in-cluster
    // clients on a real node dial it through kube-proxy.
    "10.96.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// Everything the control plane needs: one CA (serving and client), the apiserver serving cert,
/// the admin client cert (CN=admin, O=system:masters) and the service-account key pair.
#[derive(Debug)]
pub struct ControlPlanePki {
    /// The CA that signed everything below; also the apiserver's `--client-ca-file`.
    pub ca: CertificateAuthority,
    /// The kube-apiserver serving certificate (see [`APISERVER_SANS`]).
    pub apiserver: IssuedCert,
    /// The admin client certificate: CN=admin, O=system:masters.
    pub admin: IssuedCert,
    /// The service-account token key pair.
    pub service_account: ServiceAccountKeyPair,
}

/// Paths of the PEM files written by [`ControlPlanePki::write_to`].
#[derive(Debug, Clone)]
pub struct PkiFiles {
    /// CA certificate.
    pub ca_cert: PathBuf,
    /// CA private key (the controller manager's cluster-signing key).
    pub ca_key: PathBuf,
    /// Apiserver serving certificate.
    pub apiserver_cert: PathBuf,
    /// Apiserver serving key.
    pub apiserver_key: PathBuf,
    /// Service-account private key.
    pub sa_private_key: PathBuf,
    /// Service-account public key.
    pub sa_public_key: PathBuf,
}

impl ControlPlanePki {
    /// Generates a fresh PKI.
    pub fn generate() -> Result<Self, PkiError> {
        let ca = CertificateAuthority::new("etcd-operator-test-ca")?;
        let apiserver = ca.issue_serving_cert(APISERVER_SANS)?;
        let admin = ca.issue_client_cert("admin", &["system:masters"])?;
        let service_account = ServiceAccountKeyPair::generate()?;
        Ok(Self {
            ca,
            apiserver,
            admin,
            service_account,
        })
    }

    /// Writes the files the components read into `dir`.
    pub fn write_to(&self, dir: &Path) -> Result<PkiFiles, PkiError> {
        let (ca_cert, ca_key) = self.ca.cert().write_to(dir, "ca")?;
        let (apiserver_cert, apiserver_key) = self.apiserver.write_to(dir, "apiserver")?;
        let sa_private_key = write_file(dir, "sa.key", &self.service_account.private_key_pem)?;
        let sa_public_key = write_file(dir, "sa.pub", &self.service_account.public_key_pem)?;
        Ok(PkiFiles {
            ca_cert,
            ca_key,
            apiserver_cert,
            apiserver_key,
            sa_private_key,
            sa_public_key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_pem_material() {
        let pki = ControlPlanePki::generate().expect("pki");
        assert!(pki.ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pki.apiserver.key_pem.contains("PRIVATE KEY"));
        assert!(pki.service_account.public_key_pem.contains("PUBLIC KEY"));
    }

    #[test]
    fn rejects_bad_san() {
        let ca = CertificateAuthority::new("t").expect("ca");
        assert!(matches!(
            ca.issue_serving_cert(&["bücher.example"]),
            Err(PkiError::InvalidSan { .. })
        ));
    }

    #[test]
    fn apiserver_and_admin_certs_carry_the_right_names() {
        use x509_parser::extensions::GeneralName;
        let pki = ControlPlanePki::generate().expect("pki");

        let (_, cert) =
            x509_parser::parse_x509_certificate(&pki.apiserver.cert_der).expect("parse");
        let sans = cert
            .subject_alternative_name()
            .expect("extension parses")
            .expect("has SANs");
        let names: Vec<String> = sans
            .value
            .general_names
            .iter()
            .map(|n| match n {
                GeneralName::DNSName(d) => (*d).to_owned(),
                GeneralName::IPAddress(ip) => format!("{ip:?}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert!(names.contains(&"[127, 0, 0, 1]".to_owned()), "{names:?}");
        assert!(names.contains(&"localhost".to_owned()), "{names:?}");
        assert!(
            names.contains(&"kubernetes.default.svc".to_owned()),
            "{names:?}"
        );
        let (_, ca) = x509_parser::parse_x509_certificate(&pki.ca.cert().cert_der).expect("parse");
        assert_eq!(cert.issuer(), ca.subject());

        let (_, admin) = x509_parser::parse_x509_certificate(&pki.admin.cert_der).expect("parse");
        let subject = admin.subject();
        let cn: Vec<_> = subject
            .iter_common_name()
            .map(|a| a.as_str().expect("utf8"))
            .collect();
        let orgs: Vec<_> = subject
            .iter_organization()
            .map(|a| a.as_str().expect("utf8"))
            .collect();
        assert_eq!(cn, ["admin"]);
        assert_eq!(orgs, ["system:masters"]);
    }
}
