//! Reading what the certificate Secrets of an operator-managed cluster hold, for [`super::plan`].

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Secret;
use x509_parser::pem::parse_x509_pem;

use etcd_shared::tls::CertKind;

use super::issue::{CaName, Pem};
use super::plan::{CertFacts, Held};

/// Key of the CA Secret holding the CA certificate.
pub const CA_CERT: &str = "ca.crt";
/// Key of the CA Secret holding the CA key.
pub const CA_KEY: &str = "ca.key";
/// Annotation of the CA Secret: the CA's generation (see [`CaName`]).
pub const CA_GENERATION: &str = "etcd.database.coreos.com/ca-generation";
/// Key of the CA Secret holding the next CA's certificate, during a rotation's first phase.
pub const NEXT_CERT: &str = "next.crt";
/// Key of the CA Secret holding the next CA's key.
pub const NEXT_KEY: &str = "next.key";
/// Key of the CA Secret holding the previous CA's certificate, still trusted during a
/// rotation's second phase.
pub const PREVIOUS_CERT: &str = "previous.crt";
/// Annotation of the CA Secret: the value of the cluster's
/// [`etcd_shared::names::ANNOTATION_ROTATE_CA`] the last rotation answered.
pub const CA_ROTATED_FOR: &str = "etcd.database.coreos.com/ca-rotated-for";

/// What the CA Secret holds of a rotation in progress.
#[derive(Debug, Clone, Default)]
pub struct HeldRotation {
    /// The next CA (its generation one past the current one's), while trusted beside it.
    pub next: Option<HeldCa>,
    /// The previous CA's certificate, while still trusted.
    pub previous: Option<String>,
    /// The rotation request the last rotation answered.
    pub rotated_for: Option<String>,
}

impl HeldRotation {
    /// The phase of the rotation.
    pub fn phase(&self) -> super::rotation::CaPhase {
        use super::rotation::CaPhase;
        match (&self.next, &self.previous) {
            (Some(_), _) => CaPhase::TrustingBoth,
            (None, Some(_)) => CaPhase::LeavesMoved,
            (None, None) => CaPhase::Steady,
        }
    }

    /// The trust bundle with `current`: the current CA first, then the next or previous one.
    pub fn bundle(&self, current: &HeldCa) -> String {
        let mut bundle = current.pem.cert.clone();
        for other in [
            self.next.as_ref().map(|n| n.pem.cert.as_str()),
            self.previous.as_deref(),
        ]
        .into_iter()
        .flatten()
        {
            if !bundle.ends_with('\n') {
                bundle.push('\n');
            }
            bundle.push_str(other);
        }
        bundle
    }
}

/// The rotation the CA Secret holds, for the current CA of generation `generation`. A next
/// CA that does not parse or is not the next generation is ignored (made again).
pub fn rotation(
    secret: Option<&Secret>,
    cluster: &str,
    namespace: &str,
    generation: u64,
) -> HeldRotation {
    let Some(secret) = secret else {
        return HeldRotation::default();
    };
    let text = |k: &str| key(secret, k).and_then(|b| String::from_utf8(b.to_vec()).ok());
    let name = CaName {
        cluster: cluster.to_string(),
        namespace: namespace.to_string(),
        generation: generation + 1,
    };
    let next = match (text(NEXT_CERT), text(NEXT_KEY)) {
        (Some(cert), Some(key_pem)) => parse(cert.as_bytes())
            .ok()
            .filter(|p| p.subject.contains(&name.common_name()))
            .map(|p| HeldCa {
                held: Held::Present(CertFacts {
                    not_before: p.not_before,
                    not_after: p.not_after,
                    current: true,
                    names_match: true,
                }),
                subject: p.subject,
                name: name.clone(),
                pem: Pem { cert, key: key_pem },
            }),
        _ => None,
    };
    HeldRotation {
        next,
        previous: text(PREVIOUS_CERT).filter(|c| parse(c.as_bytes()).is_ok()),
        rotated_for: secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CA_ROTATED_FOR))
            .cloned(),
    }
}

/// The CA as the CA Secret holds it.
#[derive(Debug, Clone)]
pub struct HeldCa {
    /// Its name (generation).
    pub name: CaName,
    /// Certificate and key.
    pub pem: Pem,
    /// Its subject, as X.509 prints it (leaves it signed name it as their issuer).
    pub subject: String,
    /// What it is, for [`super::plan::decide_ca`].
    pub held: Held,
}

fn key<'a>(secret: &'a Secret, key: &str) -> Option<&'a [u8]> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.as_slice())
}

/// Parsed facts of a PEM certificate: validity, subject, issuer, DNS names.
struct Parsed {
    not_before: i64,
    not_after: i64,
    subject: String,
    issuer: String,
    dns: BTreeSet<String>,
}

fn parse(pem: &[u8]) -> Result<Parsed, String> {
    let (_, pem) = parse_x509_pem(pem).map_err(|e| format!("not PEM: {e}"))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let dns = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Parsed {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        dns,
    })
}

/// The CA of `cluster` in `namespace` from its Secret, `None` when there is no usable one.
pub fn ca(secret: Option<&Secret>, cluster: &str, namespace: &str) -> (Held, Option<HeldCa>) {
    let Some(secret) = secret else {
        return (Held::Missing, None);
    };
    let (Some(cert), Some(key_pem)) = (key(secret, CA_CERT), key(secret, CA_KEY)) else {
        return (Held::Missing, None);
    };
    let generation = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CA_GENERATION))
        .and_then(|g| g.parse::<u64>().ok());
    let parsed = match parse(cert) {
        Ok(p) => p,
        Err(e) => return (Held::Unreadable(e), None),
    };
    let (Some(generation), Ok(cert_text), Ok(key_text)) = (
        generation,
        String::from_utf8(cert.to_vec()),
        String::from_utf8(key_pem.to_vec()),
    ) else {
        return (Held::Unreadable("no generation or not UTF-8".into()), None);
    };
    let held = Held::Present(CertFacts {
        not_before: parsed.not_before,
        not_after: parsed.not_after,
        current: true,
        names_match: true,
    });
    let name = CaName {
        cluster: cluster.to_string(),
        namespace: namespace.to_string(),
        generation,
    };
    if parsed.subject.contains(&name.common_name()) {
        let ca = HeldCa {
            name,
            pem: Pem {
                cert: cert_text,
                key: key_text,
            },
            subject: parsed.subject,
            held: held.clone(),
        };
        (held, Some(ca))
    } else {
        (
            Held::Unreadable("the CA's name does not match its generation".into()),
            None,
        )
    }
}

/// The leaf of `kind` from its Secret (CoreOS' layout), judged against the CA `ca` that must
/// sign it, the trust bundle `bundle` it must carry and the DNS names `names`.
pub fn leaf(
    kind: CertKind,
    secret: Option<&Secret>,
    ca: &HeldCa,
    bundle: &str,
    names: &[String],
) -> Held {
    let Some(secret) = secret else {
        return Held::Missing;
    };
    let [cert_key, key_key, ca_key] = kind.coreos_keys();
    let want_bundle = bundle;
    let (Some(cert), Some(_), Some(bundle)) = (
        key(secret, cert_key),
        key(secret, key_key),
        key(secret, ca_key),
    ) else {
        return Held::Missing;
    };
    let parsed = match parse(cert) {
        Ok(p) => p,
        Err(e) => return Held::Unreadable(e),
    };
    let wanted: BTreeSet<String> = names.iter().cloned().collect();
    Held::Present(CertFacts {
        not_before: parsed.not_before,
        not_after: parsed.not_after,
        current: parsed.issuer == ca.subject && bundle == want_bundle.as_bytes(),
        names_match: parsed.dns == wanted,
    })
}

/// The end of validity of a held certificate, Unix seconds.
pub fn not_after(held: &Held) -> Option<i64> {
    match held {
        Held::Present(f) => Some(f.not_after),
        _ => None,
    }
}

/// The end of validity of the certificate a leaf Secret holds, whoever signed it.
pub fn leaf_not_after(kind: CertKind, secret: Option<&Secret>) -> Option<i64> {
    let [cert_key, _, _] = kind.coreos_keys();
    parse(key(secret?, cert_key)?).ok().map(|p| p.not_after)
}

/// The certificate (PEM) a leaf Secret holds, whoever signed it.
pub fn leaf_cert(kind: CertKind, secret: Option<&Secret>) -> Option<String> {
    let [cert_key, _, _] = kind.coreos_keys();
    String::from_utf8(key(secret?, cert_key)?.to_vec()).ok()
}
