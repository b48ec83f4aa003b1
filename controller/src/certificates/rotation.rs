//! Rotating an operator-managed cluster's CA with no outage: pure decisions on where the CA
//! Secret is in a rotation and what the members run with.
//!
//! etcd reads its trusted CA files once, at start (measured for 3.2-3.7: `docs/tls.md`), so a
//! member trusts a new CA only once it runs as a new process ([`crate::planner::rollout`]
//! replaces it). The CA Secret goes through three phases, one move at a time:
//!
//! 1. [`CaPhase::Steady`]: one CA signs and is trusted. When it is due (a third of its life
//!    left) or a rotation is asked for (`etcd.database.coreos.com/rotate-ca`), a next CA is
//!    made: [`CaMove::Start`].
//! 2. [`CaPhase::TrustingBoth`]: the trust bundle holds the current and the next CA; the leaves
//!    are still signed by the current one. Once every member pod was made with this bundle,
//!    the next CA signs: [`CaMove::Promote`].
//! 3. [`CaPhase::LeavesMoved`]: the new CA signs, the old one is still trusted. Once every
//!    member pod was made with this bundle and every member serves the new certificates on
//!    its peer and client ports, the old CA is dropped from the bundle: [`CaMove::Retire`],
//!    and the members are replaced once more to forget it.
//!
//! At every point each member trusts the CA of every certificate any member presents.

use sha2::{Digest, Sha256};

/// Where the CA Secret is in a rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaPhase {
    /// One CA signs and is trusted.
    Steady,
    /// A next CA is trusted beside the current one, which still signs.
    TrustingBoth,
    /// The new CA signs; the previous one is still trusted.
    LeavesMoved,
}

impl CaPhase {
    /// A word for Events and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            CaPhase::Steady => "steady",
            CaPhase::TrustingBoth => "trusting-both",
            CaPhase::LeavesMoved => "leaves-moved",
        }
    }
}

/// What is known of the cluster's members for the next move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationFacts {
    /// The phase the CA Secret is in.
    pub phase: CaPhase,
    /// The current CA is due for replacement, or a rotation was asked for.
    pub wanted: bool,
    /// Every member pod (and a pod of every member the status lists) was made with the
    /// current trust bundle.
    pub members_trust_bundle: bool,
    /// Every member serves the current peer and server certificates.
    pub members_serve_leaves: bool,
}

/// The next move of a rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaMove {
    /// Nothing to do now.
    Stay,
    /// Make a next CA and trust it beside the current one.
    Start,
    /// The next CA signs from now; the current one stays trusted.
    Promote,
    /// Drop the previous CA from the trust bundle.
    Retire,
}

/// The next move for `facts`.
pub fn next_move(facts: RotationFacts) -> CaMove {
    match facts.phase {
        CaPhase::Steady if facts.wanted => CaMove::Start,
        CaPhase::TrustingBoth if facts.members_trust_bundle => CaMove::Promote,
        CaPhase::LeavesMoved if facts.members_trust_bundle && facts.members_serve_leaves => {
            CaMove::Retire
        }
        _ => CaMove::Stay,
    }
}

/// A short fingerprint of PEM texts, independent of their order (a trust bundle is a set):
/// SHA-256 over the sorted certificates' DER (their PEM text when it does not parse), 16 bytes,
/// hex.
pub fn fingerprint<'a>(pems: impl IntoIterator<Item = &'a str>) -> String {
    let mut ders: Vec<Vec<u8>> = pems
        .into_iter()
        .flat_map(|pem| {
            let parsed: Vec<Vec<u8>> = x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
                .filter_map(Result::ok)
                .map(|p| p.contents)
                .collect();
            if parsed.is_empty() {
                vec![pem.as_bytes().to_vec()]
            } else {
                parsed
            }
        })
        .collect();
    ders.sort();
    ders.dedup();
    let mut hasher = Sha256::new();
    for der in &ders {
        hasher.update((der.len() as u64).to_be_bytes());
        hasher.update(der);
    }
    hasher.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The DER certificates of a PEM text.
pub fn ders(pem: &str) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
        .filter_map(Result::ok)
        .map(|p| p.contents)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(phase: CaPhase, wanted: bool, trust: bool, serve: bool) -> RotationFacts {
        RotationFacts {
            phase,
            wanted,
            members_trust_bundle: trust,
            members_serve_leaves: serve,
        }
    }

    #[test]
    fn a_rotation_moves_one_phase_at_a_time_on_what_the_members_run() {
        use CaMove::*;
        use CaPhase::*;
        let cases = [
            (facts(Steady, false, true, true), Stay),
            (facts(Steady, true, false, false), Start),
            // The next CA signs only once every member trusts it.
            (facts(TrustingBoth, true, false, true), Stay),
            (facts(TrustingBoth, false, true, false), Promote),
            // The old CA goes only once no member serves a certificate it signed.
            (facts(LeavesMoved, false, true, false), Stay),
            (facts(LeavesMoved, false, false, true), Stay),
            (facts(LeavesMoved, true, true, true), Retire),
        ];
        for (f, want) in cases {
            assert_eq!(next_move(f), want, "{f:?}");
        }
    }

    #[test]
    fn fingerprints_ignore_order_and_tell_sets_apart() {
        let a = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let b = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n";
        assert_eq!(fingerprint([a, b]), fingerprint([b, a]));
        assert_eq!(fingerprint([&format!("{a}{b}")[..]]), fingerprint([a, b]));
        assert_ne!(fingerprint([a]), fingerprint([a, b]));
        assert_eq!(fingerprint([a]).len(), 32);
    }
}
