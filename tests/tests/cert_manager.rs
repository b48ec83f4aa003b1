//! Real cert-manager on the harness (`etcd_tests::cert_manager`): a SelfSigned Issuer makes a
//! CA Certificate, a CA Issuer signs a leaf with the DNS names an etcd cluster's members and
//! clients use, the leaf's Secret chains to the CA and serves real mutual TLS (an etcd member
//! on it, a client presenting it), and renewal, manual (what `cmctl renew` does) and on time
//! (`renewBefore`), issues a new certificate.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::pem::Pem;

use etcd_tests::cert_manager::{self, CertManager, CmKind, is_issued, is_ready};
use etcd_tests::process::ManagedProcess;
use etcd_tests::suite::{Suite, Test, TestContext};
use etcd_tests::{IssuedCert, kubeconfig, poll_until};

/// Deadline of each wait for cert-manager to act.
const WAIT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    Suite::new().run(vec![
        Test::new(
            "ca_issuer_signs_an_etcd_leaf_that_serves_mutual_tls_and_renews",
            ca_issuer_signs_an_etcd_leaf_that_serves_mutual_tls_and_renews,
        ),
        Test::new(
            "renew_before_reissues_on_time",
            renew_before_reissues_on_time,
        ),
    ])
}

/// The suite's cert-manager (started by the first test that asks; its start-up time is printed
/// once).
async fn cert_manager(ctx: &TestContext) -> anyhow::Result<&'static CertManager> {
    static PRINTED: AtomicBool = AtomicBool::new(false);
    let cm = cert_manager::shared(ctx.control_plane()).await?;
    if !PRINTED.swap(true, Ordering::SeqCst) {
        println!(
            "cert-manager {} ready {:.1} s after its start",
            cm.version(),
            cm.startup().as_secs_f64()
        );
    }
    Ok(cm)
}

/// Server-side applies a cert-manager object in the test's namespace.
async fn apply(ctx: &TestContext, kind: CmKind, object: serde_json::Value) -> anyhow::Result<()> {
    let object: DynamicObject = serde_json::from_value(object)?;
    let name = object
        .metadata
        .name
        .clone()
        .context("object without a name")?;
    kind.api(ctx.client(), Some(ctx.ns()))
        .patch(
            &name,
            &PatchParams::apply("cert-manager-suite").force(),
            &Patch::Apply(&object),
        )
        .await
        .with_context(|| format!("applying {kind:?} {name}"))?;
    Ok(())
}

/// Waits until `kind` `name` is Ready for its current generation (a Certificate: issued, see
/// [`is_issued`]) and returns it.
async fn ready(ctx: &TestContext, kind: CmKind, name: &str) -> anyhow::Result<DynamicObject> {
    let api = kind.api(ctx.client(), Some(ctx.ns()));
    let what = format!("{kind:?} {name} to be Ready");
    let settled = match kind {
        CmKind::Certificate => is_issued,
        _ => is_ready,
    };
    Ok(poll_until(&what, WAIT, || async {
        let object = api.get(name).await?;
        anyhow::Ok(settled(&object).then_some(object))
    })
    .await?)
}

/// What the harness reads from a Certificate's Secret.
struct TlsSecret {
    tls_crt: Vec<u8>,
    tls_key: Vec<u8>,
    ca_crt: Vec<u8>,
}

async fn tls_secret(ctx: &TestContext, name: &str) -> anyhow::Result<TlsSecret> {
    let secret = ctx
        .api::<Secret>()
        .get(name)
        .await
        .with_context(|| format!("Secret {name}"))?;
    ensure!(
        secret.type_.as_deref() == Some("kubernetes.io/tls"),
        "Secret {name} is of type {:?}",
        secret.type_
    );
    let data = secret.data.unwrap_or_default();
    let field = |key: &str| {
        data.get(key)
            .map(|b| b.0.clone())
            .filter(|b| !b.is_empty())
            .with_context(|| format!("Secret {name} has no {key}"))
    };
    Ok(TlsSecret {
        tls_crt: field("tls.crt")?,
        tls_key: field("tls.key")?,
        ca_crt: field("ca.crt")?,
    })
}

/// The DER of every certificate in a PEM bundle, in order.
fn pem_certificates(pem: &[u8]) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut ders = Vec::new();
    for block in Pem::iter_from_buffer(pem) {
        let block = block.context("reading PEM")?;
        ensure!(
            block.label == "CERTIFICATE",
            "a {} in a bundle",
            block.label
        );
        ders.push(block.contents);
    }
    ensure!(!ders.is_empty(), "no certificate in the bundle");
    Ok(ders)
}

fn parse(der: &[u8]) -> anyhow::Result<X509Certificate<'_>> {
    let (rest, cert) = x509_parser::parse_x509_certificate(der).context("parsing X.509")?;
    ensure!(rest.is_empty(), "trailing bytes after the certificate");
    Ok(cert)
}

fn dns_names(cert: &X509Certificate<'_>) -> anyhow::Result<Vec<String>> {
    let san = cert
        .subject_alternative_name()
        .context("reading subjectAltName")?
        .context("no subjectAltName")?;
    Ok(san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some((*d).to_owned()),
            _ => None,
        })
        .collect())
}

fn key_identifiers(cert: &X509Certificate<'_>) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let (mut subject, mut authority) = (None, None);
    for ext in cert.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(id) => subject = Some(id.0.to_vec()),
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                authority = aki.key_identifier.as_ref().map(|id| id.0.to_vec());
            }
            _ => {}
        }
    }
    (subject, authority)
}

/// The checks of a leaf against its CA: issued by it (names and key identifiers), not a CA,
/// with `dns` as its DNS names and server and client auth as its extended key usages.
fn check_leaf(secret: &TlsSecret, ca_der: &[u8], dns: &[String]) -> anyhow::Result<String> {
    let chain = pem_certificates(&secret.tls_crt)?;
    let leaf = parse(&chain[0])?;
    let ca = parse(ca_der)?;
    ensure!(
        leaf.issuer().as_raw() == ca.subject().as_raw(),
        "the leaf's issuer {} is not the CA {}",
        leaf.issuer(),
        ca.subject()
    );
    let (ca_ski, _) = key_identifiers(&ca);
    let (_, leaf_aki) = key_identifiers(&leaf);
    ensure!(
        ca_ski.is_some() && leaf_aki == ca_ski,
        "the leaf's authority key id {leaf_aki:02x?} is not the CA's subject key id {ca_ski:02x?}"
    );
    ensure!(!leaf.is_ca(), "the leaf is a CA");
    let mut names = dns_names(&leaf)?;
    names.sort();
    let mut want = dns.to_vec();
    want.sort();
    ensure!(
        names == want,
        "the leaf's DNS names {names:?}, want {want:?}"
    );
    let eku = leaf
        .extended_key_usage()
        .context("reading extendedKeyUsage")?
        .context("no extendedKeyUsage")?
        .value;
    ensure!(
        eku.server_auth && eku.client_auth,
        "extended key usage {eku:?}: want server and client auth"
    );
    let validity = leaf.validity();
    ensure!(
        validity.is_valid(),
        "the leaf is not valid now: {validity:?}"
    );
    Ok(leaf.raw_serial_as_string())
}

/// An etcd member serving the leaf on its client port, demanding client certificates from the
/// CA (`--client-cert-auth --trusted-ca-file`): a client that presents the same leaf and trusts
/// only the CA, and dials the member under one of the leaf's names (its wildcard), gets
/// `/version` (both ends verified the chain, the names and the key usages: rustls on this
/// side, Go's crypto/tls in etcd); a client without a certificate is refused.
async fn serve_mutual_tls(ctx: &TestContext, secret: &TlsSecret, name: &str) -> anyhow::Result<()> {
    let tools = ctx.control_plane().tools();
    let etcd = tools.etcd(&tools.versions().apiserver_etcd)?;
    let dir = tempfile::tempdir()?;
    let write = |file: &str, bytes: &[u8]| -> anyhow::Result<String> {
        let path = dir.path().join(file);
        std::fs::write(&path, bytes)?;
        Ok(path.display().to_string())
    };
    let (crt, key, ca) = (
        write("tls.crt", &secret.tls_crt)?,
        write("tls.key", &secret.tls_key)?,
        write("ca.crt", &secret.ca_crt)?,
    );
    let [client, peer] = etcd_tests::ports::free_ports::<2>()?;
    let client_url = format!("https://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let args = [
        "--name=cm".to_owned(),
        format!("--data-dir={}", dir.path().join("data").display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=cm={peer_url}"),
        format!("--cert-file={crt}"),
        format!("--key-file={key}"),
        format!("--trusted-ca-file={ca}"),
        "--client-cert-auth".to_owned(),
    ];
    let mut member = ManagedProcess::start("etcd", &etcd, &args, dir.path().join("etcd.log"))?;
    let ca_pem = String::from_utf8(secret.ca_crt.clone())?;
    let identity = IssuedCert {
        cert_pem: String::from_utf8(secret.tls_crt.clone())?,
        key_pem: String::from_utf8(secret.tls_key.clone())?,
        cert_der: Vec::new(),
        key_der: Vec::new(),
    };
    let client_for = |with_identity: bool| {
        let mut config = kubeconfig::build(&client_url, &ca_pem, &identity);
        if let Some(cluster) = config.clusters[0].cluster.as_mut() {
            cluster.tls_server_name = Some(name.to_owned());
        }
        if !with_identity && let Some(auth) = config.auth_infos[0].auth_info.as_mut() {
            auth.client_certificate_data = None;
            auth.client_key_data = None;
        }
        kubeconfig::client(config)
    };
    let with_leaf = client_for(true).await?;
    // Polled (etcd starts in a moment); an exit of etcd ends the wait at once.
    let deadline = Instant::now() + WAIT;
    let version = loop {
        if let Some(status) = member.exit_status() {
            bail!("etcd exited ({status}): {}", member.log_tail(20));
        }
        let request = http::Request::get("/version").body(Vec::new())?;
        match with_leaf.request_text(request).await {
            Ok(version) => break version,
            Err(e) if Instant::now() >= deadline => bail!(
                "etcd did not answer over mutual TLS in {WAIT:?} (last: {e}); its log:\n{}",
                member.log_tail(20)
            ),
            Err(_) => tokio::time::sleep(etcd_tests::wait::POLL_INTERVAL).await,
        }
    };
    ensure!(version.contains("etcdserver"), "GET /version: {version}");

    let anonymous = client_for(false).await?;
    let request = http::Request::get("/version").body(Vec::new())?;
    ensure!(
        anonymous.request_text(request).await.is_err(),
        "etcd answered a client without a certificate"
    );
    member.stop(Duration::from_secs(5));
    Ok(())
}

/// What `cmctl renew` does: sets the Certificate's `Issuing` condition (reason
/// `ManuallyTriggered`) through the status subresource.
async fn renew_now(ctx: &TestContext, name: &str) -> anyhow::Result<()> {
    let api = CmKind::Certificate.api(ctx.client(), Some(ctx.ns()));
    let mut certificate = api.get(name).await?;
    let generation = certificate.metadata.generation;
    let conditions = certificate.data["status"]["conditions"]
        .as_array_mut()
        .context("the Certificate has no conditions")?;
    conditions.retain(|c| c["type"] != "Issuing");
    conditions.push(serde_json::json!({
        "type": "Issuing",
        "status": "True",
        "reason": "ManuallyTriggered",
        "message": "Certificate re-issuance manually triggered",
        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        "observedGeneration": generation,
    }));
    api.replace_status(name, &PostParams::default(), &certificate)
        .await
        .context("setting the Issuing condition")?;
    Ok(())
}

/// The Certificate's `status.revision` (0 before the first issuance).
fn revision(certificate: &DynamicObject) -> i64 {
    certificate.data["status"]["revision"].as_i64().unwrap_or(0)
}

/// Waits until Certificate `name` is issued (see [`is_issued`]) at a revision above `after`
/// and returns that revision (its Secret is written before the revision is recorded).
async fn reissued(
    ctx: &TestContext,
    name: &str,
    after: i64,
    timeout: Duration,
) -> anyhow::Result<i64> {
    let api = CmKind::Certificate.api(ctx.client(), Some(ctx.ns()));
    let what = format!("Certificate {name} to be reissued after revision {after}");
    let certificate = poll_until(&what, timeout, || async {
        let c = api.get(name).await?;
        anyhow::Ok((revision(&c) > after && is_issued(&c)).then_some(c))
    })
    .await?;
    Ok(revision(&certificate))
}

async fn ca_issuer_signs_an_etcd_leaf_that_serves_mutual_tls_and_renews(
    ctx: TestContext,
) -> anyhow::Result<()> {
    let cm = cert_manager(&ctx).await?;
    let ns = ctx.ns().to_owned();
    let result = async {
        // A SelfSigned Issuer, the CA Certificate it signs, a CA Issuer on that CA.
        apply(
            &ctx,
            CmKind::Issuer,
            serde_json::json!({
                "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
                "metadata": {"name": "selfsigned"},
                "spec": {"selfSigned": {}},
            }),
        )
        .await?;
        apply(&ctx, CmKind::Certificate, serde_json::json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": "example-ca"},
            "spec": {
                "isCA": true,
                "commonName": "example etcd CA",
                "secretName": "example-ca",
                "duration": "2160h",
                "privateKey": {"algorithm": "ECDSA", "size": 256},
                "issuerRef": {"name": "selfsigned", "kind": "Issuer", "group": "cert-manager.io"},
            },
        }))
        .await?;
        ready(&ctx, CmKind::Certificate, "example-ca").await?;
        let ca_secret = tls_secret(&ctx, "example-ca").await?;
        let ca_der = pem_certificates(&ca_secret.tls_crt)?.remove(0);
        {
            let ca = parse(&ca_der)?;
            ensure!(ca.is_ca(), "the CA Certificate's certificate is not a CA");
            ensure!(
                ca.subject().as_raw() == ca.issuer().as_raw(),
                "the CA is not self-signed"
            );
        }
        apply(
            &ctx,
            CmKind::Issuer,
            serde_json::json!({
                "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
                "metadata": {"name": "example-ca"},
                "spec": {"ca": {"secretName": "example-ca"}},
            }),
        )
        .await?;
        ready(&ctx, CmKind::Issuer, "example-ca").await?;

        // The leaf: the names of an etcd cluster `example`'s members and clients.
        let dns = vec![
            format!("*.example.{ns}.svc"),
            format!("example-client.{ns}.svc"),
        ];
        apply(&ctx, CmKind::Certificate, serde_json::json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": "example-tls"},
            "spec": {
                "secretName": "example-tls",
                "dnsNames": dns,
                "usages": ["digital signature", "key encipherment", "server auth", "client auth"],
                "duration": "1h",
                "renewBefore": "5m",
                "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
                "issuerRef": {"name": "example-ca", "kind": "Issuer", "group": "cert-manager.io"},
            },
        }))
        .await?;
        let leaf = ready(&ctx, CmKind::Certificate, "example-tls").await?;
        let first_revision = revision(&leaf);
        ensure!(first_revision == 1, "first revision {first_revision}");
        let secret = tls_secret(&ctx, "example-tls").await?;
        ensure!(
            pem_certificates(&secret.ca_crt)? == vec![ca_der.clone()],
            "ca.crt is not the CA's certificate"
        );
        let serial = check_leaf(&secret, &ca_der, &dns)?;
        serve_mutual_tls(&ctx, &secret, &format!("etcd-0.example.{ns}.svc")).await?;

        // Renewal now (cmctl renew): a new certificate and key from the same CA.
        renew_now(&ctx, "example-tls").await?;
        let second = reissued(&ctx, "example-tls", first_revision, WAIT).await?;
        let renewed = tls_secret(&ctx, "example-tls").await?;
        let new_serial = check_leaf(&renewed, &ca_der, &dns)?;
        ensure!(new_serial != serial, "renewal kept serial {serial}");
        ensure!(
            renewed.tls_key != secret.tls_key,
            "rotationPolicy Always, but the renewal kept the private key"
        );
        serve_mutual_tls(&ctx, &renewed, &format!("example-client.{ns}.svc")).await?;
        println!("leaf revision {first_revision} -> {second}: serial {serial} -> {new_serial}");
        anyhow::Ok(())
    }
    .await;
    result.map_err(|e| e.context(cm.log_tails(40)))
}

async fn renew_before_reissues_on_time(ctx: TestContext) -> anyhow::Result<()> {
    let cm = cert_manager(&ctx).await?;
    let result = async {
        apply(&ctx, CmKind::Issuer, serde_json::json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
            "metadata": {"name": "selfsigned"},
            "spec": {"selfSigned": {}},
        }))
        .await?;
        // Valid 1 h, renewed 20 s after issuance (cert-manager's minimum duration is 1 h, its
        // minimum renewBefore 5 min; renewBefore must stay below the duration).
        let renew_after = Duration::from_secs(20);
        apply(&ctx, CmKind::Certificate, serde_json::json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": "short"},
            "spec": {
                "secretName": "short-tls",
                "dnsNames": ["short.example.svc"],
                "duration": "1h",
                "renewBefore": "59m40s",
                "privateKey": {"algorithm": "ECDSA", "size": 256},
                "issuerRef": {"name": "selfsigned", "kind": "Issuer", "group": "cert-manager.io"},
            },
        }))
        .await?;
        let first = ready(&ctx, CmKind::Certificate, "short").await?;
        ensure!(revision(&first) == 1, "first revision {}", revision(&first));
        let secret = tls_secret(&ctx, "short-tls").await?;
        let der = pem_certificates(&secret.tls_crt)?.remove(0);
        let cert = parse(&der)?;
        let not_before = cert.validity().not_before.timestamp();
        let not_after = cert.validity().not_after.timestamp();
        ensure!(not_after - not_before == 3600, "validity {}s, want 1h", not_after - not_before);
        let renewal_time = first.data["status"]["renewalTime"]
            .as_str()
            .context("no status.renewalTime")?;
        let renewal: k8s_openapi::jiff::Timestamp = renewal_time.parse()?;
        ensure!(
            renewal.as_second() == not_after - (3600 - 20),
            "renewalTime {renewal_time}: want notAfter - renewBefore ({} s after notBefore)",
            renew_after.as_secs()
        );
        let serial = cert.raw_serial_as_string();
        let began = Instant::now();
        let second = reissued(&ctx, "short", revision(&first), WAIT).await?;
        let renewed = tls_secret(&ctx, "short-tls").await?;
        let new_der = pem_certificates(&renewed.tls_crt)?.remove(0);
        let new_cert = parse(&new_der)?;
        ensure!(new_cert.raw_serial_as_string() != serial, "renewal kept the serial");
        ensure!(
            new_cert.validity().not_before.timestamp() >= renewal.as_second() - 1,
            "renewed at {}, before the renewal time {renewal_time}",
            new_cert.validity().not_before
        );
        println!(
            "renewed to revision {second} {:.1} s after the first Ready (renewal time {renewal_time})",
            began.elapsed().as_secs_f64()
        );
        // Stop the renewals every 20 s.
        CmKind::Certificate
            .api(ctx.client(), Some(ctx.ns()))
            .delete("short", &Default::default())
            .await?;
        anyhow::Ok(())
    }
    .await;
    result.map_err(|e| e.context(cm.log_tails(40)))
}
