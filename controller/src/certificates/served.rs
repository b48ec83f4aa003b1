//! Which certificate a member serves: a TLS handshake that records the certificate the server
//! presents and goes no further. It proves what a member loaded (a renewal reached it, or
//! not); it never carries data, so it verifies nothing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::net::TcpStream;

/// Why the served certificate could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ServedError {
    /// No TCP connection within the timeout.
    #[error("connecting to {addr}: {source}")]
    Connect {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The connection or the handshake took longer than the timeout.
    #[error("{addr}: no certificate within {timeout:?}")]
    Timeout {
        /// The address.
        addr: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The server presented no certificate.
    #[error("{0}: the server presented no certificate")]
    NoCertificate(String),
    /// The TLS configuration could not be made.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Records the presented end-entity certificate, accepts everything (inspection only).
#[derive(Debug)]
struct Recorder {
    seen: Mutex<Option<Vec<u8>>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Ok(mut seen) = self.seen.lock() {
            *seen = Some(end_entity.as_ref().to_vec());
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The DER of the certificate the TLS server at `addr` (`IP:PORT`, `[IPv6]:PORT`) presents
/// to a client that sends no SNI, within
/// `timeout`. The handshake may fail after the certificate was seen (a server that requires a
/// client certificate refuses the anonymous client): the certificate counts.
pub async fn served_certificate(addr: &str, timeout: Duration) -> Result<Vec<u8>, ServedError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let recorder = Arc::new(Recorder {
        seen: Mutex::new(None),
        provider: provider.clone(),
    });
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(recorder.clone())
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    // Dialled by IP address: rustls sends no SNI, and the certificate seen is the one every
    // client gets (etcd 3.2 serves a reloaded certificate only to clients that send SNI).
    let ip: std::net::IpAddr = addr
        .rsplit_once(':')
        .map(|(host, _)| host.trim_matches(['[', ']']))
        .and_then(|host| host.parse().ok())
        .ok_or_else(|| {
            ServedError::Config(rustls::Error::General(format!("{addr} is not IP:PORT")))
        })?;
    let name = ServerName::IpAddress(ip.into());
    let attempt = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|source| ServedError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        // The outcome does not matter: the verifier saw the certificate or not.
        let _ = connector.connect(name, tcp).await;
        Ok::<(), ServedError>(())
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| ServedError::Timeout {
            addr: addr.to_string(),
            timeout,
        })??;
    let seen = recorder.seen.lock().ok().and_then(|mut s| s.take());
    seen.ok_or_else(|| ServedError::NoCertificate(addr.to_string()))
}

/// How long one member gets to present its certificate on one port.
pub const SERVED_TIMEOUT: Duration = Duration::from_secs(3);

/// Whether the member at each of `ips` presents, on each port of `wanted`, exactly that
/// port's certificate (DER): a renewal or a switch reached every member. A member without an
/// IP, or one that does not answer within [`SERVED_TIMEOUT`], does not count as serving it.
pub async fn every_member_serves(ips: Vec<Option<String>>, wanted: &[(i32, Vec<u8>)]) -> bool {
    for ip in ips {
        let Some(ip) = ip else {
            return false;
        };
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip
        };
        for (port, der) in wanted {
            match served_certificate(&format!("{host}:{port}"), SERVED_TIMEOUT).await {
                Ok(seen) if &seen == der => {}
                _ => return false,
            }
        }
    }
    true
}
