//! Rules on `spec.TLS`: static secrets come in complete sets with valid names.

use super::Report;
use super::syntax::{is_dns1123_subdomain, quoted};
use crate::EtcdCluster;

/// Every rule on `spec.TLS`.
pub(crate) fn check(cluster: &EtcdCluster, report: &mut Report) {
    let Some(tls) = cluster.spec.tls.as_ref() else {
        return;
    };
    let Some(st) = tls.static_tls.as_ref() else {
        report.refuse(
            "tls-incomplete",
            "spec.TLS.static",
            "is required when spec.TLS is set (the operator supports static secrets)",
        );
        return;
    };
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
