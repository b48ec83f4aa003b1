//! Safety backups (an operator extension, `spec.safetyBackup`): a snapshot of the cluster
//! written before each minor upgrade and before each scale-down, which the change waits for.
//! [`before`] decides (pure) whether a planned step is such a change and names it; the
//! pipeline takes the snapshot with [`take`] when the status has none for that change yet.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{Timestamp, tz::TimeZone};

use etcd_shared::types::{SafetyBackup, SafetyBackupRecord};

use super::reconciler::{BackupError, SnapshotSettings, snapshot_cluster};
use super::schedule::DEFAULT_TIMEOUT;
use crate::planner::{Observed, RemovalReason, Step};
use crate::snapshot::store::{StoreLocation, StoreTimeouts};
use crate::view::ClusterView;

/// The risky change `step` starts, in words (also the key the status records), when the
/// cluster asks for safety backups: a member moving to another minor line (once per line:
/// `upgrade to 3.7`), or a member removed because the spec asks for fewer
/// (`scale down to 3 (generation 4)`). `None` for every other step.
pub fn before(view: &ClusterView, model: &Observed, step: &Step) -> Option<String> {
    view.safety_backup.as_ref()?;
    match step {
        Step::UpgradeMember { name, version, .. } => {
            let current = model.pod(name)?.version?;
            ((current.major, current.minor) != (version.major, version.minor))
                .then(|| format!("upgrade to {}.{}", version.major, version.minor))
        }
        Step::RemoveMember {
            reason: RemovalReason::ScaleDown,
            ..
        } => Some(format!(
            "scale down to {} (generation {})",
            view.size,
            view.generation.unwrap_or(0)
        )),
        _ => None,
    }
}

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

/// The part of the object key that names the change: `upgrade-3.7`, `scale-down-3`.
fn slug(change: &str) -> String {
    let words: Vec<&str> = change
        .split(' ')
        .take_while(|w| !w.starts_with('('))
        .filter(|w| *w != "to")
        .collect();
    words.join("-")
}

/// The key of the snapshot taken before `change`: `KEY_before-<change>_v<revision>_<time>`.
pub fn snapshot_key(key: &str, change: &str, revision: i64, at: Timestamp) -> String {
    let time = at.to_zoned(TimeZone::UTC).strftime("%Y-%m-%d-%H:%M:%S");
    format!("{key}_before-{}_v{revision}_{time}", slug(change))
}

/// Writes the snapshot before `change` to the bucket of `spec`; the record the status keeps.
pub async fn take(
    client: &kube::Client,
    view: &ClusterView,
    spec: &SafetyBackup,
    change: &str,
    etcd_timeout: std::time::Duration,
) -> Result<SafetyBackupRecord, BackupError> {
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
        |revision| snapshot_key(&location.key, change, revision, now),
    );
    let (success, _) = tokio::time::timeout(limit, run)
        .await
        .map_err(|_| BackupError::Timeout(limit))??;
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
    use crate::planner::fixtures::ready_pod;
    use crate::planner::{MemberPlan, PodState};
    use crate::view::fixtures::view_of;

    const SAFETY: &str =
        "safetyBackup:\n  storageType: S3\n  s3:\n    path: bkt/demo.db\n    awsSecret: aws\n";

    fn model(versions: &[&str]) -> Observed {
        Observed {
            pods: versions
                .iter()
                .enumerate()
                .map(|(i, v)| ready_pod(u32::try_from(i).unwrap_or(0), v))
                .collect::<Vec<PodState>>(),
            ..Observed::default()
        }
    }

    fn upgrade(name: &str, to: &str) -> Step {
        Step::UpgradeMember {
            name: name.into(),
            image: format!("quay.io/coreos/etcd:v{to}"),
            version: to.parse().expect("version"),
        }
    }

    #[test]
    fn minor_upgrades_and_scale_downs_are_the_risky_changes() {
        let view = view_of(&format!("size: 3\nversion: 3.7.3\n{SAFETY}"));
        let m = model(&["3.6.16", "3.6.16", "3.7.3"]);
        let remove = |reason| Step::RemoveMember {
            id: 7,
            name: "demo-3".into(),
            reason,
        };
        let cases: Vec<(&str, Step, Option<&str>)> = vec![
            (
                "a member moves to 3.7",
                upgrade("demo-0", "3.7.3"),
                Some("upgrade to 3.7"),
            ),
            (
                "a member already on 3.7 (patch)",
                upgrade("demo-2", "3.7.3"),
                None,
            ),
            (
                "scale down",
                remove(RemovalReason::ScaleDown),
                Some("scale down to 3 (generation 1)"),
            ),
            (
                "a replacement is not a scale-down",
                remove(RemovalReason::Replace),
                None,
            ),
            ("nothing risky", Step::Done, None),
            (
                "a new member",
                Step::CreatePod(MemberPlan {
                    name: "demo-3".into(),
                    initial_cluster: vec![],
                    state: crate::planner::InitialState::Existing,
                    version: "3.7.3".parse().expect("v"),
                    token: "demo-uid-1".into(),
                    seed: None,
                }),
                None,
            ),
        ];
        for (name, step, want) in cases {
            assert_eq!(before(&view, &m, &step).as_deref(), want, "{name}");
        }
        let without = view_of("size: 3\nversion: 3.7.3");
        assert_eq!(
            before(&without, &m, &upgrade("demo-0", "3.7.3")),
            None,
            "not asked for"
        );
    }

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
        assert_eq!(
            snapshot_key("demo/snap.db", "upgrade to 3.7", 42, at),
            "demo/snap.db_before-upgrade-3.7_v42_2026-01-02-15:04:05"
        );
        assert_eq!(
            snapshot_key("demo/snap.db", "scale down to 3 (generation 4)", 9, at),
            "demo/snap.db_before-scale-down-3_v9_2026-01-02-15:04:05"
        );
    }
}
