//! The serving certificate: loading a PEM pair, the rustls configuration (TLS 1.2 and 1.3, ALPN
//! h2 and http/1.1), a resolver that picks the certificate without SNI (the API server dials
//! webhooks by IP and Go then sends no server name), and hot reload when the files change.
//!
//! Reload polls the files and compares their contents: cert-manager and the kubelet update
//! Secret volumes by swapping a `..data` symlink, which inode watches miss. A changed pair is
//! parsed and checked before it replaces the current one: every PEM block of the certificate
//! file must be an X.509 certificate, each one issued by the next (the leaf first), and the key
//! must match the leaf. A bad pair is counted, logged, and the current one stays. Connections
//! already open keep the certificate they were made with; new handshakes get the new one.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{PemObject, SectionKind};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use x509_parser::certificate::X509Certificate;

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
    /// The certificate file holds no PEM block at all.
    #[error("{path} holds no valid PEM certificate")]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The key file holds no PEM private key, or a malformed one.
    #[error("{path} holds no valid PEM private key: {detail}")]
    NoKey {
        /// The file.
        path: PathBuf,
        /// What the PEM parser said.
        detail: String,
    },
    /// A PEM block of the certificate file is not a valid X.509 certificate.
    #[error("{path} holds no valid PEM certificate chain: block {block} of {blocks} {problem}")]
    BadBlock {
        /// The file.
        path: PathBuf,
        /// Which block, counting from 1 (the leaf).
        block: usize,
        /// How many blocks the file holds.
        blocks: usize,
        /// What is wrong with it.
        problem: BlockProblem,
    },
    /// A certificate of the chain is not issued by the one after it.
    #[error(
        "{path}: the chain is out of order: certificate {block} is issued by \"{issuer}\" but \
         certificate {next} is \"{next_subject}\" (the leaf comes first, each certificate \
         followed by its issuer)",
        next = block + 1
    )]
    ChainOrder {
        /// The file.
        path: PathBuf,
        /// The certificate whose issuer does not follow it, counting from 1 (the leaf).
        block: usize,
        /// Its issuer's name.
        issuer: String,
        /// The subject of the certificate after it.
        next_subject: String,
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

/// What is wrong with one PEM block of the certificate file.
#[derive(Debug, thiserror::Error)]
pub enum BlockProblem {
    /// The block is not well-formed PEM (no END line, bad base64, ...).
    #[error("is not valid PEM: {0}")]
    Pem(rustls::pki_types::pem::Error),
    /// The block is PEM but of another kind (a key, a CSR, an unknown label, a stray END line).
    #[error("is a PEM \"{label}\" block, not a CERTIFICATE")]
    NotCertificate {
        /// The label of its BEGIN (or stray END) line.
        label: String,
    },
    /// The block's content is not an X.509 certificate.
    #[error("is not an X.509 certificate: {0}")]
    X509(String),
    /// The certificate is followed by other bytes inside the block.
    #[error("has {0} bytes after the certificate")]
    TrailingBytes(usize),
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

/// Parses a PEM certificate chain and its private key, and checks that they belong together:
/// every PEM block of `cert_pem` must be a certificate (text outside blocks is ignored), each
/// certificate must be issued by the next one (the leaf first), and the key must be the leaf's.
/// `cert_path` and `key_path` only name the files in errors.
pub fn parse_pair(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<LoadedPair, TlsError> {
    let blocks = pem_blocks(cert_pem);
    let bad_block = |block: usize, problem: BlockProblem| TlsError::BadBlock {
        path: cert_path.to_path_buf(),
        block: block + 1,
        blocks: blocks.len(),
        problem,
    };
    let mut chain: Vec<CertificateDer<'static>> = Vec::with_capacity(blocks.len());
    for (i, block) in blocks.iter().enumerate() {
        chain.push(block_certificate(block).map_err(|problem| bad_block(i, problem))?);
    }
    // The parsed certificates borrow from `chain`, which is then handed to rustls.
    let mut parsed = Vec::with_capacity(chain.len());
    for (i, der) in chain.iter().enumerate() {
        parsed.push(parse_certificate(der).map_err(|problem| bad_block(i, problem))?);
    }
    let Some(leaf) = parsed.first() else {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_path_buf(),
        });
    };
    // Names compared as encoded, as path building in webpki does.
    for (i, (cert, issuer)) in parsed.iter().zip(parsed.iter().skip(1)).enumerate() {
        if cert.issuer().as_raw() != issuer.subject().as_raw() {
            return Err(TlsError::ChainOrder {
                path: cert_path.to_path_buf(),
                block: i + 1,
                issuer: cert.issuer().to_string(),
                next_subject: issuer.subject().to_string(),
            });
        }
    }
    let not_after = leaf.validity().not_after.timestamp();
    let serial = leaf.raw_serial_as_string();
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
    // With ring every key type knows its public key, so `InconsistentKeys::Unknown` (the key
    // cannot tell) is refused as well: a pair that cannot be checked is not used.
    certified.keys_match().map_err(mismatch)?;
    Ok(LoadedPair {
        key: Arc::new(certified),
        not_after,
        serial,
    })
}

/// Splits a PEM file into its blocks, each from its `-----BEGIN ` line through its `-----END `
/// line. A BEGIN line before the previous block's END ends that block unterminated, as does the
/// end of the file; a stray END line is a block of its own. Lines outside blocks (explanatory
/// text, as RFC 7468 allows) are left out.
fn pem_blocks(pem: &[u8]) -> Vec<&[u8]> {
    let mut blocks = Vec::new();
    let mut open: Option<usize> = None;
    let mut at = 0;
    for line in pem.split_inclusive(|&b| b == b'\n') {
        let end = at + line.len();
        if line.starts_with(b"-----BEGIN ") {
            if let Some(start) = open {
                blocks.push(&pem[start..at]);
            }
            open = Some(at);
        } else if line.starts_with(b"-----END ") {
            blocks.push(&pem[open.take().unwrap_or(at)..end]);
        }
        at = end;
    }
    if let Some(start) = open {
        blocks.push(&pem[start..]);
    }
    blocks
}

/// The certificate one PEM block holds.
fn block_certificate(block: &[u8]) -> Result<CertificateDer<'static>, BlockProblem> {
    let mut reader = block;
    match rustls::pki_types::pem::from_buf(&mut reader) {
        Ok(Some((SectionKind::Certificate, der))) => Ok(CertificateDer::from(der)),
        // Another kind, or one rustls does not know (it skips those: `None`).
        Ok(Some(_) | None) => Err(BlockProblem::NotCertificate {
            label: block_label(block),
        }),
        Err(e) => Err(BlockProblem::Pem(e)),
    }
}

/// The label of a block's first line: `X` of `-----BEGIN X-----` (or `-----END X-----`).
fn block_label(block: &[u8]) -> String {
    let first = block.split(|&b| b == b'\n').next().unwrap_or_default();
    let first = String::from_utf8_lossy(first);
    let label = first
        .trim_end()
        .trim_start_matches("-----BEGIN ")
        .trim_start_matches("-----END ")
        .trim_end_matches('-');
    label.chars().take(64).collect()
}

/// Parses one DER certificate, refusing bytes after it.
fn parse_certificate(der: &[u8]) -> Result<X509Certificate<'_>, BlockProblem> {
    match x509_parser::parse_x509_certificate(der) {
        Ok(([], cert)) => Ok(cert),
        Ok((rest, _)) => Err(BlockProblem::TrailingBytes(rest.len())),
        Err(e) => Err(BlockProblem::X509(e.to_string())),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    use base64::Engine as _;
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };

    /// A root CA, an intermediate it signs and a leaf the intermediate signs, all PEM.
    struct Chain {
        root: String,
        intermediate: String,
        leaf: String,
        leaf_key: String,
        leaf_serial: String,
    }

    fn ca_params(name: &str) -> CertificateParams {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        params
    }

    fn chain() -> Chain {
        let root_key = KeyPair::generate().unwrap();
        let root_params = ca_params("test root");
        let root = root_params.self_signed(&root_key).unwrap();
        let root_issuer = Issuer::new(root_params, root_key);

        let intermediate_key = KeyPair::generate().unwrap();
        let intermediate_params = ca_params("test intermediate");
        let intermediate = intermediate_params
            .signed_by(&intermediate_key, &root_issuer)
            .unwrap();
        let intermediate_issuer = Issuer::new(intermediate_params, intermediate_key);

        let leaf_key = KeyPair::generate().unwrap();
        let mut leaf_params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, "test leaf");
        let leaf = leaf_params
            .signed_by(&leaf_key, &intermediate_issuer)
            .unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(leaf.der()).unwrap();
        Chain {
            root: root.pem(),
            intermediate: intermediate.pem(),
            leaf: leaf.pem(),
            leaf_key: leaf_key.serialize_pem(),
            leaf_serial: parsed.raw_serial_as_string(),
        }
    }

    fn parse(cert: &str, key: &str) -> Result<LoadedPair, TlsError> {
        parse_pair(
            cert.as_bytes(),
            key.as_bytes(),
            Path::new("tls.crt"),
            Path::new("tls.key"),
            &provider(),
        )
    }

    /// A PEM block of `label` holding `der`.
    fn pem_block(label: &str, der: &[u8]) -> String {
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
    }

    /// The DER of a one-certificate PEM.
    fn der(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .as_ref()
            .to_vec()
    }

    /// `pem` with the second of its base64 lines left out: a block cut inside, whose base64
    /// still decodes (a line is 48 bytes) but to a truncated certificate.
    fn drop_a_line(pem: &str) -> String {
        let mut lines: Vec<&str> = pem.lines().collect();
        assert!(lines.len() > 4, "{pem}");
        lines.remove(2);
        lines.join("\n") + "\n"
    }

    /// Asserts `result` refuses block `block` of `blocks`, and returns its problem.
    fn bad_block(
        result: Result<LoadedPair, TlsError>,
        block: usize,
        blocks: usize,
    ) -> BlockProblem {
        let e = result.expect_err("refused");
        let message = e.to_string();
        assert!(
            message.contains(&format!("block {block} of {blocks} ")),
            "{message}"
        );
        match e {
            TlsError::BadBlock {
                block: b,
                blocks: n,
                problem,
                ..
            } if b == block && n == blocks => problem,
            e => panic!("want block {block} of {blocks} refused, got {e:?}"),
        }
    }

    #[test]
    fn a_whole_chain_is_accepted() {
        let c = chain();
        let pair = parse(&c.leaf, &c.leaf_key).unwrap();
        assert_eq!(pair.serial, c.leaf_serial);
        assert_eq!(pair.key.cert.len(), 1);
        let pair = parse(&format!("{}{}", c.leaf, c.intermediate), &c.leaf_key).unwrap();
        assert_eq!(pair.key.cert.len(), 2);
        assert_eq!(pair.serial, c.leaf_serial);
        // With the root too, text outside the blocks (as `openssl x509` prints it), CRLF line
        // ends and no final newline.
        let text = format!(
            "subject=CN=test leaf\n{}\nsubject=CN=test intermediate\n{}{}",
            c.leaf,
            c.intermediate.replace('\n', "\r\n"),
            c.root.trim_end()
        );
        let pair = parse(&text, &c.leaf_key).unwrap();
        assert_eq!(pair.key.cert.len(), 3);
        assert_eq!(pair.key.cert[1].as_ref(), der(&c.intermediate));
    }

    #[test]
    fn a_corrupt_second_block_is_refused_naming_it() {
        let c = chain();
        // Its base64 cut inside: decodes, but to a truncated certificate.
        let cut = format!("{}{}", c.leaf, drop_a_line(&c.intermediate));
        let problem = bad_block(parse(&cut, &c.leaf_key), 2, 2);
        assert!(matches!(problem, BlockProblem::X509(_)), "{problem:?}");
        // Replaced by well-formed base64 of garbage.
        let garbage = format!("{}{}", c.leaf, pem_block("CERTIFICATE", b"garbage"));
        let problem = bad_block(parse(&garbage, &c.leaf_key), 2, 2);
        assert!(matches!(problem, BlockProblem::X509(_)), "{problem:?}");
        // Characters that are not base64.
        let mangled = c.intermediate.replacen('M', "!", 1);
        assert_ne!(mangled, c.intermediate);
        let problem = bad_block(parse(&format!("{}{mangled}", c.leaf), &c.leaf_key), 2, 2);
        assert!(matches!(problem, BlockProblem::Pem(_)), "{problem:?}");
        // A certificate followed by other bytes in the same block.
        let mut padded = der(&c.intermediate);
        padded.extend_from_slice(&[0, 0]);
        let padded = format!("{}{}", c.leaf, pem_block("CERTIFICATE", &padded));
        let problem = bad_block(parse(&padded, &c.leaf_key), 2, 2);
        assert!(
            matches!(problem, BlockProblem::TrailingBytes(2)),
            "{problem:?}"
        );
        // The message names the file, the block and the reason.
        let e = parse(&garbage, &c.leaf_key).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "tls.crt holds no valid PEM certificate chain: block 2 of 2 is not an X.509 certificate: "
            ),
            "{e}"
        );
    }

    #[test]
    fn a_corrupt_leaf_is_refused_as_block_1() {
        let c = chain();
        let text = format!("{}{}", drop_a_line(&c.leaf), c.intermediate);
        let problem = bad_block(parse(&text, &c.leaf_key), 1, 2);
        assert!(matches!(problem, BlockProblem::X509(_)), "{problem:?}");
    }

    #[test]
    fn blocks_that_are_not_certificates_are_refused() {
        let c = chain();
        let leaf_and = |tail: &str| format!("{}{}{tail}", c.leaf, c.intermediate);
        for (tail, label) in [
            // The key appended to the chain (a combined PEM).
            (c.leaf_key.clone(), "PRIVATE KEY"),
            // A label rustls does not know (its iterator skips those silently).
            (pem_block("GARBAGE", b"garbage"), "GARBAGE"),
            (
                pem_block("CERTIFICATE REQUEST", b"x"),
                "CERTIFICATE REQUEST",
            ),
            // An END line without a BEGIN.
            ("-----END CERTIFICATE-----\n".to_string(), "CERTIFICATE"),
        ] {
            let problem = bad_block(parse(&leaf_and(&tail), &c.leaf_key), 3, 3);
            match problem {
                BlockProblem::NotCertificate { label: got } => assert_eq!(got, label),
                p => panic!("{label}: {p:?}"),
            }
        }
        // A last block that never ends, or ends where the next begins.
        let cut = c.root.replace("-----END CERTIFICATE-----", "");
        let problem = bad_block(parse(&leaf_and(&cut), &c.leaf_key), 3, 3);
        assert!(matches!(problem, BlockProblem::Pem(_)), "{problem:?}");
        let unended = c.intermediate.replace("-----END CERTIFICATE-----\n", "");
        let problem = bad_block(
            parse(&format!("{}{unended}{}", c.leaf, c.root), &c.leaf_key),
            2,
            3,
        );
        assert!(matches!(problem, BlockProblem::Pem(_)), "{problem:?}");
    }

    #[test]
    fn an_empty_chain_is_refused() {
        let c = chain();
        for text in ["", "\n", "not a certificate\n"] {
            let e = parse(text, &c.leaf_key).unwrap_err();
            assert!(matches!(e, TlsError::NoCertificate { .. }), "{e:?}");
            assert_eq!(e.to_string(), "tls.crt holds no valid PEM certificate");
        }
    }

    #[test]
    fn a_chain_out_of_order_is_refused() {
        let c = chain();
        for (text, block) in [
            (format!("{}{}", c.intermediate, c.leaf), 1),
            (format!("{}{}", c.leaf, c.root), 1),
            (format!("{}{}{}", c.leaf, c.root, c.intermediate), 1),
            (format!("{}{}{}", c.leaf, c.intermediate, c.leaf), 2),
        ] {
            let e = parse(&text, &c.leaf_key).unwrap_err();
            match &e {
                TlsError::ChainOrder { block: b, .. } => assert_eq!(*b, block, "{e}"),
                e => panic!("{e:?}"),
            }
        }
        let e = parse(&format!("{}{}", c.leaf, c.root), &c.leaf_key)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "tls.crt: the chain is out of order: certificate 1 is issued by \"CN=test intermediate\" \
             but certificate 2 is \"CN=test root\" (the leaf comes first, each certificate \
             followed by its issuer)"
        );
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let c = chain();
        let other = KeyPair::generate().unwrap().serialize_pem();
        let e = parse(&format!("{}{}", c.leaf, c.intermediate), &other).unwrap_err();
        assert!(
            matches!(
                e,
                TlsError::KeyMismatch {
                    source: rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch),
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string().starts_with("tls.key does not fit tls.crt: "),
            "{e}"
        );
        let e = parse(&c.leaf, "no key").unwrap_err();
        assert!(matches!(e, TlsError::NoKey { .. }), "{e:?}");
    }

    #[test]
    fn the_reloader_keeps_the_pair_when_a_chain_block_is_corrupt() {
        let c = chain();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let good = format!("{}{}", c.leaf, c.intermediate);
        std::fs::write(&cert, &good).unwrap();
        std::fs::write(&key, &c.leaf_key).unwrap();
        let metrics = Metrics::new().unwrap();
        let (mut reloader, resolver) = CertReloader::start(&cert, &key, metrics.clone()).unwrap();
        let served = resolver.current();

        std::fs::write(&cert, format!("{}{}", c.leaf, drop_a_line(&c.intermediate))).unwrap();
        match reloader.check() {
            ReloadOutcome::Failed(TlsError::BadBlock { block: 2, .. }) => {}
            o => panic!("{o:?}"),
        }
        assert!(Arc::ptr_eq(&resolver.current(), &served), "old pair kept");
        assert!(matches!(reloader.check(), ReloadOutcome::Unchanged));
        let text = metrics.encode().unwrap();
        assert!(
            text.contains("etcd_webhook_certificate_reload_failures_total 1\n"),
            "{text}"
        );
        assert!(
            text.contains("etcd_webhook_certificate_reloads_total 0\n"),
            "{text}"
        );

        std::fs::write(&cert, &good).unwrap();
        assert!(matches!(reloader.check(), ReloadOutcome::Reloaded(_)));
    }
}
