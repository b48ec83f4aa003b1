//! `etcd_tls` against real etcd servers, on the newest line (3.6) and the oldest the operator
//! supports (3.2, an old gRPC server). Each server runs with
//! `--cert-file/--key-file/--trusted-ca-file/--client-cert-auth` on an `https` loopback URL, and
//! the operator's client does a put, a get and a member list through [`connect`] when it should,
//! and is refused with a clear error when it should not:
//!
//! - (a) the CoreOS e2e layout: one self-signed `CA:TRUE` certificate (RSA, `RSA PRIVATE KEY`)
//!   that is both etcd's `--cert-file` and the operator's CA; the operator presents another
//!   self-signed `CA:TRUE` certificate with an empty DNS SAN, which is etcd's
//!   `--trusted-ca-file`;
//! - (b) a CA and leaves it signed (server certificate, client certificate with a SEC1 key);
//! - (c) a wrong server name, in both layouts;
//! - (d) an unrelated self-signed certificate (or CA) as the operator's CA, in both layouts.
//!
//! Run: `cargo test -p etcd-controller --test etcd_tls` (needs `hack/build-tools.sh`).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use base64::Engine as _;
use etcd_controller::etcd_tls::{EtcdTlsError, MemberTls, connect};
use etcd_tests::ports::free_ports;
use etcd_tests::process::ManagedProcess;
use etcd_tests::{CertificateAuthority, Tools, poll_until};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use time::OffsetDateTime;

const TIMEOUT: Duration = Duration::from_secs(5);
const WAIT: Duration = Duration::from_secs(60);

/// The name the operator verifies (members are dialled by IP, their certificates name the
/// cluster's pods).
const MEMBER: &str = "example-0000.example.default.svc";
const WRONG_NAME: &str = "example-0000.other.default.svc";
const SERVER_SANS: &[&str] = &[
    "*.example.default.svc",
    "*.example.default.svc.cluster.local",
    "example-client.default.svc.cluster.local",
    "localhost",
];

/// A 2048-bit RSA key for the CoreOS layout (ring, under rcgen, cannot generate RSA keys).
/// Test-only; PKCS#8 here, written out as PKCS#1 (`RSA PRIVATE KEY`) the way CoreOS' tooling
/// writes it.
const RSA_PKCS8: &str = "-----BEGIN PRIVATE KEY-----
MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQCxWIIPXG7k9B7Y
W2dILPwOTM7o9zazGE2txYYUaThDLb/LN+U4Wxfv4WiTVPVL+HKDzadNFURbGnLz
jKk5NFrW+F6YgFkzse+NuRwGMJmmhNBTdH4LTUWB/XdSJK7QlyM7Ybk9jGmAz0w1
I+ZHk6HIkRpP9GYg5V7w6KgPCqBLvHe4FVm7igcxjYfx5WY/WwjNGhvgxBK9j2cB
YOF7+/SeHBKRT3O0cWT9QTQheA23ZPXKWvSYNuDgv92wKD0hZlRk79Fv7FcvMeFE
fKueuVWYtsb6AnG62s9e7XpcYKHitzW0+f6d9sX7sUdnO2xANhnhWLN8VgWBzMpC
tRDgCUWTAgMBAAECggEASaYgiSGRWhq5bo9y8mngGU4zhVMZD8JRjA9iEbrqpxdq
NYpWcpN9+txI0hqvreeVIwB2cJAa7ZyrzVIGet+vs+O8YSe4I7xK6DfOGBH51UoF
vAq+R5JFAelRsrbSNIT3mDMKuzFDJT+xfcYVXXdFciY0X6z29sVaqsBr/qcij6CZ
R5GHC3EWgb7Jd8YozMRxxUzKQh4hSFYUHfPT8uD+QHoLVkG5Fvr7VDHSbCisWC9L
N53t/6aWtEku1tRHYFu1qrZRDr+wtBsbAgnH1/mdcnqr4OgiMvftInc9HlfwNztS
fhV/cJMsJfxTTGa7HbhcF/P6FmeuItHPjP15TV5BEQKBgQDk4M4hgsU3HGAU0Yvm
hKxPWwL763/y6eQy41Vmwc0LkIRQWpIFv6VTelZILfEZd0t4VRT1cJLSWefwJYPf
DqQbZHamaLiPtZTicG8a1utYtwWuFTTEyChb1hK7m0pqUx2b+e9VpPuEhDQkk3Bc
ziaTyRQF0raOYCbajQx7GlibYwKBgQDGXG1vdFTX9QjGAxE9q9GS0AwAamygtEqc
+wMyw6fbYIEiVhIrjpSxKKVzvymo+tAwiA+Gbplt5ChHKZIHRw9tZ1tgZcJQeelO
QtqIufuabXDxzl/jFp4dS9Cm0dt08q7dkWkXikVmzqx/YXxdR/k0eblKI2CLC0f0
+pcx+IF8EQKBgQDLKfoPqQLinp9zG2ax4scJUeJeOHdE6vUTbtRZ+GHIiCnLIfpI
fAuHBCseuxku38PwNqX6EEljy0ak1sgt8dMeNZlUsdRSTH6yWddl3aze/Odf1ZcX
rgyVKHtMaNYvd0PrNnqKbX6N7MRUS0QMPTnlKTJK0PYXf6Y9jcKsa4CHvQKBgDc5
qGYtVynA2K54UCaBXZmoPo8nEhMz3soRwHQzsNoM5ibvG6Pw0Ej6bgXppOmc2rWI
S/o7dI/5w5T8Z+GK0Sq+adxOuGi7aE8XocwLK5d0/Mr1kBCjTWYOo4quRpEqt7CM
OVwKbQQQakoUlBFMZn9LnGCdtNVBUMlNsyaAb1xhAoGBAMnd03PzAGxC17pGGfz4
GBkoh0LEIRqAtUVBVNmYmzB6tyFlDGZ6+zwZ2K7tBuVhdS29HoZbfkzlFvzuQe8G
6AJ+Ho7Hkyk5Sfo1C26Vx2LCMkNZwFVo91YU0j5bN6ZGaDcNrzUU/bpdZQjoJSkX
oN8PrXQ6Y2qDufBpNPwPxYqd
-----END PRIVATE KEY-----
";

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The key inside a PKCS#8 `PrivateKeyInfo`: PKCS#1 for RSA, SEC1 for EC.
fn pkcs8_inner(pkcs8: &[u8]) -> anyhow::Result<Vec<u8>> {
    let (_, info) = x509_parser::der_parser::parse_der(pkcs8).context("PKCS#8 DER")?;
    let items = info.as_sequence().context("PKCS#8 SEQUENCE")?;
    let key = items.get(2).context("PKCS#8 privateKey")?;
    Ok(key.as_slice().context("PKCS#8 OCTET STRING")?.to_vec())
}

/// CoreOS' `prepareKeyAndCert`: self-signed, `CA:TRUE`, certSign + digitalSignature,
/// serverAuth + clientAuth, no CN, 2 hours; DNS names as given (an empty one included).
fn coreos_cert(hosts: &[&str], key: &KeyPair) -> anyhow::Result<String> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Etcd Operator Example");
    params.distinguished_name = dn;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::hours(2);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.subject_alt_names = hosts
        .iter()
        .map(|h| match h.parse() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => Ok(SanType::DnsName((*h).try_into()?)),
        })
        .collect::<Result<_, rcgen::Error>>()?;
    Ok(params.self_signed(key)?.pem())
}

/// The PEM files of one layout: what etcd reads and what the operator reads.
#[derive(Clone)]
struct Layout {
    /// etcd's `--cert-file` and `--key-file`.
    server_cert: String,
    server_key: String,
    /// etcd's `--trusted-ca-file` (the client certificates it accepts).
    server_trusted_ca: String,
    /// The operator's CA bundle, client certificate and key.
    client_ca: String,
    client_cert: String,
    client_key: String,
}

impl Layout {
    fn member_tls(&self) -> anyhow::Result<MemberTls> {
        Ok(MemberTls::new(
            self.client_ca.as_bytes(),
            self.client_cert.as_bytes(),
            self.client_key.as_bytes(),
            MEMBER,
        )?)
    }
}

/// (a): the CoreOS e2e layout (`PrepareClientTLSSecret`).
fn coreos_layout() -> anyhow::Result<Layout> {
    let rsa = KeyPair::from_pkcs8_pem_and_sign_algo(RSA_PKCS8, &rcgen::PKCS_RSA_SHA256)?;
    let pkcs1 = pem("RSA PRIVATE KEY", &pkcs8_inner(&rsa.serialize_der())?);
    let server_cert = coreos_cert(SERVER_SANS, &rsa)?;
    // The same RSA key for the operator's certificate: only the certificates differ here.
    let client_cert = coreos_cert(&[""], &rsa)?;
    Ok(Layout {
        server_cert: server_cert.clone(),
        server_key: pkcs1.clone(),
        server_trusted_ca: client_cert.clone(),
        client_ca: server_cert,
        client_cert,
        client_key: pkcs1,
    })
}

/// (b): a CA and the leaves it signed; the client key as SEC1 (`EC PRIVATE KEY`).
fn ca_layout() -> anyhow::Result<Layout> {
    let ca = CertificateAuthority::new("etcd-tls-test-ca")?;
    let server = ca.issue_peer_cert(SERVER_SANS)?;
    let client = ca.issue_client_cert("etcd-operator", &[])?;
    Ok(Layout {
        server_cert: server.cert_pem,
        server_key: server.key_pem,
        server_trusted_ca: ca.cert_pem().to_owned(),
        client_ca: ca.cert_pem().to_owned(),
        client_cert: client.cert_pem,
        client_key: pem("EC PRIVATE KEY", &pkcs8_inner(&client.key_der)?),
    })
}

/// One etcd server on loopback, killed on drop (before its directory goes).
struct Server {
    process: ManagedProcess,
    endpoint: String,
    _dir: tempfile::TempDir,
}

fn start_etcd(etcd: &Path, layout: &Layout, extra: &[&str]) -> anyhow::Result<Server> {
    let dir = tempfile::tempdir()?;
    let write = |name: &str, contents: &str| -> anyhow::Result<String> {
        let path = dir.path().join(name);
        std::fs::write(&path, contents)?;
        Ok(path.display().to_string())
    };
    let cert = write("server.crt", &layout.server_cert)?;
    let key = write("server.key", &layout.server_key)?;
    let ca = write("server-ca.crt", &layout.server_trusted_ca)?;
    let [client_port, peer_port] = free_ports()?;
    let endpoint = format!("https://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut args = vec![
        "--name=m0".to_owned(),
        format!("--data-dir={}", dir.path().join("data").display()),
        format!("--listen-client-urls={endpoint}"),
        format!("--advertise-client-urls={endpoint}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=m0={peer}"),
        format!("--cert-file={cert}"),
        format!("--key-file={key}"),
        format!("--trusted-ca-file={ca}"),
        "--client-cert-auth".to_owned(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let process = ManagedProcess::start("etcd", etcd, &args, dir.path().join("etcd.log"))?;
    Ok(Server {
        process,
        endpoint,
        _dir: dir,
    })
}

/// Put, get and member list through a client from [`connect`].
async fn put_get_list(server: &Server, tls: &MemberTls) -> anyhow::Result<()> {
    let mut client = connect(&server.endpoint, tls, TIMEOUT).await?;
    client.put("etcd-tls", "works", None).await?;
    let got = client.get("etcd-tls", None).await?;
    let value = got.kvs().first().map(|kv| kv.value().to_vec());
    ensure!(
        value.as_deref() == Some(&b"works"[..]),
        "get returned {value:?}"
    );
    let members = client.member_list().await?;
    ensure!(
        members.members().len() == 1 && members.members()[0].name() == "m0",
        "member list {:?}",
        members.members()
    );
    Ok(())
}

/// Starts etcd with `layout` and waits until the operator's client works with it.
async fn ready(
    version: &str,
    layout: &Layout,
    extra: &[&str],
) -> anyhow::Result<(Server, MemberTls)> {
    let etcd = Tools::from_env()?.etcd(version)?;
    let server = start_etcd(&etcd, layout, extra)?;
    let tls = layout.member_tls()?;
    let ok = poll_until(
        &format!("etcd {version} at {}", server.endpoint),
        WAIT,
        || async { put_get_list(&server, &tls).await.map(Some) },
    )
    .await;
    if let Err(e) = ok {
        bail!("{e}\netcd log:\n{}", server.process.log_tail(30));
    }
    Ok((server, tls))
}

/// `connect` must fail with a [`EtcdTlsError::Connect`] whose message says `expected`.
async fn refused(server: &Server, tls: &MemberTls, expected: &str) -> anyhow::Result<String> {
    match connect(&server.endpoint, tls, TIMEOUT).await {
        Ok(_) => bail!("connected, expected a refusal saying {expected:?}"),
        Err(e @ EtcdTlsError::Connect { .. }) => {
            let text = e.to_string();
            ensure!(text.contains(expected), "expected {expected:?} in: {text}");
            println!("refused as expected: {text}");
            Ok(text)
        }
        Err(e) => bail!("expected a Connect error saying {expected:?}, got {e:?}"),
    }
}

async fn coreos_self_signed_ca(version: &str, extra: &[&str]) -> anyhow::Result<()> {
    let layout = coreos_layout()?;
    // (a) put/get/member list (done by `ready`, once more for good measure).
    let (server, tls) = ready(version, &layout, extra).await?;
    put_get_list(&server, &tls).await?;
    // The other names of the certificate work too.
    put_get_list(&server, &tls.with_server_name("localhost")?).await?;
    put_get_list(
        &server,
        &tls.with_server_name("example-0003.example.default.svc.cluster.local")?,
    )
    .await?;

    // etcd does check the operator's certificate: another self-signed one is refused (by etcd,
    // so the handshake may complete on our side and the first call fails).
    let stranger = KeyPair::generate()?;
    let stranger = Layout {
        client_cert: coreos_cert(&[""], &stranger)?,
        client_key: stranger.serialize_pem(),
        ..layout.clone()
    };
    let refused_by_etcd = put_get_list(&server, &stranger.member_tls()?).await;
    ensure!(
        refused_by_etcd.is_err(),
        "etcd accepted an operator certificate it does not trust"
    );

    // (c) a wrong server name.
    refused(
        &server,
        &tls.with_server_name(WRONG_NAME)?,
        "not valid for name",
    )
    .await?;

    // (d) an unrelated self-signed CA:TRUE certificate with the same names as the CA.
    let other_key = KeyPair::generate()?;
    let unrelated = Layout {
        client_ca: coreos_cert(SERVER_SANS, &other_key)?,
        ..layout.clone()
    };
    refused(
        &server,
        &unrelated.member_tls()?,
        "is a CA certificate (basicConstraints CA:TRUE) and not one of the trusted CA certificates",
    )
    .await?;
    Ok(())
}

async fn ca_and_leaf(version: &str, extra: &[&str]) -> anyhow::Result<()> {
    let layout = ca_layout()?;
    // (b) put/get/member list.
    let (server, tls) = ready(version, &layout, extra).await?;
    put_get_list(&server, &tls).await?;

    // (c) a wrong server name.
    refused(
        &server,
        &tls.with_server_name(WRONG_NAME)?,
        "not valid for name",
    )
    .await?;

    // (d) another CA, and a self-signed certificate, as the operator's CA.
    let other_ca = CertificateAuthority::new("etcd-tls-other-ca")?;
    let unrelated = Layout {
        client_ca: other_ca.cert_pem().to_owned(),
        ..layout.clone()
    };
    refused(&server, &unrelated.member_tls()?, "UnknownIssuer").await?;
    let self_signed = Layout {
        client_ca: coreos_cert(SERVER_SANS, &KeyPair::generate()?)?,
        ..layout.clone()
    };
    refused(&server, &self_signed.member_tls()?, "UnknownIssuer").await?;
    Ok(())
}

#[tokio::test]
async fn coreos_self_signed_ca_on_etcd_3_6() -> anyhow::Result<()> {
    coreos_self_signed_ca("3.6.16", &[]).await
}

#[tokio::test]
async fn coreos_self_signed_ca_on_etcd_3_2() -> anyhow::Result<()> {
    coreos_self_signed_ca("3.2.13", &[]).await
}

#[tokio::test]
async fn ca_and_leaf_on_etcd_3_6() -> anyhow::Result<()> {
    ca_and_leaf("3.6.16", &[]).await
}

#[tokio::test]
async fn ca_and_leaf_on_etcd_3_2() -> anyhow::Result<()> {
    ca_and_leaf("3.2.13", &[]).await
}

/// Both etcd binaries here are built with a current Go, so they speak TLS 1.3; this one is held
/// to TLS 1.2 (the handshake signatures take the other verification path).
#[tokio::test]
async fn coreos_self_signed_ca_on_etcd_3_6_over_tls12() -> anyhow::Result<()> {
    coreos_self_signed_ca("3.6.16", &["--tls-max-version=TLS1.2"]).await
}

#[tokio::test]
async fn ca_and_leaf_on_etcd_3_6_over_tls12() -> anyhow::Result<()> {
    ca_and_leaf("3.6.16", &["--tls-max-version=TLS1.2"]).await
}
