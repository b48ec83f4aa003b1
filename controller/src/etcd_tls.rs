//! A TLS [`Client`] for one etcd member that also accepts the CoreOS operator's "self-signed
//! self-CA" certificates.
//!
//! The archived CoreOS etcd-operator's e2e suite, and many users who followed it, make one
//! self-signed certificate with `basicConstraints CA:TRUE` and use it both as the member's
//! server certificate and as the CA file its clients trust. Go's `crypto/x509` accepts that;
//! rustls' webpki verifier refuses it (`CaUsedAsEndEntity`). The verifier here accepts
//! everything webpki accepts (same roots: the CA bundle, same name check) and, in addition,
//! a server certificate that is byte-identical (DER) to one of the trusted CA certificates,
//! provided its validity period covers now, its SANs cover the expected server name and its
//! extended key usage (if any) allows serverAuth. Handshake signatures are verified as webpki
//! does. Anything else fails with the standard error, or with [`UntrustedCaCertificate`] when
//! the server presents a CA certificate that is not one of the trusted ones.
//!
//! The client presents the operator's certificate and key (PEM; PKCS#1 RSA as CoreOS' tooling
//! writes it, PKCS#8 or SEC1 EC), offers ALPN `h2`, and dials the member's address while
//! verifying a configured name (members are dialled by pod IP, their certificates name
//! `*.CLUSTER.NAMESPACE.svc`):
//!
//! ```no_run
//! # async fn demo(ca: &[u8], cert: &[u8], key: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use etcd_controller::etcd_tls::{MemberTls, connect};
//!
//! let tls = MemberTls::new(ca, cert, key, "example-0000.example.default.svc")?;
//! let mut client = connect("https://10.1.0.7:2379", &tls, Duration::from_secs(5)).await?;
//! let _members = client.member_list().await?;
//! # Ok(()) }
//! ```
//!
//! Plain `http://` endpoints are not this module's job: use `etcd_client::Client::connect`.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use hyper_util::rt::TokioIo;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, InconsistentKeys,
    OtherError, RootCertStore, SignatureScheme,
};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Endpoint, Uri};

/// Which keys of a client certificate Secret (or of the directory it is mounted in) to read:
/// CoreOS' client layout (`etcd-client.crt`, `etcd-client.key`, `etcd-client-ca.crt`), or,
/// when that has no certificate and `tls.crt` is there, `kubernetes.io/tls` (`tls.crt`,
/// `tls.key`, `ca.crt`) as cert-manager writes it. `has` says whether a key exists.
pub fn client_keys(has: impl Fn(&str) -> bool) -> [&'static str; 3] {
    let coreos = etcd_shared::tls::CertKind::Operator.coreos_keys();
    if !has(coreos[0]) && has(etcd_shared::tls::KUBERNETES_TLS_KEYS[0]) {
        etcd_shared::tls::KUBERNETES_TLS_KEYS
    } else {
        coreos
    }
}

/// Why TLS material could not be loaded, or a member could not be reached over TLS.
#[derive(Debug, thiserror::Error)]
pub enum EtcdTlsError {
    /// The CA bundle is not valid PEM.
    #[error("CA bundle: malformed PEM: {0}")]
    CaPem(#[source] rustls::pki_types::pem::Error),
    /// The CA bundle holds no `CERTIFICATE` block.
    #[error("CA bundle: no PEM CERTIFICATE found")]
    NoCaCertificate,
    /// A certificate of the CA bundle cannot be used as a trust anchor.
    #[error("CA bundle: certificate #{index} is not a usable X.509 certificate: {source}")]
    InvalidCaCertificate {
        /// Its position in the bundle (0-based).
        index: usize,
        /// Why rustls refused it.
        #[source]
        source: rustls::Error,
    },
    /// The client certificate file is not valid PEM.
    #[error("client certificate: malformed PEM: {0}")]
    ClientCertPem(#[source] rustls::pki_types::pem::Error),
    /// The client certificate file holds no `CERTIFICATE` block.
    #[error("client certificate: no PEM CERTIFICATE found")]
    NoClientCertificate,
    /// The client certificate cannot be parsed.
    #[error("client certificate: {0}")]
    InvalidClientCertificate(#[source] rustls::Error),
    /// The client key file is not valid PEM or holds no supported private key (`RSA PRIVATE
    /// KEY`, `PRIVATE KEY` or `EC PRIVATE KEY`; encrypted keys are not supported).
    #[error(
        "client key: no usable PEM private key (RSA PRIVATE KEY, PRIVATE KEY or EC PRIVATE KEY): {0}"
    )]
    ClientKeyPem(#[source] rustls::pki_types::pem::Error),
    /// The client key is PEM but not a key rustls can sign with.
    #[error("client key: {0}")]
    InvalidClientKey(#[source] rustls::Error),
    /// The client key is not the private key of the client certificate.
    #[error("client key does not match the client certificate's public key")]
    KeyMismatch,
    /// The name to verify the member's certificate against is neither a DNS name nor an IP.
    #[error("invalid server name {name:?}: {source}")]
    InvalidServerName {
        /// The name given.
        name: String,
        /// Why it is invalid.
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
    /// rustls refused the configuration (no usable protocol version).
    #[error("TLS configuration: {0}")]
    Config(#[source] rustls::Error),
    /// The endpoint is not `https://HOST:PORT`.
    #[error("invalid etcd endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The TCP connection or the TLS handshake failed (the message carries the whole cause,
    /// e.g. the certificate verification error).
    #[error("connecting to {endpoint} (verifying {server_name}): {message}")]
    Connect {
        /// The endpoint dialled.
        endpoint: String,
        /// The name the member's certificate was verified against.
        server_name: String,
        /// The cause, outermost first.
        message: String,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// etcd-client refused the channel.
    #[error("etcd client for {endpoint}: {source}")]
    Client {
        /// The endpoint dialled.
        endpoint: String,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
}

/// The server presented a CA certificate (`basicConstraints CA:TRUE`) as its own certificate,
/// and it is not one of the trusted CA certificates (so it cannot be accepted as pinned). Its
/// `Debug` is its message, as rustls shows it with `Debug` inside its own error.
pub struct UntrustedCaCertificate;

impl fmt::Display for UntrustedCaCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "the server's certificate is a CA certificate (basicConstraints CA:TRUE) and not one \
             of the trusted CA certificates; a CA certificate is accepted as a server \
             certificate only when it is itself in the trusted CA bundle",
        )
    }
}

impl fmt::Debug for UntrustedCaCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for UntrustedCaCertificate {}

/// TLS material for the members of one cluster, parsed and checked once: the CA bundle the
/// members' certificates must chain to (or be one of), the operator's client certificate and
/// key, and the name the members' certificates are verified against.
#[derive(Clone)]
pub struct MemberTls {
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
}

impl fmt::Debug for MemberTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemberTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl MemberTls {
    /// Parses the CA bundle, the client certificate (chain, leaf first) and its private key,
    /// all PEM, and the name to verify the members' certificates against (a DNS name such as
    /// `member.CLUSTER.NAMESPACE.svc`, or an IP address).
    pub fn new(
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
        server_name: &str,
    ) -> Result<Self, EtcdTlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = PinnedCaVerifier::new(ca_certificates(ca_pem)?, provider.clone())?;

        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(EtcdTlsError::ClientCertPem)?;
        if chain.is_empty() {
            return Err(EtcdTlsError::NoClientCertificate);
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(EtcdTlsError::ClientKeyPem)?;

        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(EtcdTlsError::Config)?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(chain, key)
            .map_err(|e| match e {
                rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch) => {
                    EtcdTlsError::KeyMismatch
                }
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => {
                    EtcdTlsError::InvalidClientCertificate(e)
                }
                other => EtcdTlsError::InvalidClientKey(other),
            })?;
        config.alpn_protocols = vec![b"h2".to_vec()];

        Ok(Self {
            config: Arc::new(config),
            server_name: parse_server_name(server_name)?,
        })
    }

    /// The same material, verifying the members' certificates against `server_name` instead
    /// (cheap: the parsed configuration is shared).
    pub fn with_server_name(&self, server_name: &str) -> Result<Self, EtcdTlsError> {
        Ok(Self {
            config: self.config.clone(),
            server_name: parse_server_name(server_name)?,
        })
    }

    /// The name the members' certificates are verified against.
    pub fn server_name(&self) -> &ServerName<'static> {
        &self.server_name
    }

    /// The rustls client configuration (ALPN `h2`, client certificate, the verifier above).
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }
}

fn parse_server_name(name: &str) -> Result<ServerName<'static>, EtcdTlsError> {
    ServerName::try_from(name.to_owned()).map_err(|source| EtcdTlsError::InvalidServerName {
        name: name.to_owned(),
        source,
    })
}

fn ca_certificates(ca_pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, EtcdTlsError> {
    let cas = CertificateDer::pem_slice_iter(ca_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(EtcdTlsError::CaPem)?;
    if cas.is_empty() {
        return Err(EtcdTlsError::NoCaCertificate);
    }
    Ok(cas)
}

/// Connects to the member at `endpoint` (`https://HOST:PORT`, HOST usually the pod IP) with
/// `tls`: TCP connect and TLS handshake each bounded by `timeout`, which is also the timeout of
/// every call made with the returned client. The first connection is made before this
/// returns, so a refused certificate is reported here, as [`EtcdTlsError::Connect`].
pub async fn connect(
    endpoint: &str,
    tls: &MemberTls,
    timeout: Duration,
) -> Result<Client, EtcdTlsError> {
    let origin = parse_endpoint(endpoint)?;
    let invalid = |reason: String| EtcdTlsError::InvalidEndpoint {
        endpoint: endpoint.to_owned(),
        reason,
    };
    let authority = origin
        .authority()
        .ok_or_else(|| invalid("no host".into()))?
        .to_string();
    // The connector does the TLS; tonic must not (it refuses `https` without its own TLS
    // config), so the endpoint is dialled as `http` and `origin` puts `https` back on the
    // requests.
    let channel = Endpoint::from_shared(format!("http://{authority}"))
        .map_err(|e| invalid(e.to_string()))?
        .origin(origin)
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector(TlsConnector {
            config: tls.config.clone(),
            server_name: tls.server_name.clone(),
            timeout,
        })
        .await
        .map_err(|source| EtcdTlsError::Connect {
            endpoint: endpoint.to_owned(),
            server_name: tls.server_name.to_str().into_owned(),
            message: error_chain(&source),
            source,
        })?;
    let options = ConnectOptions::new()
        .with_timeout(timeout)
        .with_connect_timeout(timeout);
    Client::from_channel(etcd_client::Channel::Tonic(channel), Some(options))
        .await
        .map_err(|source| EtcdTlsError::Client {
            endpoint: endpoint.to_owned(),
            source,
        })
}

/// Parses `https://HOST:PORT` (a trailing `/` is accepted).
fn parse_endpoint(endpoint: &str) -> Result<Uri, EtcdTlsError> {
    let invalid = |reason: &str| EtcdTlsError::InvalidEndpoint {
        endpoint: endpoint.to_owned(),
        reason: reason.to_owned(),
    };
    let uri = endpoint
        .parse::<Uri>()
        .map_err(|e| invalid(&e.to_string()))?;
    if uri.scheme_str() != Some("https") {
        return Err(invalid(
            "expected https://HOST:PORT (plain http endpoints do not use this TLS client)",
        ));
    }
    let Some(authority) = uri.authority() else {
        return Err(invalid("expected https://HOST:PORT, no host"));
    };
    if authority.port_u16().is_none() {
        return Err(invalid("expected https://HOST:PORT, no port"));
    }
    if authority.as_str().contains('@') {
        return Err(invalid("user information is not supported"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(invalid("expected https://HOST:PORT, without a path"));
    }
    Ok(uri)
}

/// The error and its causes, outermost first, each once.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.last().is_some_and(|last| last.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

/// The server certificate verifier: webpki's, plus trusted CA certificates used as the server
/// certificate themselves (see the module docs).
#[derive(Debug)]
struct PinnedCaVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    /// The CA bundle, DER: a server certificate byte-identical to one of these is pinned.
    pinned: Vec<CertificateDer<'static>>,
}

impl PinnedCaVerifier {
    /// Trusts `cas` as roots (webpki) and as pinned server certificates.
    fn new(
        cas: Vec<CertificateDer<'static>>,
        provider: Arc<CryptoProvider>,
    ) -> Result<Arc<Self>, EtcdTlsError> {
        let mut roots = RootCertStore::empty();
        for (index, ca) in cas.iter().enumerate() {
            roots
                .add(ca.clone())
                .map_err(|source| EtcdTlsError::InvalidCaCertificate { index, source })?;
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            // Unreachable: the bundle holds at least one anchor and no CRL is given.
            .map_err(|e| EtcdTlsError::Config(rustls::Error::General(e.to_string())))?;
        Ok(Arc::new(Self {
            webpki,
            pinned: cas,
        }))
    }
}

impl ServerCertVerifier for PinnedCaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let chain_error = match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(verified) => return Ok(verified),
            Err(e) => e,
        };
        if self
            .pinned
            .iter()
            .any(|ca| ca.as_ref() == end_entity.as_ref())
        {
            verify_pinned(end_entity, server_name, now)?;
            tracing::debug!(
                server_name = %server_name.to_str(),
                "accepted a trusted CA certificate used as the server certificate"
            );
            return Ok(ServerCertVerified::assertion());
        }
        if is_ca_certificate(end_entity) {
            return Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                OtherError(Arc::new(UntrustedCaCertificate)),
            )));
        }
        Err(chain_error)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }

    fn root_hint_subjects(&self) -> Option<&[DistinguishedName]> {
        self.webpki.root_hint_subjects()
    }
}

/// The checks webpki would make of a leaf, minus the chain: it parses (no unknown critical
/// extension), its validity period covers `now`, its extended key usage (if any) allows
/// serverAuth, and its SANs cover `server_name`.
fn verify_pinned(
    end_entity: &CertificateDer<'_>,
    server_name: &ServerName<'_>,
    now: UnixTime,
) -> Result<(), rustls::Error> {
    let parsed = ParsedCertificate::try_from(end_entity)?;
    let (_, cert) = x509_parser::parse_x509_certificate(end_entity.as_ref())
        .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;

    let time = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    let validity = cert.validity();
    let not_before = validity.not_before.timestamp();
    let not_after = validity.not_after.timestamp();
    let unix = |t: i64| UnixTime::since_unix_epoch(Duration::from_secs(t.max(0).unsigned_abs()));
    if time < not_before {
        return Err(CertificateError::NotValidYetContext {
            time: now,
            not_before: unix(not_before),
        }
        .into());
    }
    if time > not_after {
        return Err(CertificateError::ExpiredContext {
            time: now,
            not_after: unix(not_after),
        }
        .into());
    }

    match cert.extended_key_usage() {
        Ok(None) => {}
        Ok(Some(eku)) if eku.value.server_auth || eku.value.any => {}
        Ok(Some(_)) => return Err(CertificateError::InvalidPurpose.into()),
        Err(_) => return Err(CertificateError::BadEncoding.into()),
    }

    rustls::client::verify_server_name(&parsed, server_name)
}

/// The certificate says `basicConstraints CA:TRUE`.
fn is_ca_certificate(der: &CertificateDer<'_>) -> bool {
    x509_parser::parse_x509_certificate(der.as_ref())
        .ok()
        .and_then(|(_, cert)| {
            cert.basic_constraints()
                .ok()
                .flatten()
                .map(|bc| bc.value.ca)
        })
        .unwrap_or(false)
}

/// Dials the member: TCP, then the TLS handshake with the configured name (not the dialled
/// host, which is the pod IP).
#[derive(Clone)]
struct TlsConnector {
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
    timeout: Duration,
}

type ConnectFuture =
    Pin<Box<dyn Future<Output = Result<TokioIo<TlsStream<TcpStream>>, io::Error>> + Send>>;

impl tower::Service<Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(self.config.clone());
        let server_name = self.server_name.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            let (host, port) = host_port(&uri)?;
            let address = format!("{host}:{port}");
            let tcp = tokio::time::timeout(timeout, TcpStream::connect((host, port)))
                .await
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("TCP connect to {address} timed out after {timeout:?}"),
                    )
                })?
                .map_err(|e| io::Error::new(e.kind(), format!("TCP connect to {address}: {e}")))?;
            tcp.set_nodelay(true)?;
            let tls = tokio::time::timeout(timeout, connector.connect(server_name, tcp))
                .await
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("TLS handshake with {address} timed out after {timeout:?}"),
                    )
                })?
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("TLS handshake with {address}: {e}"))
                })?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// The host (IPv6 without brackets) and port of `uri`.
fn host_port(uri: &Uri) -> io::Result<(String, u16)> {
    let invalid = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no HOST:PORT in {uri}"),
        )
    };
    let host = uri.host().ok_or_else(invalid)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = uri.port_u16().ok_or_else(invalid)?;
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests;
