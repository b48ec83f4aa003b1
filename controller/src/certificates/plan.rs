//! Which certificates of an operator-managed cluster to issue now: pure decisions on what the
//! Secrets hold (read by [`super::inspect`]) and the clock.

use std::time::Duration;

use etcd_shared::tls::IssuingSettings;

/// What one certificate in a Secret is, as far as renewal cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// The Secret or its certificate key is missing.
    Missing,
    /// The certificate does not parse.
    Unreadable(String),
    /// A certificate.
    Present(CertFacts),
}

/// The facts of a held certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFacts {
    /// Start of validity, Unix seconds.
    pub not_before: i64,
    /// End of validity, Unix seconds.
    pub not_after: i64,
    /// For a leaf: signed by the cluster's current CA and with the trust bundle the CA Secret
    /// gives. For a CA: always true.
    pub current: bool,
    /// Its DNS and IP names are those the members need today (a leaf; true for a CA).
    pub names_match: bool,
}

/// Why a certificate is issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// There is none.
    Missing,
    /// What is there does not parse.
    Unreadable,
    /// It expired (the operator or its issuer was down past its renewal time).
    Expired,
    /// Less than `renewBefore` is left.
    Due,
    /// Signed by another CA, or with an old trust bundle (the CA was replaced).
    OtherCa,
    /// The names the members need changed (a cluster domain was set).
    Names,
    /// The CA is rotated (due, or asked for): a next CA is made.
    Rotation,
}

impl Reason {
    /// A word for Events, logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Missing => "missing",
            Reason::Unreadable => "unreadable",
            Reason::Expired => "expired",
            Reason::Due => "due",
            Reason::OtherCa => "other-ca",
            Reason::Names => "names",
            Reason::Rotation => "rotation",
        }
    }
}

/// The decision for one certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Keep it; look again after this long at the latest (its renewal time).
    Keep(Duration),
    /// Issue a new one.
    Issue(Reason),
}

/// The decision for a certificate valid `renew_before` short of its end (leaves:
/// `renewBefore`; the CA: a third of its life).
pub fn decide(held: &Held, now: i64, renew_before: Duration) -> Decision {
    let facts = match held {
        Held::Missing => return Decision::Issue(Reason::Missing),
        Held::Unreadable(_) => return Decision::Issue(Reason::Unreadable),
        Held::Present(f) => f,
    };
    if facts.not_after <= now {
        return Decision::Issue(Reason::Expired);
    }
    if !facts.current {
        return Decision::Issue(Reason::OtherCa);
    }
    if !facts.names_match {
        return Decision::Issue(Reason::Names);
    }
    let renew_at = facts
        .not_after
        .saturating_sub(i64::try_from(renew_before.as_secs()).unwrap_or(i64::MAX));
    if renew_at <= now {
        return Decision::Issue(Reason::Due);
    }
    Decision::Keep(Duration::from_secs(
        u64::try_from(renew_at - now).unwrap_or(0),
    ))
}

/// The decision for the CA: a new one when it is missing, unreadable, expired, or less than a
/// third of its life is left. (Replacing a CA that still signs is a rotation: the old one stays
/// trusted beside the new one until every leaf moved; see [`super::apply`].)
pub fn decide_ca(held: &Held, now: i64, settings: &IssuingSettings) -> Decision {
    decide(held, now, settings.ca_renew_before())
}

/// The earliest of the times to look again, if any.
pub fn next_check(decisions: &[Decision]) -> Option<Duration> {
    decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Keep(after) => Some(*after),
            Decision::Issue(_) => None,
        })
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn present(not_after: i64) -> Held {
        Held::Present(CertFacts {
            not_before: 0,
            not_after,
            current: true,
            names_match: true,
        })
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_certificate_is_kept_until_its_renewal_time() {
        assert_eq!(
            decide(&present(10_000), 1_000, HOUR),
            Decision::Keep(Duration::from_secs(10_000 - 3600 - 1_000))
        );
        assert_eq!(
            decide(&present(10_000), 6_400, HOUR),
            Decision::Issue(Reason::Due)
        );
    }

    #[test]
    fn expired_missing_and_unreadable_are_issued() {
        assert_eq!(
            decide(&present(10_000), 10_000, HOUR),
            Decision::Issue(Reason::Expired)
        );
        assert_eq!(
            decide(&Held::Missing, 0, HOUR),
            Decision::Issue(Reason::Missing)
        );
        assert_eq!(
            decide(&Held::Unreadable("x".into()), 0, HOUR),
            Decision::Issue(Reason::Unreadable)
        );
    }

    #[test]
    fn another_ca_or_other_names_are_issued_even_when_fresh() {
        let other = Held::Present(CertFacts {
            not_before: 0,
            not_after: 1_000_000,
            current: false,
            names_match: true,
        });
        assert_eq!(decide(&other, 0, HOUR), Decision::Issue(Reason::OtherCa));
        let names = Held::Present(CertFacts {
            not_before: 0,
            not_after: 1_000_000,
            current: true,
            names_match: false,
        });
        assert_eq!(decide(&names, 0, HOUR), Decision::Issue(Reason::Names));
    }

    #[test]
    fn the_next_check_is_the_earliest_renewal() {
        let d = [
            Decision::Keep(HOUR),
            Decision::Issue(Reason::Due),
            Decision::Keep(Duration::from_secs(60)),
        ];
        assert_eq!(next_check(&d), Some(Duration::from_secs(60)));
        assert_eq!(next_check(&[Decision::Issue(Reason::Missing)]), None);
    }
}
