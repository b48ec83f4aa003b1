//! Moving a running TLS cluster from one source of certificates to another (`static`,
//! `operatorManaged`, `certManager`, another cert-manager issuer, or other static Secrets)
//! with no outage: pure decisions on the switch Secret's phase and contents.
//!
//! etcd reads its trusted CA files once, at start, so a member trusts a new CA only as a new
//! process ([`crate::planner::rollout`] replaces it), and the old and the new source may write
//! Secrets of the same names (the operator's and cert-manager's). So the members first move
//! onto a Secret of the operator's own ([`etcd_shared::names::tls_switch_secret_name`]), then
//! it goes through the CA rotation's phases with the new source's CA:
//!
//! 1. [`SwitchPhase::Hold`]: the switch Secret holds what the members use now (the old leaves,
//!    the old CAs); the members are replaced onto it. Only then is the new source set to work
//!    (cert-manager's Certificates, the operator's CA), which may overwrite the old Secrets.
//! 2. [`SwitchPhase::TrustBoth`]: the old leaves, trusting the old and the new CAs; the members
//!    are replaced to trust both.
//! 3. [`SwitchPhase::NewLeaves`]: the new source's leaves, trusting both; members that reload
//!    certificates serve them without a restart, 3.2 members are replaced.
//! 4. [`SwitchPhase::Settle`]: once every member serves the new leaves, the members are
//!    replaced onto the new source's own Secrets (trusting its CA alone); the switch Secret goes
//!    once no member mounts it.
//!
//! At every point each member trusts the CA of every certificate any member (and the
//! operator) presents.

use std::collections::BTreeMap;

use etcd_shared::tls::CertKind;

/// Annotation of the switch Secret: its phase.
pub const PHASE_ANNOTATION: &str = "etcd.database.coreos.com/tls-switch-phase";
/// Annotation of the switch Secret: the source switched from, in words.
pub const FROM_ANNOTATION: &str = "etcd.database.coreos.com/tls-switch-from";
/// Annotation of the switch Secret: the source switched to, in words.
pub const TO_ANNOTATION: &str = "etcd.database.coreos.com/tls-switch-to";
/// Key of the switch Secret: the CAs of the source switched from (kept for the bundle while
/// the old Secrets may already hold the new source's certificates).
pub const FROM_CA_KEY: &str = "from-ca.crt";

/// Where a switch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SwitchPhase {
    /// The members move onto the switch Secret, holding what they use now.
    Hold,
    /// The old leaves; both sources' CAs trusted.
    TrustBoth,
    /// The new source's leaves; both CAs trusted.
    NewLeaves,
    /// The members move onto the new source's own Secrets.
    Settle,
}

impl SwitchPhase {
    /// Its word, on the switch Secret and in Events.
    pub fn as_str(self) -> &'static str {
        match self {
            SwitchPhase::Hold => "hold",
            SwitchPhase::TrustBoth => "trust-both",
            SwitchPhase::NewLeaves => "new-leaves",
            SwitchPhase::Settle => "settle",
        }
    }

    /// The phase a word names.
    pub fn parse(word: &str) -> Option<Self> {
        [
            SwitchPhase::Hold,
            SwitchPhase::TrustBoth,
            SwitchPhase::NewLeaves,
            SwitchPhase::Settle,
        ]
        .into_iter()
        .find(|p| p.as_str() == word)
    }

    /// Whether the members use the switch Secret in this phase (else the new source's own).
    pub fn members_on_switch(self) -> bool {
        self != SwitchPhase::Settle
    }
}

/// What is known of the members and the new source for the next move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwitchFacts {
    /// The phase the switch Secret is in.
    pub phase: SwitchPhase,
    /// Every member pod (and a pod of every member the status lists) mounts the switch Secret
    /// and was made with its current trust bundle.
    pub members_on_switch: bool,
    /// Every member serves the switch Secret's leaves on its peer and client ports.
    pub members_serve_leaves: bool,
    /// The new source's certificates are there (issued, readable, complete).
    pub target_ready: bool,
}

/// The next phase for `facts`, if it moves.
pub fn next_phase(facts: SwitchFacts) -> Option<SwitchPhase> {
    match facts.phase {
        SwitchPhase::Hold if facts.members_on_switch && facts.target_ready => {
            Some(SwitchPhase::TrustBoth)
        }
        SwitchPhase::TrustBoth if facts.members_on_switch && facts.target_ready => {
            Some(SwitchPhase::NewLeaves)
        }
        SwitchPhase::NewLeaves if facts.members_on_switch && facts.members_serve_leaves => {
            Some(SwitchPhase::Settle)
        }
        _ => None,
    }
}

/// A certificate and its key, PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    /// The certificate (chain).
    pub cert: String,
    /// Its private key.
    pub key: String,
}

/// One source's certificates: its leaves by kind and the CAs it trusts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Material {
    /// The leaves, by kind (the kinds the cluster's traffic needs).
    pub leaves: BTreeMap<CertKind, Leaf>,
    /// Its CA certificates (PEM blocks), each once.
    pub cas: Vec<String>,
}

/// The PEM certificate blocks of `pems`, each once (by its base64 text), in order.
pub fn certificate_blocks<'a>(pems: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for pem in pems {
        let mut rest = pem;
        while let Some(start) = rest.find(BEGIN) {
            let Some(len) = rest[start..].find(END) else {
                break;
            };
            let block = &rest[start..start + len + END.len()];
            let body: String = block[BEGIN.len()..block.len() - END.len()]
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect();
            if seen.insert(body) {
                out.push(format!("{block}\n"));
            }
            rest = &rest[start + len + END.len()..];
        }
    }
    out
}

/// The trust bundle of both sources: the old CAs, then the new ones, each once.
pub fn bundle(from: &[String], to: &[String]) -> String {
    certificate_blocks(from.iter().chain(to).map(String::as_str)).concat()
}

/// The switch Secret's data in `phase`: the leaves the members present (the old source's
/// until the new one's leaves take over) under CoreOS' key names, each kind with the bundle
/// as its CA, and the old CAs kept under [`FROM_CA_KEY`]. `None` when a leaf the phase needs
/// is missing.
pub fn contents(
    phase: SwitchPhase,
    from: &Material,
    to: Option<&Material>,
    kinds: &[CertKind],
) -> Option<BTreeMap<String, String>> {
    let from_cas = from.cas.concat();
    let (leaves, bundle) = match (phase, to) {
        (SwitchPhase::Hold, _) => (&from.leaves, from_cas.clone()),
        (SwitchPhase::TrustBoth, Some(to)) => (&from.leaves, bundle(&from.cas, &to.cas)),
        (SwitchPhase::NewLeaves | SwitchPhase::Settle, Some(to)) => {
            (&to.leaves, bundle(&from.cas, &to.cas))
        }
        (_, None) => return None,
    };
    let mut data = BTreeMap::from([(FROM_CA_KEY.to_string(), from_cas)]);
    for kind in kinds {
        let leaf = leaves.get(kind)?;
        let [cert, key, ca] = kind.coreos_keys();
        data.insert(cert.to_string(), leaf.cert.clone());
        data.insert(key.to_string(), leaf.key.clone());
        data.insert(ca.to_string(), bundle.clone());
    }
    Some(data)
}

/// What the switch Secret's data says of the old source: its leaves (those the members present
/// in [`SwitchPhase::Hold`] and [`SwitchPhase::TrustBoth`]) and its CAs.
pub fn from_material(data: &BTreeMap<String, String>, kinds: &[CertKind]) -> Material {
    let leaves = kinds
        .iter()
        .filter_map(|kind| {
            let [cert, key, _] = kind.coreos_keys();
            Some((
                *kind,
                Leaf {
                    cert: data.get(cert)?.clone(),
                    key: data.get(key)?.clone(),
                },
            ))
        })
        .collect();
    Material {
        leaves,
        cas: certificate_blocks(data.get(FROM_CA_KEY).map(String::as_str)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem(body: &str) -> String {
        format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n")
    }

    fn material(tag: &str) -> Material {
        Material {
            leaves: CertKind::ALL
                .into_iter()
                .map(|k| {
                    (
                        k,
                        Leaf {
                            cert: pem(&format!("{tag}{}", k.as_str())),
                            key: format!("key-{tag}-{}", k.as_str()),
                        },
                    )
                })
                .collect(),
            cas: vec![pem(&format!("{tag}CA"))],
        }
    }

    #[test]
    fn a_switch_moves_one_phase_at_a_time_on_what_the_members_run() {
        use SwitchPhase::*;
        let f = |phase, on, serve, ready| SwitchFacts {
            phase,
            members_on_switch: on,
            members_serve_leaves: serve,
            target_ready: ready,
        };
        let cases = [
            // The new source starts only once every member left the old Secrets.
            (f(Hold, false, false, true), None),
            (f(Hold, true, false, false), None),
            (f(Hold, true, false, true), Some(TrustBoth)),
            // The new leaves come only once every member trusts both CAs.
            (f(TrustBoth, false, true, true), None),
            (f(TrustBoth, true, false, true), Some(NewLeaves)),
            // The old CA goes only once every member serves the new leaves.
            (f(NewLeaves, true, false, true), None),
            (f(NewLeaves, false, true, true), None),
            (f(NewLeaves, true, true, true), Some(Settle)),
            (f(Settle, true, true, true), None),
        ];
        for (facts, want) in cases {
            assert_eq!(next_phase(facts), want, "{facts:?}");
        }
    }

    #[test]
    fn every_phase_presents_leaves_its_members_trust() {
        let (from, to) = (material("OLD"), material("NEW"));
        let kinds = CertKind::ALL;
        let hold = contents(SwitchPhase::Hold, &from, None, &kinds).expect("hold");
        assert_eq!(hold["peer.crt"], pem("OLDpeer"));
        assert_eq!(hold["peer-ca.crt"], pem("OLDCA"));
        assert!(contents(SwitchPhase::TrustBoth, &from, None, &kinds).is_none());
        let both = contents(SwitchPhase::TrustBoth, &from, Some(&to), &kinds).expect("both");
        assert_eq!(both["server.crt"], pem("OLDserver"));
        assert_eq!(
            both["server-ca.crt"],
            format!("{}{}", pem("OLDCA"), pem("NEWCA"))
        );
        let new = contents(SwitchPhase::NewLeaves, &from, Some(&to), &kinds).expect("new");
        assert_eq!(new["etcd-client.crt"], pem("NEWoperator"));
        assert_eq!(new["etcd-client.key"], "key-NEW-operator");
        assert_eq!(new["etcd-client-ca.crt"], both["server-ca.crt"]);
        // The old CAs survive every phase, for the bundle.
        assert_eq!(new[FROM_CA_KEY], pem("OLDCA"));
        // What the Secret says of the old source reads back.
        let read = from_material(&both, &kinds);
        assert_eq!(read, from);
    }

    #[test]
    fn a_missing_leaf_makes_no_contents() {
        let mut from = material("OLD");
        from.leaves.remove(&CertKind::Operator);
        assert!(contents(SwitchPhase::Hold, &from, None, &CertKind::ALL).is_none());
        assert!(contents(SwitchPhase::Hold, &from, None, &[CertKind::Peer]).is_some());
    }

    #[test]
    fn bundles_keep_each_certificate_once() {
        let a = pem("AAAA");
        let b = pem("BBBB");
        let spaced = "-----BEGIN CERTIFICATE-----\nAA\nAA\n-----END CERTIFICATE-----";
        assert_eq!(
            bundle(&[a.clone(), b.clone()], &[spaced.to_string(), b.clone()]),
            format!("{a}{b}")
        );
        assert_eq!(
            certificate_blocks(["no certificate here"]),
            Vec::<String>::new()
        );
    }
}
