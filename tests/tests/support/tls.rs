//! A cluster's TLS Secrets in CoreOS' layout (`spec.TLS.static`): peer, server and operator
//! certificates from one test CA.

use std::collections::BTreeMap;

use kube::Api;

use etcd_tests::suite::TestContext;

/// The Secrets `NAME-peer`, `NAME-server` and `NAME-operator` of `spec.TLS.static`, laid out as
/// CoreOS' TLS guide says: peer certificates for `*.NAME.NS.svc` and `*.NAME.NS.svc.cluster.local`,
/// server certificates for `*.NAME.NS.svc`, `NAME-client.NS.svc` and `localhost` only, one CA.
/// Returns the CA and the operator's client certificate.
pub async fn coreos_tls_secrets(
    ctx: &TestContext,
    name: &str,
) -> anyhow::Result<(etcd_tests::CertificateAuthority, etcd_tests::IssuedCert)> {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;

    let ns = ctx.ns();
    let ca = etcd_tests::CertificateAuthority::new("etcd-test-ca")?;
    let peer = ca.issue_peer_cert(&[
        format!("*.{name}.{ns}.svc"),
        format!("*.{name}.{ns}.svc.cluster.local"),
    ])?;
    let server = ca.issue_peer_cert(&[
        format!("*.{name}.{ns}.svc"),
        format!("{name}-client.{ns}.svc"),
        "localhost".to_string(),
    ])?;
    let operator = ca.issue_client_cert("etcd-operator", &[])?;
    let secrets: Api<Secret> = ctx.api();
    for (suffix, prefix, cert) in [
        ("peer", "peer", &peer),
        ("server", "server", &server),
        ("operator", "etcd-client", &operator),
    ] {
        let data = BTreeMap::from([
            (
                format!("{prefix}.crt"),
                ByteString(cert.cert_pem.clone().into_bytes()),
            ),
            (
                format!("{prefix}.key"),
                ByteString(cert.key_pem.clone().into_bytes()),
            ),
            (
                format!("{prefix}-ca.crt"),
                ByteString(ca.cert_pem().as_bytes().to_vec()),
            ),
        ]);
        let object = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{name}-{suffix}")),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        };
        secrets.create(&Default::default(), &object).await?;
    }
    Ok((ca, operator))
}

/// The `TLS:` section of a cluster whose Secrets [`coreos_tls_secrets`] made.
pub fn tls_section(name: &str) -> String {
    format!(
        "  TLS:\n    static:\n      member:\n        peerSecret: {name}-peer\n        serverSecret: {name}-server\n      operatorSecret: {name}-operator\n"
    )
}
