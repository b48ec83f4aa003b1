//! The serving certificate: loading a PEM pair, the rustls configuration (TLS 1.2 and 1.3, ALPN
//! h2 and http/1.1), a resolver that picks the certificate without SNI (the API server dials
//! webhooks by IP and Go then sends no server name), and hot reload when the files change.
//!
//! Reload polls the files and compares their contents: cert-manager and the kubelet update
//! Secret volumes by swapping a `..data` symlink, which inode watches miss. A changed pair is
//! parsed and checked (the key must match the certificate) before it replaces the current one;
//! a bad pair is counted, logged, and the current one stays. Connections already open keep the
//! certificate they were made with; new handshakes get the new one.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::metrics::Metrics;

/// Why a certificate pair cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The certificate file holds no PEM `CERTIFICATE`, or a malformed one.
    #[error("{path} holds no valid PEM certificate{detail}")]
    NoCertificate {
        /// The file.
        path: PathBuf,
        /// What the PEM parser said, if anything.
        detail: String,
    },
    /// The key file holds no PEM private key, or a malformed one.
    #[error("{path} holds no valid PEM private key: {detail}")]
    NoKey {
        /// The file.
        path: PathBuf,
        /// What the PEM parser said.
        detail: String,
    },
    /// The leaf certificate is not a valid X.509 certificate.
    #[error("{path}: the first certificate does not parse: {detail}")]
    BadCertificate {
        /// The file.
        path: PathBuf,
        /// What the X.509 parser said.
        detail: String,
    },
    /// rustls refused the key, or the key does not belong to the certificate.
    #[error("{key} does not fit {cert}: {source}")]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        source: rustls::Error,
    },
    /// rustls refused the protocol versions.
    #[error("cannot build the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// A parsed, checked certificate pair, ready for handshakes.
#[derive(Debug, Clone)]
pub struct LoadedPair {
    /// The chain and signing key rustls serves.
    pub key: Arc<CertifiedKey>,
    /// The leaf's notAfter, Unix seconds.
    pub not_after: i64,
    /// The leaf's serial number, hex.
    pub serial: String,
}

/// The crypto provider of every TLS object here: ring.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses a PEM certificate chain and its private key, and checks that they belong together.
/// `cert_path` and `key_path` only name the files in errors.
pub fn parse_pair(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<LoadedPair, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::NoCertificate {
            path: cert_path.to_path_buf(),
            detail: format!(": {e}"),
        })?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_path_buf(),
            detail: String::new(),
        });
    };
    let (not_after, serial) = match x509_parser::parse_x509_certificate(leaf) {
        Ok((_, cert)) => (
            cert.validity().not_after.timestamp(),
            cert.raw_serial_as_string(),
        ),
        Err(e) => {
            return Err(TlsError::BadCertificate {
                path: cert_path.to_path_buf(),
                detail: e.to_string(),
            });
        }
    };
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::NoKey {
        path: key_path.to_path_buf(),
        detail: e.to_string(),
    })?;
    let mismatch = |source| TlsError::KeyMismatch {
        cert: cert_path.to_path_buf(),
        key: key_path.to_path_buf(),
        source,
    };
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(mismatch)?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(e) => return Err(mismatch(e)),
    }
    Ok(LoadedPair {
        key: Arc::new(certified),
        not_after,
        serial,
    })
}

/// Reads and parses the pair at `cert_path` and `key_path`.
pub fn load_pair(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<LoadedPair, TlsError> {
    let cert = read(cert_path)?;
    let key = read(key_path)?;
    parse_pair(&cert, &key, cert_path, key_path, provider)
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Serves the current certificate to every client, whatever server name it asks for (or none).
#[derive(Debug)]
pub struct CertResolver {
    current: ArcSwap<CertifiedKey>,
}

impl CertResolver {
    /// A resolver serving `key` until [`CertResolver::replace`] swaps it.
    pub fn new(key: Arc<CertifiedKey>) -> Self {
        CertResolver {
            current: ArcSwap::new(key),
        }
    }

    /// Serves `key` from the next handshake on.
    pub fn replace(&self, key: Arc<CertifiedKey>) {
        self.current.store(key);
    }

    /// The pair being served.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The rustls server configuration: TLS 1.3 and 1.2, no client certificates, ALPN `h2` and
/// `http/1.1`, certificates from `resolver`.
pub fn server_config(resolver: Arc<CertResolver>) -> Result<ServerConfig, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// What one look at the files found.
#[derive(Debug)]
pub enum ReloadOutcome {
    /// The files are as they were when last looked at.
    Unchanged,
    /// A new pair is in use.
    Reloaded(LoadedPair),
    /// The files changed but cannot be used; the previous pair stays in use.
    Failed(TlsError),
}

/// The contents last looked at (or why they could not be read), to notice changes.
type Snapshot = (Result<Vec<u8>, String>, Result<Vec<u8>, String>);

/// Re-reads the certificate and key files and swaps in a changed, valid pair.
#[derive(Debug)]
pub struct CertReloader {
    cert_path: PathBuf,
    key_path: PathBuf,
    resolver: Arc<CertResolver>,
    metrics: Metrics,
    provider: Arc<CryptoProvider>,
    last_seen: Snapshot,
}

impl CertReloader {
    /// Loads the pair at the given paths (failing if it is unusable) and returns the reloader
    /// together with the resolver that serves it.
    pub fn start(
        cert_path: &Path,
        key_path: &Path,
        metrics: Metrics,
    ) -> Result<(Self, Arc<CertResolver>), TlsError> {
        let provider = provider();
        let cert = read(cert_path)?;
        let key = read(key_path)?;
        let pair = parse_pair(&cert, &key, cert_path, key_path, &provider)?;
        info!(cert = %cert_path.display(), serial = %pair.serial, not_after = pair.not_after, "serving certificate loaded");
        metrics.certificate_in_use(pair.not_after);
        let resolver = Arc::new(CertResolver::new(pair.key));
        let reloader = CertReloader {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            resolver: resolver.clone(),
            metrics,
            provider,
            last_seen: (Ok(cert), Ok(key)),
        };
        Ok((reloader, resolver))
    }

    /// Looks at the files once. A change is acted on once: a bad pair is counted and logged
    /// when it appears, not again at every look while it stays.
    pub fn check(&mut self) -> ReloadOutcome {
        let snapshot: Snapshot = (
            std::fs::read(&self.cert_path).map_err(|e| e.to_string()),
            std::fs::read(&self.key_path).map_err(|e| e.to_string()),
        );
        if snapshot == self.last_seen {
            return ReloadOutcome::Unchanged;
        }
        let result = match &snapshot {
            (Ok(cert), Ok(key)) => {
                parse_pair(cert, key, &self.cert_path, &self.key_path, &self.provider)
            }
            (Err(e), _) => Err(self.read_error(&self.cert_path, e)),
            (_, Err(e)) => Err(self.read_error(&self.key_path, e)),
        };
        self.last_seen = snapshot;
        match result {
            Ok(pair) => {
                self.resolver.replace(pair.key.clone());
                self.metrics.count_reload();
                self.metrics.certificate_in_use(pair.not_after);
                info!(cert = %self.cert_path.display(), serial = %pair.serial, not_after = pair.not_after, "serving certificate reloaded");
                ReloadOutcome::Reloaded(pair)
            }
            Err(e) => {
                self.metrics.count_reload_failure();
                warn!(error = %e, "changed serving certificate not used; keeping the current one");
                ReloadOutcome::Failed(e)
            }
        }
    }

    fn read_error(&self, path: &Path, message: &str) -> TlsError {
        TlsError::Read {
            path: path.to_path_buf(),
            source: std::io::Error::other(message.to_string()),
        }
    }

    /// Looks at the files every `interval` until `stop` is cancelled.
    pub async fn run(mut self, interval: Duration, stop: CancellationToken) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            // Two small files; reading them on a blocking thread keeps slow volumes off the
            // request threads.
            self = match tokio::task::spawn_blocking(move || {
                self.check();
                self
            })
            .await
            {
                Ok(reloader) => reloader,
                Err(e) => {
                    warn!(error = %e, "certificate reload task failed; reload stops");
                    return;
                }
            };
        }
    }
}
