//! Safety backups (an operator extension, `spec.safetyBackup`): a snapshot of the cluster
//! written before each minor upgrade and before each scale-down, which the change waits for.
//! The planner decides ([`crate::planner::safety`]); [`missing`] tells whether the stored
//! record covers a change, [`take`] writes the snapshot when the planner says so.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{Timestamp, tz::TimeZone};

use etcd_shared::types::{SafetyBackup, SafetyBackupRecord};

use crate::planner::safety::RiskyChange;
use crate::snapshot::DEFAULT_TIMEOUT;
use crate::snapshot::cluster::{SnapshotSettings, snapshot_cluster};
use crate::snapshot::error::SnapshotError;
use crate::snapshot::store::{StoreLocation, StoreTimeouts};
use crate::view::ClusterView;

/// How long a recorded snapshot stands for its change. An upgrade rolled back and asked for
/// again weeks later (its change reads the same, `upgrade to 3.7`) gets a new snapshot; a
/// change that takes longer (an idle cluster waiting for its raft snapshots before 3.7) gets a
/// fresh one before it goes on.
pub const RECORD_VALIDITY: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Whether a snapshot for `change` is still to be taken at `now`, given the one the status
/// records: none for this change, or one older than [`RECORD_VALIDITY`] (or of unknown age).
pub fn missing(change: &str, last: Option<&SafetyBackupRecord>, now: Timestamp) -> bool {
    last.is_none_or(|r| {
        let fresh = r.time.as_ref().is_some_and(|t| {
            let age = now.as_second().saturating_sub(t.0.as_second());
            u64::try_from(age).is_ok_and(|age| age < RECORD_VALIDITY.as_secs())
        });
        r.before != change || !fresh
    })
}

/// The key of the snapshot taken before `change`: `KEY_before-<change>_v<revision>_<time>`
/// (the change as [`RiskyChange::slug`] names it).
pub fn snapshot_key(key: &str, change: &RiskyChange, revision: i64, at: Timestamp) -> String {
    let time = at.to_zoned(TimeZone::UTC).strftime("%Y-%m-%d-%H:%M:%S");
    format!("{key}_before-{}_v{revision}_{time}", change.slug())
}

/// Writes the snapshot before `change` to the bucket of `spec`; the record the status keeps.
pub async fn take(
    client: &kube::Client,
    view: &ClusterView,
    spec: &SafetyBackup,
    change: &RiskyChange,
    etcd_timeout: std::time::Duration,
) -> Result<SafetyBackupRecord, SnapshotError> {
    let location = StoreLocation::from_source(&spec.storage_type, &spec.source)?;
    let limit = if spec.timeout_in_second > 0 {
        std::time::Duration::from_secs(spec.timeout_in_second.unsigned_abs())
    } else {
        DEFAULT_TIMEOUT
    };
    let now = Timestamp::now();
    let settings = SnapshotSettings {
        etcd_timeout,
        limit,
        store: StoreTimeouts::default(),
    };
    let run = snapshot_cluster(
        client,
        view,
        view.tls.operator_secret.as_deref(),
        &location,
        &settings,
        None,
        |revision| snapshot_key(&location.key, change, revision, now),
    );
    let (success, _) = tokio::time::timeout(limit, run)
        .await
        .map_err(|_| SnapshotError::Timeout(limit))??;
    Ok(SafetyBackupRecord {
        before: change.to_string(),
        path: success.path,
        revision: Some(success.revision),
        sha256: success.sha256,
        time: Some(Time(Timestamp::now())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_snapshot_per_change_with_a_readable_key() {
        let at: Timestamp = "2026-01-02T15:04:05Z".parse().expect("t");
        let record = SafetyBackupRecord {
            before: "upgrade to 3.7".into(),
            time: Some(Time(at)),
            ..SafetyBackupRecord::default()
        };
        let later = |hours: i64| {
            at.checked_add(k8s_openapi::jiff::SignedDuration::from_hours(hours))
                .expect("time")
        };
        assert!(missing("upgrade to 3.7", None, at));
        assert!(!missing("upgrade to 3.7", Some(&record), later(1)));
        assert!(missing(
            "scale down to 3 (generation 4)",
            Some(&record),
            later(1)
        ));
        // Issue 23, item 11: weeks later the same change needs a new snapshot.
        assert!(missing("upgrade to 3.7", Some(&record), later(24 * 21)));
        let undated = SafetyBackupRecord {
            time: None,
            ..record.clone()
        };
        assert!(missing("upgrade to 3.7", Some(&undated), later(1)));
        let upgrade = RiskyChange::Upgrade { major: 3, minor: 7 };
        let scale_down = RiskyChange::ScaleDown {
            size: 3,
            generation: 4,
        };
        assert_eq!(upgrade.to_string(), "upgrade to 3.7");
        assert_eq!(scale_down.to_string(), "scale down to 3 (generation 4)");
        assert_eq!(
            snapshot_key("demo/snap.db", &upgrade, 42, at),
            "demo/snap.db_before-upgrade-3.7_v42_2026-01-02-15:04:05"
        );
        assert_eq!(
            snapshot_key("demo/snap.db", &scale_down, 9, at),
            "demo/snap.db_before-scale-down-3_v9_2026-01-02-15:04:05"
        );
    }
}
