//! etcd versions: parsing, the lines the operator knows, their upgrade rules, and the
//! capability table that decides which flags and features a member of each line gets.

use std::fmt;
use std::str::FromStr;

/// The version the webhook fills in when `spec.version` is missing: the newest tested patch
/// of the newest stable line that every tool in the ecosystem supports.
pub const DEFAULT_VERSION: &str = "3.6.16";

/// The image repository filled in when `spec.repository` is missing (CoreOS' default).
pub const DEFAULT_REPOSITORY: &str = "quay.io/coreos/etcd";

/// An etcd release version, `MAJOR.MINOR.PATCH`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EtcdVersion {
    /// Major version (3 for every supported release).
    pub major: u64,
    /// Minor version: the release line.
    pub minor: u64,
    /// Patch version.
    pub patch: u64,
}

/// Why a version string is not an etcd release version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be a released etcd version MAJOR.MINOR.PATCH such as {DEFAULT_VERSION}, got {0:?}")]
pub struct ParseVersionError(pub String);

impl EtcdVersion {
    /// Builds a version from its parts.
    pub const fn new(major: u64, minor: u64, patch: u64) -> Self {
        EtcdVersion {
            major,
            minor,
            patch,
        }
    }

    /// The release line `MAJOR.MINOR` of this version.
    pub fn line(&self) -> String {
        format!("{}.{}", self.major, self.minor)
    }

    /// What the operator knows of this version's line, if it is a supported line.
    pub fn capabilities(&self) -> Option<&'static LineCapabilities> {
        LINES
            .iter()
            .find(|l| l.major == self.major && l.minor == self.minor)
    }
}

impl FromStr for EtcdVersion {
    type Err = ParseVersionError;

    /// Parses `MAJOR.MINOR.PATCH`, with or without a leading `v`. Pre-release and build
    /// suffixes are refused: the operator only runs released versions.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseVersionError(s.to_string());
        let digits = s.strip_prefix('v').unwrap_or(s);
        let mut parts = digits.split('.');
        let mut next = || -> Result<u64, ParseVersionError> {
            let part = parts.next().ok_or_else(err)?;
            let well_formed = !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_digit())
                && (part == "0" || !part.starts_with('0'));
            if !well_formed {
                return Err(err());
            }
            part.parse().map_err(|_| err())
        };
        let version = EtcdVersion::new(next()?, next()?, next()?);
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(version)
    }
}

impl fmt::Display for EtcdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A patch level etcd documents as required on one line before moving to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpgradePrerequisite {
    /// The lowest version of the previous line that may move to this line.
    pub minimum_from: EtcdVersion,
    /// etcd's reason, quoted in the refusal.
    pub reason: &'static str,
}

/// The lowest patch of a line without known security vulnerabilities (etcd's security
/// advisories), below which a version is accepted with a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecurityMinimum {
    /// The lowest patch with the fixes.
    pub minimum: EtcdVersion,
}

/// What the operator knows of one etcd release line: support status, upgrade prerequisites
/// and the features that decide how members are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineCapabilities {
    /// Major version of the line.
    pub major: u64,
    /// Minor version of the line.
    pub minor: u64,
    /// The line no longer gets fixes upstream; accepted with a warning.
    pub end_of_life: bool,
    /// The member API supports learners (non-voting members promoted once caught up), 3.4+.
    pub learners: bool,
    /// etcd serves `--listen-metrics-urls` (3.3+), so metrics and health can go on a plain port.
    pub metrics_urls: bool,
    /// etcd takes `--logger=zap` and `--log-outputs` (3.4+).
    pub zap_logger: bool,
    /// `--enable-v2` still exists on this line (removed in 3.6).
    pub v2_flag: bool,
    /// `/health` checks through a v3 read (3.4+). On 3.2 and 3.3 it is a v2 quorum read
    /// (`QGET`) that goes through raft into the WAL, and etcd 3.6 refuses to replay v2 entries
    /// ("detected disallowed v2 WAL"): a readiness probe on it would block the upgrade to 3.6
    /// until 100,000 more entries bring a snapshot. Such lines are probed over TCP instead.
    pub v3_health: bool,
    /// Members of this line write v2-format raft entries (member attributes, cluster version:
    /// 3.4 and older).
    pub writes_v2_entries: bool,
    /// Members of this line can replay v2-format raft entries from their WAL (3.6 and older;
    /// 3.7 panics: "unmarshal should never fail").
    pub replays_v2_entries: bool,
    /// The maintenance API has `MoveLeader` (3.3+), so a leader can hand over before it
    /// restarts; on older lines the restart costs an election.
    pub move_leader: bool,
    /// The offline snapshot restore is `etcdutl snapshot restore` (3.5+; the images ship
    /// `/usr/local/bin/etcdutl`); older lines have `ETCDCTL_API=3 etcdctl snapshot restore`.
    pub etcdutl: bool,
    /// `/health?exclude=NOSPACE` answers healthy while the cluster-wide NOSPACE alarm is
    /// raised (3.4+; checked on the real binaries by `controller/tests/etcd_lines.rs`: 3.3's
    /// `/health` fails under NOSPACE with or without the query, 3.2's looks at no alarm), so a
    /// full database does not take every member out of its Services. 3.2 and 3.3 are probed
    /// over TCP, which no alarm touches.
    pub health_excludes_alarms: bool,
    /// The maintenance API's Status lists raised alarms in its `errors` (3.4+); older lines
    /// are asked through the Alarm API.
    pub status_lists_alarms: bool,
    /// What etcd requires of the previous line before an upgrade to this one.
    pub upgrade_prerequisite: Option<UpgradePrerequisite>,
    /// The lowest patch of this line without known vulnerabilities, where one is known.
    pub security_minimum: Option<SecurityMinimum>,
    /// A member serves renewed certificate files to every new TLS handshake, also to clients
    /// that send no SNI (3.3+; measured on the real binaries by `hack/measure-tls-reload.sh`
    /// and `tests/tests/etcd_tls_reload.rs`). 3.2 serves them only to clients that send SNI
    /// (a client dialling an IP keeps the certificate the member started with); no line
    /// reloads its CA files.
    pub reloads_certificates: bool,
}

/// Every release line the operator supports, oldest first. The last is the newest it knows.
pub const LINES: &[LineCapabilities] = &[
    LineCapabilities {
        major: 3,
        minor: 2,
        end_of_life: true,
        learners: false,
        metrics_urls: false,
        zap_logger: false,
        v2_flag: true,
        v3_health: false,
        writes_v2_entries: true,
        replays_v2_entries: true,
        move_leader: false,
        etcdutl: false,
        health_excludes_alarms: false,
        status_lists_alarms: false,
        upgrade_prerequisite: None,
        security_minimum: None,
        reloads_certificates: false,
    },
    LineCapabilities {
        major: 3,
        minor: 3,
        end_of_life: true,
        learners: false,
        metrics_urls: true,
        zap_logger: false,
        v2_flag: true,
        v3_health: false,
        writes_v2_entries: true,
        replays_v2_entries: true,
        move_leader: true,
        etcdutl: false,
        health_excludes_alarms: false,
        status_lists_alarms: false,
        upgrade_prerequisite: None,
        security_minimum: None,
        reloads_certificates: true,
    },
    LineCapabilities {
        major: 3,
        minor: 4,
        end_of_life: true,
        learners: true,
        metrics_urls: true,
        zap_logger: true,
        v2_flag: true,
        v3_health: true,
        writes_v2_entries: true,
        replays_v2_entries: true,
        move_leader: true,
        etcdutl: false,
        health_excludes_alarms: true,
        status_lists_alarms: true,
        upgrade_prerequisite: None,
        security_minimum: None,
        reloads_certificates: true,
    },
    LineCapabilities {
        major: 3,
        minor: 5,
        end_of_life: false,
        learners: true,
        metrics_urls: true,
        zap_logger: true,
        v2_flag: true,
        v3_health: true,
        writes_v2_entries: false,
        replays_v2_entries: true,
        move_leader: true,
        etcdutl: true,
        health_excludes_alarms: true,
        status_lists_alarms: true,
        upgrade_prerequisite: None,
        security_minimum: Some(SecurityMinimum {
            minimum: EtcdVersion::new(3, 5, 33),
        }),
        reloads_certificates: true,
    },
    LineCapabilities {
        major: 3,
        minor: 6,
        end_of_life: false,
        learners: true,
        metrics_urls: true,
        zap_logger: true,
        v2_flag: false,
        v3_health: true,
        writes_v2_entries: false,
        replays_v2_entries: true,
        move_leader: true,
        etcdutl: true,
        health_excludes_alarms: true,
        status_lists_alarms: true,
        upgrade_prerequisite: Some(UpgradePrerequisite {
            minimum_from: EtcdVersion::new(3, 5, 26),
            reason: "etcd's 3.6 upgrade guide requires every 3.5 member to run 3.5.26 or later first (3.5.24 to 3.5.26 fix upgrade blockers)",
        }),
        security_minimum: Some(SecurityMinimum {
            minimum: EtcdVersion::new(3, 6, 14),
        }),
        reloads_certificates: true,
    },
    LineCapabilities {
        major: 3,
        minor: 7,
        end_of_life: false,
        learners: true,
        metrics_urls: true,
        zap_logger: true,
        v2_flag: false,
        v3_health: true,
        writes_v2_entries: false,
        replays_v2_entries: false,
        move_leader: true,
        etcdutl: true,
        health_excludes_alarms: true,
        status_lists_alarms: true,
        upgrade_prerequisite: Some(UpgradePrerequisite {
            minimum_from: EtcdVersion::new(3, 6, 11),
            reason: "etcd's 3.7 upgrade guide requires every 3.6 member to run 3.6.11 or later first (earlier 3.6 patches may not roll to 3.7)",
        }),
        security_minimum: Some(SecurityMinimum {
            minimum: EtcdVersion::new(3, 7, 1),
        }),
        reloads_certificates: true,
    },
];

/// etcd's default `--snapshot-count` on 3.6 and later: a member takes a raft snapshot after
/// this many applied entries.
pub const DEFAULT_SNAPSHOT_COUNT: u64 = 10_000;

/// etcd's default `--quota-backend-bytes` (2 GiB on every line 3.2-3.7): the backend size at
/// which a member raises the NOSPACE alarm.
pub const DEFAULT_QUOTA_BACKEND_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// The oldest version the operator runs.
pub const OLDEST_SUPPORTED: EtcdVersion = EtcdVersion::new(3, 2, 0);

/// The supported range in words, for messages: "3.2.0 to 3.7.x".
pub fn supported_range() -> String {
    let newest = LINES.last().map(|l| format!("{}.{}", l.major, l.minor));
    format!(
        "{OLDEST_SUPPORTED} to {}.x",
        newest.unwrap_or_else(|| "3.7".into())
    )
}

/// Splits an image reference's repository from a version tag: the repository plus
/// `:v<version>`, as etcd's official images are tagged.
pub fn image_for(repository: &str, version: &EtcdVersion) -> String {
    format!("{repository}:v{version}")
}

/// Why etcd does not support moving a cluster between two versions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct UpgradeRefused {
    /// Short stable name of the rule (`version-skip`, `version-downgrade`, ...).
    pub rule: &'static str,
    /// The reason, naming both versions.
    pub message: String,
    /// The version to move to first, when one fixes it (a prerequisite patch of the line the
    /// members run).
    pub first: Option<EtcdVersion>,
}

/// The patch of `version`'s line to recommend: the line's security minimum, if `version` is
/// below it.
pub fn security_fix(version: &EtcdVersion) -> Option<EtcdVersion> {
    version
        .capabilities()?
        .security_minimum
        .map(|s| s.minimum)
        .filter(|minimum| version < minimum)
}

/// Whether etcd supports moving members that run `from` to `to` in place: patch moves
/// either way, one minor line up at a time, never down a minor line or to another major,
/// and etcd's documented patch prerequisites of the previous line.
pub fn check_upgrade(from: &EtcdVersion, to: &EtcdVersion) -> Result<(), UpgradeRefused> {
    let refuse = |rule, message| {
        Err(UpgradeRefused {
            rule,
            message,
            first: None,
        })
    };
    if to.major != from.major {
        return refuse(
            "version-major",
            format!(
                "cannot move from {from} to {to}: etcd does not support changing the major version"
            ),
        );
    }
    if to.minor < from.minor {
        return refuse(
            "version-downgrade",
            format!(
                "cannot move from {from} back to {to}: etcd does not support downgrading to an older minor line in place (patch versions within {} may move either way)",
                from.line()
            ),
        );
    }
    if to.minor > from.minor + 1 {
        return refuse(
            "version-skip",
            format!(
                "cannot move from {from} to {to}: etcd upgrades one minor line at a time; move to {}.{}.x first",
                from.major,
                from.minor + 1
            ),
        );
    }
    if to.minor == from.minor + 1
        && let Some(pre) = to.capabilities().and_then(|c| c.upgrade_prerequisite)
        && *from < pre.minimum_from
    {
        // The prerequisite, or the line's security minimum where that is higher.
        let first = security_fix(&pre.minimum_from).unwrap_or(pre.minimum_from);
        return Err(UpgradeRefused {
            rule: "version-prerequisite",
            message: format!(
                "cannot move from {from} to {to}: {}; move to {first} (or a later {} patch) first",
                pre.reason,
                from.line()
            ),
            first: Some(first),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_release_versions() {
        for (input, want) in [
            ("3.6.16", EtcdVersion::new(3, 6, 16)),
            ("v3.2.13", EtcdVersion::new(3, 2, 13)),
            ("3.10.0", EtcdVersion::new(3, 10, 0)),
        ] {
            assert_eq!(input.parse::<EtcdVersion>(), Ok(want), "{input}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_release_version() {
        for input in [
            "",
            "3",
            "3.6",
            "3.6.",
            "3.6.1.2",
            "3.6.x",
            "latest",
            "3.6.0-rc.1",
            "03.6.1",
            "vv3.6.1",
            " 3.6.1",
            "3.6.+1",
        ] {
            assert!(input.parse::<EtcdVersion>().is_err(), "{input:?} parsed");
        }
    }

    #[test]
    fn orders_numerically() {
        let a: EtcdVersion = "3.5.9".parse().unwrap();
        let b: EtcdVersion = "3.5.26".parse().unwrap();
        assert!(a < b);
    }

    #[test]
    fn capability_table_is_ordered_and_ends_at_newest_line() {
        assert!(LINES.windows(2).all(|w| w[0].minor + 1 == w[1].minor));
        assert_eq!(supported_range(), "3.2.0 to 3.7.x");
        let default: EtcdVersion = DEFAULT_VERSION.parse().unwrap();
        assert!(default.capabilities().is_some_and(|c| !c.end_of_life));
    }

    #[test]
    fn images_are_tagged_with_a_v() {
        let v = EtcdVersion::new(3, 6, 16);
        assert_eq!(
            image_for("quay.io/coreos/etcd", &v),
            "quay.io/coreos/etcd:v3.6.16"
        );
    }
}
