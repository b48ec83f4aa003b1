//! Rules on `spec.TLS`: exactly one source of certificates; static secrets come in complete
//! sets with valid names; durations and issuers that the issuing will accept.

use super::Report;
use super::syntax::{is_dns1123_subdomain, quoted};
use crate::EtcdCluster;
use crate::tls::{ISSUER_KINDS, TlsSettingsError, TlsSource};
use crate::types::{CertManagerTls, StaticTls};

/// Every rule on `spec.TLS`.
pub(crate) fn check(cluster: &EtcdCluster, report: &mut Report) {
    let Some(tls) = cluster.spec.tls.as_ref() else {
        return;
    };
    let sources = tls.sources();
    if sources.len() > 1 {
        report.refuse(
            "tls-sources",
            "spec.TLS",
            "names more than one source of certificates: set exactly one of static, operatorManaged and certManager",
        );
        return;
    }
    match sources.first() {
        None => report.refuse(
            "tls-incomplete",
            "spec.TLS",
            "names no source of certificates: set one of static (your Secrets), operatorManaged (the operator's own CA, {} for the defaults) and certManager (an issuerRef)",
        ),
        Some(TlsSource::Static(st)) => check_static(st, report),
        Some(TlsSource::OperatorManaged(om)) => {
            if let Err(e) = om.settings() {
                report.refuse("tls-duration", field("operatorManaged", &e), message(&e));
            }
        }
        Some(TlsSource::CertManager(cm)) => check_cert_manager(cm, report),
    }
}

fn field(source: &str, e: &TlsSettingsError) -> String {
    let f = match e {
        TlsSettingsError::Syntax { field, .. } | TlsSettingsError::Range { field, .. } => field,
    };
    format!("spec.TLS.{source}.{f}")
}

fn message(e: &TlsSettingsError) -> String {
    match e {
        TlsSettingsError::Syntax { source, .. } => source.to_string(),
        TlsSettingsError::Range { message, .. } => message.clone(),
    }
}

fn check_cert_manager(cm: &CertManagerTls, report: &mut Report) {
    let r = &cm.issuer_ref;
    if !is_dns1123_subdomain(&r.name) {
        report.refuse(
            "tls-issuer",
            "spec.TLS.certManager.issuerRef.name",
            format!("{} is not a valid issuer name", quoted(&r.name)),
        );
    }
    if let Some(kind) = r.kind.as_deref()
        && !ISSUER_KINDS.contains(&kind)
    {
        report.refuse(
            "tls-issuer",
            "spec.TLS.certManager.issuerRef.kind",
            format!("{} is not Issuer or ClusterIssuer", quoted(kind)),
        );
    }
    if let Some(group) = r.group.as_deref()
        && !is_dns1123_subdomain(group)
    {
        report.refuse(
            "tls-issuer",
            "spec.TLS.certManager.issuerRef.group",
            format!("{} is not an API group", quoted(group)),
        );
    }
    if let Err(e) = cm.check() {
        report.refuse("tls-duration", field("certManager", &e), message(&e));
    }
}

/// CoreOS' static secrets: complete sets with valid names.
fn check_static(st: &StaticTls, report: &mut Report) {
    let member = st.member.as_ref();
    let peer = member.and_then(|m| m.peer_secret.as_deref());
    let server = member.and_then(|m| m.server_secret.as_deref());
    let operator = st.operator_secret.as_deref();
    for (field, name) in [
        ("spec.TLS.static.member.peerSecret", peer),
        ("spec.TLS.static.member.serverSecret", server),
        ("spec.TLS.static.operatorSecret", operator),
    ] {
        if let Some(name) = name
            && !is_dns1123_subdomain(name)
        {
            report.refuse(
                "tls-secret-name",
                field,
                format!("{} is not a valid Secret name", quoted(name)),
            );
        }
    }
    if peer.is_none() && server.is_none() && operator.is_none() {
        report.refuse(
            "tls-incomplete",
            "spec.TLS.static",
            "names no secret: set member.peerSecret for peer TLS, and member.serverSecret with operatorSecret for client TLS",
        );
    }
    if server.is_some() != operator.is_some() {
        let (field, missing) = if server.is_some() {
            ("spec.TLS.static.operatorSecret", "operatorSecret")
        } else {
            ("spec.TLS.static.member.serverSecret", "member.serverSecret")
        };
        report.refuse(
            "tls-incomplete",
            field,
            format!("{missing} is required: serverSecret and operatorSecret go together (members that serve clients over TLS need the operator to present a client certificate)"),
        );
    }
}
