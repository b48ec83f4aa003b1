//! The cert-manager Certificates of `spec.TLS.certManager`: one per certificate the cluster
//! needs (peer, server, the operator's client), each writing the Secret of the same name
//! (`kubernetes.io/tls`: `tls.crt`, `tls.key`, `ca.crt`) that the members mount and the
//! operator dials with. cert-manager issues and renews them; the members of 3.3+ load a renewed
//! leaf per handshake as with the operator's own certificates, and 3.2 members are replaced
//! after a renewal ([`leaf_files`], [`crate::planner::rollout`]). The trust bundle is
//! cert-manager's (the issuer's CA): a CA change is not rolled out.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};

use etcd_shared::names;
use etcd_shared::tls::{CERT_MANAGER_GROUP, CertKind, KUBERNETES_TLS_KEYS};
use etcd_shared::types::CertManagerTls;

use crate::cache;
use crate::error::{Error, FIELD_MANAGER};
use crate::planner::{TlsFiles, TlsStamp};
use crate::view::ClusterView;

/// cert-manager's Certificate kind.
pub fn certificate_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(CERT_MANAGER_GROUP, "v1", "Certificate"),
        "certificates",
    )
}

/// The Certificate of `kind` for the cluster of `view` from the issuer `tls` names.
pub fn certificate(view: &ClusterView, tls: &CertManagerTls, kind: CertKind) -> Value {
    let name = kind.secret_name(&view.name);
    let usages: &[&str] = match kind {
        CertKind::Operator => &["digital signature", "key encipherment", "client auth"],
        CertKind::Peer | CertKind::Server => &[
            "digital signature",
            "key encipherment",
            "server auth",
            "client auth",
        ],
    };
    let issuer = &tls.issuer_ref;
    let mut spec = json!({
        "secretName": name,
        "commonName": kind.common_name(&view.name, &view.namespace),
        "usages": usages,
        "issuerRef": {
            "name": issuer.name,
            "kind": issuer.kind.as_deref().unwrap_or("Issuer"),
            "group": issuer.group.as_deref().unwrap_or(CERT_MANAGER_GROUP),
        },
        // ECDSA P-256 in PKCS#8, which every etcd line reads; a new key at each renewal.
        "privateKey": {
            "algorithm": "ECDSA",
            "size": 256,
            "encoding": "PKCS8",
            "rotationPolicy": "Always",
        },
        "secretTemplate": {
            "labels": names::object_labels(&view.name, "tls"),
        },
    });
    let dns = kind.dns_names(&view.name, &view.namespace, view.domain.as_deref());
    if !dns.is_empty() {
        spec["dnsNames"] = json!(dns);
    }
    let ips: Vec<String> = kind
        .ip_addresses()
        .iter()
        .map(|ip| ip.to_string())
        .collect();
    if !ips.is_empty() {
        spec["ipAddresses"] = json!(ips);
    }
    if let Some(d) = &tls.duration {
        spec["duration"] = json!(d);
    }
    if let Some(r) = &tls.renew_before {
        spec["renewBefore"] = json!(r);
    }
    json!({
        "apiVersion": format!("{CERT_MANAGER_GROUP}/v1"),
        "kind": "Certificate",
        "metadata": {
            "name": name,
            "namespace": view.namespace,
            "labels": names::object_labels(&view.name, "tls"),
            "ownerReferences": [view.owner],
        },
        "spec": spec,
    })
}

/// Applies the three Certificates where what the API server holds differs (a hand edit is
/// undone on the next reconcile).
pub async fn keep_certificates(
    client: &kube::Client,
    view: &ClusterView,
    tls: &CertManagerTls,
) -> Result<(), Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &view.namespace, &certificate_resource());
    for kind in CertKind::ALL {
        let want = certificate(view, tls, kind);
        let name = kind.secret_name(&view.name);
        let held = api
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("get certificate {name}")))?;
        if let Some(held) = held {
            let have = serde_json::to_value(&held).map_err(|source| Error::Serialize {
                what: "certificate",
                source,
            })?;
            if cache::contains(&have["spec"], &want["spec"])
                && cache::contains(&have["metadata"], &want["metadata"])
            {
                continue;
            }
        }
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&want),
        )
        .await
        .map_err(Error::kube(format!("apply certificate {name}")))?;
    }
    Ok(())
}

/// The peer and server certificates cert-manager's Secrets hold now, as the member pods made
/// from now on record them (their trust is not compared: cert-manager's CA is not rotated by
/// the operator). `None` while either Secret is missing or has no certificate.
pub async fn leaf_files(
    client: &kube::Client,
    view: &ClusterView,
) -> Result<Option<TlsFiles>, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &view.namespace);
    let mut certs = Vec::new();
    for kind in [CertKind::Peer, CertKind::Server] {
        let name = kind.secret_name(&view.name);
        let secret = api
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("get secret {name}")))?;
        let cert = secret
            .as_ref()
            .and_then(|s| s.data.as_ref())
            .and_then(|d| d.get(KUBERNETES_TLS_KEYS[0]))
            .and_then(|b| String::from_utf8(b.0.clone()).ok());
        match cert {
            Some(cert) => certs.push(cert),
            None => return Ok(None),
        }
    }
    Ok(Some(TlsFiles {
        current: TlsStamp {
            trust: None,
            leaves: Some(super::rotation::fingerprint(
                certs.iter().map(String::as_str),
            )),
        },
        rotating: false,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::fixtures::view_of;

    #[test]
    fn the_server_certificate_names_every_member_and_the_client_service() {
        let view = view_of(
            "size: 3\nTLS:\n  certManager:\n    issuerRef:\n      name: etcd-ca\n    duration: 2h",
        );
        let tls = view.tls.cert_manager.clone().expect("certManager");
        let c = certificate(&view, &tls, CertKind::Server);
        assert_eq!(c["spec"]["secretName"], "demo-server-tls");
        assert_eq!(c["spec"]["issuerRef"]["kind"], "Issuer");
        assert_eq!(c["spec"]["issuerRef"]["group"], "cert-manager.io");
        assert_eq!(c["spec"]["duration"], "2h");
        assert_eq!(c["spec"]["privateKey"]["encoding"], "PKCS8");
        let dns: Vec<&str> = c["spec"]["dnsNames"]
            .as_array()
            .expect("dnsNames")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(dns.contains(&"*.demo.ns1.svc") && dns.contains(&"demo-client.ns1.svc"));
        assert_eq!(c["spec"]["ipAddresses"][0], "127.0.0.1");
        assert_eq!(c["metadata"]["ownerReferences"][0]["kind"], "EtcdCluster");
    }

    #[test]
    fn the_operator_certificate_is_a_client_certificate_without_names() {
        let view = view_of(
            "size: 3\nTLS:\n  certManager:\n    issuerRef:\n      name: ca\n      kind: ClusterIssuer",
        );
        let tls = view.tls.cert_manager.clone().expect("certManager");
        let c = certificate(&view, &tls, CertKind::Operator);
        assert_eq!(c["spec"]["commonName"], "etcd-operator");
        assert!(c["spec"].get("dnsNames").is_none());
        assert_eq!(c["spec"]["usages"][2], "client auth");
        assert_eq!(c["spec"]["issuerRef"]["kind"], "ClusterIssuer");
    }
}
