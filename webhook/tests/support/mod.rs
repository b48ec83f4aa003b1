//! What the webhook's tests and benchmark share: certificates made with rcgen, an HTTPS client
//! that trusts the test CA and dials an IP (so, like the API server's Go client, it sends no
//! SNI), a plain HTTP GET, AdmissionReview builders and a Prometheus text parser.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::{http1, http2};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// A test certificate authority.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub cert_pem: String,
}

/// A serving certificate and its key.
#[derive(Clone)]
pub struct Pair {
    /// Certificate, PEM.
    pub cert_pem: String,
    /// Private key, PEM.
    pub key_pem: String,
    /// The serial, as x509-parser prints it (`01:02:...`).
    pub serial: String,
}

impl Ca {
    /// A new CA.
    pub fn new() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "etcd-webhook test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A serving certificate for 127.0.0.1 and localhost with the given serial.
    pub fn issue(&self, serial: u64) -> Pair {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        params.serial_number = Some(SerialNumber::from(serial));
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.der()).unwrap();
        Pair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            serial: parsed.raw_serial_as_string(),
        }
    }
}

/// Writes `pair` as `tls.crt` and `tls.key` in `dir`.
pub fn write_pair(dir: &Path, pair: &Pair) -> (PathBuf, PathBuf) {
    let cert = dir.join("tls.crt");
    let key = dir.join("tls.key");
    std::fs::write(&cert, &pair.cert_pem).unwrap();
    std::fs::write(&key, &pair.key_pem).unwrap();
    (cert, key)
}

/// Lays `pair` out as the kubelet does a Secret volume: `..<version>/tls.*`, a `..data` symlink
/// to it and `tls.crt -> ..data/tls.crt`. Calling it again swaps `..data` atomically.
pub fn kubelet_swap(dir: &Path, version: u32, pair: &Pair) -> (PathBuf, PathBuf) {
    let versioned = dir.join(format!("..v{version}"));
    std::fs::create_dir_all(&versioned).unwrap();
    std::fs::write(versioned.join("tls.crt"), &pair.cert_pem).unwrap();
    std::fs::write(versioned.join("tls.key"), &pair.key_pem).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..v{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for name in ["tls.crt", "tls.key"] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
    if version > 1 {
        let _ = std::fs::remove_dir_all(dir.join(format!("..v{}", version - 1)));
    }
    (dir.join("tls.crt"), dir.join("tls.key"))
}

/// A TLS client configuration trusting `ca_pem`, offering `alpn`, with the given versions,
/// without session resumption.
pub fn client_config(
    ca_pem: &str,
    alpn: &[&[u8]],
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let ca = rustls::pki_types::pem::PemObject::from_pem_slice(ca_pem.as_bytes()).unwrap();
    let ca: CertificateDer<'static> = ca;
    roots.add(ca).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    // Like the API server's Go client (no ClientSessionCache): every connection makes a full
    // handshake, so it sees the certificate served now, not the one of a resumed session.
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// Either HTTP version's request sender.
enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

/// One keep-alive HTTPS connection.
pub struct Conn {
    sender: Sender,
    /// Serial of the certificate the server presented.
    pub peer_serial: String,
    /// The ALPN protocol agreed.
    pub alpn: Option<Vec<u8>>,
    /// The TLS version agreed.
    pub version: Option<rustls::ProtocolVersion>,
    addr: SocketAddr,
}

/// A response, body collected.
#[derive(Debug)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The Content-Type header.
    pub content_type: String,
    /// The body.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Conn {
    /// Connects to `addr` (an IP: no SNI is sent) with `config`; speaks h2 when ALPN picks it.
    pub async fn connect(
        addr: SocketAddr,
        config: Arc<rustls::ClientConfig>,
    ) -> std::io::Result<Conn> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::IpAddress(addr.ip().into());
        let tls = TlsConnector::from(config).connect(name, tcp).await?;
        let (_, session) = tls.get_ref();
        let leaf = session
            .peer_certificates()
            .and_then(|c| c.first())
            .expect("server presented a certificate");
        let (_, parsed) = x509_parser::parse_x509_certificate(leaf).unwrap();
        let peer_serial = parsed.raw_serial_as_string();
        let alpn = session.alpn_protocol().map(<[u8]>::to_vec);
        let version = session.protocol_version();
        let io = TokioIo::new(tls);
        let sender = if alpn.as_deref() == Some(b"h2") {
            let (sender, conn) = http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            Sender::H2(sender)
        } else {
            let (sender, conn) = http1::handshake(io).await.map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            Sender::H1(sender)
        };
        Ok(Conn {
            sender,
            peer_serial,
            alpn,
            version,
            addr,
        })
    }

    /// Sends `request` and collects the answer.
    pub async fn send(&mut self, request: Request<Full<Bytes>>) -> Result<Reply, hyper::Error> {
        let response = match &mut self.sender {
            Sender::H1(s) => {
                s.ready().await?;
                s.send_request(request).await?
            }
            Sender::H2(s) => {
                s.ready().await?;
                s.send_request(request).await?
            }
        };
        collect(response).await
    }

    /// POSTs `body` to `path` with the given content type.
    pub async fn post_raw(
        &mut self,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<Bytes>,
    ) -> Result<Reply, hyper::Error> {
        let mut builder = Request::post(format!("https://{}{path}", self.addr));
        if let Some(ct) = content_type {
            builder = builder.header("content-type", ct);
        }
        self.send(builder.body(Full::new(body.into())).unwrap())
            .await
    }

    /// POSTs an AdmissionReview to `path` and returns its `response`, checking the HTTP status.
    pub async fn review(&mut self, path: &str, review: &Value) -> Value {
        let reply = self
            .post_raw(
                path,
                Some("application/json"),
                serde_json::to_vec(review).unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert_eq!(reply.content_type, "application/json");
        let v = reply.json();
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(v["kind"], "AdmissionReview");
        assert_eq!(
            v["response"]["uid"], review["request"]["uid"],
            "the answer carries the request's uid"
        );
        v["response"].clone()
    }
}

async fn collect(response: Response<hyper::body::Incoming>) -> Result<Reply, hyper::Error> {
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = response.into_body().collect().await?.to_bytes();
    Ok(Reply {
        status,
        content_type,
        body,
    })
}

/// A plain-HTTP GET on a fresh connection.
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<Reply> {
    let tcp = TcpStream::connect(addr).await?;
    let (mut sender, conn) = http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    let request = Request::get(format!("http://{addr}{path}"))
        .header("host", addr.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(std::io::Error::other)?;
    collect(response).await.map_err(std::io::Error::other)
}

/// The EtcdCluster GroupVersionKind as an AdmissionRequest has it.
pub fn etcd_kind() -> Value {
    json!({"group": "etcd.database.coreos.com", "version": "v1beta2", "kind": "EtcdCluster"})
}

/// An EtcdCluster object named `name` with `spec` (`Value::Null` leaves `spec` out).
pub fn cluster(name: &str, spec: Value) -> Value {
    let mut object = json!({
        "apiVersion": "etcd.database.coreos.com/v1beta2",
        "kind": "EtcdCluster",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": "5f1b5d1e-0000-4000-8000-000000000001",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {"example.com/note": "kept as is"},
            "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "etcd.database.coreos.com/v1beta2", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]
        },
    });
    if !spec.is_null() {
        object["spec"] = spec;
    }
    object
}

/// An AdmissionReview of `operation` on `object` (with `old` for updates).
pub fn review(uid: &str, operation: &str, object: Value, old: Value) -> Value {
    let name = object["metadata"]["name"].clone();
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": etcd_kind(),
            "resource": {"group": "etcd.database.coreos.com", "version": "v1beta2", "resource": "etcdclusters"},
            "requestKind": etcd_kind(),
            "requestResource": {"group": "etcd.database.coreos.com", "version": "v1beta2", "resource": "etcdclusters"},
            "name": if name.is_null() { json!("") } else { name },
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": {"kind": if operation == "CREATE" { "CreateOptions" } else { "UpdateOptions" }, "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

/// One sample of a metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The metric name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// Parses the Prometheus text exposition format (0.0.4) strictly: `# HELP` and `# TYPE` lines,
/// and samples `name{label="value",...} number`. Every sample's family must have been typed.
pub fn parse_prometheus(text: &str) -> Result<Vec<Sample>, String> {
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = Vec::new();
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !n.starts_with(|c: char| c.is_ascii_digit())
    };
    for (i, line) in text.lines().enumerate() {
        let err = |m: &str| format!("line {}: {m}: {line:?}", i + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("HELP"), Some(name), _) if valid_name(name) => {}
                (Some("TYPE"), Some(name), Some(kind))
                    if valid_name(name)
                        && ["counter", "gauge", "histogram", "summary", "untyped"]
                            .contains(&kind) =>
                {
                    typed.insert(name.to_string(), kind.to_string());
                }
                _ => return Err(err("bad comment")),
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').ok_or_else(|| err("no value"))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v.parse().map_err(|_| err("bad value"))?,
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .ok_or_else(|| err("unclosed labels"))?;
                let mut labels = BTreeMap::new();
                let mut rest = body;
                while !rest.is_empty() {
                    let (key, after) = rest.split_once("=\"").ok_or_else(|| err("bad label"))?;
                    let mut value = String::new();
                    let mut chars = after.char_indices();
                    let mut end = None;
                    while let Some((j, c)) = chars.next() {
                        match c {
                            '\\' => match chars.next() {
                                Some((_, 'n')) => value.push('\n'),
                                Some((_, c)) => value.push(c),
                                None => return Err(err("bad escape")),
                            },
                            '"' => {
                                end = Some(j);
                                break;
                            }
                            c => value.push(c),
                        }
                    }
                    let end = end.ok_or_else(|| err("unterminated label value"))?;
                    if !valid_name(key) {
                        return Err(err("bad label name"));
                    }
                    labels.insert(key.to_string(), value);
                    rest = &after[end + 1..];
                    rest = rest.strip_prefix(',').unwrap_or(rest);
                }
                (name, labels)
            }
        };
        if !valid_name(name) {
            return Err(err("bad metric name"));
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| typed.get(*f).is_some_and(|k| k == "histogram"))
            })
            .unwrap_or(name);
        if !typed.contains_key(family) {
            return Err(err("sample without a TYPE"));
        }
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    Ok(samples)
}

/// The value of the sample `name` whose labels include `labels`, or 0 when there is none.
pub fn metric(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}
