//! Pure decisions of the backup reconciler: whether a backup is due, the key of each periodic
//! snapshot (CoreOS' naming), which old snapshots retention deletes, and the status each outcome
//! writes. No I/O here; `backup::reconciler` carries them out.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use etcd_shared::types::{EtcdBackupSpec, EtcdBackupStatus};

use crate::conditions::{self, Stamp, bounded_message};
use crate::snapshot::DEFAULT_TIMEOUT;
use crate::snapshot::cluster::Success;
use crate::snapshot::keys::interval;

/// Condition type: the latest backup succeeded.
pub const SUCCEEDED: &str = "Succeeded";

/// What to do with a backup now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Take a snapshot now.
    TakeNow,
    /// Nothing until then (a periodic backup not yet due).
    WaitFor(Duration),
    /// Nothing until the spec changes (a one-shot backup that succeeded).
    Done,
}

/// The whole backup's time limit (`timeoutInSecond`, CoreOS' default 60 s).
pub fn timeout(spec: &EtcdBackupSpec) -> Duration {
    match spec.backup_policy.as_ref().map(|p| p.timeout_in_second) {
        Some(s) if s > 0 => Duration::from_secs(s.unsigned_abs()),
        _ => DEFAULT_TIMEOUT,
    }
}

/// Whether a backup is due: a one-shot backup until it has succeeded for the current spec; a
/// periodic one when its interval has passed since the last success (at once after a spec
/// change or when none succeeded yet). Failures are retried by the reconciler's backoff.
pub fn next(
    spec: &EtcdBackupSpec,
    status: Option<&EtcdBackupStatus>,
    generation: Option<i64>,
    now: Timestamp,
) -> Next {
    let current =
        status.filter(|s| s.observed_generation.is_some() && s.observed_generation == generation);
    let Some(status) = current else {
        return Next::TakeNow;
    };
    match interval(spec) {
        None if status.succeeded => Next::Done,
        None => Next::TakeNow,
        Some(every) => {
            let Some(last) = status.last_success_date.as_ref() else {
                return Next::TakeNow;
            };
            let elapsed = now.duration_since(last.0);
            let elapsed = Duration::try_from(elapsed).unwrap_or(Duration::ZERO);
            if elapsed >= every {
                Next::TakeNow
            } else {
                Next::WaitFor(every - elapsed)
            }
        }
    }
}

/// The status after a successful backup.
pub fn succeeded(
    old: Option<&EtcdBackupStatus>,
    success: &Success,
    generation: Option<i64>,
    now: Timestamp,
) -> EtcdBackupStatus {
    let at = Time(now);
    let message = format!(
        "snapshot of revision {} ({} bytes, etcd {}) written to {} in {:.1} s",
        success.revision,
        success.size,
        success.etcd_version,
        success.path,
        success.took.as_secs_f64()
    );
    EtcdBackupStatus {
        succeeded: true,
        reason: None,
        etcd_version: Some(success.etcd_version.clone()),
        etcd_revision: Some(success.revision),
        last_success_date: Some(at.clone()),
        last_backup_path: Some(success.path.clone()),
        last_backup_size: i64::try_from(success.size).ok(),
        last_backup_sha256: Some(success.sha256.clone()),
        conditions: with_condition(
            old,
            Stamp::new(generation, now).condition(SUCCEEDED, true, "BackupSucceeded", message),
        ),
        observed_generation: generation,
    }
}

/// The status after a failed backup: what the last success recorded is kept, CoreOS' `Reason`
/// says why this one failed.
pub fn failed(
    old: Option<&EtcdBackupStatus>,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> EtcdBackupStatus {
    let mut status = old.cloned().unwrap_or_default();
    status.succeeded = false;
    // One bounded line: a store's answer can be a multi-line XML document.
    let message = bounded_message(message.to_string());
    status.reason = Some(format!("{reason}: {message}"));
    let failed = Stamp::new(generation, now).condition(SUCCEEDED, false, reason, message);
    status.conditions = with_condition(old, failed);
    status.observed_generation = generation;
    status
}

fn with_condition(old: Option<&EtcdBackupStatus>, new: Condition) -> Vec<Condition> {
    let mut list = vec![new];
    if let Some(old) = old {
        conditions::carry_transition_times(&mut list, &old.conditions);
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_shared::types::BackupPolicy;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("a timestamp")
    }

    fn spec(interval: i64) -> EtcdBackupSpec {
        EtcdBackupSpec {
            backup_policy: (interval > 0).then(|| BackupPolicy {
                backup_interval_in_second: interval,
                ..BackupPolicy::default()
            }),
            ..EtcdBackupSpec::default()
        }
    }

    fn status(generation: i64, succeeded: bool, last: Option<&str>) -> EtcdBackupStatus {
        EtcdBackupStatus {
            succeeded,
            last_success_date: last.map(|t| Time(at(t))),
            observed_generation: Some(generation),
            ..EtcdBackupStatus::default()
        }
    }

    #[test]
    fn when_a_backup_is_due() {
        let now = at("2026-12-04T12:00:00Z");
        let cases: Vec<(&str, EtcdBackupSpec, Option<EtcdBackupStatus>, Next)> = vec![
            ("new one-shot", spec(0), None, Next::TakeNow),
            (
                "one-shot done",
                spec(0),
                Some(status(1, true, Some("2026-12-04T11:00:00Z"))),
                Next::Done,
            ),
            (
                "one-shot failed: retried",
                spec(0),
                Some(status(1, false, None)),
                Next::TakeNow,
            ),
            (
                "one-shot, spec changed",
                spec(0),
                Some(status(0, true, Some("2026-12-04T11:00:00Z"))),
                Next::TakeNow,
            ),
            (
                "periodic, none yet",
                spec(600),
                Some(status(1, false, None)),
                Next::TakeNow,
            ),
            (
                "periodic, not due",
                spec(600),
                Some(status(1, true, Some("2026-12-04T11:55:00Z"))),
                Next::WaitFor(Duration::from_secs(300)),
            ),
            (
                "periodic, due",
                spec(600),
                Some(status(1, true, Some("2026-12-04T11:50:00Z"))),
                Next::TakeNow,
            ),
            (
                "periodic, failed since its last success: waits out the interval",
                spec(600),
                Some(status(1, false, Some("2026-12-04T11:59:00Z"))),
                Next::WaitFor(Duration::from_secs(540)),
            ),
            (
                "periodic, last success in the future (clock moved back)",
                spec(600),
                Some(status(1, true, Some("2026-12-04T12:30:00Z"))),
                Next::WaitFor(Duration::from_secs(600)),
            ),
        ];
        for (name, spec, status, want) in cases {
            assert_eq!(next(&spec, status.as_ref(), Some(1), now), want, "{name}");
        }
    }

    #[test]
    fn statuses_record_the_outcome() {
        let now = at("2026-12-04T12:00:00Z");
        let ok = Success {
            path: "b/k".into(),
            etcd_version: "3.6.16".into(),
            revision: 42,
            size: 1056,
            sha256: "ab".repeat(32),
            took: Duration::from_millis(1500),
        };
        let s = succeeded(None, &ok, Some(3), now);
        assert!(s.succeeded && s.reason.is_none());
        assert_eq!(s.etcd_revision, Some(42));
        assert_eq!(s.last_backup_size, Some(1056));
        assert_eq!(s.conditions[0].status, "True");
        assert_eq!(s.observed_generation, Some(3));

        let later = at("2026-12-04T12:10:00Z");
        let f = failed(
            Some(&s),
            "StoreFailed",
            "connection refused",
            Some(3),
            later,
        );
        assert!(!f.succeeded);
        assert_eq!(f.reason.as_deref(), Some("StoreFailed: connection refused"));
        assert_eq!(
            f.last_success_date, s.last_success_date,
            "the last success is kept"
        );
        assert_eq!(f.conditions[0].status, "False");
        assert_eq!(f.conditions[0].last_transition_time, Time(later));
        let f2 = failed(
            Some(&f),
            "StoreFailed",
            "again",
            Some(3),
            at("2026-12-04T12:20:00Z"),
        );
        assert_eq!(
            f2.conditions[0].last_transition_time,
            Time(later),
            "no transition"
        );
    }
}
