//! The verifier's decisions, the parsing of TLS material and endpoints, and in-process
//! handshakes (TLS 1.2 and 1.3) through the connector.

use std::net::{IpAddr, Ipv4Addr};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::PrivatePkcs8KeyDer;
use time::OffsetDateTime;
use tower::Service as _;

use super::*;

/// A certificate with its key.
struct Pair {
    der: CertificateDer<'static>,
    pem: String,
    key: KeyPair,
}

impl Pair {
    fn of(cert: rcgen::Certificate, key: KeyPair) -> Pair {
        let (der, pem) = (cert.der().clone(), cert.pem());
        Pair { der, pem, key }
    }

    fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }
}

fn san(name: &str) -> SanType {
    match name.parse::<IpAddr>() {
        Ok(ip) => SanType::IpAddress(ip),
        Err(_) => SanType::DnsName(name.try_into().expect("IA5 name")),
    }
}

fn params(sans: &[&str]) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Etcd Operator Example");
    params.distinguished_name = dn;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::hours(2);
    params.subject_alt_names = sans.iter().map(|s| san(s)).collect();
    params
}

/// CoreOS' `prepareKeyAndCert`: self-signed, CA:TRUE, serverAuth + clientAuth.
fn coreos_params(sans: &[&str]) -> CertificateParams {
    let mut params = params(sans);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params
}

fn self_signed(params: &CertificateParams) -> Pair {
    let key = KeyPair::generate().expect("key");
    Pair::of(params.self_signed(&key).expect("self-signed"), key)
}

fn coreos(sans: &[&str]) -> Pair {
    self_signed(&coreos_params(sans))
}

/// A CA (no SANs) and the issuer that signs with it.
fn new_ca() -> (Pair, Issuer<'static, KeyPair>) {
    let mut ca_params = params(&[]);
    ca_params.distinguished_name.push(DnType::CommonName, "ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = self_signed(&ca_params);
    let issuer = Issuer::new(ca_params, KeyPair::from_pem(&ca.key_pem()).expect("ca key"));
    (ca, issuer)
}

fn signed_by(issuer: &Issuer<'static, KeyPair>, params: &CertificateParams) -> Pair {
    let key = KeyPair::generate().expect("key");
    Pair::of(params.signed_by(&key, issuer).expect("signed"), key)
}

/// A CA and a leaf it signed for `sans`.
fn ca_and_leaf(sans: &[&str]) -> (Pair, Pair) {
    let (ca, issuer) = new_ca();
    let mut leaf_params = params(sans);
    leaf_params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let leaf = signed_by(&issuer, &leaf_params);
    (ca, leaf)
}

fn verifier(cas: &[&Pair]) -> Arc<PinnedCaVerifier> {
    PinnedCaVerifier::new(
        cas.iter().map(|c| c.der.clone()).collect(),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .expect("verifier")
}

fn verify(verifier: &PinnedCaVerifier, leaf: &Pair, name: &str) -> Result<(), rustls::Error> {
    let name = ServerName::try_from(name.to_owned()).expect("name");
    verifier
        .verify_server_cert(&leaf.der, &[], &name, &[], UnixTime::now())
        .map(|_| ())
}

/// The certificate error `result` was refused with (`what` names the case).
fn refused(result: Result<(), rustls::Error>, what: &str) -> CertificateError {
    match result {
        Err(rustls::Error::InvalidCertificate(e)) => e,
        other => panic!("{what}: not refused for its certificate: {other:?}"),
    }
}

const MEMBER: &str = "example-0000.example.default.svc";
const SANS: &[&str] = &[
    "*.example.default.svc",
    "*.example.default.svc.cluster.local",
    "example-client.default.svc",
    "localhost",
    "127.0.0.1",
];

#[test]
fn webpki_alone_refuses_a_ca_used_as_server_certificate() {
    // The problem this module solves.
    let server = coreos(SANS);
    let err = verifier(&[&server])
        .webpki
        .verify_server_cert(
            &server.der,
            &[],
            &ServerName::try_from(MEMBER).expect("name"),
            &[],
            UnixTime::now(),
        )
        .expect_err("webpki refuses");
    assert!(format!("{err:?}").contains("CaUsedAsEndEntity"), "{err:?}");
}

#[test]
fn accepts_a_pinned_self_signed_ca_for_each_of_its_names() {
    let server = coreos(SANS);
    let v = verifier(&[&server]);
    for name in [
        MEMBER,
        "example-0001.example.default.svc.cluster.local",
        "example-client.default.svc",
        "localhost",
        "127.0.0.1",
    ] {
        verify(&v, &server, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn refuses_a_pinned_certificate_for_another_name() {
    let server = coreos(SANS);
    let v = verifier(&[&server]);
    for name in [
        "example-0000.other.default.svc",
        "a.b.example.default.svc",
        "127.0.0.2",
    ] {
        let err = verify(&v, &server, name).expect_err(name);
        assert!(
            matches!(
                err,
                rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. })
            ),
            "{name}: {err:?}"
        );
    }
}

#[test]
fn refuses_a_pinned_certificate_outside_its_validity() {
    let now = OffsetDateTime::now_utc();
    let mut expired = coreos_params(SANS);
    expired.not_before = now - time::Duration::days(2);
    expired.not_after = now - time::Duration::days(1);
    let expired = self_signed(&expired);
    let err = refused(verify(&verifier(&[&expired]), &expired, MEMBER), "expired");
    assert!(
        matches!(err, CertificateError::ExpiredContext { .. }),
        "{err:?}"
    );

    let mut future = coreos_params(SANS);
    future.not_before = now + time::Duration::days(1);
    future.not_after = now + time::Duration::days(2);
    let future = self_signed(&future);
    let err = refused(
        verify(&verifier(&[&future]), &future, MEMBER),
        "not yet valid",
    );
    assert!(
        matches!(err, CertificateError::NotValidYetContext { .. }),
        "{err:?}"
    );
}

#[test]
fn refuses_a_pinned_certificate_not_for_servers() {
    let mut params = coreos_params(SANS);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_only = self_signed(&params);
    let err = refused(
        verify(&verifier(&[&client_only]), &client_only, MEMBER),
        "EKU",
    );
    assert!(matches!(err, CertificateError::InvalidPurpose), "{err:?}");

    // No EKU at all: any use, as for Go.
    let mut params = coreos_params(SANS);
    params.extended_key_usages = vec![];
    let any_use = self_signed(&params);
    verify(&verifier(&[&any_use]), &any_use, MEMBER).expect("no EKU");
}

#[test]
fn refuses_an_unrelated_self_signed_ca_clearly() {
    let trusted = coreos(SANS);
    let other = coreos(SANS);
    let err = verify(&verifier(&[&trusted]), &other, MEMBER).expect_err("unrelated");
    assert!(
        err.to_string()
            .contains("is a CA certificate (basicConstraints CA:TRUE) and not one of the trusted"),
        "{err}"
    );
}

#[test]
fn refuses_an_unrelated_self_signed_leaf() {
    let (ca, _) = ca_and_leaf(SANS);
    let mut params = params(SANS);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let other = self_signed(&params);
    let err = refused(verify(&verifier(&[&ca]), &other, MEMBER), "unrelated");
    assert!(matches!(err, CertificateError::UnknownIssuer), "{err:?}");
}

#[test]
fn the_standard_chain_still_works_and_checks_names() {
    let (ca, leaf) = ca_and_leaf(SANS);
    let v = verifier(&[&ca]);
    verify(&v, &leaf, MEMBER).expect("CA + leaf");
    verify(&v, &leaf, "127.0.0.1").expect("IP SAN");
    let err = refused(
        verify(&v, &leaf, "example-0000.other.default.svc"),
        "wrong name",
    );
    assert!(
        matches!(err, CertificateError::NotValidForNameContext { .. }),
        "{err:?}"
    );
    // A CA:TRUE leaf signed by a trusted CA is still refused (only the trusted CAs are pinned).
    let (ca2, issuer) = new_ca();
    let ca_flagged_leaf = signed_by(&issuer, &coreos_params(SANS));
    let err = verify(&verifier(&[&ca2]), &ca_flagged_leaf, MEMBER).expect_err("CA leaf");
    assert!(err.to_string().contains("not one of the trusted"), "{err}");
    // The CA itself, presented as the server certificate, is pinned only for its SANs (none).
    let err = refused(verify(&v, &ca, MEMBER), "CA without SANs");
    assert!(
        matches!(err, CertificateError::NotValidForNameContext { .. }),
        "{err:?}"
    );
}

#[test]
fn a_bundle_trusts_both_layouts() {
    let (ca, leaf) = ca_and_leaf(SANS);
    let pinned = coreos(SANS);
    let v = verifier(&[&ca, &pinned]);
    verify(&v, &leaf, MEMBER).expect("CA + leaf");
    verify(&v, &pinned, MEMBER).expect("pinned");
    let err = verify(&v, &coreos(SANS), MEMBER).expect_err("unrelated");
    assert!(err.to_string().contains("not one of the trusted"), "{err}");
}

// --- TLS material ---

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The key inside a PKCS#8 `PrivateKeyInfo`: PKCS#1 for RSA, SEC1 for EC.
fn pkcs8_inner(pkcs8: &[u8]) -> Vec<u8> {
    let (_, info) = x509_parser::der_parser::parse_der(pkcs8).expect("PKCS#8 DER");
    let items = info.as_sequence().expect("SEQUENCE");
    items[2].as_slice().expect("OCTET STRING").to_vec()
}

fn client() -> Pair {
    let mut params = coreos_params(&[""]);
    params
        .distinguished_name
        .push(DnType::CommonName, "operator");
    self_signed(&params)
}

fn member_tls(ca: &Pair, client: &Pair, key_pem: &str) -> Result<MemberTls, EtcdTlsError> {
    MemberTls::new(
        ca.pem.as_bytes(),
        client.pem.as_bytes(),
        key_pem.as_bytes(),
        MEMBER,
    )
}

#[test]
fn loads_pkcs8_and_sec1_keys_and_a_client_certificate_with_an_empty_dns_san() {
    let server = coreos(SANS);
    let client = client();
    let tls = member_tls(&server, &client, &client.key_pem()).expect("PKCS#8");
    assert_eq!(tls.client_config().alpn_protocols, vec![b"h2".to_vec()]);
    assert_eq!(tls.server_name().to_str(), MEMBER);

    let sec1 = pem("EC PRIVATE KEY", &pkcs8_inner(&client.key.serialize_der()));
    member_tls(&server, &client, &sec1).expect("SEC1");

    let other = tls.with_server_name("10.0.0.7").expect("IP name");
    assert_eq!(other.server_name().to_str(), "10.0.0.7");
}

#[test]
fn refuses_bad_material_precisely() {
    let server = coreos(SANS);
    let client = client();
    let key = client.key_pem();

    assert!(matches!(
        MemberTls::new(b"", client.pem.as_bytes(), key.as_bytes(), MEMBER),
        Err(EtcdTlsError::NoCaCertificate)
    ));
    let truncated = &server.pem[..server.pem.len() - 10];
    assert!(matches!(
        MemberTls::new(
            truncated.as_bytes(),
            client.pem.as_bytes(),
            key.as_bytes(),
            MEMBER
        ),
        Err(EtcdTlsError::CaPem(_))
    ));
    let junk = pem("CERTIFICATE", b"not a certificate");
    assert!(matches!(
        MemberTls::new(
            junk.as_bytes(),
            client.pem.as_bytes(),
            key.as_bytes(),
            MEMBER
        ),
        Err(EtcdTlsError::InvalidCaCertificate { index: 0, .. })
    ));
    assert!(matches!(
        MemberTls::new(
            server.pem.as_bytes(),
            key.as_bytes(),
            key.as_bytes(),
            MEMBER
        ),
        Err(EtcdTlsError::NoClientCertificate)
    ));
    assert!(matches!(
        MemberTls::new(
            server.pem.as_bytes(),
            junk.as_bytes(),
            key.as_bytes(),
            MEMBER
        ),
        Err(EtcdTlsError::InvalidClientCertificate(_))
    ));
    assert!(matches!(
        member_tls(&server, &client, &client.pem),
        Err(EtcdTlsError::ClientKeyPem(_))
    ));
    assert!(matches!(
        member_tls(&server, &client, &pem("PRIVATE KEY", b"junk")),
        Err(EtcdTlsError::InvalidClientKey(_))
    ));
    let err = member_tls(&server, &client, &server.key_pem()).expect_err("mismatch");
    assert!(matches!(err, EtcdTlsError::KeyMismatch), "{err:?}");
    assert_eq!(
        err.to_string(),
        "client key does not match the client certificate's public key"
    );
    assert!(matches!(
        MemberTls::new(
            server.pem.as_bytes(),
            client.pem.as_bytes(),
            key.as_bytes(),
            "not a name!"
        ),
        Err(EtcdTlsError::InvalidServerName { .. })
    ));
}

#[test]
fn parses_https_endpoints_only() {
    for ok in [
        "https://127.0.0.1:2379",
        "https://127.0.0.1:2379/",
        "https://[::1]:2379",
    ] {
        parse_endpoint(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for (bad, why) in [
        ("http://127.0.0.1:2379", "plain http"),
        ("127.0.0.1:2379", "https://HOST:PORT"),
        ("https://127.0.0.1", "no port"),
        ("https://127.0.0.1:2379/v3", "without a path"),
        ("https://u@127.0.0.1:2379", "user information"),
        ("https://", "invalid"),
    ] {
        let err = parse_endpoint(bad).expect_err(bad);
        assert!(err.to_string().contains(why), "{bad}: {err}");
    }
    let uri: Uri = "http://[::1]:2379".parse().expect("uri");
    assert_eq!(host_port(&uri).expect("host"), ("::1".to_owned(), 2379));
}

#[test]
fn error_chains_say_each_cause_once() {
    #[derive(Debug)]
    struct Outer(io::Error);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("transport error")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    let err = Outer(io::Error::other("handshake: bad certificate"));
    assert_eq!(
        error_chain(&err),
        "transport error: handshake: bad certificate"
    );
}

// --- in-process handshakes through the connector ---

/// Serves one TLS handshake with `cert` on a loopback port, the given protocol versions.
async fn serve_once(
    cert: &Pair,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> (u16, tokio::task::JoinHandle<Result<(), io::Error>>) {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key.serialize_der()));
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(vec![cert.der.clone()], key)
    .expect("server config");
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await?;
        let _tls = acceptor.accept(tcp).await?;
        Ok(())
    });
    (port, task)
}

async fn dial(tls: &MemberTls, port: u16) -> Result<TokioIo<TlsStream<TcpStream>>, io::Error> {
    let mut connector = TlsConnector {
        config: tls.client_config(),
        server_name: tls.server_name().clone(),
        timeout: Duration::from_secs(5),
    };
    connector
        .call(format!("http://127.0.0.1:{port}").parse().expect("uri"))
        .await
}

#[tokio::test]
async fn handshakes_with_a_pinned_self_signed_ca_over_tls12_and_tls13() {
    let server = coreos(SANS);
    let client = client();
    let tls = member_tls(&server, &client, &client.key_pem()).expect("tls");
    for versions in [
        &[&rustls::version::TLS12][..],
        &[&rustls::version::TLS13][..],
    ] {
        let (port, task) = serve_once(&server, versions).await;
        let io = dial(&tls, port).await.expect("handshake");
        let (_, conn) = io.inner().get_ref();
        assert_eq!(conn.alpn_protocol(), Some(&b"h2"[..]));
        assert_eq!(conn.protocol_version(), Some(versions[0].version));
        task.await.expect("join").expect("server handshake");
    }

    let wrong = tls
        .with_server_name("example-0000.other.default.svc")
        .expect("name");
    let (port, _task) = serve_once(&server, &[&rustls::version::TLS13]).await;
    let err = dial(&wrong, port).await.expect_err("wrong name");
    let text = err.to_string();
    assert!(
        text.contains("TLS handshake with 127.0.0.1:") && text.contains("not valid for name"),
        "{text}"
    );
}
